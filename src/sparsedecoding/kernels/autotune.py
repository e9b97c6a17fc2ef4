"""Choose the launch configuration of the Triton kernel per problem by timing a few candidates on first use.

Candidates fix rows per program, words per loop step and warps, and take split-K from the grid size: the
smallest power of two that gives every SM at least two programs (and its double), as long as every split
still runs two or more loop steps. Timing uses `triton.testing.do_bench` (median, L2 flushed between calls) on
the caller's tensors and includes the whole launch (the float32 copy of x for batches above 1 too). Results are
kept per device, shape, batch, values per word and dtype; a CUDA-graph capture that meets an untuned problem
raises instead of timing inside the capture."""

from __future__ import annotations

import logging

import torch
import triton

from ..errors import KernelInputError
from .format import values_per_word
from .triton_spmv import SpmvConfig, launch

log = logging.getLogger(__name__)

# (rows per program, words per loop step, warps): 32 rows put a warp's lanes on 32 rows of one word, so an x
# gather touches one word's columns; 16 rows trade that for twice the programs.
_TILES = ((32, 8, 4), (32, 16, 4), (16, 16, 4))
_MAX_SPLIT_K = 16
_WARMUP_MS, _REP_MS = 2, 10

_tuned: dict[tuple, SpmvConfig] = {}
_timings: dict[tuple, dict[SpmvConfig, float]] = {}  # milliseconds of every candidate timed


def problem_key(x: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> tuple:
    out_features, words = bitmask.shape
    return (str(x.device), out_features, words, x.shape[0], values_per_word(n, m), str(x.dtype))


def candidate_configs(out_features: int, words: int, batch: int, sm_count: int) -> list[SpmvConfig]:
    """The configurations worth timing for one problem (see the module docstring)."""
    configs = []
    for rows, block_words, warps in _TILES:
        row_blocks = triton.cdiv(out_features, rows)
        most = 1  # the largest power-of-two split that leaves every split two loop steps
        while most < _MAX_SPLIT_K and words >= 2 * block_words * (2 * most):
            most *= 2
        split = 1
        while row_blocks * split < 2 * sm_count and split < most:
            split *= 2
        for split_k in sorted({split, min(2 * split, most)}):
            configs.append(SpmvConfig(rows, block_words, split_k, warps))
    return configs


def tuned_config(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> SpmvConfig:
    """The fastest candidate for this problem, timed on first use."""
    key = problem_key(x, bitmask, n, m)
    config = _tuned.get(key)
    if config is not None:
        return config
    if torch.cuda.is_current_stream_capturing():
        raise KernelInputError(f"nm_spmv is not tuned for {key} yet; run it once on this shape and batch "
                               "before capturing a CUDA graph")
    out_features, words = bitmask.shape
    sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
    timings = {}
    for candidate in candidate_configs(out_features, words, x.shape[0], sm_count):
        timings[candidate] = triton.testing.do_bench(
            lambda: launch(x, values, bitmask, n, m, candidate), warmup=_WARMUP_MS, rep=_REP_MS,
            return_mode="median")
    config = min(timings, key=timings.get)
    log.debug("nm_spmv %s: %s (%.2f us)", key, config, timings[config] * 1e3)
    _tuned[key] = config
    _timings[key] = timings
    return config


def tuning_results() -> dict[tuple, tuple[SpmvConfig, dict[SpmvConfig, float]]]:
    """For every problem tuned so far: the chosen configuration and each candidate's median time in ms."""
    return {key: (config, dict(_timings[key])) for key, config in _tuned.items()}
