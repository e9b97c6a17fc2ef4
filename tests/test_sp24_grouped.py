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
    monkeypatch.delenv("SPARSEDECODING_SP24_EARLY_TRIGGER", raising=False)
    # the default build first; under timed (the default) the tuner times the early one too, at every batch
    assert not sp24.early_trigger(w, 1) and all(sp24.times_both_builds(w, b) for b in (1, 8, 16))
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


def test_the_grouped_launch_bound_setting_reads_keys_and_labels(monkeypatch):
    """SPARSEDECODING_SP24_GROUPED_CTAS: timed (default), 2 or 1; each keys its own tuned launches; a bad value is one
    error naming the choices; the label marks a one-CTA candidate; timed loads both builds before a decode."""
    from helpers import fake_sp24_libraries

    from sparsedecoding.kernels import op, sp24_linear
    from sparsedecoding.kernels.op import KernelChoiceError

    weight, order = grouped(32, 64, seed=6)
    w = sp24.tile_grouped(weight, order)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    layouts = {}
    for value in ("", "2", "1", "timed"):
        monkeypatch.setenv(op.SP24_GROUPED_CTAS_SETTING, value)
        layouts[value] = dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, w)))["layout"]
        assert op.sp24_grouped_ctas_setting() == (1 if value == "1" else 2)
        assert op.sp24_grouped_ctas_timed() == (value in ("", "timed"))
        assert op.settings()[op.SP24_GROUPED_CTAS_SETTING] == (value or "timed")
    assert layouts == {"": "grouped", "timed": "grouped", "2": "grouped-ctas2", "1": "grouped-ctas1"}
    monkeypatch.setenv(op.SP24_GROUPED_CTAS_SETTING, "3")
    with pytest.raises(KernelChoiceError, match="SP24_GROUPED_CTAS='3'; use timed .*, 2 .* or 1"):
        op.sp24_grouped_ctas_setting()
    assert sp24.choice_label((1, 4, False, 0, 1)) == "1/4s+1c"
    assert sp24.choice_label((2, 1, False, 0, 2)) == sp24.choice_label((2, 1, False, 0)) == "2"
    monkeypatch.setenv(op.SP24_GROUPED_CTAS_SETTING, "timed")
    built = fake_sp24_libraries(monkeypatch)
    sp24_linear._load_grouped_build((8, 16))
    assert built == [("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1"),
                     ("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1", "-DSP24_GROUPED_CTAS=1"),
                     ("-DSP24_GROUPED",), ("-DSP24_GROUPED", "-DSP24_GROUPED_CTAS=1")]


@pytest.mark.gpu
@pytest.mark.parametrize("split_rows", [16, 8])
def test_under_timed_bounds_the_tuner_keeps_the_fastest_of_both(monkeypatch, split_rows):
    """SPARSEDECODING_SP24_GROUPED_CTAS=timed: every candidate is checked against float64 under both launch bounds
    (the tuner raises on a mismatch) and the kept launch is the fastest of all; a plain 2:4 weight gets none of it.
    Under SPARSEDECODING_SP24_EARLY_TRIGGER=timed every grouped candidate runs in both builds too."""
    from helpers import random_nm_weight

    from sparsedecoding.kernels import op

    monkeypatch.setenv(op.SP24_GROUPED_CTAS_SETTING, "timed")
    monkeypatch.setenv(op.SP24_EARLY_TRIGGER_SETTING, "timed")
    weight, order = sp24.random_grouped(1024, 4096, torch.Generator().manual_seed(7), split_rows=split_rows)
    w = sp24.tile_grouped(weight.cuda(), order.cuda(), split_rows=split_rows)
    plain = sp24.tile(sp24.pack_nm(random_nm_weight(1024, 4096, 2, 4), 2, 4).to("cuda"))
    for batch in (1, 16):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        launch = sp24.tuned_launch(x, w)
        timings = sp24.launch_timings(sp24.problem_key(x, w))
        assert {choice[4] for choice in timings} == {1, 2} and {choice[2] for choice in timings} == {False, True}
        assert {choice[:4] for choice in timings if choice[4] == 1} == {choice[:4] for choice in timings
                                                                         if choice[4] == 2}
        assert {choice[:2] + choice[3:] for choice in timings if choice[2]} == {
            choice[:2] + choice[3:] for choice in timings if not choice[2]}
        assert sp24.choice_of(launch) == next(iter(timings)) and launch.bound == next(iter(timings))[4]
        sp24.tuned_launch(x, plain)
        assert {choice[4] for choice in sp24.launch_timings(sp24.problem_key(x, plain))} == {2}


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


