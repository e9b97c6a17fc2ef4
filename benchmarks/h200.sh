#!/usr/bin/env bash
# The commands run on the H200 (device tool), by stage, so every committed result has its exact command here.
#   smoke:    GPU tests, a solver timing, the quick kernel and engine benchmarks
#   receive:  copy the piece of the Qwen GGUF carried in .xfer/ to /root/m (one per call: a call carries <= 64 MiB)
#   final:    assemble + verify + convert the GGUF, quick engine benchmark, core of the quality grid
# Second session (a machine is held 30 min at most; the model pieces are received during the benchmark calls):
#   bench:    receive a piece, GPU tests, the full kernel benchmark
#   e2e:      receive a piece, the full end-to-end benchmark
#   final2:   assemble both models, `prune` through the CLI (peak memory), the engine's correctness check on both
#             real models, drift, the rest of the 16k quality grid (mix, cross-model ablation), the discrepancy analysis
#   discrepancy: the discrepancy analysis on the real model
#   grid64k:  the pre-registered 64k-token sampled calibration grid (its own report folder)
# Next session (written before it; nothing below has run yet):
#   followup: receive a SmolLM2 piece (carry .xfer/spart00, then `receive` with spart01), GPU kernel tests with the
#             batch-2-4 word-half candidates, the kernel benchmark at batch 1/2/4 and the engine at batch 1-8 to see
#             whether they help, then the SmolLM2 engine check that ran out of time here
# Third session:
#   dotsweep: (run twice, with the tensor-core kernels of commits 8812f67 and ac3769a among the tuner's candidates,
#             since removed) kernel benchmark of the 8B shapes at batch 2-16 with every candidate's time, then the
#             8B engine at batch 1-8
#   hybrid:   (after `receive` with .xfer/spart00 and spart01; pieces of 45 MiB) the 8B engine at batch 1-8 with the 2:4 model also holding dense
#             copies from batch 3, the GPU kernel and engine tests, the SmolLM2 engine check
#   checks3:  (after `receive` of the 45 MiB pieces .xfer/cpart00-22 and spart00-01; carry cpart23 + spart02) the
#             engine check under the measured tolerance: SmolLM2 unpruned, Qwen unpruned (logits), Qwen pruned 2:4
#             through the CLI (decode-time calibration, the default) then checked
#   refine64k: (after the 18 `receive` calls) the 64k sampled grid with block-wise refinement, fixed in advance:
#             200 steps per layer at learning rate 5e-5, sequential propagation first, into its own folder
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
  bench)
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    timeout 200 python3 -m pytest -q -m gpu tests/test_kernels.py tests/test_solvers.py tests/test_engine_gpu.py \
      -p no:cacheprovider 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
    timeout 340 python3 benchmarks/kernel_bench.py --out "$OUT/kernel_h200_full.md" > "$OUT/kernel_full.log" 2>&1
    tail -30 "$OUT/kernel_h200_full.md"
    ;;
  e2e)
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/
    timeout 540 python3 benchmarks/e2e_bench.py --repeats 2 --out "$OUT/e2e_h200_full.md" > "$OUT/e2e_full.log" 2>&1
    tail -30 "$OUT/e2e_full.log"
    ;;
  final2)
    mkdir -p /root/cache/gguf && cat /root/m/part* > /root/cache/gguf/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    cat /root/m/small* > /root/cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 -m sparsedecoding fetch qwen2.5-coder-1.5b 2>&1 | tail -1
    python3 -m sparsedecoding fetch smollm2-135m 2>&1 | tail -1
    qwen=/root/cache/models/qwen2.5-coder-1.5b
    timeout 120 python3 -m sparsedecoding prune --model qwen2.5-coder-1.5b --pattern 2:4 --gen-batch-size 82 \
      --out /root/pruned-2of4 > "$OUT/prune_cli.log" 2>&1
    cp /root/pruned-2of4/sparsedecoding.json "$OUT/prune_cli_manifest.json"; tail -5 "$OUT/prune_cli.log"
    mkdir -p "$OUT/checks"
    timeout 100 python3 -m sparsedecoding.engine.check --model /root/pruned-2of4 --out "$OUT/checks/qwen_pruned_2of4.md" \
      > "$OUT/checks/qwen.log" 2>&1
    timeout 60 python3 -m sparsedecoding.engine.check --model /root/cache/models/smollm2-135m --prune 2:4 \
      --out "$OUT/checks/smollm2_2of4.md" > "$OUT/checks/smollm2.log" 2>&1
    timeout 60 python3 -m sparsedecoding analyze drift --dense $qwen --pruned /root/pruned-2of4 --out "$OUT/drift" \
      --no-plot --batch-size 82 > "$OUT/checks/drift.log" 2>&1
    tar czf "$OUT/checks.tgz" -C "$OUT" checks drift prune_cli_manifest.json prune_cli.log && rm -rf "$OUT/checks" "$OUT/drift"
    # resumes the committed 16k report (same settings): adds the mix and the cross-model ablation
    cp -rn benchmarks/results/quality-qwen2.5-coder-1.5b /root/quality-16k
    timeout 280 python3 benchmarks/quality_report.py --out /root/quality-16k --eval-batch-size 82 --timeout 6 \
      --configs 'mix-sparsegpt-*,small-*' > "$OUT/quality.log" 2>&1
    tar czf "$OUT/quality-16k.tgz" -C /root quality-16k
    grep -E "INFO sparsedecoding.compare" "$OUT/quality.log" | tail -12
    ;;
  discrepancy)
    timeout "${1:-300}" python3 -m sparsedecoding analyze discrepancy --model /root/cache/models/qwen2.5-coder-1.5b \
      --out /root/discrepancy --no-plot --gen-batch-size 82 > "$OUT/discrepancy.log" 2>&1
    tar czf "$OUT/discrepancy.tgz" -C /root discrepancy 2>/dev/null; tail -30 "$OUT/discrepancy.log"
    ;;
  grid64k)
    # Pre-registered before any of its results existed: 4 sampled continuations per calibration prompt
    # (temperature 0.7, top-p 0.95), 65536 tokens per source, SparseGPT damping 0.01; sequential propagation first
    # (the configuration chosen in advance), then dense propagation, then the equal-budget text baseline.
    deadline=$((SECONDS + ${1:-500}))
    (for configs in 'decode-sparsegpt-*-seq' 'decode-sparsegpt-2of4,decode-sparsegpt-50pct' 'text-sparsegpt-2of4,text-sparsegpt-50pct'; do
      left=$((deadline - SECONDS)); [ $left -gt 30 ] || break
      timeout $left python3 benchmarks/quality_report.py --out /root/quality-64k --eval-batch-size 82 --timeout 6 \
        --tokens 65536 --samples-per-prompt 4 --temperature 0.7 --top-p 0.95 --gen-batch-size 328 --configs "$configs"
    done) > "$OUT/quality64k.log" 2>&1 &
    grid=$!
    while kill -0 $grid 2>/dev/null; do
      sleep 20
      tar czf "$OUT/quality-64k.tgz" -C /root quality-64k 2>/dev/null
    done
    tar czf "$OUT/quality-64k.tgz" -C /root quality-64k
    grep -E "INFO sparsedecoding.compare" "$OUT/quality64k.log" | tail -12
    ;;
  followup)
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/
    timeout 200 python3 -m pytest -q -m gpu tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -20 | tee "$OUT/gpu_tests.log"
    timeout 150 python3 benchmarks/kernel_bench.py --batches 1 2 4 --out "$OUT/kernel_h200_bs124.md" \
      > "$OUT/kernel.log" 2>&1
    timeout 150 python3 benchmarks/e2e_bench.py --preset llama-3.1-8b --repeats 2 --out "$OUT/e2e_h200_8b.md" \
      > "$OUT/e2e.log" 2>&1
    if [ -f /root/m/small01 ]; then
      mkdir -p /root/cache/gguf && cat /root/m/small* > /root/cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
      python3 -m sparsedecoding fetch smollm2-135m 2>&1 | tail -1
      timeout 200 python3 -m sparsedecoding.engine.check --model /root/cache/models/smollm2-135m --prune 2:4 \
        --out "$OUT/engine_check_smollm2-135m_2of4.md" > "$OUT/check_smollm2.log" 2>&1
    fi
    tail -12 "$OUT/kernel_h200_bs124.md"; grep -A12 "## Targets" "$OUT/e2e_h200_8b.md"
    ;;
  dotsweep)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    timeout 300 python3 benchmarks/kernel_bench.py --models Llama-3.1-8B --patterns 2:4 16:32 --batches 2 4 8 16 \
      --out "$OUT/kernel_dot_sweep.md" > "$OUT/kernel_dot.log" 2>&1
    grep -E "b[0-9]+:" "$OUT/kernel_dot.log" | tail -40
    timeout 260 python3 benchmarks/e2e_bench.py --preset llama-3.1-8b --repeats 2 --out "$OUT/e2e_h200_8b_dot.md" \
      > "$OUT/e2e_dot.log" 2>&1
    grep -A12 "## Targets" "$OUT/e2e_h200_8b_dot.md"; tail -5 "$OUT/e2e_dot.log"
    ;;
  hybrid)
    mkdir -p /root/m && cp -n .xfer/*/* /root/m/
    timeout 240 python3 benchmarks/e2e_bench.py --preset llama-3.1-8b --repeats 2 --out "$OUT/e2e_h200_8b_hybrid.md" \
      > "$OUT/e2e_hybrid.log" 2>&1
    grep -A16 "## Targets" "$OUT/e2e_h200_8b_hybrid.md"; tail -3 "$OUT/e2e_hybrid.log"
    timeout 150 python3 -m pytest -q -m gpu tests/test_kernels.py tests/test_engine_gpu.py -p no:cacheprovider 2>&1 \
      | tail -15 | tee "$OUT/gpu_tests_v3.log"
    if ls /root/m/small* > /dev/null 2>&1; then  # fetch checks size and sha256 of the assembled file
      mkdir -p /root/cache/gguf && cat /root/m/small* > /root/cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
      python3 -m sparsedecoding fetch smollm2-135m 2>&1 | tail -1
      for prune in none 2:4; do
        name=$([ $prune = none ] && echo dense || echo 2of4); extra=$([ $prune = none ] || echo "--prune $prune")
        timeout 150 python3 -m sparsedecoding.engine.check --model /root/cache/models/smollm2-135m $extra \
          --out "$OUT/engine_check_smollm2-135m_$name.md" > "$OUT/check_smollm2_$name.log" 2>&1
        grep -iE "pass|fail" "$OUT/engine_check_smollm2-135m_$name.md" | tail -4
      done
    fi
    ;;
  checks3)
    mkdir -p /root/m /root/cache/gguf && cp -n .xfer/*/* /root/m/ && ls /root/m | wc -l
    cat /root/m/part* > /root/cache/gguf/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
    cat /root/m/small* > /root/cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 -m sparsedecoding fetch smollm2-135m 2>&1 | tail -1
    python3 -m sparsedecoding fetch qwen2.5-coder-1.5b 2>&1 | tail -1
    check() { name=$1; shift; timeout 150 python3 -m sparsedecoding.engine.check "$@" --out "$OUT/engine_check_$name.md" \
      > "$OUT/check_$name.log" 2>&1; grep -E "^\| [0-9]" "$OUT/engine_check_$name.md"; tail -1 "$OUT/check_$name.log"; }
    check smollm2-135m_dense_h200 --model /root/cache/models/smollm2-135m --checks logits
    check qwen2.5-coder-1.5b_dense_h200 --model /root/cache/models/qwen2.5-coder-1.5b --checks logits
    timeout 120 python3 -m sparsedecoding prune --model qwen2.5-coder-1.5b --pattern 2:4 --gen-batch-size 82 \
      --out /root/pruned-2of4 > "$OUT/prune_cli.log" 2>&1; tail -2 "$OUT/prune_cli.log"
    check qwen2.5-coder-1.5b_2of4_h200 --model /root/pruned-2of4
    ;;
  refine64k)
    # Fixed before any refinement result existed: same calibration as grid64k (the same sets are rebuilt with the
    # same seed), SparseGPT damping 0.01, then 200 Adam steps per layer at 5e-5 (layers where the held-out
    # calibration batch gets worse keep the solver's weights).
    if [ ! -d /root/cache/models/qwen2.5-coder-1.5b ]; then  # the 18 pieces arrive through `receive` first
      mkdir -p /root/cache/gguf && cat /root/m/part* > /root/cache/gguf/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
      python3 -m sparsedecoding fetch qwen2.5-coder-1.5b 2>&1 | tail -1
    fi
    deadline=$((SECONDS + ${1:-500}))
    (for configs in 'decode-sparsegpt-*-seq' 'decode-sparsegpt-2of4,decode-sparsegpt-50pct'; do
      left=$((deadline - SECONDS)); [ $left -gt 30 ] || break
      timeout $left python3 benchmarks/quality_report.py --out /root/quality-64k-refine --eval-batch-size 82 \
        --timeout 6 --tokens 65536 --samples-per-prompt 4 --temperature 0.7 --top-p 0.95 --gen-batch-size 328 \
        --refine-steps 200 --refine-lr 5e-5 --configs "$configs"
    done) > "$OUT/quality64k_refine.log" 2>&1 &
    grid=$!
    while kill -0 $grid 2>/dev/null; do
      sleep 20
      tar czf "$OUT/quality-64k-refine.tgz" -C /root quality-64k-refine 2>/dev/null
    done
    tar czf "$OUT/quality-64k-refine.tgz" -C /root quality-64k-refine
    grep -E "INFO sparsedecoding.compare" "$OUT/quality64k_refine.log" | tail -12
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
