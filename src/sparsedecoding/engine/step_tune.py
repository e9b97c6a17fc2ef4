"""Choosing the 2:4 kernel's launches by whole decode steps (SPARSEDECODING_STEP_TUNE).

The sp24 tuner (`kernels.sp24.tuned_launch`) times each problem's correct candidate launches (split-K count and
slices) alone: one launch after another of the same problem, on weight copies past the L2. In a decode step each
launch follows another kernel, and programmatic launches overlap one kernel's start with the previous one's tail,
so the launch that is fastest alone need not be fastest in the step. `tune_step` takes, for each 2:4 problem a
captured decode step launches, the tuner's fastest few candidates, captures the step with each in turn, replays
it, and keeps the candidate whose step is fastest: one problem at a time, the one with the most kernel time first,
the others held at their current choice. Under SPARSEDECODING_SP24_EARLY_TRIGGER=timed (the default) the candidates
are launches in either build of the kernel (the trigger after a CTA's first requests, or after its main loop) where
the tuner timed both (`kernels.sp24.times_both_builds`), and the fastest of each build is always among those tried:
the early trigger lets the next linear's CTAs in beside this one's, so which build is faster depends on the kernels
around it, which only a whole step shows. And since it depends on them, one problem at a time can miss it: the 8B
preset's 2:4 + int4 step was 1.5% faster with every launch in the default build than with every launch in the
early one (results/timed_trigger_h200_8b_int4*.md), yet from all early, switching any one launch alone to the
default build made the step slower (results/step_tune_h200_8b_timed.md). So before going problem by problem, the
tuner compares whole steps with every problem at its fastest launch in each build against its picks as they stand,
and starts from the fastest (`BuildChoice`; on that int4 step at batch 1: every problem in the default build, then
the qkv and gate_up moved back to the early one, 1.086x the tuner's picks, results/step_tune_h200_8b_timed_builds.md).
Under SPARSEDECODING_STEP_TUNE_PAIRS=1 a last pass takes neighbouring problems two at a time (each problem and the
one launched after it, in launch order, the last with the first of the next layer) and times every pairing of a few
candidates of each (`PairChoice`), for moves one problem at a time cannot make: two tunings of the same kernels
ended 4.8% apart on the 8B preset's 2:4 + int4 step at batch 1 (results/handoff_h200_8b_int4_repeat.md, one process,
1.590 against 1.666 ms), differing in the o's build and the gate_up's slices. From the one-at-a-time picks the pass
gained 1.002 / 1.022 / 1.006x at batch 1 / 4 / 8 and did not reach that 1.590 ms
(results/step_pairs_h200_8b_int4.md), so it is off by default.
The choice is kept for the process, like the tuner's (every later engine with the same problem launches it), and is
reported as `StepChoice`s (after the `BuildChoice`; then the `PairChoice`s).

Replays write the KV cache at positions from the middle of the cache on and change the engine's token; tuning
runs when the engine is built, before any generation, whose prefill overwrites what it reads.

Under SPARSEDECODING_SP24_GROUPED_CTAS=timed (the default) a grouped-columns problem's launches under the one-CTA and
the two-CTA bound count as builds of their own in the one-at-a-time and pair passes (`_build_of`): the fastest under
each is always tried. The whole-build move stays the early trigger's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

Choice = tuple  # (splits, slices, early build, grid, grouped launch bound) of an sp24 launch (`sp24.Choice`)


@dataclass(frozen=True)
class StepChoice:
    """One problem's outcome: `launches` per decode step; `before` the launch it had (the tuner's pick, or an earlier
    step tuning's); `step_ms` the median decode-step time with each candidate tried; `chosen` the one kept."""

    key: tuple  # `kernels.sp24.problem_key`
    problem: str
    launches: int
    before: Choice
    step_ms: dict[Choice, float]
    chosen: Choice

    def line(self) -> str:
        tried = ", ".join(f"{_label(choice)} {ms:.4f} ms" for choice, ms in self.step_ms.items())
        return (f"{self.problem} ({self.launches} a step): before {_label(self.before)}; steps with {tried}; "
                f"kept {_label(self.chosen)}")