def test_splits_shared_by_8_rows_are_read_back_without_the_slow_search(monkeypatch):
    """A split shared by 8 rows fits many groups, so the first greedy pass dead-ends on most words (81% of random
    16:32g8 words in the seventy-second session, each then searched for about 25 ms); the exact cover solves them:
    every word of a random 16:32g8 mask (the presets' masks) comes back with a valid split, at most 1% of them
    searched one by one. The same for 16-row splits."""
    from sparsedecoding import solvers
    from sparsedecoding.engine.loading import _random_grouped_bitmask

    searched = []
    search = solvers._order_by_search
    monkeypatch.setattr(solvers, "_order_by_search", lambda kept: searched.append(1) or search(kept))
    for split_rows in (8, 16):
        rows, columns = 512, 1024
        words = _random_grouped_bitmask(rows, columns, "cpu", torch.Generator().manual_seed(split_rows), split_rows)
        kept = ((words.unsqueeze(-1) >> torch.arange(32)) & 1).bool().view(rows, columns)
        kept = kept.view(rows // split_rows, split_rows, columns // 32, 32).transpose(1, 2).reshape(-1, split_rows, 32)
        searched.clear()
        order, found = solvers.grouped_order_of(kept)
        assert bool(found.all()) and len(searched) <= len(kept) // 100, (split_rows, len(searched))
        assert torch.equal(order.sort(-1).values, torch.arange(32).expand_as(order))
        grouped_kept = kept.gather(2, order.unsqueeze(1).expand(-1, split_rows, -1)).view(-1, split_rows, 8, 4)
        assert bool((grouped_kept.sum(-1) == 2).all())
        again, _ = solvers.grouped_order_of(kept)
        assert torch.equal(again, order)  # seeded: the same mask, the same split


def test_16_32_and_16_32_plus_2_weights_are_turned_down_without_the_slow_search(monkeypatch):
    """The engine tries every 16:32 linear as 16:32g and 16:32g8 before its overflow slots; a 16:32+2 or plain 16:32
    weight must be turned down by the quick look alone (one-by-one searches of its first words took 25 s a 1024 x
    4096 weight at 8 rows), while a 16:32g8 weight still reads back."""
    from sparsedecoding import solvers
    from sparsedecoding.engine.loading import random_bitmask

    searched = []
    search = solvers._order_by_search
    monkeypatch.setattr(solvers, "_order_by_search", lambda kept: searched.append(1) or search(kept))

    def weight(**pattern) -> torch.Tensor:
        words = random_bitmask(256, 1024, 16, 32, "cpu", torch.Generator().manual_seed(9), **pattern)
        return ((words.unsqueeze(-1) >> torch.arange(32)) & 1).view(256, 1024).to(torch.bfloat16)

    for pattern in ({"overflow": 2}, {}):
        for split_rows in (16, 8):
            assert sp24.grouped_split(weight(**pattern), split_rows=split_rows) is None, (pattern, split_rows)
    assert searched == []
    halves = weight(placement="groups", split_rows=8)
    assert sp24.grouped_split(halves) is None and sp24.grouped_split(halves, split_rows=8) is not None


# Words of random 16:32g8 masks (engine.loading.random_bitmask, seed 0, 4096 x 4096) on which the cover with the first
# 8 pairs of each number found nothing in 32 passes: their columns repeat so often that the completing pair is not
# among the first 8 of its number (seventy-third session)
TIED_WORDS = [[650941278, 1995969444, 1449275631, 1401290528, 448278488, 105893951, 3500785504, 3789574845],
              [3141703251, 936805451, 3686974987, 2755466589, 3034015884, 3688530963, 1253877193, 1423250747],
              [1558222235, 2712358293, 532878769, 2389751563, 1385659436, 1009302349, 887189869, 2900400011]]


def test_words_whose_pairs_tie_are_read_back_by_the_wider_cover_not_the_search(monkeypatch):
    """Each of TIED_WORDS has a split (every row keeps two of each group) that the first cover misses; the second,
    wider one finds it, so none is left to the one-by-one search (tens of milliseconds a word on a CPU; with such
    words searched and every linear read twice, the 8B preset's 16:32g8 model did not finish tiling in 5.8 minutes
    on an H100, results/e2e_grouped8_h100_8b_stalled.log)."""
    from sparsedecoding import solvers

    kept = ((torch.tensor(TIED_WORDS).unsqueeze(-1) >> torch.arange(32)) & 1).bool()  # [3, 8 rows, 32]
    assert not bool(solvers._orders_by_cover(kept)[1].any())
    searched = []
    search = solvers._order_by_search
    monkeypatch.setattr(solvers, "_order_by_search", lambda word: searched.append(1) or search(word))
    order, found = solvers.grouped_order_of(kept)
    assert bool(found.all()) and searched == []
    assert torch.equal(order.sort(-1).values, torch.arange(32).expand_as(order))
    assert bool((kept.gather(2, order.unsqueeze(1).expand(-1, 8, -1)).view(3, 8, 8, 4).sum(-1) == 2).all())


def test_all_or_none_stops_searching_at_the_first_word_without_a_split(monkeypatch):
    """`grouped_split` needs every word's split, so its read-back (`all_or_none`) stops the one-by-one search at the
    first word that has none, where a plain read-back searches every word left."""
    from sparsedecoding import solvers

    picks = torch.rand(3, 8, 32, generator=torch.Generator().manual_seed(44)).argsort(-1)[..., :16]
    kept = torch.zeros(3, 8, 32).scatter_(2, picks, 1.0).bool()  # 16 random columns a row: no split fits
    searched = []
    search = solvers._order_by_search
    monkeypatch.setattr(solvers, "_order_by_search", lambda word: searched.append(1) or search(word))
    assert not bool(solvers.grouped_order_of(kept)[1].any()) and len(searched) == 3
    searched.clear()
    assert not bool(solvers.grouped_order_of(kept, all_or_none=True)[1].any()) and len(searched) == 1


def test_the_cover_passes_what_chunks_leave_on_together(monkeypatch):
    """`_orders_by_cover` gives each chunk _CHUNK_PASSES passes, then gathers every chunk's unsolved words for the
    rest, numbering the passes on (only the very first pass takes no random choice, and no two calls share a seed):
    with chunks of 16 words every word is solved as in one chunk, each split valid."""
    from sparsedecoding import solvers
    from sparsedecoding.engine.loading import _random_grouped_bitmask

    words = _random_grouped_bitmask(256, 1024, "cpu", torch.Generator().manual_seed(31), 8)
    kept = ((words.unsqueeze(-1) >> torch.arange(32)) & 1).bool().view(32, 8, 32, 32).transpose(1, 2)
    kept = kept.reshape(-1, 8, 32)
    whole, found = solvers._orders_by_cover(kept)
    calls = []
    chunk = solvers._cover_chunk
    monkeypatch.setattr(solvers, "_cover_chunk", lambda words, passes, ties: calls.append((len(words), passes))
                        or chunk(words, passes, ties))
    monkeypatch.setattr(solvers, "_COVER_CHUNK", 16)
    small, small_found = solvers._orders_by_cover(kept)
    assert bool(found.all()) and bool(small_found.all())
    first = range(solvers._CHUNK_PASSES)
    assert calls[:64] == [(16, first)] * 64
    later = [passes for _, passes in calls[64:]]
    assert later and later == [range(4 * i, 4 * i + 4) for i in range(1, len(later) + 1)]  # numbered on, one call each
    for order in (whole, small):
        assert bool((kept.gather(2, order.unsqueeze(1).expand(-1, 8, -1)).view(-1, 8, 8, 4).sum(-1) == 2).all())


def test_tile_model_reads_a_16_32g8_split_once_and_keeps_a_broken_linear_packed(caplog, monkeypatch):
    """`tile_model` on 16:32 linears: `tileable` looks at the first words only, so a 16:32g8 mask's split is read
    whole once a linear (it was read twice: on the 8B preset, 27 million words each time); one whose later word
    has no split (and is beyond 16:32+2) stays packed, named in a warning, and the rest are still tiled."""
    import logging

    from sparsedecoding import solvers
    from sparsedecoding.kernels import sp24_linear
    from sparsedecoding.kernels.format import pack_nm
    from sparsedecoding.kernels.linear import PackedLinear

    good, _ = sp24.random_grouped(64, 256, torch.Generator().manual_seed(41), split_rows=8)
    broken, _ = sp24.random_grouped(64, 256, torch.Generator().manual_seed(42), split_rows=8)
    picks = torch.rand(8, 32, generator=torch.Generator().manual_seed(43)).argsort(1)[:, :16]
    broken[-8:, :32] = torch.zeros(8, 32).scatter_(1, picks, 1.0)  # the last 8-row word: 16 random columns a row
    assert not bool(solvers.grouped_order_of(broken[-8:, :32].bool().unsqueeze(0))[1].any())  # which no split fits
    model = torch.nn.Sequential(PackedLinear(pack_nm(good, 16, 32)), PackedLinear(pack_nm(broken, 16, 32)))
    reads = []
    reader = solvers.grouped_order_of

    def counting(kept, search=True, **options):
        reads.append((len(kept), search))
        return reader(kept, search, **options)

    monkeypatch.setattr(solvers, "grouped_order_of", counting)
    with caplog.at_level(logging.WARNING, logger=sp24_linear.__name__):
        tiled = sp24_linear.tile_model(model, require_cuda=False, slots=True)
    assert tiled == 1 and isinstance(model[0], sp24_linear.Sp24Linear) and model[0].split_rows == 8
    assert isinstance(model[1], PackedLinear)
    assert [n for n, search in reads if search] == [64, 64]  # the whole split once a linear: 8 row blocks x 8 words
    assert [record.message for record in caplog.records if "stays on the packed kernels" in record.message] == [
        "1 stays on the packed kernels: its mask is not 16:32g or 16:32g8, and 321 words keep more than 2 weights "
        "beyond two in their groups of four: not a 16:32+2 weight (prune with --pattern 16:32+2)"]


@pytest.mark.gpu
def test_splits_shared_by_8_rows_are_read_back_on_the_gpu():
    """The same read-back on a CUDA mask (the engine tiles on the weight's device, in larger chunks there): every
    word of a random 16:32g8 mask of an 8B o's shape gets a valid split."""
    from sparsedecoding import solvers
    from sparsedecoding.engine.loading import _random_grouped_bitmask

    rows, columns = 4096, 4096
    words = _random_grouped_bitmask(rows, columns, "cuda", torch.Generator("cuda").manual_seed(3), 8)
    kept = ((words.unsqueeze(-1) >> torch.arange(32, device="cuda")) & 1).bool().view(rows, columns)
    kept = kept.view(rows // 8, 8, columns // 32, 32).transpose(1, 2).reshape(-1, 8, 32)
    order, found = solvers.grouped_order_of(kept)
    assert bool(found.all())
    assert bool((kept.gather(2, order.unsqueeze(1).expand(-1, 8, -1)).view(-1, 8, 8, 4).sum(-1) == 2).all())


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


def test_a_glu_weight_tiles_in_pairs_and_reads_back():
    weight, order = grouped(64, 256, seed=8)
    w = sp24.tile_grouped(weight, order, glu=True)
    assert w.glu and w.out_features == 32
    assert torch.equal(sp24.tiled_to_dense(w), weight.double())
    assert torch.equal(partition(sp24.grouped_order(w)), partition(order))
    with pytest.raises(KernelInputError, match="multiple of 32 rows"):
        sp24.tile_grouped(*grouped(48, 256, seed=9), glu=True)


def test_the_split_is_found_from_a_weight_or_turned_down():
    from sparsedecoding.solvers import keep_mask
    from sparsedecoding.patterns import SparsityPattern

    weight, order = grouped(64, 256, seed=10)
    found = sp24.grouped_split(weight)
    assert found is not None and torch.equal(sp24.tiled_to_dense(sp24.tile_grouped(weight, found)), weight.double())
    dense = torch.randn(64, 256, generator=torch.Generator().manual_seed(11))
    plain = dense * keep_mask(dense.abs(), SparsityPattern.parse("16:32"))
    assert sp24.grouped_split(plain) is None and sp24.grouped_split(weight[:40]) is None


def test_a_16_32g_packed_linear_becomes_a_grouped_sp24_linear_and_saves_as_16_32():
    """CPU: `tileable` takes a 16:32g linear (its mask beyond 16:32+2), `Sp24Linear.from_module` tiles it in grouped
    columns, its forward (densified on the CPU) and its packed form are the weight's, and the state dict loads back
    into a fresh layer in the same layout."""
    from sparsedecoding.kernels.format import pack_nm
    from sparsedecoding.kernels.linear import PackedLinear
    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tileable

    weight, _ = grouped(64, 256, seed=12)
    module = PackedLinear(pack_nm(weight, 16, 32))
    assert tileable(module, require_cuda=False, slots=True) is None
    assert "16:32" in tileable(module, require_cuda=False, slots=False)
    layer = Sp24Linear.from_module(module)
    assert layer.grouped and not layer.slotted and (layer.n, layer.m) == (16, 32)
    assert "16:32g" in repr(layer)
    x = torch.randn(3, 256).bfloat16()
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))
    assert torch.equal(layer.packed.to_dense(), weight)
    fresh = Sp24Linear.from_module(module)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.grouped and torch.equal(sp24.tiled_to_dense(fresh.weight), weight.double())
    glu = Sp24Linear.from_module(module, glu=True)
    assert glu.grouped and glu.glu and glu.out_features == 32


