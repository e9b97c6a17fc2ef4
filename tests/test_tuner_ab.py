"""benchmarks/tuner_ab.py's CPU side: the methods it compares and the order it tunes them in."""

from __future__ import annotations

import os

from helpers import benchmark_module


def test_methods_alternate_which_goes_first(monkeypatch):
    tuner_ab = benchmark_module(monkeypatch, "tuner_ab")
    assert tuner_ab.method_order(2) == ["before", "no mixed", "now", "no mixed", "now", "before"]
    assert tuner_ab.METHODS["before"] == (2, 8, False, 3, "0")  # the tuner until the forty-fifth session
    assert tuner_ab.method_order(2, ("now", "spread")) == ["now", "spread", "spread", "now"]


def test_a_method_sets_the_tuner_and_restores_it(monkeypatch):
    tuner_ab = benchmark_module(monkeypatch, "tuner_ab")
    sp24 = tuner_ab.sp24
    monkeypatch.delenv("SPARSEDECODING_SP24_MIXED", raising=False)
    def current():
        return (sp24.TUNE_ROTATION_L2S, sp24._MAX_COPIES, sp24.TUNE_INTERLEAVED, sp24.TIMED_OTHER_BUILD,
                tuner_ab.op.sp24_mixed_value())

    now = current()
    with tuner_ab.method("before"):
        assert current() == (2, 8, False, 3, "0")
    assert current() == now == tuner_ab.METHODS["now"] == (3, 128, True, None, "1")
    assert "SPARSEDECODING_SP24_MIXED" not in os.environ  # unset again, as it was
    monkeypatch.setenv("SPARSEDECODING_SP24_MIXED", "1")
    with tuner_ab.method("no mixed"):
        assert current() == (3, 128, True, None, "0")
    with tuner_ab.method("spread"):  # the probe: mixed grids and one heavy CTA a multiprocessor
        assert current() == (3, 128, True, None, "2")
    assert os.environ["SPARSEDECODING_SP24_MIXED"] == "1"


def test_misses_list_every_candidate_beside_each_tunings_view(monkeypatch):
    tuner_ab = benchmark_module(monkeypatch, "tuner_ab")
    fast, slow = (1, 8, True, 0), (2, 4, True, 0)
    row = {"problem": "8B o int4 b1", "fastest_ms": 0.0041, "times": {slow: 0.0048, fast: 0.0041},
           "pick_ms": {"before": [0.0048], "now": [0.0041]},
           "tunings": [("before", {slow: 0.0040, fast: 0.0042}), ("now", {fast: 0.0040})]}
    text = tuner_ab.misses([row])
    lines = text.splitlines()
    assert lines[0] == "### 8B o int4 b1"
    assert lines[4] == "| 1/8s+e | 4.10 | 4.20 | 4.00 (kept) |"
    assert lines[5] == "| 2/4s+e | 4.80 | 4.00 (kept) | - |"
    row["pick_ms"]["before"] = [0.0042]  # within 5%: not listed
    assert tuner_ab.misses([row]) == "none"
