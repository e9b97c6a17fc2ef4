"""benchmarks/mask_overflow.py: the 16:32 magnitude mask and the count of kept weights beyond two in a group of 4."""

from __future__ import annotations

import pytest
import torch

from helpers import benchmark_module


@pytest.fixture
def overflow(monkeypatch):
    return benchmark_module(monkeypatch, "mask_overflow")


def test_magnitude_mask_keeps_the_16_largest_of_every_32(overflow):
    weight = torch.randn(3, 64)
    kept = overflow.magnitude_mask(weight)
    assert kept.view(3, 2, 32).sum(-1).eq(16).all()
    for row in range(3):
        for word in range(2):
            values = weight[row, 32 * word:32 * word + 32].abs()
            mask = kept[row, 32 * word:32 * word + 32]
            assert values[mask].min() >= values[~mask].max()


def test_overflow_counts_what_two_per_group_cannot_hold(overflow):
    kept = torch.zeros(1, 32, dtype=torch.bool)
    kept[0, :16] = True  # groups of four keep 4, 4, 4, 4, 0, 0, 0, 0: two beyond two in each of the first four
    counts = overflow.kept_per_group(kept)
    assert counts.tolist() == [[4, 4, 4, 4, 0, 0, 0, 0]]
    assert overflow.overflow(counts) == 8
    assert overflow.overflow(overflow.kept_per_group(torch.zeros(3, 8, dtype=torch.bool))) == 0


def test_a_folder_without_weights_is_one_error_line(overflow, tmp_path, capsys):
    assert overflow.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