@pytest.mark.gpu
@pytest.mark.parametrize("split_rows", [16, 8])
def test_a_grouped_sp24_linear_runs_eager_compiled_and_with_the_norm_in_front(split_rows):
    """On CUDA: the layer's eager and torch.compile'd calls (the custom ops) and `normed` against float64 products
    of the weight, within the tuner's bound (the tuner checks each launch too); 16:32g and 16:32g8."""
    from sparsedecoding.kernels.format import pack_nm
    from sparsedecoding.kernels.linear import PackedLinear
    from sparsedecoding.kernels.reference import rms_norm
    from sparsedecoding.kernels.sp24_linear import Sp24Linear

    weight, _ = sp24.random_grouped(512, 1024, torch.Generator(device="cuda").manual_seed(13), split_rows=split_rows)
    layer = Sp24Linear.from_module(PackedLinear(pack_nm(weight, 16, 32)))
    assert layer.grouped and layer.split_rows == split_rows
    compiled = torch.compile(lambda t: layer(t), fullgraph=True)
    for batch in (1, 8, 16):
        x = torch.randn(batch, 1024, device="cuda").bfloat16()
        exact = x.double() @ weight.double().T
        scale = (x.double().abs() @ weight.double().abs().T).max()
        for y in (layer(x), compiled(x)):
            assert float((y.double() - exact).abs().max() / scale) < 2e-2
        res, norm = torch.randn_like(x), torch.rand(1024, device="cuda").bfloat16() + 0.5
        y, total = layer.normed(x, res, norm, 1e-6)
        assert torch.equal(total, x + res)
        expected = rms_norm(total, norm, 1e-6).double() @ weight.double().T
        assert float((y.double() - expected).abs().max() / expected.abs().max()) < 2e-2


