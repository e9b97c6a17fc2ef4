"""benchmarks/setting_ab_bench.py's CPU side: the step tuning's log lines collected for the report."""

from __future__ import annotations

import logging

from helpers import benchmark_module


def test_only_the_engines_step_tuning_lines_are_collected(monkeypatch):
    ab = benchmark_module(monkeypatch, "setting_ab_bench")
    lines = ab.StepTuningLines()
    log = logging.getLogger("sparsedecoding.engine.generate")
    log.addHandler(lines)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        log.info("step tuning: %s", "4096x4096 int4, 1 rows (32 a step): before 1/8s+e; kept 1/8s")
        log.info("compiled in %d s", 3)  # not the step tuning's
        log.debug("step tuning: below the handler's level")
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    assert lines.lines == ["4096x4096 int4, 1 rows (32 a step): before 1/8s+e; kept 1/8s"]
