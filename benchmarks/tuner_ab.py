"""The sp24 tuner's picks under its two timing methods, side by side in one process.

- `before`: each candidate timed alone, one after another, over weight copies adding up to two L2 caches, at most 8
  copies, in the build `sp24.early_trigger` picks, then the three fastest again beside the same launches in the other
  build (the tuner until the forty-fifth session);
- `no mixed`: every candidate in both builds, in interleaved rounds (`autotune.interleaved_replay_ms`) over copies
  adding up to three L2 caches, at most 128 (`sp24.rotation_copies`): the forty-fifth session's tuner;
- `now`: the same with mixed grids among the candidates (`SPARSEDECODING_SP24_MIXED=1`, `sp24.mixed_heavy`);
- `spread` (a probe, sixtieth session; only with --methods): those and the grids of one heavy CTA a multiprocessor
  (`SPARSEDECODING_SP24_MIXED=2`, `sp24.spread_heavy`).

Each method tunes each problem (`sp24.tuned_launch`, its float64 checks included) --repeats times from scratch, the
methods alternating. Then every checked candidate of the problem and cuBLAS on the dense pruned weight are timed as
the kernel bench times launches (CUDA-graph replays over copies adding up to three L2 caches), all in the same
interleaved rounds: the reference each pick is measured by. Reported per problem: the fastest candidate, each
method's picks with their reference times, and per method the geomean over problems of the mean pick's slowdown
against the fastest candidate and of its speedup against cuBLAS.

    PYTHONPATH=src python benchmarks/tuner_ab.py --kinds int4 --batches 1 --out benchmarks/results/tuner_ab_h200.md
    PYTHONPATH=src python benchmarks/tuner_ab.py --kinds int4 --batches 1 --methods now spread --out ...
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from collections import Counter

import torch
import torch.nn.functional as F

from cuda_kernel_bench import write_report
from kernel_bench import L2_ROTATION_BYTES, geomean, linear_shapes, random_nm_weight
from quant_kernel_bench import grid_weight
from sp24_bench import GROUP_SIZE, KINDS, MODELS, SHAPES, TARGETS_13, TARGETS_12, copies
from sparsedecoding.kernels import op, sp24
from sparsedecoding.kernels.autotune import interleaved_replay_ms
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.runenv import environment_markdown

# each method's settings: (sp24.TUNE_ROTATION_L2S, sp24._MAX_COPIES, sp24.TUNE_INTERLEAVED, sp24.TIMED_OTHER_BUILD,
# SPARSEDECODING_SP24_MIXED)
SETTINGS = ("TUNE_ROTATION_L2S", "_MAX_COPIES", "TUNE_INTERLEAVED", "TIMED_OTHER_BUILD")
METHODS = {"before": (2, 8, False, 3, "0"), "no mixed": (3, 128, True, None, "0"),
           "now": (*(getattr(sp24, name) for name in SETTINGS), "1"),
           "spread": (*(getattr(sp24, name) for name in SETTINGS), "2")}
DEFAULT_METHODS = ("before", "no mixed", "now")
MIXED_TEXT = {"0": "", "1": ", mixed grids", "2": ", mixed grids and one heavy CTA a multiprocessor"}
REFERENCE_ROUNDS = 9


@contextlib.contextmanager
def method(name: str):
    """sp24's tuner under the method's settings, as it was afterwards."""
    saved = tuple(getattr(sp24, setting) for setting in SETTINGS)
    saved_mixed = os.environ.get(op.SP24_MIXED_SETTING)
    *values, mixed = METHODS[name]
    for setting, value in zip(SETTINGS, values):
        setattr(sp24, setting, value)
    os.environ[op.SP24_MIXED_SETTING] = mixed
    try:
        yield
    finally:
        for setting, value in zip(SETTINGS, saved):
            setattr(sp24, setting, value)
        if saved_mixed is None:
            os.environ.pop(op.SP24_MIXED_SETTING, None)
        else:
            os.environ[op.SP24_MIXED_SETTING] = saved_mixed


def method_order(repeats: int, names: tuple[str, ...] = DEFAULT_METHODS) -> list[str]:
    """The tunings' order: every method once a repeat, the order rotated by one each repeat (before, no mixed, now;
    no mixed, now, before; ...)."""
    return [names[(r + i) % len(names)] for r in range(repeats) for i in range(len(names))]


def reference_times(x: torch.Tensor, w: sp24.Sp24Weight, dense: torch.Tensor, launches: dict) -> dict:
    """Milliseconds per launch of every candidate in `launches` and of cuBLAS ("cuBLAS") on `dense`, over copies past
    three L2s (kernel_bench's L2_ROTATION_BYTES), all in the same interleaved rounds."""
    weights = copies(w)
    denses = [dense] + [dense.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / (dense.numel() * 2)))]
    names = list(launches) + ["cuBLAS"]
    calls = [lambda i, launch=launches[name]: launch(x, weights[i % len(weights)]) for name in launches]
    calls.append(lambda i: F.linear(x, denses[i % len(denses)]))
    times = interleaved_replay_ms(calls, list(range(max(len(weights), len(denses)))), REFERENCE_ROUNDS)
    return dict(zip(names, times))


