"""kernels/quad_slots.py: the lanes' layout of a 16:32+4q weight's overflow and the arithmetic a register-only slot
loop would run (A registers from each lane's own value, metadata words from its byte and its neighbour's), emulated
in float64: it must rebuild W_over exactly, so the layout and the rule are checked before any CUDA exists."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.errors import PackingError
from sparsedecoding.kernels import quad_slots
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import capped_keep_mask, keep_mask


def placed_weight(out: int, in_features: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, in_features, generator=generator)
    return (weight * keep_mask(weight.abs(), SparsityPattern.parse("16:32+4q"))).bfloat16()


@pytest.mark.parametrize("shape", [(32, 256), (48, 96), (16, 544)], ids=["one-step", "padded", "steps"])
def test_the_lanes_layout_rebuilds_the_overflow_exactly(shape):
    weight = placed_weight(*shape, seed=sum(shape))
    w24, slots = quad_slots.split_quad_slots(weight)
    assert ((w24 != 0).view(shape[0], -1, 4).sum(-1) <= 2).all()
    rest = (weight.double() - w24.double())
    assert int((rest != 0).sum()) > shape[0] * shape[1] // 64  # a real overflow, not an empty one
    assert torch.equal(quad_slots.emulate(slots), rest)
    # and the product it would add, against float64
    x = torch.randn(5, shape[1], dtype=torch.float64)
    assert torch.allclose(x @ quad_slots.emulate(slots).T + x @ w24.double().T, x @ weight.double().T)


def test_every_position_and_both_rows_and_group_halves_occur():
    """The emulation is only a check if the layout's every case happens: positions 0-3 (3 takes the register's
    second half), rows g and g + 8, groups c and c + 4."""
    _, slots = quad_slots.split_quad_slots(placed_weight(64, 512, seed=9))
    own = slots.info.to(torch.int64) & 0xF
    used = slots.values != 0
    assert set((own[used] >> 2).tolist()) == {0, 1, 2, 3}
    assert set((own[used] & 1).tolist()) == {0, 1} and set((own[used] >> 1 & 1).tolist()) == {0, 1}


def test_a_wrong_metadata_rule_breaks_the_rebuild(monkeypatch):
    """With the 2:4 part's usual constant (positions 0 and 1) the OR rule no longer names the right columns."""
    weight = placed_weight(32, 256, seed=11)
    w24, slots = quad_slots.split_quad_slots(weight)
    monkeypatch.setattr(quad_slots, "META_BASE", 0x44444444)
    assert not torch.equal(quad_slots.emulate(slots), weight.double() - w24.double())


def test_the_bytes_are_those_of_16_32_plus_2_slots():
    _, slots = quad_slots.split_quad_slots(placed_weight(32, 256, seed=12))
    assert slots.nbytes == 32 * 256 // 32 * 2 * 3  # two slots a row and word, three bytes each


def test_an_unplaced_weight_is_refused_in_one_line():
    generator = torch.Generator().manual_seed(13)
    weight = torch.randn(16, 64, generator=generator)
    weight = weight * capped_keep_mask(weight.abs(), SparsityPattern.parse("16:32+2"))
    with pytest.raises(PackingError, match="16:32\\+4q") as info:
        quad_slots.split_quad_slots(weight)
    assert "\n" not in str(info.value)
    with pytest.raises(PackingError, match="multiple of 16"):
        quad_slots.split_quad_slots(torch.zeros(24, 64))
