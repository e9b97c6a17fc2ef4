"""Mixed grids of the 2:4 kernel (sp24.cu's `heavy`, `sp24.mixed_heavy`): the first CTAs take 8 / slices row tiles
each, the rest one row tile each, so that a grid just past one wave puts at most one heavy CTA on a multiprocessor.
On CPU: the heavy count, the multiprocessor loads it gives under in-order dispatch, the tuner's candidates and labels.
On GPU: a mixed launch's rows equal, bit for bit, the uniform launch's at the heavy CTAs' slices and at 8 slices, and
match float64; the tuner checks and times mixed candidates."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.kernels import sp24
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.op import KernelChoiceError
from sparsedecoding.kernels.sp24 import mixed_heavy, spread_heavy, tile

from helpers import random_nm_weight
from test_cuda_mma_codes import float64_error
from test_sp24 import _packed_on_gpu

SMS = 132


def most_rows(ctas: list[int], sms: int) -> int:
    """The most row tiles any multiprocessor reads when CTA i (reading ctas[i] tiles) goes to multiprocessor i % sms,
    a first CTA to each before any second (a grid of at most two waves)."""
    loads = [0] * sms
    for i, tiles in enumerate(ctas):
        loads[i % sms] += tiles
    return max(loads)


def uniform(row_tiles: int, tiles: int) -> list[int]:
    return [min(tiles, row_tiles - i) for i in range(0, row_tiles, tiles)]


def mixed(row_tiles: int, tiles: int, heavy: int) -> list[int]:
    return [tiles] * heavy + [1] * (row_tiles - heavy * tiles)


# --- CPU ---------------------------------------------------------------------------------------------------------

def test_heavy_ctas_of_the_shapes_that_pass_a_wave():
    assert mixed_heavy(320, 4, SMS) == 56  # Qwen3-14B o: 5120 rows
    assert mixed_heavy(384, 4, SMS) == 120  # Llama-3.1-8B qkv: 6144 rows
    assert mixed_heavy(320, 2, SMS) is None  # four tiles a CTA: 80 CTAs, none sharing a multiprocessor
    assert mixed_heavy(600, 2, SMS) == 112  # 150 CTAs of four tiles; mixed: 112 of four, then 152 of one
    assert mixed_heavy(256, 4, SMS) is None  # 8B o: one wave already
    assert mixed_heavy(448, 4, SMS) is None  # 14B qkv: 184 heavy CTAs would put two on some multiprocessors
    assert mixed_heavy(320, 8, SMS) is None  # one tile a CTA: nothing to mix


@pytest.mark.parametrize("slices", [2, 4])
def test_a_mixed_grid_is_one_wave_and_reads_fewer_rows_per_multiprocessor(slices):
    tiles = 8 // slices
    for row_tiles in range(2 * SMS + 1, 2 * SMS * tiles):
        heavy = mixed_heavy(row_tiles, slices, SMS)
        if heavy is None:
            continue
        ctas = mixed(row_tiles, tiles, heavy)
        assert len(ctas) <= 2 * SMS and sum(ctas) == row_tiles
        assert most_rows(ctas, SMS) <= tiles + 1
        assert most_rows(ctas, SMS) <= most_rows(uniform(row_tiles, tiles), SMS)
    assert most_rows(mixed(320, 2, 56), SMS) == 3 < most_rows(uniform(320, 2), SMS) == 4


def test_one_heavy_cta_a_multiprocessor_where_the_rest_fits_one_a_multiprocessor():
    assert spread_heavy(320, 4, SMS) == SMS  # Qwen3-14B o: 132 CTAs of two tiles, then 56 of one
    assert spread_heavy(384, 4, SMS) == SMS  # Llama-3.1-8B qkv: 132 of two, then 120 of one
    assert spread_heavy(448, 4, SMS) is None  # 14B qkv: 184 one-tile CTAs would put two beside some heavy ones
    assert spread_heavy(256, 4, SMS) is None  # 8B o: 128 two-tile CTAs, one wave of one a multiprocessor already
    assert spread_heavy(320, 2, SMS) is None  # 132 CTAs of four tiles would pass the weight's 320
    assert spread_heavy(320, 8, SMS) is None  # one tile a CTA: nothing to mix
    for row_tiles in range(SMS + 1, 6 * SMS):
        for slices in (2, 4):
            heavy = spread_heavy(row_tiles, slices, SMS)
            if heavy is None:
                continue
            tiles = 8 // slices
            ctas = mixed(row_tiles, tiles, heavy)
            assert sum(ctas) == row_tiles and len(ctas) <= 2 * SMS
            assert most_rows(ctas, SMS) == tiles + 1 <= most_rows(uniform(row_tiles, tiles), SMS)
            other = mixed_heavy(row_tiles, slices, SMS)
            assert other is None or len(ctas) <= len(mixed(row_tiles, tiles, other))


def test_the_tuner_tries_mixed_grids_only_where_they_help(monkeypatch):
    w = tile(pack_nm(random_nm_weight(5120, 256, 2, 4, torch.bfloat16, seed=8), 2, 4))
    assert sp24._mixed_candidates(w, 1, SMS) == sp24._mixed_candidates(w, 8, SMS) == [(4, 56)]
    assert sp24._mixed_candidates(w, 9, SMS) == []  # two n-tiles
    small = tile(pack_nm(random_nm_weight(4096, 256, 2, 4, torch.bfloat16, seed=8), 2, 4))
    assert sp24._mixed_candidates(small, 1, SMS) == []
    glu = tile(pack_nm(random_nm_weight(5120, 256, 2, 4, torch.bfloat16, seed=8), 2, 4), glu=True)
    assert sp24._mixed_candidates(glu, 1, SMS) == []
    monkeypatch.setenv("SPARSEDECODING_SP24_MIXED", "2")  # the probe: also one heavy CTA a multiprocessor
    assert sp24._mixed_candidates(w, 1, SMS) == [(4, 56), (4, 132)]
    assert sp24._mixed_candidates(small, 1, SMS) == []
    monkeypatch.setenv("SPARSEDECODING_SP24_MIXED", "0")
    assert sp24._mixed_candidates(w, 1, SMS) == []
    monkeypatch.setenv("SPARSEDECODING_SP24_MIXED", "yes")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_MIXED='yes'"):
        sp24._mixed_candidates(w, 1, SMS)


def test_mixed_setting_defaults_on_and_keys_the_launches(monkeypatch):
    """SPARSEDECODING_SP24_MIXED: on unset, part of the tuned launches' key (a launch tuned with mixed grids among the
    candidates is not reused without them), anything but 0 / 1 / 2 refused by name in the settings."""
    from sparsedecoding.kernels.op import SP24_MIXED_SETTING, settings, settings_line

    w = tile(pack_nm(random_nm_weight(5120, 256, 2, 4, torch.bfloat16, seed=8), 2, 4))
    x = torch.randn(1, 256).bfloat16()
    monkeypatch.delenv(SP24_MIXED_SETTING, raising=False)
    key = sp24.problem_key(x, w)
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, key))["mixed"] == "1"
    assert "SPARSEDECODING_SP24_MIXED=1" in settings_line()
    monkeypatch.setenv(SP24_MIXED_SETTING, "0")
    assert sp24.problem_key(x, w) != key and "SPARSEDECODING_SP24_MIXED=0" in settings_line()
    monkeypatch.setenv(SP24_MIXED_SETTING, "2")  # the probe's candidates are a launch key of their own
    probe = sp24.problem_key(x, w)
    assert probe != key and dict(zip(sp24.PROBLEM_KEY_FIELDS, probe))["mixed"] == "2"
    assert "SPARSEDECODING_SP24_MIXED=2" in settings_line()
    monkeypatch.setenv(SP24_MIXED_SETTING, "on")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_MIXED='on'"):
        settings()


def test_mixed_choices_are_labelled_with_their_heavy_ctas(monkeypatch):
    monkeypatch.setenv("SPARSEDECODING_SP24_EARLY_TRIGGER", "timed")
    assert sp24.choice_label((1, 4, True, -56)) == "1/4s-m56+e"
    assert sp24.choice_label((1, 4, False, 264)) == "sk264"
    assert sp24.choice_label((2, 4, False, 0)) == "2/4s"


# --- GPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("slices,heavy", [(4, 1), (4, 7), (2, 3), (1, 2)])
@pytest.mark.parametrize("batch", [1, 5, 8])
def test_mixed_rows_equal_the_uniform_launches_bit_for_bit(kind, slices, heavy, batch):
    out, in_features = 400, 1024  # 25 row tiles, an odd count
    packed, dtype = _packed_on_gpu(kind, out, in_features, seed=17)
    w = tile(packed)
    x = torch.randn(batch, in_features, device="cuda").to(dtype)
    y = sp24.Sp24Launch(x, w, 1, slices, heavy=heavy)(x, w)
    rows = 16 * heavy * (8 // slices)
    assert torch.equal(y[:, :rows], sp24.Sp24Launch(x, w, 1, slices)(x, w)[:, :rows])
    assert torch.equal(y[:, rows:], sp24.Sp24Launch(x, w, 1, 8)(x, w)[:, rows:])
    dense = packed.to_dense() if kind == "bf16" else packed.to_dense(torch.float64)
    assert float64_error(y, x, dense) <= 1


@pytest.mark.gpu
def test_mixed_launch_with_the_rmsnorm_in_front_equals_the_uniform_ones():
    out, in_features, heavy = 400, 1024, 5
    packed, dtype = _packed_on_gpu("int4", out, in_features, seed=18)
    w = tile(packed)
    x = torch.randn(2, in_features, device="cuda").to(dtype)
    res = torch.randn(2, in_features, device="cuda").to(dtype)
    norm_weight = torch.rand(in_features, device="cuda").to(dtype) + 0.5
    y, total = sp24.Sp24Launch(x, w, 1, 4, norm=True, heavy=heavy)(x, w, res, norm_weight, 1e-6)
    y4, total4 = sp24.Sp24Launch(x, w, 1, 4, norm=True)(x, w, res, norm_weight, 1e-6)
    y8, _ = sp24.Sp24Launch(x, w, 1, 8, norm=True)(x, w, res, norm_weight, 1e-6)
    rows = 16 * heavy * 2
    assert torch.equal(total, total4)
    assert torch.equal(y[:, :rows], y4[:, :rows]) and torch.equal(y[:, rows:], y8[:, rows:])


@pytest.mark.gpu
def test_mixed_grids_that_cannot_run_raise():
    from sparsedecoding.errors import KernelInputError

    packed, dtype = _packed_on_gpu("bf16", 400, 1024, seed=19)
    w = tile(packed)
    x = torch.randn(1, 1024, device="cuda").to(dtype)
    for kwargs in ({"splits": 2, "slices": 4, "heavy": 3}, {"slices": 8, "heavy": 3}, {"slices": 4, "heavy": 13},
                   {"slices": 1, "ctas": 132, "heavy": 3}):
        with pytest.raises(KernelInputError, match="mixed grid"):
            sp24.Sp24Launch(x, w, **kwargs)
    wide = torch.randn(9, 1024, device="cuda").to(dtype)  # two n-tiles: kernels without the mixed grids
    with pytest.raises(KernelInputError, match="batch 1-8"):
        sp24.Sp24Launch(wide, w, 1, 4, heavy=3)


@pytest.mark.gpu
def test_the_tuner_checks_and_times_mixed_grids_on_a_shape_past_a_wave():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = 16 * (2 * sms + 56)  # the row tiles of a 14B o on an H200: heavy CTAs at 4 slices
    packed, dtype = _packed_on_gpu("int4", out, 1024, seed=20)
    w = tile(packed)
    x = torch.randn(1, 1024, device="cuda").to(dtype)
    sp24.tuned_launch(x, w)  # every candidate checked against float64 inside (a mismatch raises)
    timings = sp24.launch_timings(sp24.problem_key(x, w))
    heavy = mixed_heavy(out // 16, 4, sms)
    assert heavy is not None and any(choice[3] == -heavy for choice in timings)
