"""Choose the launch configuration of the Triton kernel per problem by timing a few candidates on first use.

Candidates (`candidate_configs`) vary the lane layout (whole words or word halves per lane, words per warp),
rows per program, words per loop step, warps, split-K and, for batches above 1, the dtype of the transposed x.
They are compiled together on a thread pool, then each one's output is checked once against a float64 product
of the same packed weight; a candidate that fails to compile or to match is logged, kept out of the choice and
listed in `rejected_candidates()` (a kernel bug, never a silent substitute). Each candidate is timed as the
decoder runs it: replayed from a CUDA graph, round-robin over enough temporary copies of the weight that the L2
cache cannot serve them (median per launch, the copy of x for batches above 1 included); `do_bench`'s single
launches after an L2 flush add launch and write-back time that swamps the 4096-row shapes (benchmarks/KERNEL_NOTES.md,
v2). Results
are kept per device, shape, batch, values per word and dtype; a CUDA-graph capture that meets an untuned
problem raises instead of timing inside the capture."""

from __future__ import annotations

import logging
import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch
import triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from ..errors import KernelInputError
from .format import dense_from_parts, values_per_word
from .triton_spmv import SpmvConfig, compile_for, interpreted, launch

log = logging.getLogger(__name__)

_MAX_SPLIT_K = 16
_LAUNCHES_PER_REPLAY, _REPLAYS = 24, 5
_ROUNDS = 7  # `interleaved_replay_ms`: rounds over the candidates, one timed replay of each a round
_MAX_WEIGHT_COPIES = 8  # rotation copies beyond the caller's weight: at most 2·L2 bytes in all
# The same for the per-kernel tuners (`Tuner`) that time over copies: enough that a weight of 3 MB (a 16:32 int8
# linear of Qwen2.5-Coder-1.5B) is read past the L2; 8 copies kept such weights in it, and timed that way the
# nmq tuner picked launches up to 1.6x slower than the fastest (benchmarks/results/quant_kernel_h200_16of32_before.md)
_MAX_TUNER_COPIES = 40
_CHECK_CHUNK_ELEMENTS = 1 << 24  # densified weight elements per float64 check chunk: at most 128 MB
_COMPILE_THREADS = min(16, os.cpu_count() or 1)

# Tiles: (rows per program, words per loop step, warps, lanes per word, words of a row per warp). Word halves
# per lane (lanes per word 2) read whole 128-byte lines per quarter-warp and suit one batch row; whole words
# per lane keep a quarter-warp's x gathers on one line and suit wide batches (see triton_spmv).
# The widest tiles (64-128 words a step, 4 word halves a thread) put a 4096-row matrix's loads in flight in one
# or two rounds, which is what small shapes need.
_HALF_WORD_TILES = ((8, 16, 4, 2, 2), (4, 16, 4, 2, 4), (16, 16, 8, 2, 2), (8, 32, 8, 2, 4), (8, 64, 8, 2, 4),
                    (4, 128, 8, 2, 4))
_WHOLE_WORD_TILES = ((8, 16, 4, 1, 1), (16, 16, 4, 1, 1))

_tuned: dict[tuple, SpmvConfig] = {}
_timings: dict[tuple, dict[SpmvConfig, float]] = {}  # milliseconds of every candidate timed
_rejected: dict[tuple, dict[SpmvConfig, str]] = {}  # candidates that failed to compile or to match, and why


