"""kernels/overflow.py: a 16:32+K weight split into a packed 2:4 weight and K fixed slots a row and word, and the
reference product of the parts (the format a future kernel would read; CPU)."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.errors import PackingError
from sparsedecoding.kernels.overflow import overflow_mm_reference, split_overflow
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import keep_mask


def capped_weight(out: int, in_features: int, pattern: str, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, in_features, generator=generator)
    return (weight * keep_mask(weight.abs(), SparsityPattern.parse(pattern))).to(dtype)


@pytest.mark.parametrize("pattern,slots", [("16:32+2", 2), ("16:32+1", 2), ("16:32+0", 1), ("16:32+4", 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_parts_rebuild_the_weight_exactly(pattern, slots, dtype):
    weight = capped_weight(48, 160, pattern, dtype)
    split = split_overflow(weight, slots)
    assert torch.equal(split.to_dense(), weight)
    split.w24.check_popcounts()  # a 2:4 weight the 2:4 kernels take
    assert split.values.shape == (48, 5, slots) and split.columns.dtype == torch.uint8
    assert int(split.columns.max()) < 32 and int((split.values != 0).sum(-1).max()) <= SparsityPattern.parse(
        pattern).overflow
    # the 2:4 part holds the two largest |w| of each group of four: the slots never outweigh it
    small = split.w24.to_dense().abs().view(48, -1, 4)
    smallest_kept = torch.where(small > 0, small, torch.full_like(small, float("inf"))).amin(-1).view(48, 5, 8)
    for row in range(48):
        for word in range(5):
            for value, column in zip(split.values[row, word], split.columns[row, word]):
                if value != 0:
                    assert value.abs() <= smallest_kept[row, word, int(column) // 4]


def test_bytes_a_weight_with_two_slots():
    split = split_overflow(capped_weight(64, 256, "16:32+2"), 2)
    assert split.nbytes() == 64 * 256 * 1.125 + 64 * 8 * 2 * 3  # 2:4 values + bitmask, slots (bf16 + uint8)


def test_the_reference_product_matches_float64():
    weight = capped_weight(33, 128, "16:32+2")
    split = split_overflow(weight, 2)
    for shape in ((128,), (5, 128)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).bfloat16()
        exact = x.double() @ weight.double().T
        assert overflow_mm_reference(x, split).shape == exact.shape
        assert float((overflow_mm_reference(x, split).double() - exact).abs().max()) < 1e-4


@pytest.mark.parametrize("weight,slots,message", [
    (capped_weight(4, 64, "16:32+4"), 2, "more than 2 weights beyond two"),
    (torch.ones(2, 32), 2, "keep more than 16 weights"),
    (torch.ones(2, 48), 2, "a multiple of 32"),
    (capped_weight(4, 64, "16:32+2"), 0, "slots = 0"),
])
def test_what_the_format_cannot_hold_is_one_error_line(weight, slots, message):
    with pytest.raises(PackingError) as info:
        split_overflow(weight, slots)
    assert message in str(info.value) and "\n" not in str(info.value)
