"""Grouped columns (16:32g) on the sparse tensor-core kernel: each 16-row tile's 32-column words in their own order, a
2:4 weight in that order, x's rows gathered by ldmatrix in the same order (sp24.cu's OVER 6, sp24.tile_grouped)."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import sp24


def grouped(out: int, in_features: int, seed: int, dtype=torch.bfloat16, device: str = "cpu"):
    return sp24.random_grouped(out, in_features, torch.Generator(device=device).manual_seed(seed), dtype)


def partition(order: torch.Tensor) -> torch.Tensor:
    """Each word's groups as sets: sorted within and across groups."""
    return order.reshape(*order.shape[:-1], 8, 4).sort(-1).values.sort(-2).values


@pytest.mark.parametrize("out,in_features", [(48, 96), (40, 64), (33, 320), (128, 512)])
def test_tile_grouped_reads_back_exactly_in_the_weight_own_order(out, in_features):
    weight, order = grouped(out, in_features, seed=out)
    for arrange in (True, False):
        w = sp24.tile_grouped(weight, order, arrange=arrange)
        assert w.grouped and w.over_v is None and w.over_o.dtype == torch.uint8
        assert torch.equal(sp24.tiled_to_dense(w), weight.double())
        assert torch.equal(sp24.to_dense(w), weight)  # CPU: through tiled_to_dense
        assert torch.equal(partition(sp24.grouped_order(w)), partition(order))
        if not arrange:
            assert torch.equal(sp24.grouped_order(w), order)


def test_the_places_name_each_column_once_and_match_the_staging():
    """Place q of column c is its staged byte / 2 (`staged_offset`, which the slots already read through), a
    permutation of 0..31 whose bank group q % 8 is 2·(c / 8) + c % 2."""
    columns = torch.arange(32)
    places = sp24.place_of(columns)
    assert torch.equal(places.sort().values, columns)
    assert torch.equal(places, sp24.staged_offset(columns) // 2)
    assert torch.equal(places % 8, 2 * (columns // 8) + columns % 2)


def test_arranging_keeps_the_partition_and_never_costs_more_wavefronts():
    order = torch.rand(64, 4, 32, generator=torch.Generator().manual_seed(3)).argsort(-1)
    arranged = sp24.arrange_groups(order)
    assert torch.equal(partition(arranged), partition(order))

    def wavefronts(o):  # each 8x8 matrix of the ldmatrix.x4: as many as the most rows in one bank group
        bank = sp24.place_of(o) % 8
        return torch.nn.functional.one_hot(bank.view(*o.shape[:-1], 4, 8), 8).sum(-2).amax(-1).sum(-1)

    before, after = wavefronts(order), wavefronts(arranged)
    assert bool((after <= before).all()) and float(after.float().mean()) < float(before.float().mean())
    # group {c, c + 8, c + 16, c + 24} takes banks 0, 2, 4, 6 for even c and 1, 3, 5, 7 for odd c: two even groups
    # in one matrix cost two wavefronts, an even and an odd one
    given = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7]).view(8, 1) + torch.tensor([0, 8, 16, 24])
    given = given.reshape(1, 1, 32)
    assert int(wavefronts(given)) == 8 and int(wavefronts(sp24.arrange_groups(given))) == 4


def test_bad_inputs_are_refused_in_one_line():
    weight, order = grouped(32, 64, seed=1)
    for bad, match in ((weight.float(), "16-bit"),):
        with pytest.raises(KernelInputError, match=match):
            sp24.tile_grouped(bad, order)
    with pytest.raises(KernelInputError, match="shape"):
        sp24.tile_grouped(weight, order[:, :1])
    broken = order.clone()
    broken[0, 0, 0] = broken[0, 0, 1]
    with pytest.raises(KernelInputError, match="permutation"):
        sp24.tile_grouped(weight, broken)
    three = weight.clone()
    three[0] = 1.0  # every column kept: four a group
    with pytest.raises(KernelInputError, match="row 0 keeps 4") as info:
        sp24.tile_grouped(three, order)
    assert "\n" not in str(info.value)
    w = sp24.tile_grouped(weight, order)
    with pytest.raises(KernelInputError, match="grouped columns"):
        sp24.untile(w)


def test_a_grouped_launch_keys_its_own_build_and_loop(monkeypatch):
    from helpers import fake_sp24_libraries, random_nm_weight

    weight, order = grouped(48, 544, seed=14)
    w = sp24.tile_grouped(weight, order)
    assert all(sp24.over_loop(w, batch) == sp24.GROUPED for batch in (1, 5, 8, 16))
    assert not sp24.times_both_builds(w, 1) and not sp24.early_trigger(w, 1)
    assert not sp24.stream_fits(w, 1, 1) and sp24._mixed_candidates(w, 1, 132) == []
    assert sp24.multicast_of(w, norm=False) == 0  # x staged as the column copy needs it, never by multicast
    # a plain 2:4 weight of the same shape is another problem: its launch runs another loop
    plain_same = sp24.tile(sp24.pack_nm(random_nm_weight(48, 544, 2, 4), 2, 4))
    x = torch.zeros(1, 544, dtype=torch.bfloat16)
    assert sp24.problem_key(x, w) != sp24.problem_key(x, plain_same)
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, w)))["layout"] == "grouped"
    # x staged as its column copy alone takes as much shared memory as the rows alone (16 bytes a column and 8 rows);
    # with the RMSNorm in front the rows are staged too, then copied: twice the splits at batch 16
    wide, wide_order = grouped(16, 4096, seed=2)
    wide = sp24.tile_grouped(wide, wide_order)
    plain = sp24.tile(sp24.pack_nm(random_nm_weight(16, 4096, 2, 4), 2, 4))
    assert (sp24.min_splits(wide, 16), sp24.min_splits(wide, 16, norm=True), sp24.min_splits(plain, 16)) == (2, 4, 2)
    built = fake_sp24_libraries(monkeypatch)
    sp24._load(grouped=True)
    assert built == [("-DSP24_GROUPED",)]


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(128, 256), (48, 96), (4096, 4096), (1008, 14336), (6144, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_kernel_matches_float64(out, in_features, dtype):
    from helpers import sp24_outputs

    weight, order = grouped(out, in_features, seed=out, dtype=dtype)
    w = sp24.tile_grouped(weight.cuda(), order.cuda())
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, dtype):
        x64, w64 = x.double().cpu(), weight.double()
        exact = x64 @ w64.T
        bound = (torch.finfo(dtype).eps * exact.abs() + 2 * in_features * 2.0**-24 * (x64.abs() @ w64.abs().T)
                 + 1e-300)
        assert float(((y.double().cpu() - exact).abs() / bound).max()) <= 1, (out, in_features, batch, splits, slices)