def problem_key(x: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> tuple:
    out_features, words = bitmask.shape
    return (str(x.device), out_features, words, x.shape[0], values_per_word(n, m), str(x.dtype))


def _splits(out_features: int, words: int, rows: int, block_words: int, sm_count: int) -> list[int]:
    """The smallest power-of-two split-K that gives every SM two programs, and its double, as long as every
    split keeps two or more loop steps."""
    row_blocks = triton.cdiv(out_features, rows)
    most = 1
    while most < _MAX_SPLIT_K and words >= 2 * block_words * (2 * most):
        most *= 2
    split = 1
    while row_blocks * split < 2 * sm_count and split < most:
        split *= 2
    return sorted({split, min(2 * split, most)})


def candidate_configs(out_features: int, words: int, batch: int, values_per_word: int,
                      sm_count: int) -> list[SpmvConfig]:
    """The configurations worth timing for one problem. Word halves need 32·N/M a multiple of 16 (every 50%
    pattern). Batch 1: the half-word tiles, and one whole-word tile. Wider batches: whole-word tiles with 16-bit
    x (faster than float32 x at batch 8), one with float32 x, and up to batch 4 one half-word tile with float32 x
    and every half-word tile with 16-bit x: at batch 2-4 one 4- or 8-byte x gather per value serves every batch
    row, so the batch-1 layouts can win there. The measurements behind this set: benchmarks/KERNEL_NOTES.md
    ("Why the tuner's candidate set")."""
    halves_fit = values_per_word % 16 == 0
    if batch == 1:
        tiles = [(t, True) for t in (_HALF_WORD_TILES if halves_fit else ()) + _WHOLE_WORD_TILES[1:]]
    else:
        tiles = [(t, False) for t in _WHOLE_WORD_TILES] + [(_WHOLE_WORD_TILES[0], True)]
        if halves_fit and batch <= 4:
            tiles += [(_HALF_WORD_TILES[0], True)] + [(t, False) for t in _HALF_WORD_TILES]
    configs = []
    for (rows, block_words, warps, word_lanes, warp_words), x_float32 in tiles:
        for split_k in _splits(out_features, words, rows, block_words, sm_count):
            configs.append(SpmvConfig(rows, block_words, split_k, warps, word_lanes, warp_words, x_float32))
    return configs


class Float64Reference:
    """x·Wᵀ in float64 (products of 16-bit floats are exact) and the error bound of one output: one unit of
    y's last place (any rounding mode) + twice the worst case of an fp32 sum of `in` products
    (2·in·2⁻²⁴·Σ|w·x|). A correct kernel stays within it; a wrong column or a lost word lands far outside."""

    def __init__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor):
        self._build(x, bitmask.shape[0], lambda r0, r1: dense_from_parts(values[r0:r1], bitmask[r0:r1]).double())

    @classmethod
    def of_rows(cls, x: torch.Tensor, rows: int,
                weight_rows: Callable[[int, int], torch.Tensor]) -> Float64Reference:
        """The same for a weight given by `weight_rows(r0, r1)`: its rows r0..r1 in float64 (a dense weight times
        its scales, say), built a chunk at a time like the packed one."""
        reference = cls.__new__(cls)
        reference._build(x, rows, weight_rows)
        return reference

    def _build(self, x: torch.Tensor, rows: int, weight_rows: Callable[[int, int], torch.Tensor]) -> None:
        x64 = x.double()
        chunk = max(1, _CHECK_CHUNK_ELEMENTS // x.shape[1])
        exact, magnitude = [], []
        for r0 in range(0, rows, chunk):
            weight = weight_rows(r0, min(r0 + chunk, rows))
            exact.append(x64 @ weight.T)
            magnitude.append(x64.abs() @ weight.abs().T)
        self.exact = torch.cat(exact, dim=1)
        self.magnitude = torch.cat(magnitude, dim=1)  # Σ|w·x| per output
        info = torch.finfo(x.dtype)
        self.bound = info.eps * self.exact.abs() + 2 * x.shape[1] * 2.0**-24 * self.magnitude + info.tiny

    def error(self, y: torch.Tensor) -> float:
        """Largest |y - x·Wᵀ| / bound (≤ 1 passes; NaN fails)."""
        return float(((y.double() - self.exact).abs() / self.bound).max())


def output_error(y: torch.Tensor, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> float:
    """Largest |y - x·Wᵀ| / bound of `Float64Reference` for one output."""
    return Float64Reference(x, values, bitmask).error(y)


def compile_failure(exc: Exception) -> str:
    """A candidate's rejection reason for a Triton compile error: its type and last line."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"


def passing_candidates(kernel: str, key: tuple, candidates: list, rejected: dict) -> list:
    """The candidates not in `rejected` (candidate -> reason), in order, after logging every rejection as an
    error; RuntimeError when none is left."""
    for candidate, reason in rejected.items():
        log.error("%s %s: candidate %s is not used: %s", kernel, key, candidate, reason)
    passed = [c for c in candidates if c not in rejected]
    if not passed:
        raise RuntimeError(f"{kernel}: no candidate configuration compiled and matched float64 for {key}: "
                           f"{ {str(c): r for c, r in rejected.items()} }")
    return passed


# (a weight's tensors, run_on(candidate, tensors)): what `fastest_correct` times a candidate on, over copies
Rotation = tuple[tuple[torch.Tensor, ...], Callable[[object, tuple[torch.Tensor, ...]], object]]


def fastest_correct(kernel: str, key: tuple, candidates: list, run: Callable[[object], torch.Tensor],
                    reference: Float64Reference, rejected_store: dict, rotation: Rotation | None = None) -> object:
    """The fastest of the `candidates` whose output `run(candidate)` compiles and matches the float64 `reference`;
    the others go into `rejected_store[key]` with the reason and are logged (`passing_candidates`), never used.
    With a `rotation`, each is timed as the decoder runs it: replayed from a CUDA graph round-robin over copies of
    the weight's tensors past the L2 (`replay_ms`); without one, by triton's do_bench. `Tuner` calls it for the
    per-kernel tuners."""
    rejected = {}
    for config in candidates:
        try:
            error = reference.error(run(config))
        except (CompilationError, OutOfResources) as exc:
            rejected[config] = compile_failure(exc)
            continue
        if not error <= 1:  # NaN fails too
            rejected[config] = f"output off by {error:.3g} x the float64 bound"
    rejected_store[key] = rejected
    passed = passing_candidates(kernel, key, candidates, rejected)
    if rotation is None:
        times = {config: triton.testing.do_bench(lambda config=config: run(config)) for config in passed}
    else:
        tensors, run_on = rotation
        weights = weight_copies(tensors, _MAX_TUNER_COPIES)
        times = {config: replay_ms(lambda weight, config=config: run_on(config, weight), weights)
                 for config in passed}
        del weights
    best = min(times, key=times.get)
    log.debug("%s %s: %s (%.4f ms)", kernel, key, best, times[best])
    return best


class Tuner:
    """One kernel's choices, problem by problem (a key of device, shape, batch, dtype, ...): the fastest candidate
    that compiles and matches float64 (`fastest_correct`), chosen on first use and kept; under the Triton
    interpreter the first candidate, untimed. The tuners of `triton_nmq` (timed over weight copies in CUDA
    graphs), `triton_w8`, `triton_w4` and `triton_overflow` (timed by do_bench) are instances."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.chosen: dict[tuple, object] = {}
        self.rejected: dict[tuple, dict] = {}  # candidates that failed to compile or to match, and why

    def config(self, key: tuple, candidates: Callable[[], list], run: Callable[[object], torch.Tensor],
               reference: Callable[[], Float64Reference], rotation: Callable[[], Rotation] | None = None) -> object:
        """The choice for `key`; on first use `candidates()` are checked with `run(candidate)` against
        `reference()` and timed (over weight copies in CUDA graphs with a `rotation()`: `fastest_correct`)."""
        if key not in self.chosen:
            listed = candidates()
            self.chosen[key] = listed[0] if interpreted() else fastest_correct(
                self.kernel, key, listed, run, reference(), self.rejected,
                None if rotation is None else rotation())
        return self.chosen[key]

    def rejected_candidates(self) -> dict[tuple, dict]:
        """For every problem tuned so far: the candidates that failed to compile or to match float64, and why."""
        return {key: dict(rejected) for key, rejected in self.rejected.items() if rejected}


def weight_copies(tensors: tuple[torch.Tensor, ...], max_copies: int) -> list[tuple[torch.Tensor, ...]]:
    """The caller's tensors and as many temporary copies (at most `max_copies`) as a round over them needs to read
    2x the L2 cache."""
    l2_bytes = torch.cuda.get_device_properties(tensors[0].device).L2_cache_size
    weight_bytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    copies = min(max_copies, math.ceil(2 * l2_bytes / weight_bytes) - 1)
    return [tensors] + [tuple(tensor.clone() for tensor in tensors) for _ in range(copies)]


def replay_ms(call: Callable[[object], object], weights: list) -> float:
    """Median milliseconds per launch of a CUDA graph that calls `call(weight)` round-robin over `weights` (at least
    _LAUNCHES_PER_REPLAY launches a replay; _REPLAYS timed replays after an untimed one that uploads the graph):
    `interleaved_replay_ms` of the one call."""
    return interleaved_replay_ms([call], weights, _REPLAYS)[0]


def interleaved_replay_ms(calls: list[Callable[[object], object]], weights: list,
                          rounds: int = _ROUNDS) -> list[float]:
    """For each of `calls`, the median over `rounds` rounds of its milliseconds per launch in a CUDA graph that calls
    it round-robin over `weights` (at least _LAUNCHES_PER_REPLAY launches a replay; one graph a call, captured and
    uploaded first). A round replays every graph once, back to back, starting one call later each round: a drift of
    the clocks or of the memory traffic around falls on every call alike, where timing the calls one after another
    lets it fall on whichever is timed then."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1; got {rounds}")
    if not calls:
        return []
    sequence = [weights[i % len(weights)] for i in range(max(_LAUNCHES_PER_REPLAY, len(weights)))]
    graphs = []
    for call in calls:
        graph = torch.cuda.CUDAGraph()
        # thread_local: tuning can run during a tensor-parallel engine's warm-up, while NCCL's watchdog thread polls
        # events; in the default global mode such a call from another thread invalidates the capture (as in
        # `engine.generate.Engine._capture`)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for weight in sequence:
                call(weight)
        graph.replay()  # uploads the graph; untimed
        graphs.append(graph)
    times: list[list[float]] = [[] for _ in calls]
    for first in range(rounds):
        events = []
        for i in [(first + j) % len(calls) for j in range(len(calls))]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[i].replay()
            end.record()
            events.append((i, start, end))
        events[-1][2].synchronize()
        for i, start, end in events:
            times[i].append(start.elapsed_time(end) / len(sequence))
    return [statistics.median(t) for t in times]


def _graph_time(x: torch.Tensor, weights: list[tuple[torch.Tensor, torch.Tensor]], n: int, m: int,
                config: SpmvConfig) -> float:
    """Median milliseconds per launch of a CUDA graph that calls `config` round-robin over `weights`."""
    return replay_ms(lambda weight: launch(x, *weight, n, m, config), weights)


def _compile_all(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                 candidates: list[SpmvConfig]) -> dict[SpmvConfig, str]:
    """Compile every candidate on a thread pool; the ones Triton cannot build, with the reason."""
    def build(config: SpmvConfig) -> str | None:
        try:
            compile_for(x, values, bitmask, n, m, config)
        except (CompilationError, OutOfResources) as exc:
            return compile_failure(exc)
        return None

    with ThreadPoolExecutor(_COMPILE_THREADS) as pool:
        failures = dict(zip(candidates, pool.map(build, candidates)))
    return {config: reason for config, reason in failures.items() if reason is not None}


def tuned_config(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> SpmvConfig:
    """The fastest correct candidate for this problem, compiled, checked and timed on first use."""
    key = problem_key(x, bitmask, n, m)
    config = _tuned.get(key)
    if config is not None:
        return config
    if torch.cuda.is_current_stream_capturing():
        raise KernelInputError(f"nm_spmv is not tuned for {key} yet; run it once on this shape and batch "
                               "before capturing a CUDA graph")
    out_features, words = bitmask.shape
    sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
    candidates = candidate_configs(out_features, words, x.shape[0], values_per_word(n, m), sm_count)
    rejected: dict[SpmvConfig, str] = _compile_all(x, values, bitmask, n, m, candidates)
    reference = Float64Reference(x, values, bitmask)
    for candidate in candidates:
        if candidate not in rejected:
            error = reference.error(launch(x, values, bitmask, n, m, candidate))
            if not error <= 1:  # NaN fails too
                rejected[candidate] = f"output off by {error:.3g} x the float64 bound"
    _rejected[key] = rejected
    passed = passing_candidates("nm_spmv", key, candidates, rejected)
    weights = weight_copies((values, bitmask), _MAX_WEIGHT_COPIES)
    timings = {candidate: _graph_time(x, weights, n, m, candidate) for candidate in passed}
    del weights
    config = min(timings, key=timings.get)
    log.debug("nm_spmv %s: %s (%.2f us)", key, config, timings[config] * 1e3)
    _tuned[key] = config
    _timings[key] = timings
    return config


def tuning_results() -> dict[tuple, tuple[SpmvConfig, dict[SpmvConfig, float]]]:
    """For every problem tuned so far: the chosen configuration and each candidate's median time in ms."""
    return {key: (config, dict(_timings[key])) for key, config in _tuned.items()}


def rejected_candidates() -> dict[tuple, dict[SpmvConfig, str]]:
    """For every problem tuned so far: the candidates that failed to compile or to match float64, and why."""
    return {key: dict(rejected) for key, rejected in _rejected.items() if rejected}