def test_random_16_32g_weights_for_the_presets_have_a_split_in_every_tile_word():
    from sparsedecoding.engine.loading import random_packed
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator().manual_seed(14)
    packed = random_packed(64, 256, SparsityPattern.parse("16:32g"), torch.bfloat16, "cpu", generator)
    dense = packed.to_dense()
    assert (packed.n, packed.m) == (16, 32) and bool(((dense != 0).view(64, 8, 32).sum(-1) == 16).all())
    assert sp24.grouped_split(dense) is not None
    plain = random_packed(64, 256, SparsityPattern.parse("16:32"), torch.bfloat16, "cpu", generator)
    assert sp24.grouped_split(plain.to_dense()) is None
    # 16:32g8: a split for each 8 rows, not (as a rule) one for the whole tile
    halves = random_packed(64, 256, SparsityPattern.parse("16:32g8"), torch.bfloat16, "cpu", generator).to_dense()
    assert sp24.grouped_split(halves, split_rows=8) is not None and sp24.grouped_split(halves) is None


@pytest.mark.gpu
def test_sparsegpt_prunes_to_16_32g_on_the_gpu_without_a_graph():
    """The split's search decides on the host when to stop, so the column loop runs uncaptured for 16:32g."""
    from sparsedecoding import solvers
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator(device="cuda").manual_seed(15)
    weight = torch.randn(64, 256, device="cuda", generator=generator)
    x = torch.randn(1024, 256, device="cuda", generator=generator)
    pruned = solvers.sparsegpt(weight, x.T @ x / 1024, "16:32g")
    assert solvers.placement_breaks(pruned != 0, SparsityPattern.parse("16:32g")) == 0