@pytest.mark.gpu
def test_grouped_kernel_tunes_with_the_rmsnorm_in_front():
    """The tuner's own float64 checks (a mismatch raises) on the plain and the RMSNorm-in-front launches."""
    weight, order = grouped(2048, 4096, seed=15)
    w = sp24.tile_grouped(weight.cuda(), order.cuda())
    for batch in (1, 8, 16):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        assert sp24.tuned_launch(x, w).over_loop == sp24.GROUPED
        norm = (torch.randn_like(x), torch.rand(4096, device="cuda").bfloat16() + 0.5, 1e-6)
        sp24.tuned_launch(x, w, norm)


# --- the 16:32g pattern in the solvers -----------------------------------------------------------------------------

def test_the_16_32g_mask_keeps_half_in_a_split_of_every_tile_word():
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.solvers import keep_mask, placement_breaks

    score = torch.rand(64, 256, generator=torch.Generator().manual_seed(5))
    pattern = SparsityPattern.parse("16:32g")
    kept = keep_mask(score, pattern)
    assert bool((kept.view(64, -1, 32).sum(-1) == 16).all())
    assert placement_breaks(kept, pattern) == 0
    # at least 2:4's score (its groups are where the search starts), at most 16:32's (which it constrains)
    totals = [float((score * keep_mask(score, SparsityPattern.parse(p))).sum()) for p in ("2:4", "16:32g", "16:32")]
    assert totals[0] < totals[1] < totals[2]
    # a 16:32 mask chosen freely breaks the split in most words
    assert placement_breaks(keep_mask(score, SparsityPattern.parse("16:32")), pattern) > 0


def test_a_split_is_read_back_from_any_16_32g_mask():
    from sparsedecoding.solvers import _order_by_search, grouped_order_of

    weight, _ = grouped(64, 256, seed=6)
    words = (weight != 0).view(4, 16, 8, 32).transpose(1, 2).reshape(-1, 16, 32)
    order, found = grouped_order_of(words)
    assert bool(found.all())
    grouped_kept = words.gather(2, order.unsqueeze(1).expand(-1, 16, -1)).view(-1, 16, 8, 4).sum(-1)
    assert bool((grouped_kept == 2).all())
    assert torch.equal(order.sort(-1).values, torch.arange(32).expand_as(order))
    searched = _order_by_search(words[0])
    assert searched is not None and bool((words[0][:, searched].view(16, 8, 4).sum(-1) == 2).all())
    broken = words.clone()
    broken[0, 0, :] = torch.arange(32) < 16  # row 0 keeps columns 0-15: no split serves it and the others
    assert not bool(grouped_order_of(broken)[1][0]) and _order_by_search(broken[0]) is None


def test_sparsegpt_prunes_to_16_32g():
    from sparsedecoding import solvers
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(32, 128, generator=generator)
    x = torch.randn(512, 128, generator=generator)
    hessian = x.T @ x / 512
    pruned = solvers.sparsegpt(weight, hessian, "16:32g")
    assert solvers.placement_breaks(pruned != 0, SparsityPattern.parse("16:32g")) == 0
    assert bool(((pruned != 0).view(32, -1, 32).sum(-1) == 16).all())

    def loss(p):
        delta = weight - p
        return float(((delta @ hessian) * delta).sum())

    assert loss(solvers.sparsegpt(weight, hessian, "16:32")) < loss(pruned) < loss(solvers.sparsegpt(weight, hessian,
                                                                                                        "2:4"))
