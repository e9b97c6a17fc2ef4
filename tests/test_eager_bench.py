"""benchmarks/eager_bench.py's verdicts from alternated rounds (no GPU): a target's ratio is the median of the
per-round ratios of the two calls timed in the same round, and bad counts are refused before any GPU work."""

import pytest

from helpers import benchmark_module


def row(shape, weights, f_linear, sp24, nm_spmv):
    return {"shape": shape, "pattern": "2:4", "batch": 1, "weights": weights,
            "F.linear walls": f_linear, "F.linear wall": sorted(f_linear)[len(f_linear) // 2],
            "Sp24Linear walls": sp24, "Sp24Linear wall": sorted(sp24)[len(sp24) // 2],
            "nm_spmv walls": nm_spmv, "nm_spmv wall": sorted(nm_spmv)[len(nm_spmv) // 2]}


def test_targets_take_the_median_of_paired_round_ratios(monkeypatch):
    bench = benchmark_module(monkeypatch, "eager_bench")
    square = bench.SHAPES["4096x4096"]
    # one slow round of the sparse call (30 us against 20) does not decide; the paired ratios are 1.0, 1.1, 1.5
    lines, passed = bench.targets([row(square, "same", [20.0, 20.0, 20.0], [20.0, 22.0, 30.0], [15.0, 15.0, 15.0])])
    assert passed and "Sp24Linear wall 22.0 us / F.linear 20.0 us = 1.10, rounds 1.00-1.50" in lines
    # pairing matters: a round where both calls ran slow (40 and 44 us) is still a ratio of 1.1; the medians of
    # the two calls' own times (30 against 20) would read 1.5
    lines, passed = bench.targets([row(square, "same", [20.0, 40.0, 20.0], [22.0, 44.0, 30.0], [15.0, 15.0, 15.0])])
    assert passed and "Sp24Linear wall 30.0 us / F.linear 20.0 us = 1.10, rounds 1.10-1.50 (target <= 1.2): PASS" \
        in lines
    lines, passed = bench.targets([row(square, "same", [20.0, 20.0, 20.0], [25.0, 25.0, 22.0], [15.0, 15.0, 15.0])])
    assert not passed and "= 1.25, rounds 1.10-1.25 (target <= 1.2): FAIL" in lines
    gate_up = bench.SHAPES["gate_up 28672x4096"]
    lines, passed = bench.targets([row(gate_up, "rotated", [58.0], [58.0], [40.0])])
    assert not passed and "= 1.00 (target < 1.0): FAIL" in lines  # strictly faster on gate_up


def test_bad_counts_are_refused_before_the_gpu_check(monkeypatch, capsys):
    bench = benchmark_module(monkeypatch, "eager_bench")
    for argv in (["--rounds", "0"], ["--calls", "0"], ["--device-calls", "-1"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2 and "must be at least 1" in capsys.readouterr().err
