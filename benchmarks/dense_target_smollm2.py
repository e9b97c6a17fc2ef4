"""Dense-target reconstruction vs the self target on SmolLM2-135M, on CPU (issue 11 item 2): Lee perplexity of the
16:32 model after sequential propagation with each target, from the same fixed-text calibration set.

    python benchmarks/dense_target_smollm2.py --tokens 4096 --out benchmarks/results/dense_target_smollm2_cpu.md

`--src DIR` imports the package from another tree (e.g. a git worktree of an older commit) to compare versions."""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--tokens", type=int, default=4096, help="text calibration tokens (default: %(default)s)")
parser.add_argument("--pattern", default="16:32")
parser.add_argument("--targets", nargs="+", default=["self", "dense"], choices=["self", "dense"])
parser.add_argument("--src", type=Path, default=Path(__file__).parent.parent / "src", help="package source tree")
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()
sys.path.insert(0, str(args.src.resolve()))

import torch  # noqa: E402

import sparsedecoding  # noqa: E402

from sparsedecoding.data import lee_text  # noqa: E402
from sparsedecoding.evaluation.metrics import perplexity  # noqa: E402
from sparsedecoding.models import load_model, resolve_model  # noqa: E402
from sparsedecoding.pipeline import PruneConfig, build_calibration, prune_layers  # noqa: E402
from sparsedecoding.runenv import environment_markdown  # noqa: E402

torch.set_num_threads(2)
folder = resolve_model("smollm2-135m")
dense, tokenizer, _ = load_model(folder, torch.device("cpu"))
calib, _ = build_calibration(PruneConfig(model=str(folder), out="", calibration="text", tokens=args.tokens),
                             dense, tokenizer)
lee = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:4096]
commit = subprocess.run(["git", "-C", str(args.src), "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
rows = [f"| dense | - | {perplexity(dense, lee, 512, 16)[0]:.1f} | - |"]
for target in args.targets:
    model = copy.deepcopy(dense)
    started = time.perf_counter()
    prune_layers(model, calib, PruneConfig(model=str(folder), out="", pattern=args.pattern, propagation="sequential",
                                           target=target, solver="sparsegpt"))  # as its committed report
    rows.append(f"| {args.pattern}, sequential | {target} | {perplexity(model, lee, 512, 16)[0]:.1f} | "
                f"{time.perf_counter() - started:.0f} |")
    print(rows[-1], flush=True)
lines = ["# Dense-target vs self-target reconstruction, SmolLM2-135M (CPU)", "",
         environment_markdown(f"python {' '.join(sys.argv)}", torch.device("cpu")).rstrip(),
         f"- package source: {Path(sparsedecoding.__file__).parent} (commit {commit or 'unknown'})", "",
         f"{args.tokens} tokens of fixed text (`lee_background.cor`) calibrate both runs; perplexity on the first 4096 "
         f"tokens of the held-out Lee corpus.", "",
         "| model | target | Lee perplexity | prune s |", "|---|---|---|---|", *rows, ""]
args.out.parent.mkdir(parents=True, exist_ok=True)
args.out.write_text("\n".join(lines) + "\n")
print(f"wrote {args.out}")
