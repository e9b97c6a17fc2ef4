"""benchmarks/step_profile.py's bandwidth line (no GPU): the block linears' bytes of a preset and the share of copy
bandwidth the sparse kernels reach."""

from __future__ import annotations

import pytest

from sparsedecoding.engine.config import preset
from sparsedecoding.patterns import SparsityPattern

from helpers import benchmark_module


@pytest.fixture
def bench(monkeypatch):
    return benchmark_module(monkeypatch, "step_profile")


def test_block_linear_bytes_count_the_decoder_linears_only(bench):
    args = preset("llama-3.1-8b")
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    per_layer = (q + 2 * kv) * args.dim + args.dim * q + 3 * args.intermediate_size * args.dim
    weights = args.n_layers * per_layer
    assert bench.block_linear_bytes(args, None, None, 128) == 2 * weights
    # 2:4 in bf16: half the values plus one bit a column
    assert bench.block_linear_bytes(args, SparsityPattern.parse("2:4"), None, 128) == weights + weights // 8


def test_bandwidth_line_gives_the_sparse_kernels_share(bench):
    by_kind = {"sp24 (2:4 linears)": [64.0, 1500.0], "Inductor (norms, rope, adds, ...)": [97.0, 500.0]}
    line = bench.bandwidth_line(3 * 10**9, 4e12, by_kind, sparse=True)
    assert line == ("- block linears: 3.000 GB a step, 0.750 ms at this run's copy bandwidth (4.00 TB/s); the sparse "
                    "kernels take 1.500 ms of kernel time, 50% of it")
    assert bench.bandwidth_line(3 * 10**9, 4e12, by_kind, sparse=False).endswith("(4.00 TB/s)")