@dataclass(frozen=True)
class BuildChoice:
    """Under SPARSEDECODING_SP24_EARLY_TRIGGER=timed, the move made before the problems one at a time: `step_ms` the
    median decode-step time of each assignment tried, `picks` each assignment (problem -> launch): "tuner" the
    launches as they stood, "early" / "default" every problem at its fastest launch alone in that build of the
    kernel; `chosen` the one kept."""

    step_ms: dict[str, float]
    picks: dict[str, dict[tuple, Choice]]
    chosen: str

    def line(self) -> str:
        tried = ", ".join(f"{name} {ms:.4f} ms" for name, ms in self.step_ms.items())
        return f"every problem in one build: steps with {tried}; kept {self.chosen}"


@dataclass(frozen=True)
class PairChoice:
    """The pass over neighbouring problems (SPARSEDECODING_STEP_TUNE_PAIRS): `keys` / `problems` the two (the second
    launched after the first), `before` their launches as the pass found them, `step_ms` the median decode-step time
    of each pairing tried, `chosen` the one kept."""

    keys: tuple[tuple, tuple]
    problems: tuple[str, str]
    before: tuple[Choice, Choice]
    step_ms: dict[tuple[Choice, Choice], float]
    chosen: tuple[Choice, Choice]

    def line(self) -> str:
        def pair(choices: tuple[Choice, Choice]) -> str:
            return f"{_label(choices[0])} + {_label(choices[1])}"

        tried = ", ".join(f"{pair(choices)} {ms:.4f} ms" for choices, ms in self.step_ms.items())
        return (f"{self.problems[0]}, then {self.problems[1]}: before {pair(self.before)}; steps with {tried}; "
                f"kept {pair(self.chosen)}")


def _label(choice: Choice) -> str:
    from ..kernels.sp24 import choice_label

    return choice_label(choice)


def _build_of(choice: Choice) -> tuple:
    """The build a candidate runs in: its early trigger, and its grouped launch bound where the choice names one
    (`sp24.Choice`'s fifth field)."""
    return tuple(choice[2:3]) + tuple(choice[4:5])


