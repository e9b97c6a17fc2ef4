"""Build the CUDA kernel libraries offline, for a GPU this machine need not have, into the cache that
`kernels.cuda_mma.build` reads (SPARSEDECODING_CACHE, or --cache): the same file names and nvcc command line, so
a GPU machine with the same nvcc release loads them instead of spending a minute per library in nvcc, and a
machine without nvcc finds them by the record written beside each (`cuda_mma.prebuilt`). Each library is the
source as it stands, for compute capability --arch, with the defines the kernels ask for (every library the kernel
settings can ask for by default; --only NAME ... builds some).

    PATH=/usr/local/bin:$PATH python benchmarks/prebuild_kernels.py --arch 90 --cache .kcache
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CSRC = REPO / "src" / "sparsedecoding" / "kernels" / "csrc"
# (source, defines): what sp24.py (default build; SPARSEDECODING_SP24_HALF_META=0; the slots' columns order; int8 or
# int4 in steps of 8 k-tiles, alone and with the columns order),
# sp24_split.py and cuda_mma.py (default geometry) ask for
LIBRARIES = {
    "sp24": ("sp24.cu", ()),
    "sp24-full-meta": ("sp24.cu", ("-DSP24_HALF_META=0",)),
    "sp24-columns": ("sp24.cu", ("-DSP24_COLUMNS",)),
    "sp24-int8-step8": ("sp24.cu", ("-DSP24_INT8_KS=8",)),  # SPARSEDECODING_SP24_INT8_STEP=8's int8 weights
    "sp24-columns-int8-step8": ("sp24.cu", ("-DSP24_COLUMNS", "-DSP24_INT8_KS=8")),
    "sp24-int4-step8": ("sp24.cu", ("-DSP24_INT4_KS=8",)),  # SPARSEDECODING_SP24_INT4_STEP=8's int4 weights
    "sp24-columns-int4-step8": ("sp24.cu", ("-DSP24_COLUMNS", "-DSP24_INT4_KS=8")),
    "slots": ("slots.cu", ()),
    "nm_mma": ("nm_mma.cu", ()),
    # nm_scatter.py (scatter_bench.py): the default CTA, its probe without the expansion, and the other CTA sizes
    "nm_scatter": ("nm_scatter.cu", ()),
    "nm_scatter-probe": ("nm_scatter.cu", ("-DNM_SCATTER_NO_EXPAND",)),
    **{f"nm_scatter-{w}warps": ("nm_scatter.cu", (f"-DNM_SCATTER_WARPS={w}",)) for w in (4, 16)},
    **{f"sp24-ablate{n}": ("sp24.cu", (f"-DSP24_ABLATE={n}",)) for n in (1, 2, 3, 4, 5, 9)},  # ablate_probe.py
    # ablate_probe.py --kinds slots: the slots on the tensor cores, one part taken out
    **{f"sp24-columns-ablate{n}": ("sp24.cu", ("-DSP24_COLUMNS", f"-DSP24_ABLATE={n}")) for n in (6, 7, 8)},
    "sp24-early-trigger": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1",)),  # ablate_probe.py --builds, h200.sh early-trigger
    "sp24-early-ablate9": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_ABLATE=9")),  # ablate_probe.py --builds
    "sp24-columns-early-trigger": ("sp24.cu", ("-DSP24_COLUMNS", "-DSP24_EARLY_TRIGGER=1")),  # the slots' columns order
    # SPARSEDECODING_SP24_MMA_CTAS=1: the slots on the tensor cores under the one-CTA launch bound
    "sp24-columns-mma-one-cta": ("sp24.cu", ("-DSP24_COLUMNS", "-DSP24_OVER_MMA_CTAS=1")),
    "sp24-quads": ("sp24.cu", ("-DSP24_QUADS",)),  # quad-placed slots (16:32+4q), sp24.tile_quads
    "sp24-grouped": ("sp24.cu", ("-DSP24_GROUPED",)),  # grouped columns (16:32g), sp24.tile_grouped
    # SPARSEDECODING_SP24_EARLY_TRIGGER=1 on grouped columns (h200.sh grouped-early), under each launch bound (both
    # loaded under SPARSEDECODING_SP24_GROUPED_CTAS=timed, the default)
    "sp24-early-grouped": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_GROUPED")),
    "sp24-early-grouped-1cta": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_GROUPED", "-DSP24_GROUPED_CTAS=1")),
    # the same for 8-row halves (h200.sh grouped-halves-early)
    "sp24-early-grouped-halves": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1")),
    "sp24-early-grouped-halves-1cta": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1",
                                                   "-DSP24_GROUPED_CTAS=1")),
    # grouped columns whose 8-row halves have their own order (tile_grouped(..., split_rows=8)), grouped_bench.py
    "sp24-grouped-halves": ("sp24.cu", ("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1")),
    "sp24-grouped-halves2": ("sp24.cu", ("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=2")),  # SP24_HALVES_ACC=2
    # the grouped kernels' one-CTA bound, 16-row orders and halves: loaded beside the two-CTA builds under
    # SPARSEDECODING_SP24_GROUPED_CTAS=timed (the default since the seventy-third session), alone under =1
    "sp24-grouped-1cta": ("sp24.cu", ("-DSP24_GROUPED", "-DSP24_GROUPED_CTAS=1")),
    **{f"sp24-grouped-halves{'' if a == 1 else a}-1cta": ("sp24.cu", ("-DSP24_GROUPED", f"-DSP24_GROUPED_HALVES={a}",
                                                                     "-DSP24_GROUPED_CTAS=1")) for a in (1, 2)},
    # ablate_probe.py --builds (int4 CTAs a multiprocessor): the early build with 3 CTAs, and 3 or 4 with one buffer
    "sp24-early-int4-3ctas": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_INT4_CTAS=3")),
    # x staged by multicast bulk copies in clusters of 2 or 4 CTAs (SP24_MULTICAST): SPARSEDECODING_SP24_MULTICAST's
    # builds for plain launches (2, the default, with and without the early trigger) and ablate_probe.py --builds
    **{f"sp24-multicast{c}": ("sp24.cu", (f"-DSP24_MULTICAST={c}",)) for c in (2, 4)},
    **{f"sp24-early-multicast{c}": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", f"-DSP24_MULTICAST={c}")) for c in (2, 4)},
    # ablate_probe.py --builds: every other int4 step through shared memory by cp.async (SP24_INT4_HYBRID)
    "sp24-int4-hybrid": ("sp24.cu", ("-DSP24_INT4_HYBRID=1",)),
    "sp24-early-int4-hybrid": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_INT4_HYBRID=1")),
    **{f"sp24-early-int4-{n}ctas-1buffer": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", f"-DSP24_INT4_CTAS={n}",
                                                        "-DSP24_INT4_BUFFERS=1")) for n in (3, 4)},
    # ablate_probe.py --builds: the same CTAs a multiprocessor under the multicast default
    **{f"sp24-early-multicast2-int4-{n}ctas-1buffer": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                                  f"-DSP24_INT4_CTAS={n}", "-DSP24_INT4_BUFFERS=1"))
       for n in (3, 4)},
    # ablate_probe.py --builds: three register buffers for the int4 launches that hold them (SP24_INT4_BUFFERS=3)
    "sp24-early-multicast2-int4-3buffers": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                         "-DSP24_INT4_BUFFERS=3")),
    # ablate_probe.py --builds: a warp's third int4 step through shared memory beside two buffers (SP24_INT4_SLOT3)
    "sp24-early-multicast2-int4-slot3": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                      "-DSP24_INT4_SLOT3=1")),
    # ablate_probe.py --builds: stream-K's counting with a fence by every thread (as first built), and none at all
    "sp24-early-multicast2-stream-fences": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                        "-DSP24_STREAM_FENCES=1")),
    **{f"sp24-early-multicast2-ablate{n}": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                      f"-DSP24_ABLATE={n}")) for n in (10, 11)},  # 11: split-K's
    # ablate_probe.py --builds: split-K's splits as clusters adding through distributed shared memory
    "sp24-early-cluster-split": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_CLUSTER_SPLIT=1")),
    # ablate_probe.py --builds: the handoff's adders' waits (SP24_HANDOFF_WAIT_GROUP; the default, 2, one split's
    # entries re-read together): all of them together (0, as timed in sp24_h200_handoff_batched.md; spills) and each
    # entry alone (1, as timed in sp24_h200_handoff_each.md)
    **{f"sp24-early-multicast2-wait-{name}": ("sp24.cu", ("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2",
                                                         f"-DSP24_HANDOFF_WAIT_GROUP={group}"))
       for name, group in (("batched", 0), ("each", 1))},
    # the other build the tuner times (`sp24.times_both_builds`) for codes with slots at batch 1-4
    **{f"{columns}{code}-step8-early-trigger": ("sp24.cu", (*flags, f"-DSP24_{code.upper()}_KS=8",
                                                          "-DSP24_EARLY_TRIGGER=1"))
       for columns, flags in (("sp24-", ()), ("sp24-columns-", ("-DSP24_COLUMNS",))) for code in ("int8", "int4")},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="90", help="compute capability without the dot (default: %(default)s)")
    parser.add_argument("--cache", type=Path, help="the cache folder (default: SPARSEDECODING_CACHE or ~/.cache)")
    parser.add_argument("--only", nargs="+", choices=sorted(LIBRARIES), default=sorted(LIBRARIES))
    args = parser.parse_args()
    if not args.arch.isdigit():
        parser.error(f"--arch {args.arch!r}: digits, e.g. 90")
    if args.cache:
        os.environ["SPARSEDECODING_CACHE"] = str(args.cache.resolve())
    from sparsedecoding.kernels import cuda_mma

    nvcc = cuda_mma._nvcc()
    if nvcc is None:
        print("error: nvcc not found (set CUDA_HOME or put nvcc on PATH)", file=sys.stderr)
        return 2
    for name in args.only:
        source, defines = LIBRARIES[name]
        target = cuda_mma.library_path(CSRC / source, args.arch, defines, nvcc)
        if target.is_file() and cuda_mma.damaged(target) is None:
            print(f"{name}: cached {target}")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        try:
            cuda_mma.compile_library(nvcc, CSRC / source, args.arch, defines, target)
        except cuda_mma.CudaKernelUnavailableError as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 1
        print(f"{name}: built {target} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
