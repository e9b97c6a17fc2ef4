"""The quality table: dense vs text- vs decode-calibrated pruning of Qwen2.5-Coder-1.5B-Instruct at 2:4 and 50%,
SparseGPT and Wanda, dense vs sequential propagation, a text+decode mix, and the cross-model ablation on
SmolLM2-135M, all with 16384 calibration tokens per source, evaluated on the held-out (odd) half of HumanEval and on
lee.cor. Same as `sparsedecoding compare` (see `--help` and `--list`), which it runs with the arguments given;
results accumulate in benchmarks/results/quality/ (quality.md, quality.json, configs/NAME.json + .humaneval.jsonl).

On one H200, in commands that fit a 9-minute limit (finished configurations are skipped, so re-running the same
command resumes):

    python benchmarks/quality_report.py --configs dense,text-sparsegpt-2of4,decode-sparsegpt-2of4,text-sparsegpt-50pct,decode-sparsegpt-50pct
    python benchmarks/quality_report.py --configs '*-wanda-*,mix-*'
    python benchmarks/quality_report.py --configs '*-seq'
    python benchmarks/quality_report.py --configs 'small-*'
"""

from __future__ import annotations

import sys

from sparsedecoding.cli import main

if __name__ == "__main__":
    # Results record the equivalent `sparsedecoding compare …` command line.
    sys.argv = ["sparsedecoding", "compare", *sys.argv[1:]]
    sys.exit(main(sys.argv[1:]))
