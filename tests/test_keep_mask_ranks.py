"""ADMM's projection (`solvers.projection`) ranks short N:M groups (M <= SMALL_GROUP) by pairwise comparison instead
of `topk`: `keep_mask`'s mask wherever a group's scores are distinct, exactly N kept a group with ties (the lower
index first), any float dtype; other patterns are `keep_mask`'s own."""

import pytest
import torch

from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern


def topk_mask(score: torch.Tensor, n: int, m: int) -> torch.Tensor:
    groups = score.reshape(score.shape[0], -1, m)
    kept = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, groups.topk(n, dim=2).indices, True)
    return kept.reshape(score.shape)


@pytest.mark.parametrize("text", ["1:2", "2:4", "1:4", "3:4", "4:8", "2:8", "7:8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_short_groups_keep_what_topk_keeps_for_distinct_scores(text, dtype):
    pattern = SparsityPattern.parse(text)
    assert pattern.m <= solvers.SMALL_GROUP
    generator = torch.Generator().manual_seed(pattern.n * 100 + pattern.m)
    # a permutation of 0..M-1 in every group: distinct within each group, exactly, in every dtype
    score = torch.rand(24, 64 // pattern.m, pattern.m, generator=generator).argsort(2).reshape(24, 64).to(dtype)
    mask = solvers.projection(score, pattern)
    assert mask.dtype == torch.bool and mask.shape == score.shape
    assert torch.equal(mask, topk_mask(score, pattern.n, pattern.m))
    assert torch.equal(mask, solvers.keep_mask(score, pattern))


def test_ties_keep_exactly_n_a_group_the_lower_index_first():
    score = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 0.5]])
    mask = solvers.projection(score, SparsityPattern.parse("2:4"))
    assert mask.tolist() == [[True, True, False, False, True, True, False, False, True, True, False, False]]


def test_ranks_count_larger_or_equal_earlier_entries():
    groups = torch.tensor([[[3.0, 1.0, 3.0, 2.0]]])
    assert solvers.group_ranks(groups).tolist() == [[[0, 3, 1, 2]]]


@pytest.mark.parametrize("text", ["16:32", "16:32+2", "16:32+2l", "16:32+4q", "50%"])
def test_other_patterns_project_as_keep_mask(text, monkeypatch):
    pattern = SparsityPattern.parse(text)
    score = torch.randperm(32 * 64, generator=torch.Generator().manual_seed(3)).reshape(32, 64).float()
    expected = solvers.keep_mask(score, pattern)
    monkeypatch.setattr(solvers, "group_ranks", None)  # never reached for these patterns
    assert torch.equal(solvers.projection(score, pattern), expected)
