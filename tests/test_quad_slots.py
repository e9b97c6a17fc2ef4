"""kernels/quad_slots.py: the lanes' layout of a 16:32+4q weight's overflow and the arithmetic of sp24.cu's
register-only slot loop (OVER 5: A registers from each lane's own value, metadata words from its byte and its
neighbour's), emulated in float64: it must rebuild W_over exactly (CPU); and the kernel against float64 (GPU)."""

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


def test_tile_quads_reads_back_exactly_and_keys_its_own_build(monkeypatch):
    """CPU: the tiled weight (2:4 part + quad slots) reads back as the weight, and a launch of it asks for the
    SP24_QUADS build at every batch (over_loop 5), no column copy."""
    from helpers import fake_sp24_libraries
    from sparsedecoding.kernels import sp24

    weight = placed_weight(48, 544, seed=14)
    w = sp24.tile_quads(weight)
    assert w.quads and torch.equal(sp24.tiled_to_dense(w), weight.double())
    assert all(sp24.over_loop(w, batch) == sp24.QUADS for batch in (1, 5, 8, 16))
    assert not sp24.times_both_builds(w, 1) and not sp24.early_trigger(w, 1)
    built = fake_sp24_libraries(monkeypatch)
    sp24._load(quads=True)
    assert built == [("-DSP24_QUADS",)]
    with pytest.raises(Exception, match="16-bit"):
        sp24.tile_quads(weight.float())
    with pytest.raises(Exception, match="quad-placed"):  # the 16:32+2 slot reader never misreads this layout
        sp24.untile_slots(w)
    assert torch.equal(sp24.to_dense(w), weight)  # CPU: through tiled_to_dense


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(128, 256), (48, 96), (4096, 4096), (1008, 14336), (6144, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quad_slot_kernel_matches_float64(out, in_features, dtype):
    from helpers import sp24_outputs
    from sparsedecoding.kernels import sp24

    weight = placed_weight(out, in_features, seed=out).to(dtype).cuda()
    w = sp24.tile_quads(weight)
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, dtype):
        x64, w64 = x.double().cpu(), weight.double().cpu()
        exact = x64 @ w64.T
        bound = (torch.finfo(dtype).eps * exact.abs() + 2 * in_features * 2.0**-24 * (x64.abs() @ w64.abs().T)
                 + 1e-300)
        assert float(((y.double().cpu() - exact).abs() / bound).max()) <= 1, (out, in_features, batch, splits, slices)


@pytest.mark.gpu
def test_quad_slot_kernel_tunes_with_the_rmsnorm_in_front():
    """The tuner's own float64 checks (a mismatch raises) on the plain and the RMSNorm-in-front launches."""
    from sparsedecoding.kernels import sp24

    weight = placed_weight(2048, 4096, seed=15).cuda()
    w = sp24.tile_quads(weight)
    for batch in (1, 8, 16):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        assert sp24.tuned_launch(x, w).over_loop == sp24.QUADS
        norm = (torch.randn_like(x), torch.rand(4096, device="cuda").bfloat16() + 0.5, 1e-6)
        sp24.tuned_launch(x, w, norm)