def test_admm_prunes_to_16_32g_with_each_split_search_starting_from_the_last():
    from sparsedecoding import solvers
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator().manual_seed(16)
    weight = torch.randn(32, 128, generator=generator)
    x = torch.randn(512, 128, generator=generator)
    hessian = x.T @ x / 512
    pruned = solvers.admm(weight, hessian, "16:32g", iterations=20)
    assert solvers.placement_breaks(pruned != 0, SparsityPattern.parse("16:32g")) == 0
    score = torch.rand(32, 128, generator=generator)
    _, split = solvers.grouped_mask_and_split(score, SparsityPattern.parse("16:32g"))
    again, same = solvers.grouped_mask_and_split(score, SparsityPattern.parse("16:32g"), split)
    assert torch.equal(same, split)  # a split no swap improves stays as it is

    def loss(p):
        delta = weight - p
        return float(((delta @ hessian) * delta).sum())

    assert loss(pruned) < loss(solvers.admm(weight, hessian, "2:4", iterations=20))


def test_admm_searches_the_split_on_squares_by_default_and_on_magnitudes_when_asked():
    """admm's `split` picks what the 16:32g projection's split keeps most of; either mask is 16:32g, the plain
    patterns' masks do not depend on it, and a value it does not know is refused before any work."""
    import pytest

    from sparsedecoding import solvers
    from sparsedecoding.errors import SolverSettingsError
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator().manual_seed(17)
    weight = torch.randn(32, 128, generator=generator) * torch.rand(1, 128, generator=generator).add(0.2)
    x = torch.randn(512, 128, generator=generator)
    hessian = x.T @ x / 512
    squared = solvers.admm(weight, hessian, "16:32g", iterations=20)
    assert torch.equal(solvers.admm(weight, hessian, "16:32g", iterations=20, split="squared"), squared)
    plain = solvers.admm(weight, hessian, "2:4", iterations=20)
    magnitude = solvers.admm(weight, hessian, "16:32g", iterations=20, split="magnitude")
    assert torch.equal(solvers.admm(weight, hessian, "2:4", iterations=20, split="magnitude"), plain)
    for pruned in (squared, magnitude):
        assert solvers.placement_breaks(pruned != 0, SparsityPattern.parse("16:32g")) == 0
    assert not torch.equal(squared, magnitude)  # the two searches end in different splits on this weight
    with pytest.raises(SolverSettingsError, match="admm split = 'cubed'"):
        solvers.admm(weight, hessian, "16:32g", iterations=2, split="cubed")


