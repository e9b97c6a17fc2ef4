"""benchmarks/quant_e2e_bench.py's report lines on synthetic measurements: the targets and, with --head, each
quantized head against the bf16 head of the same run (no GPU: the lines only read SpeedResult rows)."""

from __future__ import annotations

import pytest

from sparsedecoding.engine.bench import SpeedResult
from sparsedecoding.patterns import SparsityPattern

from helpers import benchmark_module


@pytest.fixture
def bench(monkeypatch):
    return benchmark_module(monkeypatch, "quant_e2e_bench")


def row(weights: str, seconds: float) -> SpeedResult:
    return SpeedResult("llama-3.1-8b", weights, 1, 100, seconds, 0, 0.0)


def test_head_lines_pair_each_quantized_head_with_the_bf16_head_of_the_same_run(bench):
    results = [row("dense", 0.5), row("2:4 int4 g128", 0.2), row("2:4 int4 g128, int8 head", 0.16),
               row("dense int4 g128", 0.3), row("dense int4 g128, int8 head", 0.3), row("2:4 int8", 0.25)]
    lines = bench.head_lines(results, "llama-3.1-8b", [SparsityPattern.parse("2:4")], 128, "int8")
    assert "- 2:4 int4 g128: 2.000 -> 1.600 ms a step, 1.250x" in lines
    assert "- dense int4 g128: 3.000 -> 3.000 ms a step, 1.000x" in lines
    assert "- 2:4 int8: not measured" in lines and "- dense int8: not measured" in lines
    targets = bench.target_lines(results, "llama-3.1-8b", [SparsityPattern.parse("2:4")], 128, "int8")
    assert "- 2:4 int4 g128, int8 head: 3.125x dense bf16 (target >= 3.0: met); 1.875x dense int4 (faster than " \
           "our dense int4 path)" in targets


def test_the_time_budget_starts_no_group_after_it_and_lets_a_started_one_finish(bench):
    now = [0.0]

    def run_group(group):  # each group takes 40 s of the fake clock
        now[0] += 40.0
        return [group]

    groups = [(None, None), ("int8", None), ("int8", "int4"), ("int4", None)]
    results, skipped = bench.measure(groups, run_group, 100.0, clock=lambda: now[0])
    assert results == groups[:3] and skipped == groups[3:]  # the third began at 80 s, before the budget, and ended
    now[0] = 0.0
    assert bench.measure(groups, run_group, None, clock=lambda: now[0]) == (groups, [])
    assert bench.group_name("int8", "int4") == "int8 values, int4 head"
    assert bench.group_name(None, None) == "bf16 values"