def bench_problem(model: str, shape: str, kind: str, batch: int, repeats: int, generator,
                  methods: tuple[str, ...] = DEFAULT_METHODS) -> dict:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    if kind == "bf16":
        weight = random_nm_weight(out, in_features, 2, 4, generator)
        w, dense = sp24.tile(pack_nm(weight, 2, 4)), weight
    else:
        group = in_features if kind == "int8" else GROUP_SIZE
        quantized = pack_nm_quantized(grid_weight(out, in_features, 2, 4, kind, generator), 2, 4, kind, group)
        w, dense = sp24.tile(quantized), quantized.to_dense(torch.float64).bfloat16()
    x = torch.randn(batch, in_features, device="cuda").bfloat16()
    picks: dict[str, list] = {name: [] for name in methods}
    tuning_s: dict[str, list[float]] = {name: [] for name in methods}
    launches: dict[sp24.Choice, sp24.Sp24Launch] = {}  # every tuning's checked candidates (the other build's differ)
    tunings: list[tuple[str, dict]] = []  # (method, the tuner's milliseconds per candidate), in tuning order
    keys = set()  # the problem's key under each method (SPARSEDECODING_SP24_MIXED is one of its fields)
    for name in method_order(repeats, methods):
        with method(name):
            key = sp24.problem_key(x, w)
            keys.add(key)
            sp24.forget_tuning(key)
            started = time.perf_counter()
            sp24.tuned_launch(x, w)
            tuning_s[name].append(time.perf_counter() - started)
        picks[name].append(sp24.chosen_launch(key))
        launches.update(sp24._choices[key])
        tunings.append((name, sp24.launch_timings(key)))
    times = reference_times(x, w, dense, launches)
    for key in keys:
        sp24.forget_tuning(key)
    cublas = times.pop("cuBLAS")
    fastest = min(times, key=times.get)
    row = {"problem": f"{model} {shape} ({out}x{in_features}) {kind} b{batch}", "kind": kind, "batch": batch,
           "cublas": cublas, "fastest": fastest, "fastest_ms": times[fastest], "candidates": len(times),
           "picks": picks, "pick_ms": {name: [times[c] for c in picks[name]] for name in methods},
           "tuning_s": {name: statistics.mean(t) for name, t in tuning_s.items()}, "times": times,
           "tunings": tunings}
    print(f"{row['problem']}: fastest {sp24.choice_label(fastest)} {times[fastest] * 1e3:.1f} us, cuBLAS "
          f"{cublas * 1e3:.1f} us; " + "; ".join(
              f"{name} " + ", ".join(f"{sp24.choice_label(c)} {t * 1e3:.1f}" for c, t in zip(picks[name],
                                                                                        row["pick_ms"][name]))
              for name in methods), flush=True)
    del w, dense, launches
    torch.cuda.empty_cache()
    return row


