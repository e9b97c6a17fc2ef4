"""Can a producer warp with bulk copies into a shared-memory ring hide a codes kernel's compute under its loads, where
sp24's register buffers cannot? `stream_probe.cu` streams a weight-sized buffer from HBM four ways (mode 0: each
warp's own 16-byte loads into two register buffers, as sp24.cu; mode 1: one producer warp, cp.async.bulk into a ring
of stages with mbarriers, eight consumer warps; mode 2: cp.async by every thread into a ring, Marlin's multistage
pattern; mode 4: mode 0 with every other step through the warp's own shared memory by cp.async, waited on apart from
the register loads) while spending `work` rounds of integer arithmetic on every 16 bytes (four independent chains a
piece, or one with --chain), and mode 0's loop without its loads times the compute alone. Graph replays round-robin
over buffer copies past the L2, median us a launch, the least of alternated rounds; read bandwidth = the buffer's
bytes over that time. sp24's own tuned 2:4 + int4 launches on the 8B shapes of the same bytes, and a device-to-
device copy, are timed in the same rounds for scale.

    python benchmarks/stream_probe.py --out results/stream_probe_h200.md
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_cuda_mma_codes import grid_weight  # noqa: E402

from sparsedecoding.kernels import cuda_mma, sp24  # noqa: E402
from sparsedecoding.kernels.autotune import replay_ms  # noqa: E402
from sparsedecoding.kernels.quantized import pack_nm_quantized  # noqa: E402
from sparsedecoding.runenv import environment_markdown  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "stream_probe.cu"
ROUNDS = 3
L2_ROTATION = 2  # copies of every buffer: at least twice the L2 in a round
# (label, mode, CTAs an SM, stages, stage bytes)
WAYS = (("registers, 2 CTAs/SM", 0, 2, 0, 0),
        ("compute alone (registers' loop, no loads)", 3, 2, 0, 0),
        ("hybrid: even steps in registers, odd by cp.async, 2 CTAs/SM", 4, 2, 0, 0),
        ("bulk ring, 1 CTA/SM, 6 x 32 KB", 1, 1, 6, 32768),
        ("bulk ring, 2 CTAs/SM, 6 x 16 KB", 1, 2, 6, 16384),
        ("bulk ring, 2 CTAs/SM, 8 x 8 KB", 1, 2, 8, 8192),
        ("cp.async ring, 1 CTA/SM, 6 x 32 KB", 2, 1, 6, 32768),
        ("cp.async ring, 2 CTAs/SM, 6 x 16 KB", 2, 2, 6, 16384),
        ("cp.async ring, 2 CTAs/SM, 8 x 8 KB", 2, 2, 8, 8192))
# the 8B shapes' 2:4 + int4 weights (out, in), whose tiled bytes the buffers match
SHAPES = {"8B gate_up": (28672, 4096), "8B down": (4096, 14336), "8B o": (4096, 4096)}


def launcher(library: ctypes.CDLL, mode: int, ctas: int, stages: int, stage_bytes: int, out: torch.Tensor, work: int,
             chain: int):
    def call(buffer: torch.Tensor) -> None:
        err = library.stream_launch(mode, buffer.data_ptr(), buffer.numel(), out.data_ptr(), work, ctas, stages,
                                    stage_bytes, chain, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(library.stream_error_string(err).decode())
    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", nargs="+", type=int, default=[0, 2, 4, 6, 8],
                        help="rounds of arithmetic a 16-byte piece (default: %(default)s)")
    parser.add_argument("--chain", action="store_true",
                        help="one dependent chain of arithmetic a piece instead of four independent ones")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    args = parser.parse_args()
    if any(w < 0 or w > 64 for w in args.work):
        parser.error("--work: 0-64 rounds")
    if not torch.cuda.is_available():
        print("error: stream_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    library = cuda_mma.open_library(SOURCE, min_major=9)
    library.stream_launch.restype = ctypes.c_int
    library.stream_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    library.stream_error_string.restype = ctypes.c_char_p
    library.stream_error_string.argtypes = [ctypes.c_int]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = torch.zeros(2 * sms * 288, dtype=torch.int32, device="cuda")
    rows = []
    for shape in args.shapes:
        rows_out, cols = SHAPES[shape]
        x = torch.randn(1, cols, device="cuda").bfloat16()
        w = sp24.tile(pack_nm_quantized(grid_weight(rows_out, cols, "int4", 128).cuda(), 2, 4, "int4", 128))
        launch = sp24.tuned_launch(x, w)
        unit = 6 * 32768  # every way's granule divides it
        nbytes = (w.nbytes + unit - 1) // unit * unit
        copies = max(L2_ROTATION, -(-2 * l2 // nbytes))
        buffers = [torch.randint(0, 2 ** 31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda").view(torch.uint8)
                   for _ in range(copies)]
        sides = {"sp24 int4, tuned": (lambda wt: launch(x, wt), sp24._copies(w)),
                 "copy (read + write)": (lambda b: torch.empty_like(b).copy_(b), buffers)}
        for work in args.work:
            for label, mode, per_sm, stages, stage_bytes in WAYS:
                call = launcher(library, mode, per_sm * sms, stages, stage_bytes, out, work, int(args.chain))
                sides[f"{label}, work {work}"] = (call, buffers)
        for _, (call, copies_) in sides.items():  # outside any capture: checks every launch once
            call(copies_[0])
        torch.cuda.synchronize()
        times = {side: [] for side in sides}
        for order in range(ROUNDS):
            for side in (list(sides) if order % 2 == 0 else list(sides)[::-1]):
                call, copies_ = sides[side]
                times[side].append(1000 * replay_ms(call, copies_))
        for side, values in times.items():
            us = min(values)
            moved = (2 * nbytes if side.startswith("copy") else w.nbytes if side.startswith("sp24")
                     else 0 if side.startswith("compute alone") else nbytes)
            rows.append(f"| {shape} ({nbytes / 1e6:.1f} MB) | {side} | {us:.2f} | "
                        + (f"{moved / us / 1e3:.0f} |" if moved else "- |"))
            print(rows[-1], flush=True)
        del buffers, sides
        torch.cuda.empty_cache()
    text = "\n".join([
        "# Streaming a weight's bytes with compute on them: register buffers, a bulk-copy ring, a cp.async ring", "",
        environment_markdown("python benchmarks/stream_probe.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])),
        "", f"{__doc__.split(chr(10) + chr(10))[0]}", "",
        f"Graph replays round-robin over {L2_ROTATION}+ copies of each buffer (past twice the L2), median us a launch, "
        f"the least of {ROUNDS} alternated rounds. GB/s: the bytes read (copy: read + written) over the time.", "",
        "| buffer | way, work rounds a 16-byte piece | us | GB/s |", "|---|---|---|---|", *rows, ""])
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
