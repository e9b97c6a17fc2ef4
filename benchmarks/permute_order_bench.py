"""What `prune --permute-channels` adds to a prune's time: `solvers.balanced_column_order` on the saliency shapes of
one layer's down (rows x intermediate) and o (rows x query heads a KV head, stacked, x head_dim), for the
Qwen2.5-Coder-1.5B and Llama-3.1-8B shapes, at 2:4 and 16:32. The saliency is synthetic (|N(0,1)|² times a per-column
scale drawn log-uniform over two decades, as real Hessian diagonals spread), so the dropped-saliency ratios say only
that the search works on that shape, not what it does to a real weight. Writes a markdown report and its JSON:

    PYTHONPATH=src python benchmarks/permute_order_bench.py --out benchmarks/results/permute_order_h100.md

`--before COMMIT` also times the search as that commit wrote it (`solvers.py` read from git, or from a file of that
name's copy where the history is not at hand), side by side on the same saliency, and checks that both choose the
same order; `--models` keeps only the shapes of those models. `--grouped G` also times the search within runs of G
columns (`solvers.grouped_column_order`, `prune --permute-scope group` with int4 values, G = --group-size) on the
linears wider than G, beside the layer-wide search in the same run (and, with `--before`, that commit's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown, pick_device

# (model, linear, rows, columns); o: hidden rows times the query heads of one KV head, head_dim columns
SHAPES = [("qwen2.5-coder-1.5b", "down", 1536, 8960), ("qwen2.5-coder-1.5b", "o (one KV head)", 1536 * 6, 128),
          ("llama-3.1-8b", "down", 4096, 14336), ("llama-3.1-8b", "o (one KV head)", 4096 * 4, 128)]


def synthetic_saliency(rows: int, cols: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** (2 * torch.rand(cols, generator=g))
    return ((torch.randn(rows, cols, generator=g) ** 2) * scale).to(device)


def solvers_at(before: str) -> types.ModuleType:
    """`sparsedecoding/solvers.py` as it was at commit `before` (or the copy of it in the file `before`, where git
    history is not at hand, as on the device), as a module of the package (its relative imports resolve against
    today's package; they are settings, errors and patterns)."""
    root = Path(__file__).resolve().parents[1]
    if Path(before).is_file():
        source = Path(before).read_text()
    else:
        try:
            source = subprocess.run(["git", "-C", str(root), "show", f"{before}:src/sparsedecoding/solvers.py"],
                                    check=True, capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"error: git cannot show solvers.py at {before}: "
                             f"{getattr(exc, 'stderr', '') or exc}".strip())
    module = types.ModuleType(f"sparsedecoding.solvers_at_{Path(before).stem.replace('-', '_')}")
    module.__package__ = "sparsedecoding"
    sys.modules[module.__name__] = module  # its dataclasses look their module up there
    exec(compile(source, f"solvers.py@{before}", "exec"), module.__dict__)
    return module


def timed(search, S: torch.Tensor, pattern, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        order = search(S, pattern)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times), order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="a commit whose search is timed beside today's")
    parser.add_argument("--models", nargs="+", choices=sorted({shape[0] for shape in SHAPES}),
                        default=sorted({shape[0] for shape in SHAPES}))
    parser.add_argument("--grouped", type=int, default=0, metavar="G",
                        help="also time the search within runs of G columns (0: off)")
    args = parser.parse_args()
    if args.grouped < 0 or args.grouped % 32:
        parser.error("--grouped must be 0 or a multiple of 32 (a group of 16:32 must fit a run)")
    device = pick_device(args.device)
    earlier = solvers_at(args.before) if args.before else None
    rows = []
    for model, linear, height, width in SHAPES:
        if model not in args.models:
            continue
        S = synthetic_saliency(height, width, device)
        for name in ("2:4", "16:32"):
            pattern = SparsityPattern.parse(name)
            group, drop = solvers.permutation_groups(pattern)
            seconds, order = timed(solvers.balanced_column_order, S, pattern, device, args.repeats)
            before = solvers.dropped_saliency(S, group, drop).sum()
            after = solvers.dropped_saliency(S[:, order], group, drop).sum()
            rows.append({"model": model, "linear": linear, "rows": height, "columns": width, "pattern": name,
                         "seconds": seconds, "dropped_ratio": float(after / before)})
            if earlier is not None:
                seconds_before, order_before = timed(earlier.balanced_column_order, S, pattern, device, args.repeats)
                rows[-1].update(seconds_before=seconds_before, same_order=bool(torch.equal(order, order_before)))
            if args.grouped and width > args.grouped:
                def grouped(S, pattern, module=solvers):
                    return module.grouped_column_order(S, pattern, args.grouped)
                seconds, order = timed(grouped, S, pattern, device, args.repeats)
                after = solvers.dropped_saliency(S[:, order], group, drop).sum()
                rows[-1].update(seconds_grouped=seconds, dropped_ratio_grouped=float(after / before))
                if earlier is not None:
                    seconds_before, order_before = timed(lambda S, pattern: grouped(S, pattern, earlier), S, pattern,
                                                         device, args.repeats)
                    rows[-1].update(seconds_grouped_before=seconds_before,
                                    same_grouped_order=bool(torch.equal(order, order_before)))
            print(rows[-1], flush=True)
    save_report(
        args.out, "benchmarks/permute_order_bench.py", rows,
        "`--permute-channels`: the column-order search's time per linear (synthetic saliency)", device,
        f"Least of {args.repeats} runs. One prune calls it once for each layer's down and once for each KV head's "
        "o columns." + (f" `{args.before}`: the search as that commit wrote it, timed right after today's on the "
                        "same saliency." if earlier else "") + "\n\n"
        + table(rows, args.before) + grouped_table(rows, args.grouped, args.before))