def test_a_kept_weight_of_value_zero_still_finds_its_split():
    """A weight pruned to 16:32g whose kept value rounded to zero reads as a row keeping 15: the split is still found
    (at most two in that row's groups) and the weight tiles."""
    weight, _ = grouped(32, 64, seed=17)
    kept_at = (weight[3] != 0).nonzero().flatten()
    weight[3, kept_at[:2]] = 0  # two kept weights of row 3 become zeros
    order = sp24.grouped_split(weight)
    assert order is not None
    assert torch.equal(sp24.tiled_to_dense(sp24.tile_grouped(weight, order)), weight.double())


# --- 8-row halves with their own order (split_rows 8, SP24_GROUPED_HALVES) -----------------------------------------

@pytest.mark.parametrize("out,in_features", [(48, 96), (40, 64), (33, 320), (128, 512)])
def test_halves_tile_and_read_back_each_half_in_its_own_order(out, in_features):
    weight, order = sp24.random_grouped(out, in_features, torch.Generator().manual_seed(out), split_rows=8)
    row_tiles = -(-out // 16)
    assert order.shape == (2 * row_tiles, in_features // 32, 32)
    # the halves' orders differ, so a 16-row order does not fit this weight
    assert not torch.equal(partition(order[0::2]), partition(order[1::2]))
    for arrange in (True, False):
        w = sp24.tile_grouped(weight, order, arrange=arrange, split_rows=8)
        assert w.grouped and w.split_rows == 8 and w.over_o.numel() == row_tiles * w.steps * 32 * 16
        assert torch.equal(sp24.tiled_to_dense(w), weight.double())
        assert torch.equal(partition(sp24.grouped_order(w)), partition(order))
        if not arrange:
            assert torch.equal(sp24.grouped_order(w), order)
    # each lane's 16 bytes a step: the first half's places for k-tiles 0-7, then the second half's
    w = sp24.tile_grouped(weight, order, arrange=False, split_rows=8)
    lanes = w.over_o.view(row_tiles, w.steps, 32, 2, w.ks)
    assert torch.equal(lanes[0, 0, :, 1, 0].long(), sp24.place_of(order[1, 0]))
    assert torch.equal(lanes[0, 0, :, 0, 1].long(), sp24.place_of(order[0, 1]))
    glu_weight, glu_order = sp24.random_grouped(64, 256, torch.Generator().manual_seed(3), split_rows=8)
    glu = sp24.tile_grouped(glu_weight, glu_order, glu=True, split_rows=8)
    assert torch.equal(sp24.tiled_to_dense(glu), glu_weight.double())
    assert torch.equal(partition(sp24.grouped_order(glu)), partition(glu_order))


def test_halves_refuse_bad_settings_and_key_their_own_build(monkeypatch):
    from helpers import fake_sp24_libraries

    weight, order = sp24.random_grouped(32, 64, torch.Generator().manual_seed(4), split_rows=8)
    with pytest.raises(KernelInputError, match="split_rows = 4"):
        sp24.tile_grouped(weight, order, split_rows=4)
    with pytest.raises(KernelInputError, match="shape"):
        sp24.tile_grouped(weight, order[:2], split_rows=8)  # a 16-row order's shape
    w = sp24.tile_grouped(weight, order, split_rows=8)
    sixteen = sp24.tile_grouped(*grouped(32, 64, seed=4))
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    assert sp24.layout(w) == "grouped8" and sp24.layout(sixteen) == "grouped"
    assert sp24.problem_key(x, w) != sp24.problem_key(x, sixteen)
    assert sp24.over_loop(w, 1) == sp24.GROUPED
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, w)))["layout"] == "grouped8-acc1"
    monkeypatch.setenv("SPARSEDECODING_SP24_HALVES_ACC", "2")  # the second half's own accumulator: another build
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, w)))["layout"] == "grouped8-acc2"
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, sixteen)))["layout"] == "grouped"
    monkeypatch.setenv("SPARSEDECODING_SP24_GROUPED_CTAS", "1")  # the one-CTA bound: another build for both layouts
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, w)))["layout"] == "grouped8-acc2-ctas1"
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, sixteen)))["layout"] == "grouped-ctas1"
    built = fake_sp24_libraries(monkeypatch)
    sp24._load(grouped=True, halves=1)
    sp24._load(grouped=True, halves=2)
    sp24._load(grouped=True, grouped_ctas=1)
    assert built == [("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=1"), ("-DSP24_GROUPED", "-DSP24_GROUPED_HALVES=2"),
                     ("-DSP24_GROUPED", "-DSP24_GROUPED_CTAS=1")]


