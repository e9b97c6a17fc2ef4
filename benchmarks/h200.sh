#!/usr/bin/env bash
# The commands run on the H200 (device tool), by stage, so every committed result has its exact command here.
#   smoke:    GPU tests, a solver timing, the quick kernel and engine benchmarks
#   receive:  copy the piece of the Qwen GGUF carried in .xfer/ to /root/m (one per call: a call carries <= 64 MiB)
#   final:    assemble + verify + convert the GGUF, quick engine benchmark, core of the quality grid
# Long steps run under `timeout` so that a slow step never costs the results of the others; results are written
# to $OUT (tarred where a step makes many files).
# Run from the repository root with OUT set to a folder for logs and reports.
set -uo pipefail
stage=$1; shift
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 SPARSEDECODING_CACHE=/root/cache TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /root/cache/data
cp -n .devdata/* /root/cache/data/ 2>/dev/null
if [ -d .whl ] && [ ! -d /tmp/site/gguf ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
case $stage in
  smoke)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    timeout 240 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
    timeout 90 python3 benchmarks/solver_bench.py --layers 4 2>&1 | tail -8 | tee "$OUT/solver.log"
    timeout 200 python3 benchmarks/kernel_bench.py --quick --out "$OUT/kernel_quick.md" 2>&1 | tail -60
    timeout 200 python3 benchmarks/e2e_bench.py --quick --out "$OUT/e2e_quick.md" 2>&1 | tail -30
    ;;
  receive)
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/ && ls /root/m | wc -l
    ;;
  final)
    # One call: the GGUF (carried in 18 raw pieces by `receive`), the quick engine benchmark, then the core of the
    # quality grid for $1 seconds, tarred every 20 s so that a cut-off run still returns every finished config.
    grid_seconds=${1:-330}
    mkdir -p /root/cache/gguf && cat /root/m/part* > /root/cache/gguf/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    python3 -m sparsedecoding fetch qwen2.5-coder-1.5b 2>&1 | tail -1
    timeout 100 python3 benchmarks/e2e_bench.py --quick --out "$OUT/e2e_h200_quick_v2.md" 2>&1 | tail -8
    timeout "$grid_seconds" python3 benchmarks/quality_report.py --out /root/quality-16k --eval-batch-size 82 \
      --timeout 6 --configs dense,text-sparsegpt-2of4,decode-sparsegpt-2of4,decode-sparsegpt-2of4-seq,text-sparsegpt-50pct,decode-sparsegpt-50pct,decode-sparsegpt-50pct-seq \
      > "$OUT/quality.log" 2>&1 &
    grid=$!
    while kill -0 $grid 2>/dev/null; do
      sleep 20
      tar czf "$OUT/quality-16k.tgz" -C /root quality-16k 2>/dev/null
    done
    tar czf "$OUT/quality-16k.tgz" -C /root quality-16k
    grep -E "INFO sparsedecoding.compare" "$OUT/quality.log" | tail -12
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
