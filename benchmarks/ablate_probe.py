"""Where a step of sp24's codes kernels spends its time: the tuned-shape launches at batch 1 timed on the normal
build and on builds with one part of a step taken out (sp24.cu's SP24_ABLATE: 1 constant metadata, 2 no
dequantization, 3 no MMAs, 4 no weight loads, 5 the loads alone), side by side in one process; bf16 values with
their own tuned launches for comparison. The ablated builds compute wrong products on purpose; only their times
mean anything. Prints a markdown table; writes it to --out too.

    python benchmarks/ablate_probe.py --out results/ablate_h200.md
    python benchmarks/ablate_probe.py --kinds int4 --builds "half metadata=" "full metadata=-DSP24_HALF_META=0"
    python benchmarks/ablate_probe.py --builds "after=" "early=-DSP24_EARLY_TRIGGER=1" --slices 2 4 8

--slices times every shape at one split and each of those slice counts instead of its tuned launch.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import random_nm_weight  # noqa: E402
from test_cuda_mma_codes import grid_weight  # noqa: E402

from sparsedecoding.kernels import cuda_mma, sp24  # noqa: E402
from sparsedecoding.kernels.autotune import replay_ms  # noqa: E402
from sparsedecoding.kernels.format import pack_nm  # noqa: E402
from sparsedecoding.kernels.quantized import pack_nm_quantized  # noqa: E402
from sparsedecoding.runenv import environment_markdown  # noqa: E402

VARIANTS = {0: "full step", 1: "constant metadata", 2: "no dequantization", 3: "no MMAs", 4: "no weight loads",
            5: "loads alone"}
# (name, out, in, splits, slices): the 8B shapes with sp24_h200.md's tuned int4 launches at batch 1 (and bf16's)
SHAPES = (("8B qkv", 6144, 4096, 1, 4), ("8B o", 4096, 4096, 1, 8), ("8B gate_up", 28672, 4096, 1, 1),
          ("8B down", 4096, 14336, 1, 8))
ROUNDS = 4  # timings of every build and shape, in alternating order
BF16_LAUNCHES = {"8B qkv": (1, 4), "8B o": (1, 8), "8B gate_up": (1, 4), "8B down": (4, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--builds", nargs="+", metavar="LABEL=DEFINES",
                        help="compare these builds instead of the ablations: a label, =, and nvcc -D flags separated "
                             "by commas (empty: the normal build), e.g. 'normal=' 'full metadata=-DSP24_HALF_META=0'")
    parser.add_argument("--kinds", nargs="+", choices=("int4", "int8", "bf16"), default=["int4", "int8", "bf16"])
    parser.add_argument("--slices", nargs="+", type=int, choices=(1, 2, 4, 8),
                        help="time each shape at one split and each of these slice counts, not its tuned launch")
    args = parser.parse_args()
    bad = [b for b in args.builds or [] if "=" not in b or not b.partition("=")[0].strip()]
    if bad:
        parser.error(f"--builds {bad[0]!r}: use LABEL=DEFINES (DEFINES may be empty)")
    if not torch.cuda.is_available():
        print("error: ablate_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    builds = {label: tuple(d for d in flags.split(",") if d) for label, _, flags in
              (b.partition("=") for b in args.builds)} if args.builds else {
        label: (f"-DSP24_ABLATE={n}",) if n else () for n, label in VARIANTS.items()}
    original = cuda_mma.open_library
    rows = []
    for kind, group in (("int4", 128), ("int8", None), ("bf16", None)):
        if kind not in args.kinds:
            continue
        for name, out, inf, tuned_splits, tuned_slices in SHAPES:
            if kind == "bf16":
                tuned_splits, tuned_slices = BF16_LAUNCHES[name]
                w = sp24.tile(pack_nm(random_nm_weight(out, inf, 2, 4, torch.bfloat16, seed=1).cuda(), 2, 4))
            else:
                scale = group or inf
                w = sp24.tile(pack_nm_quantized(grid_weight(out, inf, kind, scale).cuda(), 2, 4, kind, scale))
            weights = sp24._copies(w)
            x = torch.randn(1, inf, device="cuda").bfloat16()
            configs = [(1, n) for n in args.slices] if args.slices else [(tuned_splits, tuned_slices)]
            for splits, slices in configs:
                launches = {}
                for variant, extra in builds.items():
                    cuda_mma.open_library = (lambda source, min_major, defines, extra=extra:
                                             original(source, min_major=min_major, defines=tuple(defines) + extra))
                    sp24._libraries.clear()
                    launches[variant] = sp24.Sp24Launch(x, w, splits, slices)
                cuda_mma.open_library = original
                sp24._libraries.clear()
                # timed in rounds of alternating order (first to last, then last to first), the minimum kept: in the
                # twenty-third session's two probes the build timed first was about 1 us slower on one shape alone
                rounds = {variant: [] for variant in builds}
                for order in range(ROUNDS):
                    for variant in (list(builds) if order % 2 == 0 else list(builds)[::-1]):
                        launch = launches[variant]
                        rounds[variant].append(1000 * replay_ms(lambda wt, launch=launch: launch(x, wt), weights))
                times = {variant: min(values) for variant, values in rounds.items()}
                same = ""
                if args.builds:  # builds meant to compute one product: each against the first, bit for bit
                    products = [launches[variant](x, weights[0]) for variant in builds]
                    same = " | " + ("yes" if all(torch.equal(products[0], p) for p in products[1:]) else "NO")
                rows.append(f"| {kind} | {name} ({out}x{inf}) | {splits}/{slices}s | "
                            + " | ".join(f"{times[v]:.1f}" for v in builds) + same + " |")
                print(rows[-1], flush=True)
    text = "\n".join([
        ("# sp24 at batch 1: builds side by side" if args.builds else
         "# sp24 at batch 1: a step with one part taken out (SP24_ABLATE builds)"), "",
        environment_markdown("python benchmarks/ablate_probe.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])), "",
        f"Graph replays round-robin over weight copies past the L2, median us a launch, the least of {ROUNDS} rounds "
        "that alternate the builds' order"
        + ("; builds: " + ", ".join(f"{label}: `{' '.join(flags) or 'no defines'}`" for label, flags in builds.items())
           + "." if args.builds else "; the ablated builds compute wrong products on purpose."), "",
        "| values | shape | splits/slices | " + " | ".join(builds) + (" | bit for bit |" if args.builds else " |"),
        "|---|---|---|" + "---|" * (len(builds) + bool(args.builds)), *rows, ""])
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
