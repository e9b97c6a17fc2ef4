"""The overflow-slot kernel (`kernels.triton_overflow`): y += x·W_overᵀ in place against a float64 product, under
the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the kernel module is imported) and on the GPU, where
it also completes the sp24 product of the 2:4 part to the whole 16:32+K weight; one clear error per bad input."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels.overflow import split_overflow  # noqa: E402
from sparsedecoding.kernels.triton_overflow import (OverflowConfig, OverflowSlots, float64_reference,  # noqa: E402
                                                    overflow_add_)
from sparsedecoding.patterns import SparsityPattern  # noqa: E402
from sparsedecoding.solvers import keep_mask  # noqa: E402


def capped_problem(out, in_features, batch, pattern="16:32+2", slots=2, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, in_features, generator=g)
    weight = (weight * keep_mask(weight.abs(), SparsityPattern.parse(pattern))).to(dtype)
    x = torch.randn(batch, in_features, generator=g).to(dtype)
    y = torch.randn(batch, out, generator=g).to(dtype)
    split = split_overflow(weight, slots)
    return weight, split, x.to(DEVICE), y.to(DEVICE)


def float64_error(y, y0, x, over64):
    """Largest |y − (y0 + x·W_overᵀ)| over a bound computed here from the definition (one ulp of the result plus
    an fp32 sum of in + 1 terms), ≤ 1 passes."""
    x64, y64 = x.double().cpu(), y0.double().cpu()
    exact = y64 + x64 @ over64.T
    magnitude = y64.abs() + x64.abs() @ over64.abs().T
    bound = torch.finfo(x.dtype).eps * exact.abs() + 2 * (x.shape[1] + 1) * 2.0**-24 * magnitude + 1e-300
    return float(((y.double().cpu() - exact).abs() / bound).max())


CASES = [  # out, in, batch, config
    (32, 256, 1, OverflowConfig(32, 8)),
    (13, 160, 1, OverflowConfig(16, 4)),  # rows past the end, words no step divides
    (48, 320, 3, OverflowConfig(32, 8)),  # batch not a power of two
    (40, 96, 16, OverflowConfig(16, 2)),
    (8, 64, 2, OverflowConfig(64, 16)),  # more tile rows and words than the weight has
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out,in_features,batch,config", CASES)
def test_kernel_matches_float64(out, in_features, batch, config, dtype):
    weight, split, x, y = capped_problem(out, in_features, batch, dtype=dtype, seed=out + batch)
    slots = OverflowSlots.of(split).to_device(DEVICE)
    y0 = y.clone()
    result = overflow_add_(x, slots, y, config)
    assert result is y  # in place
    over64 = weight.double() - split.w24.to_dense().double()
    assert float64_error(y, y0, x, over64) <= 1
    assert float64_reference(x, slots, y0).error(y) <= 1


def test_the_layout_rebuilds_the_overflow():
    weight, split, _, _ = capped_problem(24, 128, 1, pattern="16:32+1", slots=2)
    slots = OverflowSlots.of(split)
    assert slots.values.shape == (4, 2, 24) and slots.columns.dtype == torch.uint8
    assert torch.equal(slots.to_dense(), weight.double() - split.w24.to_dense().double())
    assert slots.nbytes == 4 * 2 * 24 * 3


def test_a_wrong_output_fails_the_check():
    """The float64 check rejects a sum that lost one word of slots."""
    _, split, x, y = capped_problem(32, 128, 2)
    slots = OverflowSlots.of(split).to_device(DEVICE)
    wrong = OverflowSlots(slots.values.clone(), slots.columns, slots.shape)
    wrong.values[1] = 0
    reference = float64_reference(x, slots, y)
    assert reference.error(overflow_add_(x, wrong, y.clone(), OverflowConfig(32, 4))) > 1


def test_bad_inputs_give_one_clear_error():
    _, split, x, y = capped_problem(16, 64, 1)
    slots = OverflowSlots.of(split).to_device(DEVICE)
    for args, message in (((x.float(), slots, y), "bf16 or fp16"),
                          ((x[:, :32], slots, y), r"expected \[batch, 64\]"),
                          ((torch.zeros(17, 64, dtype=x.dtype, device=DEVICE), slots, y), "batch 1..16"),
                          ((x, slots, y[:, :8]), r"expected \[1, 16\]"),
                          ((x, OverflowSlots(slots.values, slots.columns.long(), slots.shape), y), "uint8"),
                          ((x, OverflowSlots(slots.values.transpose(0, 2).contiguous().transpose(0, 2),
                                             slots.columns, slots.shape), y), "contiguous")):
        with pytest.raises(KernelInputError, match=message):
            overflow_add_(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 5, 16])
@pytest.mark.parametrize("out,in_features", [(4096, 4096), (1000, 1536)])
def test_sp24_plus_slots_on_gpu_is_the_whole_weight(batch, out, in_features):
    """The tuned sp24 launch on the 2:4 part, then the tuned slot kernel, give x·Wᵀ of the 16:32+2 weight."""
    from sparsedecoding.kernels.sp24 import sp24_mm, tile

    weight, split, x, _ = capped_problem(out, in_features, batch, seed=batch)
    w24 = tile(split.w24.to("cuda"))
    y = sp24_mm(x, w24)
    overflow_add_(x, OverflowSlots.of(split).to_device("cuda"), y)
    x64, w64 = x.double().cpu(), weight.double()
    exact = x64 @ w64.T
    # the 2:4 part is rounded to bf16 once before the slots are added: two roundings of the result
    bound = 2 * torch.finfo(x.dtype).eps * exact.abs() + 2 * (in_features + 1) * 2.0**-24 * (x64.abs() @ w64.abs().T)
    assert float(((y.double().cpu() - exact).abs() / (bound + 1e-300)).max()) <= 1