def _step_ms(engine, graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Milliseconds per decode step over `replays` replays of `graph` from the middle of the cache."""
    length = engine.max_seq_len
    start = max(0, min(length // 2, length - replays))
    count = max(1, min(replays, length - start))
    engine.position.fill_(start)
    graph.replay()  # its first replay uploads the graph
    engine.position.fill_(start)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(count):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / count


def _timed_steps(engine, graphs: dict, replays: int, rounds: int) -> dict:
    """The median decode-step ms of each graph over `rounds` interleaved timings of `replays` steps."""
    times: dict = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            times[name].append(_step_ms(engine, graph, replays))
    return {name: statistics.median(values) for name, values in times.items()}


def _tune_builds(engine, timings: dict, replays: int, rounds: int, margin: float) -> BuildChoice | None:
    """The whole-build move (module docstring): None unless the tuner timed launches in both builds. Leaves the
    kept assignment chosen."""
    from ..kernels import sp24

    builds = {choice[2] for choice_timings in timings.values() for choice in choice_timings}
    if len(builds) < 2:
        return None
    picks = {"tuner": {key: sp24.chosen_launch(key) for key in timings}}
    for name, early in (("early", True), ("default", False)):  # timings are fastest first
        picks[name] = {key: next((choice for choice in choice_timings if choice[2] == early), picks["tuner"][key])
                       for key, choice_timings in timings.items()}
    graphs = {}
    for name, assignment in picks.items():
        for key, choice in assignment.items():
            sp24.choose_launch(key, choice)
        graphs[name] = engine.capture()
    medians = _timed_steps(engine, graphs, replays, rounds)
    fastest = min(medians, key=medians.get)
    chosen = fastest if medians[fastest] < (1 - margin) * medians["tuner"] else "tuner"
    for key, choice in picks[chosen].items():
        sp24.choose_launch(key, choice)
    return BuildChoice(medians, picks, chosen)


def _pair_pool(key: tuple, timings: dict[Choice, float], within: float, size: int) -> list[Choice]:
    """A problem's candidates in the pass over pairs: its launch now, then the fastest alone of each build the tuner
    timed, then the next fastest within `within` times the best; `size` at most."""
    from ..kernels import sp24

    best = min(timings.values())
    pool = [sp24.chosen_launch(key)]
    for build in sorted({_build_of(choice) for choice in timings}):  # timings are fastest first
        pool.append(next(choice for choice in timings if _build_of(choice) == build))
    pool += [choice for choice, ms in timings.items() if ms <= within * best]
    return list(dict.fromkeys(pool))[:size]


def _tune_pairs(engine, problems: dict, timings: dict, within: float, size: int, replays: int, rounds: int,
                margin: float) -> list[PairChoice]:
    """The pass over neighbouring problems (module docstring), the pairs with the most kernel time first."""
    from ..kernels import sp24

    keys = list(problems)  # in the order a step first launches them
    if len(keys) < 2:
        return []
    pairs = [(keys[i], keys[(i + 1) % len(keys)]) for i in range(len(keys) if len(keys) > 2 else 1)]
    cost = {key: problems[key] * min(timings[key].values()) for key in keys}
    outcomes = []
    for first, second in sorted(pairs, key=lambda pair: -(cost[pair[0]] + cost[pair[1]])):
        before = (sp24.chosen_launch(first), sp24.chosen_launch(second))
        pairings = [(a, b) for a in _pair_pool(first, timings[first], within, size)
                    for b in _pair_pool(second, timings[second], within, size)]
        if len(pairings) < 2:
            continue
        graphs = {}
        for a, b in pairings:
            sp24.choose_launch(first, a)
            sp24.choose_launch(second, b)
            graphs[(a, b)] = engine.capture()
        medians = _timed_steps(engine, graphs, replays, rounds)
        del graphs
        fastest = min(medians, key=medians.get)
        chosen = fastest if medians[fastest] < (1 - margin) * medians[before] else before
        sp24.choose_launch(first, chosen[0])
        sp24.choose_launch(second, chosen[1])
        outcomes.append(PairChoice((first, second), (sp24.problem_text(first), sp24.problem_text(second)), before,
                                   medians, chosen))
    return outcomes


def tune_step(engine, top: int = 4, within: float = 1.5, replays: int = 32, rounds: int = 3,
              margin: float = 0.003, pairs: bool | None = None,
              pair_pool: int = 3) -> list[StepChoice | BuildChoice | PairChoice]:
    """Picks each 2:4 problem's launch by decode-step time, as the module says, and leaves `engine.graph`
    captured with the picks. `top`: candidates tried a problem, the tuner's fastest first, each at most `within`
    times the tuner's best, and the fastest of each build the tuner timed (whatever `top` and `within`); `rounds`
    interleaved timings of `replays` steps each, their median compared. A candidate replaces the tuner's pick only
    if its step is more than `margin` (relative) faster. Returns one
    StepChoice per problem with more than one candidate tried, after the BuildChoice of the whole-build move where
    the tuner timed both builds (its "tuner" picks are the launches before any move); then, with `pairs` (default:
    SPARSEDECODING_STEP_TUNE_PAIRS), one PairChoice per pair of neighbouring problems with more than one pairing
    (`pair_pool` candidates each at most)."""
    from ..kernels import sp24
    from ..kernels.op import step_tune_pairs_setting

    with sp24.recording_problems() as problems:
        engine.graph = engine.capture()
    timings = {key: sp24.launch_timings(key) for key in problems}
    order = sorted(problems, key=lambda key: -problems[key] * min(timings[key].values()))
    build = _tune_builds(engine, timings, replays, rounds, margin)
    outcomes: list[StepChoice | BuildChoice] = [] if build is None else [build]
    for key in order:
        best = min(timings[key].values())
        candidates = [choice for choice, ms in timings[key].items() if ms <= within * best][:top]
        for build in {_build_of(choice) for choice in timings[key]}:  # timings are fastest first
            fastest = next(choice for choice in timings[key] if _build_of(choice) == build)
            if fastest not in candidates:
                candidates.append(fastest)
        current = sp24.chosen_launch(key)
        if current not in candidates:
            candidates.insert(0, current)
        if len(candidates) < 2:
            continue
        graphs = {}
        for choice in candidates:
            sp24.choose_launch(key, choice)
            graphs[choice] = engine.capture()
        medians = _timed_steps(engine, graphs, replays, rounds)
        fastest = min(medians, key=medians.get)
        chosen = fastest if medians[fastest] < (1 - margin) * medians[current] else current
        sp24.choose_launch(key, chosen)
        del graphs
        outcomes.append(StepChoice(key, sp24.problem_text(key), problems[key], current, medians, chosen))
    if pairs is None:
        pairs = step_tune_pairs_setting()
    if pairs:
        outcomes += _tune_pairs(engine, problems, timings, within, pair_pool, replays, rounds, margin)
    engine.graph = engine.capture()
    return outcomes