def test_the_solver_split_rows_setting_shares_splits_by_fewer_rows():
    from sparsedecoding import solvers
    from sparsedecoding.errors import SparsityPatternError
    from sparsedecoding.patterns import SparsityPattern

    pattern = SparsityPattern.parse("16:32g")
    score = torch.rand(64, 256, generator=torch.Generator().manual_seed(5))
    totals = {}
    for rows in (16, 8, 4):
        solvers.GROUPED_SPLIT_ROWS = rows
        try:
            kept = solvers.keep_mask(score, pattern)
            # every block of `rows` rows shares one split (read back by search, which gives up on some 4-row words:
            # with so few rows many splits fit, `_order_by_search`)
            assert rows == 4 or solvers.placement_breaks(kept, pattern) == 0
            assert bool((kept.view(64, -1, 32).sum(-1) == 16).all())
        finally:
            solvers.GROUPED_SPLIT_ROWS = solvers.PLACED_TILE_ROWS
        totals[rows] = float((score * kept).sum())
        if rows == 8:  # the halves' masks fit their own splits, not (as a rule) a split shared by all 16
            assert solvers.placement_breaks(kept, pattern) > 0
    free = float((score * solvers.keep_mask(score, SparsityPattern.parse("16:32"))).sum())
    assert totals[16] < totals[8] < totals[4] <= free
    solvers.GROUPED_SPLIT_ROWS = 5
    try:
        with pytest.raises(SparsityPatternError, match=r"by 5 rows \(4, 8 or 16"):
            solvers.keep_mask(score, pattern)
    finally:
        solvers.GROUPED_SPLIT_ROWS = solvers.PLACED_TILE_ROWS


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(128, 256), (48, 96), (4096, 4096), (1008, 14336)])
def test_halves_kernel_matches_float64(out, in_features):
    from helpers import sp24_outputs

    weight, order = sp24.random_grouped(out, in_features, torch.Generator().manual_seed(out), split_rows=8)
    w = sp24.tile_grouped(weight.cuda(), order.cuda(), split_rows=8)
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, torch.bfloat16):
        x64, w64 = x.double().cpu(), weight.double()
        exact = x64 @ w64.T
        bound = (torch.finfo(torch.bfloat16).eps * exact.abs()
                 + 2 * in_features * 2.0**-24 * (x64.abs() @ w64.abs().T) + 1e-300)
        assert float(((y.double().cpu() - exact).abs() / bound).max()) <= 1, (out, in_features, batch, splits, slices)


@pytest.mark.parametrize("solver", ["sparsegpt", "admm"])
def test_the_solvers_prune_to_16_32g8_and_it_tiles_in_halves(solver):
    """16:32g8 (a split for every 8 rows): both solvers' masks fit it, its loss lies between 16:32's and 16:32g's
    (on this problem), and the pruned weight's halves' orders are found and tiled exactly."""
    from sparsedecoding import solvers
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator().manual_seed(21)
    weight = torch.randn(64, 256, generator=generator)
    x = torch.randn(1024, 256, generator=generator)
    hessian = x.T @ x / 1024
    prune = {"sparsegpt": solvers.sparsegpt, "admm": lambda w, h, p: solvers.admm(w, h, p, iterations=20)}[solver]
    pruned = prune(weight, hessian, "16:32g8")
    assert solvers.placement_breaks(pruned != 0, SparsityPattern.parse("16:32g8")) == 0
    assert bool(((pruned != 0).view(64, -1, 32).sum(-1) == 16).all())

    def loss(p):
        delta = weight - p
        return float(((delta @ hessian) * delta).sum())

    assert loss(prune(weight, hessian, "16:32")) < loss(pruned) < loss(prune(weight, hessian, "16:32g"))
    bf16 = pruned.bfloat16()
    assert sp24.grouped_split(bf16) is None  # no split shared by whole tiles
    order = sp24.grouped_split(bf16, split_rows=8)
    assert order is not None and order.shape == (8, 8, 32)
    assert torch.equal(sp24.tiled_to_dense(sp24.tile_grouped(bf16, order, split_rows=8)), bf16.double())


