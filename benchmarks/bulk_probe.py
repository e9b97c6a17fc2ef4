"""Probe (not a report): sp24 launches of codes at batch 1 timed with the register path and with 2-4 bulk-copy
slots a warp, side by side, for a few splits and slices; prints one line a launch."""
import sys

import torch

sys.path.insert(0, "tests")
from sparsedecoding.kernels.autotune import replay_ms  # noqa: E402
from sparsedecoding.kernels.quantized import pack_nm_quantized  # noqa: E402
from sparsedecoding.kernels.sp24 import MAX_DYNAMIC_SMEM, Sp24Launch, _copies, bulk_smem, tile  # noqa: E402
from test_cuda_mma_codes import grid_weight  # noqa: E402

for kind, group in (("int4", 128), ("int8", None)):  # noqa: B007
    for out, inf in ((28672, 4096), (4096, 14336), (4096, 4096)):
        scale = group or inf
        w = tile(pack_nm_quantized(grid_weight(out, inf, kind, scale).cuda(), 2, 4, kind, scale))
        weights = _copies(w)
        for batch in (1, 4):
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