def summary(rows: list[dict]) -> str:
    lines = ["| values | batch | method | geomean of the mean pick's time / fastest candidate's | worst pick "
             "(x fastest) | picks slower than the fastest by >5% | geomean vs cuBLAS, mean pick | geomean vs cuBLAS, "
             "fastest candidate | target | tuning s a problem (mean) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, batch in sorted({(r["kind"], r["batch"]) for r in rows}, key=lambda kb: (KINDS.index(kb[0]), kb[1])):
        group = [r for r in rows if (r["kind"], r["batch"]) == (kind, batch)]
        target = TARGETS_13.get(kind) if batch == 1 else None
        target = TARGETS_12.get(batch) if kind == "bf16" else target
        best = geomean([r["cublas"] / r["fastest_ms"] for r in group])
        for name in group[0]["pick_ms"]:  # the methods run, in their order
            means = [statistics.mean(r["pick_ms"][name]) for r in group]
            slow = geomean([m / r["fastest_ms"] for m, r in zip(means, group)])
            worst = max(t / r["fastest_ms"] for r in group for t in r["pick_ms"][name])
            over = sum(t > 1.05 * r["fastest_ms"] for r in group for t in r["pick_ms"][name])
            total = sum(len(r["pick_ms"][name]) for r in group)
            speed = geomean([r["cublas"] / m for m, r in zip(means, group)])
            tuning = statistics.mean(r["tuning_s"][name] for r in group)
            lines.append(f"| {kind} | {batch} | {name} | {slow:.3f} | {worst:.2f} | {over} of {total} | {speed:.2f}x "
                         f"| {best:.2f}x | {f'{target:.2f}x' if target else '-'} | {tuning:.1f} |")
    return "\n".join(lines)


def details(rows: list[dict]) -> str:
    methods = list(rows[0]["pick_ms"]) if rows else []  # the methods run, in their order
    lines = ["| problem | candidates | cuBLAS us | fastest candidate us | " + " | ".join(
        f"{name}: picks (us)" for name in methods) + " |", "|---|---|---|---|" + "---|" * len(methods)]
    for r in rows:
        cells = []
        for name in methods:
            counted = Counter(zip(r["picks"][name], r["pick_ms"][name]))
            cells.append(", ".join(f"{sp24.choice_label(c)} {t * 1e3:.1f}" + (f" (x{n})" if n > 1 else "")
                                   for (c, t), n in counted.items()))
        lines.append(f"| {r['problem']} | {r['candidates']} | {r['cublas'] * 1e3:.1f} | "
                     f"{sp24.choice_label(r['fastest'])} {r['fastest_ms'] * 1e3:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def misses(rows: list[dict]) -> str:
    """For each problem where a pick was more than 5% slower than the fastest candidate: every candidate's reference
    time beside what each tuning measured for it (- where a tuning did not time it), fastest first."""
    parts = []
    for r in rows:
        if all(t <= 1.05 * r["fastest_ms"] for ts in r["pick_ms"].values() for t in ts):
            continue
        lines = [f"### {r['problem']}", "", "| candidate | reference us | " + " | ".join(
            f"tuning {i + 1} ({name}) us" for i, (name, _) in enumerate(r["tunings"])) + " |",
            "|---|---|" + "---|" * len(r["tunings"])]
        for choice in sorted(r["times"], key=r["times"].get):
            cells = [f"{tuned[choice] * 1e3:.2f}" + (" (kept)" if choice == next(iter(tuned)) else "")
                     if choice in tuned else "-" for _, tuned in r["tunings"]]
            lines.append(f"| {sp24.choice_label(choice)} | {r['times'][choice] * 1e3:.2f} | " + " | ".join(cells)
                         + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS, help="presets (default: %(default)s)")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, choices=SHAPES, help="linears (default: all)")
    parser.add_argument("--kinds", nargs="+", default=["int4"], choices=KINDS, help="kept values (default: int4)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1], choices=range(1, 17), metavar="B",
                        help="batch sizes 1..16 (default: 1)")
    parser.add_argument("--repeats", type=int, default=3, help="tunings per method and problem (default: 3)")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS),
                        help="the tuners compared (default: %(default)s)")
    parser.add_argument("--out", help="write the markdown report here too")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    if not torch.cuda.is_available():
        print("error: tuner_ab.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    generator = torch.Generator(device="cuda").manual_seed(0)
    methods = tuple(dict.fromkeys(args.methods))
    rows = [bench_problem(model, shape, kind, batch, args.repeats, generator, methods)
            for kind in args.kinds for batch in args.batches for model in args.models for shape in args.shapes]
    described = "; ".join(f"`{name}`: rotation over {l2s} L2s, at most {most} copies, "
                        + ("interleaved rounds" if inter else "one candidate after another") + ", "
                        + ("every candidate in both builds" if other is None else
                           f"the {other} fastest of the first build again in the other")
                        + MIXED_TEXT[mixed]
                        for name, (l2s, most, inter, other, mixed) in METHODS.items() if name in methods)
    report = ("# The sp24 tuner's picks: timing methods side by side\n\n"
              + environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda"))
              + f"- methods: {described}; {args.repeats} tunings each a problem, alternating\n"
              + f"- reference: every checked candidate and cuBLAS in {REFERENCE_ROUNDS} interleaved rounds of graph "
              + "replays over copies adding up to three L2 caches (median)\n"
              + f"- {op.settings_line()}\n\n## Per values and batch (geomean over the problems)\n\n"
              + summary(rows) + "\n\n## Per problem\n\n" + details(rows)
              + "\n\n## Where a pick was more than 5% slower than the fastest candidate\n\n" + misses(rows)
              + f"\n\nWhole run: {time.perf_counter() - started:.0f} s\n")
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