def test_a_16_32g8_packed_linear_becomes_a_halves_sp24_linear_and_reloads_so():
    """CPU: a 16:32 linear whose mask is 16:32g8 (not 16:32g) tiles in 8-row orders, runs (densified on the CPU) as
    its weight, saves as 16:32 and loads back into the same layout."""
    from sparsedecoding.kernels.format import pack_nm
    from sparsedecoding.kernels.linear import PackedLinear
    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tileable

    weight, _ = sp24.random_grouped(64, 256, torch.Generator().manual_seed(22), split_rows=8)
    module = PackedLinear(pack_nm(weight, 16, 32))
    assert sp24.grouped_split(weight) is None and tileable(module, require_cuda=False, slots=True) is None
    layer = Sp24Linear.from_module(module)
    assert layer.grouped and layer.split_rows == 8 and layer.weight.split_rows == 8
    assert "16:32g8" in repr(layer)
    x = torch.randn(3, 256).bfloat16()
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))
    assert torch.equal(layer.packed.to_dense(), weight)
    plain_weight, _ = grouped(64, 256, seed=23)
    fresh = Sp24Linear.from_module(PackedLinear(pack_nm(plain_weight, 16, 32)))
    assert fresh.split_rows == 16
    fresh.load_state_dict(layer.state_dict())
    assert fresh.split_rows == 8 and torch.equal(sp24.tiled_to_dense(fresh.weight), weight.double())
    glu = Sp24Linear.from_module(module, glu=True)
    assert glu.grouped and glu.glu and glu.split_rows == 8



def test_grouped_bench_times_each_variant_under_its_own_settings(monkeypatch):
    """benchmarks/grouped_bench.py's grouped sides (no GPU): one 16:32g side by default, suffixes only where more than
    the default value is asked for, and each side's launches built under exactly its settings."""
    from helpers import benchmark_module

    from sparsedecoding.kernels import op

    bench = benchmark_module(monkeypatch, "grouped_bench")
    assert bench.grouped_sides(False, [1], ["timed"]) == {"16:32g": (16, {op.SP24_GROUPED_CTAS_SETTING: "timed"})}
    assert list(bench.grouped_sides(True, [1], ["timed"])) == ["16:32g", "16:32g/8"]
    assert list(bench.grouped_sides(False, [1], ["2"])) == ["16:32g ctas2"]
    assert list(bench.grouped_sides(False, [1], ["2", "timed"])) == ["16:32g ctas2", "16:32g ctastimed"]
    sides = bench.grouped_sides(True, [1, 2], ["2", "1"])
    assert list(sides) == ["16:32g ctas2", "16:32g ctas1", "16:32g/8 acc1 ctas2", "16:32g/8 acc1 ctas1",
                           "16:32g/8 acc2 ctas2", "16:32g/8 acc2 ctas1"]
    assert sides["16:32g/8 acc2 ctas1"] == (8, {op.SP24_HALVES_ACC_SETTING: "2", op.SP24_GROUPED_CTAS_SETTING: "1"})


def test_grouped_readback_bench_compares_with_and_without_the_cover(monkeypatch):
    """benchmarks/grouped_readback_cpu.py's two sides on a small 16:32g8 mask: without the cover most words go to the
    one-by-one search, with it nearly none; both solve every word; the library's functions are put back after each,
    and so is the quick look after a turn-down timed as before."""
    from helpers import benchmark_module

    from sparsedecoding import solvers

    bench = benchmark_module(monkeypatch, "grouped_readback_cpu")
    cover, reader, share = solvers._orders_by_cover, solvers.grouped_order_of, sp24.QUICK_LOOK_SHARE
    kept = bench.tile_words(32, 512, 8, seed=8)
    with_cover, without = bench.read_back(kept, cover=True), bench.read_back(kept, cover=False)
    assert with_cover["found"] == without["found"] == with_cover["words"] == 64
    assert with_cover["searched"] <= 1 and without["searched"] >= 32
    assert solvers._orders_by_cover is cover
    weight = kept.view(4, 16, 8, 32).transpose(1, 2).reshape(32, 512).to(torch.bfloat16)  # the mask's rows again
    seconds, found = bench.turn_down(weight, 8, quick=False)
    assert found and seconds > 0
    assert (solvers.grouped_order_of, sp24.QUICK_LOOK_SHARE) == (reader, share)


def test_grouped_readback_gpu_bench_refuses_before_any_work(monkeypatch, capsys, tmp_path):
    """benchmarks/grouped_readback_gpu.py: an --out in a missing folder, then no CUDA GPU, each one error line and
    exit 2, no report written."""
    from helpers import benchmark_module

    bench = benchmark_module(monkeypatch, "grouped_readback_gpu")
    assert bench.main(["--out", str(tmp_path / "missing" / "r.md")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing'} is not a folder"
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path / "r.md")]) == 2
    assert capsys.readouterr().err.strip() == "error: grouped_readback_gpu needs a CUDA GPU"
    assert list(tmp_path.iterdir()) == []
