"""Placed 16:32 masks (`SparsityPattern.placement`, solvers.lane_placed_keep_mask / quad_placed_keep_mask): every
mask obeys its placement, keeps 16 of every 32, and is the best one the placement allows (no single exchange of a
kept and a dropped weight that stays placed raises the total score: the allowed sets are a matroid's, where that
is the optimality test). SparseGPT and `keep_zeros` honour the placement."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.errors import SparsityPatternError
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import (capped_keep_mask, check_kept_zeros, keep_mask, placement_breaks, sparsegpt,
                                    wanda)

LANES, QUADS = SparsityPattern.parse("16:32+2l"), SparsityPattern.parse("16:32+4q")


def placed(kept: torch.Tensor, pattern: SparsityPattern) -> bool:
    return placement_breaks(kept, pattern) == 0 and bool(kept.view(kept.shape[0], -1, 32).sum(-1).eq(16).all())


@pytest.mark.parametrize("pattern", [LANES, QUADS], ids=["lanes", "quads"])
def test_placed_masks_obey_their_placement_and_keep_16_of_32(pattern):
    score = torch.rand(48, 96, generator=torch.Generator().manual_seed(3))
    kept = keep_mask(score, pattern)
    assert placed(kept, pattern)
    # the unplaced 16:32+2 greedy breaks the lane placement often, so the test above can fail
    assert placement_breaks(capped_keep_mask(score, SparsityPattern.parse("16:32+2")), LANES) > 0


def test_the_lane_placement_is_a_stricter_quad_placement():
    score = torch.rand(32, 64, generator=torch.Generator().manual_seed(4))
    lanes, quads = keep_mask(score, LANES), keep_mask(score, QUADS)
    assert placement_breaks(lanes, QUADS) == 0
    two_four = keep_mask(score, SparsityPattern.parse("16:32+0"))
    capped = keep_mask(score, SparsityPattern.parse("16:32+2"))
    assert (score * two_four).sum() <= (score * lanes).sum() <= (score * capped).sum()
    assert (score * lanes).sum() <= (score * quads).sum()


@pytest.mark.parametrize("pattern", [LANES, QUADS], ids=["lanes", "quads"])
def test_no_placed_exchange_improves_the_greedy_mask(pattern):
    """One 16-row tile and one word: every (drop a kept weight, keep a dropped one of the same row) exchange that
    stays placed scores no higher (for quads the exchange may also move a weight between a quad's two rows)."""
    score = torch.rand(16, 32, generator=torch.Generator().manual_seed(5))
    assert_no_better_exchange(score, keep_mask(score, pattern), pattern)


def assert_no_better_exchange(score: torch.Tensor, kept: torch.Tensor, pattern: SparsityPattern) -> None:
    best = float((score * kept).sum())
    for row in (3, 9):  # a row of either half (with quads, and its quad partner)
        rows = [row, row ^ 8] if pattern is QUADS else [row]
        for out in kept[row].nonzero().flatten().tolist():
            for other in rows:
                for into in (~kept[other]).nonzero().flatten().tolist():
                    trial = kept.clone()
                    trial[row, out], trial[other, into] = False, True
                    if placement_breaks(trial, pattern) == 0 and trial.sum(1).le(16).all():
                        assert float((score * trial).sum()) <= best + 1e-6


@pytest.mark.parametrize("pattern", [LANES, QUADS], ids=["lanes", "quads"])
def test_the_exchange_check_finds_a_worse_mask(pattern):
    """The check above can fail: the placed greedy mask of a perturbed score is beaten by an exchange."""
    score = torch.rand(16, 32, generator=torch.Generator().manual_seed(5))
    noisy = score + 0.5 * torch.rand(16, 32, generator=torch.Generator().manual_seed(8))
    with pytest.raises(AssertionError):
        assert_no_better_exchange(score, keep_mask(noisy, pattern), pattern)


def test_sparsegpt_and_wanda_keep_the_placement():
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(32, 64, generator=generator)
    x = torch.randn(256, 64, generator=generator)
    hessian = 2 * x.T @ x / 256
    for pattern in (LANES, QUADS):
        assert placed(sparsegpt(weight, hessian, pattern) != 0, pattern)
        assert placed(wanda(weight, hessian, pattern) != 0, pattern)


def test_a_placement_needs_whole_16_row_tiles_and_keep_zeros_checks_it():
    weight = torch.randn(24, 32)
    with pytest.raises(SparsityPatternError, match="16-row tile"):
        sparsegpt(weight, torch.eye(32), LANES)
    score = torch.rand(16, 32, generator=torch.Generator().manual_seed(7))
    unplaced = torch.randn(16, 32) * capped_keep_mask(score, SparsityPattern.parse("16:32+2"))
    assert placement_breaks(unplaced != 0, LANES) > 0
    with pytest.raises(SparsityPatternError, match="lanes placement"):
        check_kept_zeros(unplaced, LANES)
    check_kept_zeros(torch.randn(16, 32) * keep_mask(score, LANES), LANES)


def test_the_cli_check_refuses_a_placement_on_rows_that_do_not_fill_16_row_tiles(tmp_path):
    """Checked before any model work: k/v of one 24-wide head have 24 rows."""
    import json

    from sparsedecoding.models import check_pattern_fits

    config = {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
              "intermediate_size": 192, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsityPatternError, match="k/v_proj has 24") as info:
        check_pattern_fits(tmp_path, QUADS, "sparsegpt", 128)
    assert "\n" not in str(info.value)
    check_pattern_fits(tmp_path, SparsityPattern.parse("16:32+4"), "sparsegpt", 128)
    config["num_key_value_heads"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_pattern_fits(tmp_path, QUADS, "sparsegpt", 128)
