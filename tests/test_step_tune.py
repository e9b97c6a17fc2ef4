"""Choosing 2:4 launches by decode-step time (`engine.step_tune`, SPARSEDECODING_STEP_TUNE): the choice logic on CPU
with the kernel's tuner and the engine's graphs stood in for, and on the GPU a real engine's choices."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sparsedecoding.engine import step_tune
from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import op, sp24
from sparsedecoding.kernels.op import KernelChoiceError


class FakeEngine:
    """Captures a 'graph' that is a copy of the launches chosen at capture time."""

    def __init__(self, current: dict):
        self.current, self.graph, self.captures = current, None, 0

    def capture(self):
        self.captures += 1
        return dict(self.current)


def fake_kernel(monkeypatch, timings: dict, lookups: dict, step_cost: dict, together=None) -> tuple[dict, list]:
    """sp24's tuner state stood in for: `timings` the tuner's ms per (key, choice), `lookups` the launches a step
    makes of each key; a step's time is the sum over keys of step_cost[key][its choice], plus together(graph) if
    given (what the launches cost one another). Returns the current choices (the tuner's fastest) and a log of the
    choices each timed graph held."""
    current = {key: min(t, key=t.get) for key, t in timings.items()}
    timed = []

    @contextlib.contextmanager
    def recording():
        yield dict(lookups)

    def choose(key, choice):
        if choice not in timings[key]:
            raise KernelInputError("unknown")
        current[key] = choice

    def step_ms(engine, graph, replays):
        timed.append(dict(graph))
        return sum(step_cost[key][graph[key]] for key in graph) + (together(graph) if together else 0.0)

    monkeypatch.setattr(sp24, "recording_problems", recording)
    monkeypatch.setattr(sp24, "launch_timings", lambda key: dict(sorted(timings[key].items(), key=lambda i: i[1])))
    monkeypatch.setattr(sp24, "chosen_launch", lambda key: current[key])
    monkeypatch.setattr(sp24, "choose_launch", choose)
    monkeypatch.setattr(sp24, "problem_text", lambda key: f"problem {key}")
    monkeypatch.setattr(step_tune, "_step_ms", step_ms)
    return current, timed


def test_the_fastest_step_wins_and_a_gain_inside_the_margin_keeps_the_tuners_pick(monkeypatch):
    big, small = "gate_up", "o"
    timings = {big: {(1, 4, False, 0): 0.010, (2, 1, False, 0): 0.011, (4, 1, False, 0): 0.020, (8, 1, False, 0): 0.012,
                     (3, 1, False, 0): 0.013, (6, 1, False, 0): 0.014},
               small: {(1, 1, False, 0): 0.004, (2, 1, False, 0): 0.0041}}
    step_cost = {big: {(1, 4, False, 0): 1.00, (2, 1, False, 0): 1.01, (4, 1, False, 0): 0.50, (8, 1, False, 0): 0.90,
                       (3, 1, False, 0): 0.95, (6, 1, False, 0): 0.97},
                 small: {(1, 1, False, 0): 0.500, (2, 1, False, 0): 0.499}}
    current, timed = fake_kernel(monkeypatch, timings, {big: 32, small: 32}, step_cost)
    engine = FakeEngine(current)
    outcomes = step_tune.tune_step(engine, top=4, within=1.5, rounds=3, margin=0.003)
    assert [o.key for o in outcomes] == [big, small]  # the most kernel time first
    first = outcomes[0]
    # the tuner's four fastest within 1.5x of its best; (4, 1, False, 0) is 2x slower alone and never tried, though its
    # steps would be fastest
    assert list(first.step_ms) == [(1, 4, False, 0), (2, 1, False, 0), (8, 1, False, 0), (3, 1, False, 0)]
    assert first.before == (1, 4, False, 0) and first.chosen == (8, 1, False, 0)
    assert first.step_ms[(8, 1, False, 0)] == pytest.approx(0.90 + 0.500)
    second = outcomes[1]
    assert second.before == (1, 1, False, 0) and second.chosen == (1, 1, False, 0)  # 0.07% faster: inside the margin
    assert current == {big: (8, 1, False, 0), small: (1, 1, False, 0)}
    assert engine.graph == current  # captured again with the choices
    # each candidate timed `rounds` times, with the other problem at its choice so far
    assert sum(1 for graph in timed if graph == {big: (8, 1, False, 0), small: (2, 1, False, 0)}) == 3
    assert "kept 8" in first.line() and "before 1/4s" in first.line()


def test_under_timed_the_fastest_launch_of_each_build_is_tried_in_steps(monkeypatch):
    """SPARSEDECODING_SP24_EARLY_TRIGGER=timed: the tuner timed launches in both builds; the fastest of the build
    that is slower alone is tried in whole steps even outside `top` and `within`, and wins if its steps are
    faster. With one problem the whole-build move already finds it."""
    monkeypatch.setenv(op.SP24_EARLY_TRIGGER_SETTING, "timed")
    key = "gate_up"
    timings = {key: {(1, 1, True, 0): 0.010, (2, 1, True, 0): 0.0105, (1, 2, True, 0): 0.011, (1, 1, False, 0): 0.016,
                     (2, 1, False, 0): 0.017}}
    step_cost = {key: {(1, 1, True, 0): 1.00, (2, 1, True, 0): 1.02, (1, 2, True, 0): 1.01, (1, 1, False, 0): 0.98,
                       (2, 1, False, 0): 0.97}}
    current, timed = fake_kernel(monkeypatch, timings, {key: 32}, step_cost)
    build, outcome = step_tune.tune_step(FakeEngine(current), top=2, within=1.5, rounds=1)
    assert build.picks == {"tuner": {key: (1, 1, True, 0)}, "early": {key: (1, 1, True, 0)},
                           "default": {key: (1, 1, False, 0)}}
    assert build.chosen == "default" and build.step_ms["default"] == pytest.approx(0.98)
    assert "kept default" in build.line()
    # then the problem alone: the two fastest alone, then the other build's fastest (1.6x the best alone: outside
    # `within` too), which is its launch now, the whole-build move's; it stays
    assert list(outcome.step_ms) == [(1, 1, True, 0), (2, 1, True, 0), (1, 1, False, 0)]
    assert outcome.before == outcome.chosen == (1, 1, False, 0) and current == {key: (1, 1, False, 0)}
    assert "before 1;" in outcome.line() and outcome.line().endswith("kept 1")


def test_under_timed_a_whole_build_wins_where_no_single_switch_does(monkeypatch):
    """Two problems, each faster alone in the early build and no single switch from there faster in the step, but
    the step with both in the default build is fastest (early launches let the next kernels in early, at a cost to
    the step; the 8B int4 steps measured it so): the whole-build move takes the default build; without two builds
    there is no such move."""
    monkeypatch.setenv(op.SP24_EARLY_TRIGGER_SETTING, "timed")
    timings = {"qkv": {(1, 4, True, 0): 0.005, (1, 4, False, 0): 0.0055},
               "down": {(4, 2, True, 0): 0.009, (4, 2, False, 0): 0.0098}}
    step_cost = {"qkv": {(1, 4, True, 0): 0.50, (1, 4, False, 0): 0.51}, "down": {(4, 2, True, 0): 0.90, (4, 2, False, 0): 0.91}}

    def crowding(graph):  # any launch in the early build lets the next kernels in early, at a cost to the step
        return 0.05 if any(choice[2] for choice in graph.values()) else 0.0

    current, timed = fake_kernel(monkeypatch, timings, {"qkv": 32, "down": 32}, step_cost, crowding)
    engine = FakeEngine(current)
    build, *problems = step_tune.tune_step(engine, rounds=1)
    assert build.chosen == "default"
    assert build.step_ms == pytest.approx({"tuner": 1.45, "early": 1.45, "default": 1.42})
    assert current == {"qkv": (1, 4, False, 0), "down": (4, 2, False, 0)} and engine.graph == current
    # one problem at a time from there: switching either back to early alone is slower, so both stay
    assert [p.chosen for p in problems] == [(4, 2, False, 0), (1, 4, False, 0)]
    monkeypatch.setenv(op.SP24_EARLY_TRIGGER_SETTING, "auto")
    one_build = {key: {c: ms for c, ms in t.items() if c[2]} for key, t in timings.items()}
    current, _ = fake_kernel(monkeypatch, one_build, {"qkv": 32, "down": 32}, step_cost, crowding)
    assert not any(isinstance(o, step_tune.BuildChoice) for o in step_tune.tune_step(FakeEngine(current), rounds=1))


def test_a_problem_with_one_candidate_is_left_alone(monkeypatch):
    current, timed = fake_kernel(monkeypatch, {"qkv": {(1, 1, False, 0): 0.01, (2, 1, False, 0): 0.05}}, {"qkv": 32},
                                 {"qkv": {(1, 1, False, 0): 1.0, (2, 1, False, 0): 0.1}})
    engine = FakeEngine(current)
    assert step_tune.tune_step(engine, within=1.5) == []
    assert current == {"qkv": (1, 1, False, 0)} and timed == [] and engine.captures == 2


def _o_then_gate_up(monkeypatch):
    """The 8B int4 step's trap (results/handoff_h200_8b_int4_repeat.md), stood in for: the o launched before the
    gate_up; alone, the o's early build and the gate_up's two slices are fastest, and from that pairing no single
    switch is faster in a step, but the o's default build with the gate_up's one slice is (what the early trigger
    lets in beside the gate_up depends on both)."""
    monkeypatch.setenv(op.SP24_EARLY_TRIGGER_SETTING, "timed")
    o_early, o_default = (1, 8, True, 0), (1, 8, False, 0)
    gu_2s, gu_1, gu_1_default = (1, 2, True, 0), (1, 1, True, 0), (1, 1, False, 0)
    timings = {"o": {o_early: 0.0040, o_default: 0.0041},
               "gate_up": {gu_2s: 0.0137, gu_1: 0.0138, gu_1_default: 0.0150}}
    step_cost = {"o": {o_early: 0.50, o_default: 0.51}, "gate_up": {gu_2s: 1.00, gu_1: 1.01, gu_1_default: 1.05}}

    def together(graph):
        return -0.08 if graph["o"] == o_default and graph["gate_up"] == gu_1 else 0.0

    current, timed = fake_kernel(monkeypatch, timings, {"o": 32, "gate_up": 32}, step_cost, together)
    return current, timed, (o_default, gu_1)


def test_the_pass_over_pairs_makes_the_move_no_single_switch_makes(monkeypatch):
    current, timed, best = _o_then_gate_up(monkeypatch)
    engine = FakeEngine(current)
    build, *singles, pair = step_tune.tune_step(engine, rounds=1, pairs=True)
    assert build.chosen == "tuner" and [s.chosen for s in singles] == [(1, 2, True, 0), (1, 8, True, 0)]
    assert isinstance(pair, step_tune.PairChoice) and pair.keys == ("o", "gate_up")  # in launch order
    assert pair.before == ((1, 8, True, 0), (1, 2, True, 0)) and pair.chosen == best
    # each problem's launch now, the fastest of each build, then the fastest within 1.5x: 2 x 3 pairings
    assert len(pair.step_ms) == 6 and pair.step_ms[best] == pytest.approx(1.44)
    assert pair.step_ms[pair.before] == pytest.approx(1.50)
    assert current == {"o": best[0], "gate_up": best[1]} and engine.graph == current
    assert pair.line().startswith("problem o, then problem gate_up: before 1/8s+e + 1/2s+e;")
    assert pair.line().endswith("kept 1/8s + 1+e")


def test_without_the_pairs_setting_the_step_stays_where_single_switches_leave_it(monkeypatch):
    monkeypatch.delenv(op.STEP_TUNE_PAIRS_SETTING, raising=False)
    current, _, _ = _o_then_gate_up(monkeypatch)
    outcomes = step_tune.tune_step(FakeEngine(current), rounds=1)
    assert not any(isinstance(o, step_tune.PairChoice) for o in outcomes)
    assert current == {"o": (1, 8, True, 0), "gate_up": (1, 2, True, 0)}
    monkeypatch.setenv(op.STEP_TUNE_PAIRS_SETTING, "1")  # the setting turns the pass on
    current, _, best = _o_then_gate_up(monkeypatch)
    assert isinstance(step_tune.tune_step(FakeEngine(current), rounds=1)[-1], step_tune.PairChoice)
    assert current == {"o": best[0], "gate_up": best[1]}


def test_pairs_run_round_the_layer_most_kernel_time_first_and_keep_the_launch_inside_the_margin(monkeypatch):
    """Three problems: three pairs, the last with the first (the next layer's); a pairing faster by less than the
    margin leaves the launches as they are."""
    timings = {"qkv": {(1, 4, False, 0): 0.005, (2, 2, False, 0): 0.0055},
               "o": {(1, 8, False, 0): 0.004, (2, 4, False, 0): 0.0042},
               "down": {(4, 2, False, 0): 0.009, (8, 1, False, 0): 0.0095}}
    step_cost = {"qkv": {(1, 4, False, 0): 0.50, (2, 2, False, 0): 0.501},
                 "o": {(1, 8, False, 0): 0.40, (2, 4, False, 0): 0.4005},
                 "down": {(4, 2, False, 0): 0.90, (8, 1, False, 0): 0.9001}}
    current, _ = fake_kernel(monkeypatch, timings, {"qkv": 32, "o": 32, "down": 32}, step_cost,
                             lambda graph: -0.001 if graph["down"] == (8, 1, False, 0) else 0.0)
    outcomes = step_tune.tune_step(FakeEngine(current), rounds=1, pairs=True)
    pairs = [o for o in outcomes if isinstance(o, step_tune.PairChoice)]
    assert [p.keys for p in pairs] == [("down", "qkv"), ("o", "down"), ("qkv", "o")]
    assert all(p.chosen == p.before for p in pairs)  # 0.05% faster at best: inside the 0.3% margin
    assert current == {"qkv": (1, 4, False, 0), "o": (1, 8, False, 0), "down": (4, 2, False, 0)}


def test_choosing_an_unchecked_launch_is_an_error():
    with pytest.raises(KernelInputError, match="not a checked candidate"):
        sp24.choose_launch(("no such problem",), (1, 1, False, 0))


def test_problem_text_names_shape_values_rows_norm_and_glu():
    """Read off real keys (`problem_key` of CPU weights), field by field: an earlier version read them one place
    off, naming the GLU weight "dense", every problem "GLU" and none "norm"."""
    from helpers import coded_24

    glu = sp24.tile(coded_24("int4", 64, 512), glu=True)
    x = torch.randn(1, 512).bfloat16()
    assert len(sp24.problem_key(x, glu)) == len(sp24.PROBLEM_KEY_FIELDS)
    assert sp24.problem_text(sp24.problem_key(x, glu, norm=True)) == "64x512 int4, 1 rows, norm, GLU"
    assert sp24.problem_text(sp24.problem_key(x, sp24.tile(coded_24("int8", 64, 512)))) == "64x512 int8, 1 rows"
    dense = sp24.tile_dense(torch.randint(-127, 128, (32, 256), dtype=torch.int8),
                            torch.ones(32, dtype=torch.bfloat16), "int8", 256)
    assert sp24.problem_text(sp24.problem_key(torch.randn(4, 256).bfloat16(), dense)) == "32x256 dense int8, 4 rows"


@pytest.mark.parametrize("name,default", [(op.STEP_TUNE_SETTING, True), (op.STEP_TUNE_PAIRS_SETTING, False)])
@pytest.mark.parametrize("value", [None, "1", "0", "yes"])
def test_the_step_tune_settings(name, default, value, monkeypatch):
    read = {op.STEP_TUNE_SETTING: op.step_tune_setting, op.STEP_TUNE_PAIRS_SETTING: op.step_tune_pairs_setting}[name]
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    if value == "yes":
        with pytest.raises(KernelChoiceError, match=name):
            op.settings()
    else:
        assert read() is {None: default, "1": True, "0": False}[value]


@pytest.mark.gpu
@pytest.mark.parametrize("quantize,pairs", [(None, "0"), ("int4", "0"), ("int4", "1")])
def test_a_step_tuned_engine_launches_checked_candidates_and_decodes_the_packed_models_tokens(quantize, pairs,
                                                                                            monkeypatch):
    """With SPARSEDECODING_STEP_TUNE=1 a compiled engine times its 2:4 problems' candidates in whole steps (and with
    SPARSEDECODING_STEP_TUNE_PAIRS=1 neighbouring problems' pairings), keeps one of them for each, and its decode
    still gives the packed model's eager tokens."""
    from test_sp24_linear import _assert_compiled_decode_gives_the_eager_tokens, _packed_and_tiled

    from sparsedecoding.engine import Engine

    args, packed, tiled = _packed_and_tiled(quantize, 128, monkeypatch, SPARSEDECODING_FUSE_GLU="1",
                                            SPARSEDECODING_FUSE_NORM="1", SPARSEDECODING_STEP_TUNE="1",
                                            SPARSEDECODING_STEP_TUNE_PAIRS=pairs)
    engine = Engine(tiled, 3, 40, compile=True)
    assert engine.step_choices
    assert any(isinstance(c, step_tune.PairChoice) for c in engine.step_choices) == (pairs == "1")
    kept = {}  # each problem's launch after the last outcome that chose it
    for choice in engine.step_choices:
        if isinstance(choice, step_tune.BuildChoice):  # under SPARSEDECODING_SP24_EARLY_TRIGGER=timed
            assert set(choice.step_ms) == set(choice.picks) == {"tuner", "early", "default"}
            assert all(launch in sp24.launch_timings(key) for picks in choice.picks.values()
                       for key, launch in picks.items())  # each a checked candidate
            continue
        assert choice.before in choice.step_ms and choice.chosen in choice.step_ms
        assert all(ms > 0 for ms in choice.step_ms.values())
        if isinstance(choice, step_tune.PairChoice):
            kept.update(zip(choice.keys, choice.chosen))
        else:
            kept[choice.key] = choice.chosen
    for key, launch in kept.items():
        assert sp24.chosen_launch(key) == launch
        assert launch in sp24.launch_timings(key)
    del engine
    _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled)


def test_under_timed_bounds_the_fastest_launch_of_each_bound_is_tried_in_steps(monkeypatch):
    """SPARSEDECODING_SP24_GROUPED_CTAS=timed: a grouped problem's launches under the one-CTA bound (the choice's
    fifth field) count as a build of their own, so the fastest of them is tried in whole steps though it sits outside
    `top` and `within`, and kept where its step is faster; no whole-build move (one early-trigger build)."""
    key = "gate_up"
    timings = {key: {(1, 1, False, 0, 2): 0.010, (2, 1, False, 0, 2): 0.0105, (1, 2, False, 0, 2): 0.011,
                     (1, 1, False, 0, 1): 0.016, (2, 1, False, 0, 1): 0.017}}
    step_cost = {key: {(1, 1, False, 0, 2): 1.00, (2, 1, False, 0, 2): 1.02, (1, 2, False, 0, 2): 1.01,
                       (1, 1, False, 0, 1): 0.95, (2, 1, False, 0, 1): 0.97}}
    current, timed = fake_kernel(monkeypatch, timings, {key: 32}, step_cost)
    (outcome,) = step_tune.tune_step(FakeEngine(current), top=2, within=1.5, rounds=1)
    assert list(outcome.step_ms) == [(1, 1, False, 0, 2), (2, 1, False, 0, 2), (1, 1, False, 0, 1)]
    assert outcome.before == (1, 1, False, 0, 2) and outcome.chosen == (1, 1, False, 0, 1)
    assert current == {key: (1, 1, False, 0, 1)} and outcome.line().endswith("kept 1+1c")