def save_report(out: Path, script: str, rows: list[dict], title: str, device: torch.device, body: str) -> None:
    """Write OUT (the title, this run's command and environment, then `body`) and its JSON twin (the command and the
    rows, to reload and plot), and print the report."""
    command = "PYTHONPATH=src python " + " ".join([script, *sys.argv[1:]])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    out.write_text(f"# {title}\n\n{environment_markdown(command, device)}\n{body}")
    print(out.read_text())


def table(rows: list[dict], before: str | None) -> str:
    extra = f" | seconds at `{before}` | x faster | same order |" if before else " |"
    lines = [f"| model | linear | rows x columns | pattern | seconds | dropped saliency, new / old order{extra}",
             "|---|---|---|---|---|---|" + ("---|---|---|" if before else "")]
    for r in rows:
        cells = (f" {r['seconds_before']:.3f} | {r['seconds_before'] / r['seconds']:.2f} | "
                 f"{'yes' if r['same_order'] else 'NO'} |" if before else "")
        lines.append(f"| {r['model']} | {r['linear']} | {r['rows']} x {r['columns']} | {r['pattern']} | "
                     f"{r['seconds']:.3f} | {r['dropped_ratio']:.3f} |{cells}")
    return "\n".join(lines) + "\n"


def grouped_table(rows: list[dict], block: int, before: str | None) -> str:
    """The search within runs of `block` columns beside the layer-wide one (rows that timed it), or nothing."""
    timed_rows = [r for r in rows if "seconds_grouped" in r]
    if not timed_rows:
        return ""
    extra = f" | seconds at `{before}` | x faster | same order |" if before else " |"
    lines = [f"\nWithin runs of {block} columns (`grouped_column_order`), in the same run:\n",
             "| model | linear | pattern | layer-wide seconds | grouped seconds | grouped / layer-wide | dropped "
             f"saliency, grouped / old order{extra}",
             "|---|---|---|---|---|---|---|" + ("---|---|---|" if before else "")]
    for r in timed_rows:
        cells = (f" {r['seconds_grouped_before']:.3f} | {r['seconds_grouped_before'] / r['seconds_grouped']:.2f} | "
                 f"{'yes' if r['same_grouped_order'] else 'NO'} |" if before else "")
        lines.append(f"| {r['model']} | {r['linear']} | {r['pattern']} | {r['seconds']:.3f} | "
                     f"{r['seconds_grouped']:.3f} | {r['seconds_grouped'] / r['seconds']:.2f} | "
                     f"{r['dropped_ratio_grouped']:.3f} |{cells}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
