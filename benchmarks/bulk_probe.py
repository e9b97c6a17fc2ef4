"""Probe (not a report): sp24 launches of codes at batch 1 timed with the register path and with 2-4 bulk-copy
slots a warp, side by side, for a few splits and slices; prints one line a launch."""
import sys

import os

import torch

sys.path.insert(0, "tests")
from sparsedecoding.kernels.autotune import replay_ms  # noqa: E402
from sparsedecoding.kernels.quantized import pack_nm_quantized  # noqa: E402
from sparsedecoding.kernels.sp24 import MAX_DYNAMIC_SMEM, Sp24Launch, _copies, bulk_smem, tile  # noqa: E402
from test_cuda_mma_codes import grid_weight  # noqa: E402

if os.environ.get("BULK_PROBE_DEFINES"):  # e.g. -DSP24_LOADS_ALONE: every launch from a library built with it
    from sparsedecoding.kernels import cuda_mma

    _open = cuda_mma.open_library
    cuda_mma.open_library = lambda source, min_major, defines: _open(
        source, min_major=min_major, defines=tuple(defines) + tuple(os.environ["BULK_PROBE_DEFINES"].split(",")))

for kind, group in (("int4", 128), ("int8", None))[:int(os.environ.get("BULK_PROBE_KINDS", 2))]:
    for out, inf in ((28672, 4096), (4096, 14336), (4096, 4096))[:int(os.environ.get("BULK_PROBE_SHAPES", 3))]:
        scale = group or inf
        w = tile(pack_nm_quantized(grid_weight(out, inf, kind, scale).cuda(), 2, 4, kind, scale))
        weights = _copies(w)
        for batch in (1, 4)[:int(os.environ.get("BULK_PROBE_BATCHES", 2))]:
            x = torch.randn(batch, inf, device="cuda").bfloat16()
            for splits, slices in ((1, 1), (1, 2), (1, 4), (2, 1), (4, 2)):
                times = []
                for stages in (0, 2, 3, 4):
                    if stages and bulk_smem(w, batch, splits, stages) > MAX_DYNAMIC_SMEM:
                        times.append("  -  ")
                        continue
                    try:
                        launch = Sp24Launch(x, w, splits, slices, stages=stages)
                    except Exception as exc:  # a split count this batch cannot stage
                        times.append(type(exc).__name__[:5])
                        continue
                    times.append(f"{1000 * replay_ms(lambda wt: launch(x, wt), weights):5.1f}")
                print(kind, f"{out}x{inf}", f"b{batch}", f"{splits}/{slices}s", "reg/2q/3q/4q us:", *times,
                      flush=True)
