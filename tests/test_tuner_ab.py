"""benchmarks/tuner_ab.py's CPU side: the methods it compares and the order it tunes them in."""

from __future__ import annotations

from helpers import benchmark_module


def test_methods_alternate_which_goes_first(monkeypatch):
    tuner_ab = benchmark_module(monkeypatch, "tuner_ab")
    assert tuner_ab.method_order(3) == ["before", "now", "now", "before", "before", "now"]
    assert tuner_ab.METHODS["before"] == (2, 8, False)  # the tuner until the forty-fifth session


def test_a_method_sets_the_tuner_and_restores_it(monkeypatch):
    tuner_ab = benchmark_module(monkeypatch, "tuner_ab")
    sp24 = tuner_ab.sp24
    now = sp24.TUNE_ROTATION_L2S, sp24._MAX_COPIES, sp24.TUNE_INTERLEAVED
    with tuner_ab.method("before"):
        assert (sp24.TUNE_ROTATION_L2S, sp24._MAX_COPIES, sp24.TUNE_INTERLEAVED) == (2, 8, False)
    assert (sp24.TUNE_ROTATION_L2S, sp24._MAX_COPIES, sp24.TUNE_INTERLEAVED) == now == tuner_ab.METHODS["now"]
