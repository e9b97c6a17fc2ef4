"""One-shot pruning and quantization solvers. Each takes a weight W [out, in], the layer Hessian H [in, in] of the
reconstruction loss ‖W·X − Ŵ·X‖² (H = 2·X·Xᵀ/N) and a sparsity pattern (or a quantization, for GPTQ), and returns
the new weight in W's dtype. A solver never knows where H came from.

Quantized results stay weights: kept values lie on a symmetric grid code·scale (int8: codes −128..127, one scale
per output row; int4: codes −8..7, one scale per row and group of `group_size` input columns). Scales are rounded up
to few significant bits so that every code·scale is exact in bfloat16, whatever W's dtype (a pruned checkpoint is
saved in its source dtype, usually bfloat16, and must stay on the grid): bfloat16 holds 8 significant bits, codes
take up to 7 (int8) or 3 (int4), which leaves 1 for int8 scales (powers of two) and 5 for int4 scales.
`quantization_codes` recovers codes and scales from such a weight, so a quantized checkpoint needs no side files."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch

from .errors import CalibrationError, QuantizationError, SolverSettingsError, SparsityPatternError
from .patterns import SparsityPattern
from .settings import ADMM_PRODUCTS, ADMM_SPLITS, SOLVER_ORDERS

log = logging.getLogger(__name__)

PLACED_TILE_ROWS = 16  # placements (SparsityPattern.placement) are per 16-row tile: rows g and g + 8 share a quad
PLACED_GROUPS = 8  # groups of four columns in a placed pattern's 32-column word
MAX_DAMPING = 1.0  # relative to the mean diagonal; beyond this H is too far from PD to trust the result


def check_inputs(weight: torch.Tensor, hessian: torch.Tensor | None, uses: str = "full") -> None:
    """SolverSettingsError unless `weight` is a finite floating [out, in] tensor with values (not on the meta device)
    and, where the solver reads it (`uses` "full" or "diagonal"), `hessian` an [in, in] floating tensor
    (CalibrationError where the part read holds NaN or inf). Checked up front, so that a wrong argument is named
    rather than surfacing as an index error deep in the solve, or as NaN spread through the result."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        described = f"{tuple(weight.shape)} {weight.dtype}" if isinstance(weight, torch.Tensor) else type(weight)
        raise SolverSettingsError(f"weight must be a 2-D floating-point tensor [out, in], got {described}")
    if weight.is_meta:
        raise SolverSettingsError("weight is on the meta device and has no values; load the weights first")
    if weight.shape[1] == 0:
        raise SolverSettingsError(f"weight {tuple(weight.shape)} has no input columns to prune")
    if not bool(torch.isfinite(weight).all()):
        raise SolverSettingsError("weight holds NaN or inf; prune a finite checkpoint")
    if uses == "none":
        return
    columns = weight.shape[1]
    if not isinstance(hessian, torch.Tensor) or hessian.shape != (columns, columns) or \
            not hessian.is_floating_point():
        described = f"{tuple(hessian.shape)} {hessian.dtype}" if isinstance(hessian, torch.Tensor) else type(hessian)
        raise SolverSettingsError(f"hessian must be a floating-point [{columns}, {columns}] tensor for a weight of "
                                  f"{columns} input columns, got {described}")
    if hessian.is_meta:
        raise SolverSettingsError("hessian is on the meta device and has no values; build it from real inputs")
    read = hessian.diagonal() if uses == "diagonal" else hessian
    if not bool(torch.isfinite(read).all()):
        raise CalibrationError("the Hessian holds NaN or inf; calibrate again (a layer input was not finite)")


def check_pattern(weight: torch.Tensor, pattern: SparsityPattern) -> None:
    if pattern.is_nm and weight.shape[1] % pattern.m != 0:
        raise SparsityPatternError(f"{pattern} needs in_features divisible by {pattern.m}, got {weight.shape[1]}")
    if pattern.placement and weight.shape[0] % PLACED_TILE_ROWS:
        raise SparsityPatternError(f"{pattern} places weights per {PLACED_TILE_ROWS}-row tile; this weight has "
                                   f"{weight.shape[0]} rows")


def placement_breaks(kept: torch.Tensor, pattern: SparsityPattern) -> int:
    """How many (row, word) pairs (lanes) or (quad, word) pairs (quads) of the mask `kept` [rows, cols] break the
    pattern's placement (also counting any group of four that keeps all four); 0 without a placement."""
    if not pattern.placement:
        return 0
    rows, cols = kept.shape
    fours = kept.reshape(rows, cols // 32, PLACED_GROUPS, 4).sum(-1)
    extra = (fours - 2).clamp(min=0)  # [rows, words, 8]
    full = fours.max(-1).values > 3
    if pattern.placement == "groups":  # (tile, word) pairs whose mask no split into groups of four fits
        rows_per = split_rows_of(pattern)
        words = kept.reshape(rows // rows_per, rows_per, cols // 32, 32).transpose(1, 2).reshape(-1, rows_per, 32)
        return int((~grouped_order_of(words)[1]).sum())
    if pattern.placement == "lanes":
        half = (torch.arange(rows, device=kept.device) % PLACED_TILE_ROWS // (PLACED_TILE_ROWS // 2)).view(rows, 1)
        bad = full
        for cls in range(4):
            used = extra[:, :, cls] + extra[:, :, cls + 4]
            bad = bad | (used > 1) | (used.bool() & (cls != half) & (cls != half + 2))
        return int(bad.sum())
    tiles = extra.reshape(rows // PLACED_TILE_ROWS, 2, PLACED_TILE_ROWS // 2, cols // 32, PLACED_GROUPS)
    by_class = tiles.sum(1).reshape(rows // PLACED_TILE_ROWS, PLACED_TILE_ROWS // 2, cols // 32, 2, 4).sum(3)
    quad_full = full.reshape(rows // PLACED_TILE_ROWS, 2, PLACED_TILE_ROWS // 2, cols // 32).any(1)
    return int(((by_class > 1).any(-1) | quad_full).sum())


def check_kept_zeros(weight: torch.Tensor, pattern: SparsityPattern) -> None:
    """`keep_zeros` keeps a weight's zeros as its mask, so they must already form the N:M pattern: at least M − N
    zeros in every group of M columns (SparsityPatternError otherwise, naming how many groups fall short)."""
    if not pattern.is_nm:
        raise SparsityPatternError(f"keeping the existing mask needs an N:M pattern (the kernel's format); got "
                                   f"{pattern}")
    zeros = (weight == 0).view(weight.shape[0], -1, pattern.m).sum(-1)
    short = int((zeros < pattern.m - pattern.n).sum())
    if short:
        raise SparsityPatternError(f"keeping the existing mask needs a {pattern} sparse weight, but {short} groups of "
                                   f"{pattern.m} columns have fewer than {pattern.m - pattern.n} zeros: prune the "
                                   "model first (this weight is not pruned, or was pruned with another pattern)")
    if pattern.overflow >= 0:  # N:M+K: at most K nonzeros beyond two in the groups of 4 of each group of M
        beyond = ((weight != 0).view(weight.shape[0], -1, 4).sum(-1) - 2).clamp_min(0)
        over = int((beyond.view(weight.shape[0], -1, pattern.m // 4).sum(-1) > pattern.overflow).sum())
        if over:
            raise SparsityPatternError(f"keeping the existing mask needs a {pattern} sparse weight, but {over} groups "
                                       f"of {pattern.m} columns keep more than {pattern.overflow} weights beyond two "
                                       "in a group of 4: prune the model with this pattern first")
    breaks = placement_breaks(weight != 0, pattern)
    if breaks:
        raise SparsityPatternError(f"keeping the existing mask needs a {pattern} sparse weight, but {breaks} of its "
                                   f"words break the {pattern.placement} placement: prune the model with this "
                                   "pattern first")


# ADMM's projection (`projection`) ranks groups of at most this many columns by pairwise comparison (`group_ranks`)
# rather than by `topk`, which is slow along a short last dimension: on the H100 the 2:4 projection of
# Llama-3.1-8B's stacked gate/up weight took 54 ms by `topk` and 6 ms ranked (16:32 by `topk`: 8 ms;
# benchmarks/results/admm_parts_h100*.md), and ADMM projects once an iteration. SparseGPT's loop keeps `topk`: it
# masks one block of columns at a time, where the ranking's extra launches cost more than they save.
SMALL_GROUP = 8


def group_ranks(groups: torch.Tensor) -> torch.Tensor:
    """Each entry's rank within its group along the last dimension, 0 for the largest: the count of entries in the
    group that are larger, or equal and earlier (ties go to the lower index). One comparison pass per group member."""
    m = groups.shape[-1]
    position = torch.arange(m, device=groups.device)
    ranks = torch.zeros(groups.shape, dtype=torch.uint8, device=groups.device)
    for j in range(m):
        other = groups[..., j:j + 1]
        ranks += (other > groups) | ((other == groups) & (position > j))
    return ranks


def projection(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """`keep_mask`'s mask, plain N:M groups of at most `SMALL_GROUP` columns ranked by `group_ranks` (the same mask
    where a group's scores are distinct; ties go to the lower index)."""
    if pattern.is_nm and pattern.m <= SMALL_GROUP and pattern.overflow < 0 and not pattern.placement:
        rows, cols = score.shape
        return (group_ranks(score.reshape(rows, cols // pattern.m, pattern.m)) < pattern.n).reshape(rows, cols)
    return keep_mask(score, pattern)


def keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """Boolean mask of kept entries: the N largest scores in each group of M consecutive columns of a row, or the
    (1 − sparsity) largest of each row for unstructured patterns; with an `overflow` limit, `capped_keep_mask`; with
    a `placement`, `lane_placed_keep_mask`, `quad_placed_keep_mask` or `grouped_keep_mask`."""
    rows, cols = score.shape
    if pattern.placement == "groups":
        return grouped_keep_mask(score, pattern)
    if pattern.placement:
        return (lane_placed_keep_mask if pattern.placement == "lanes" else quad_placed_keep_mask)(score, pattern)
    if pattern.is_nm and pattern.overflow >= 0:
        return capped_keep_mask(score, pattern)
    if pattern.is_nm:
        groups = score.reshape(rows, cols // pattern.m, pattern.m)
        kept = torch.zeros_like(groups, dtype=torch.bool)
        kept.scatter_(2, groups.topk(pattern.n, dim=2).indices, True)
        return kept.reshape(rows, cols)
    n_pruned = math.floor(cols * pattern.sparsity + 1e-9)  # 100 · 0.29 is 28.999…: still 29 columns
    kept = torch.ones_like(score, dtype=torch.bool)
    if n_pruned:
        kept.scatter_(1, score.topk(n_pruned, dim=1, largest=False).indices, False)
    return kept


def capped_keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """The N:M+K mask of largest total score: in each group of M columns of a row, N kept, at most 2 in each group of
    4 columns except for at most K (`pattern.overflow`) kept beyond 2 in the group of M. Greedy in falling score
    order, which is optimal here: the allowed sets are the independent sets of a matroid (each column takes one of
    its group of 4's two own slots or one of the K shared ones, at most two shared a group of 4, N in all)."""
    rows, cols = score.shape
    m, n, cap = pattern.m, pattern.n, pattern.overflow
    groups = score.reshape(-1, m)  # one row per group of M columns
    order = groups.argsort(dim=1, descending=True)
    kept = torch.zeros_like(groups, dtype=torch.bool)
    per_four = torch.zeros(groups.shape[0], m // 4, dtype=torch.int64, device=score.device)
    total = torch.zeros(groups.shape[0], dtype=torch.int64, device=score.device)
    over = torch.zeros_like(total)
    for rank in range(m):
        column = order[:, rank]
        four = (column // 4).unsqueeze(1)
        held = per_four.gather(1, four).squeeze(1)
        takes = (total < n) & ((held < 2) | ((held < 4) & (over < cap)))
        kept.scatter_(1, column.unsqueeze(1), takes.unsqueeze(1))
        per_four.scatter_add_(1, four, takes.long().unsqueeze(1))
        over += takes & (held >= 2)
        total += takes
    return kept.reshape(rows, cols)


def lane_placed_keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """`capped_keep_mask` for 16:32+2l: row r (h = 1 for rows 8-15 of its 16-row tile) may keep a third weight in a
    group of four only in one group of {h, h + 4} and one of {h + 2, h + 6}, never a fourth. Greedy as there, still
    optimal (each kept column takes one of its group's two places or its row's one place of the group's class)."""
    rows, cols = score.shape
    m, n = pattern.m, pattern.n
    groups = score.reshape(-1, m)
    words = cols // m
    half = (torch.arange(groups.shape[0], device=score.device) // words) % PLACED_TILE_ROWS // (PLACED_TILE_ROWS // 2)
    order = groups.argsort(dim=1, descending=True)
    kept = torch.zeros_like(groups, dtype=torch.bool)
    per_four = torch.zeros(groups.shape[0], PLACED_GROUPS, dtype=torch.int64, device=score.device)
    per_class = torch.zeros(groups.shape[0], 4, dtype=torch.int64, device=score.device)  # slots used, by group % 4
    total = torch.zeros(groups.shape[0], dtype=torch.int64, device=score.device)
    for rank in range(m):
        column = order[:, rank]
        four = column // 4
        held = per_four.gather(1, four.unsqueeze(1)).squeeze(1)
        cls = four % 4
        allowed = (cls == half) | (cls == half + 2)
        free = per_class.gather(1, cls.unsqueeze(1)).squeeze(1) == 0
        overflow = (held == 2) & allowed & free
        takes = (total < n) & ((held < 2) | overflow)
        kept.scatter_(1, column.unsqueeze(1), takes.unsqueeze(1))
        per_four.scatter_add_(1, four.unsqueeze(1), takes.long().unsqueeze(1))
        per_class.scatter_add_(1, cls.unsqueeze(1), (takes & overflow).long().unsqueeze(1))
        total += takes
    return kept.reshape(rows, cols)


def quad_placed_keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """The mask for 16:32+4q: rows g and g + 8 of a 16-row tile share four places a word, one a group class (group
    index mod 4), each taking a weight beyond two in a group of four of either row; 16 kept a row and word. Greedy
    over the pair's 64 columns in falling score order (the allowed sets are still a matroid: optimal). Needs a
    multiple of 16 rows."""
    rows, cols = score.shape
    m, n = pattern.m, pattern.n
    words = cols // m
    # [tile, half, g, word, 32] -> pairs [tile, g, word] x [half, 32]
    tile, half_rows = rows // PLACED_TILE_ROWS, PLACED_TILE_ROWS // 2
    pairs = score.reshape(tile, 2, half_rows, words, m).permute(0, 2, 3, 1, 4).reshape(-1, 2 * m)
    order = pairs.argsort(dim=1, descending=True)
    kept = torch.zeros_like(pairs, dtype=torch.bool)
    # kept so far by (half, group)
    per_four = torch.zeros(pairs.shape[0], 2 * PLACED_GROUPS, dtype=torch.int64, device=score.device)
    per_class = torch.zeros(pairs.shape[0], 4, dtype=torch.int64, device=score.device)
    total = torch.zeros(pairs.shape[0], 2, dtype=torch.int64, device=score.device)
    for rank in range(2 * m):
        column = order[:, rank]
        half, four = column // m, column % m // 4
        held = per_four.gather(1, (half * PLACED_GROUPS + four).unsqueeze(1)).squeeze(1)
        cls = four % 4
        free = per_class.gather(1, cls.unsqueeze(1)).squeeze(1) == 0
        overflow = (held == 2) & free
        room = total.gather(1, half.unsqueeze(1)).squeeze(1) < n
        takes = room & ((held < 2) | overflow)
        kept.scatter_(1, column.unsqueeze(1), takes.unsqueeze(1))
        per_four.scatter_add_(1, (half * PLACED_GROUPS + four).unsqueeze(1), takes.long().unsqueeze(1))
        per_class.scatter_add_(1, cls.unsqueeze(1), (takes & overflow).long().unsqueeze(1))
        total.scatter_add_(1, half.unsqueeze(1), takes.long().unsqueeze(1))
    return kept.reshape(tile, half_rows, words, 2, m).permute(0, 3, 1, 2, 4).reshape(rows, cols)


GROUP_SWAPS = [(i, j) for i in range(32) for j in range(i + 1, 32) if i // 4 != j // 4]  # 448 swaps across groups
GROUP_SEARCH_ROUNDS = 64  # best-improvement swaps a word at most (a random 16x32 word settles in about 15-25)
_GROUP_CHUNK = 512  # words searched at once: 512 x 448 swaps x 16 rows x 8 scores in float32 is about 117 MB
_GROUP_CHUNK_CUDA = 8192  # on a GPU (about 1.9 GB), where fewer, larger launches are what saves time
# SPARSEDECODING_GROUPED_SEARCH: how `grouped_partition` runs its rounds. "triton": one launch of
# `kernels.triton_grouped_search` for every word's every round (CUDA, or the Triton interpreter), the torch search's
# swaps and sums but for the order of the sums over rows and groups; "torch": all words' rounds in torch, chunk by
# chunk; "auto" (unset): triton on CUDA, torch elsewhere. Measured side by side on an H100
# (results/grouped_search_h100.md, ADMM 16:32g, 100 iterations, Qwen2.5-Coder-1.5B's shapes): 1.99-7.64x faster a
# linear, 2.80x over the model's 28 layers (556 s -> 199 s of ADMM), masks agreeing in 99.3-99.8% of entries with
# layer losses 0.998-1.002x the torch search's.
GROUPED_SEARCH_SETTING = "SPARSEDECODING_GROUPED_SEARCH"
GROUPED_SEARCH_CHOICES = ("auto", "torch", "triton")


def grouped_search_setting(device: torch.device) -> str:
    """The search SPARSEDECODING_GROUPED_SEARCH picks for scores on `device`: "triton" or "torch" ("auto", unset or
    empty: triton on CUDA). SolverSettingsError for another value, or for "triton" where the kernel cannot run (a
    CPU outside the Triton interpreter)."""
    value = os.environ.get(GROUPED_SEARCH_SETTING, "").strip().lower() or "auto"
    if value not in GROUPED_SEARCH_CHOICES:
        raise SolverSettingsError(f"{GROUPED_SEARCH_SETTING}={value!r}; use auto (triton on CUDA, else torch), "
                                  "torch (the split search in torch) or triton (one Triton kernel, CUDA or "
                                  "TRITON_INTERPRET=1)")
    if value == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if value == "triton":
        from .kernels import triton_grouped_search
        if not triton_grouped_search.available(device):
            raise SolverSettingsError(f"{GROUPED_SEARCH_SETTING}=triton runs on CUDA or under TRITON_INTERPRET=1; "
                                      f"these scores are on {device}")
    return value


def _top_two(x: torch.Tensor) -> torch.Tensor:
    """The sum of the two largest of the last dimension (of four), by elementwise max and min (`topk` along a
    dimension of four is slow, on the CPU most of all): the largest is the larger pair maximum, the second the larger
    of the smaller pair maximum and the larger pair minimum."""
    a, b, c, d = x.unbind(-1)
    high1, high2 = torch.maximum(a, b), torch.maximum(c, d)
    low = torch.maximum(torch.minimum(a, b), torch.minimum(c, d))
    return torch.maximum(high1, high2) + torch.maximum(torch.minimum(high1, high2), low)


_OTHERS = ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2))  # each entry of a group of four: the other three


def _others_top_two(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each entry of each group of four (`grouped` [..., 8, 4]): the sum of the two largest of the group's other
    three entries, and the second largest of them; both flattened to [..., 32] by position."""
    others = grouped[..., torch.tensor(_OTHERS, device=grouped.device)]  # [..., 8, 4, 3]
    a, b, c = others.unbind(-1)
    high, low = torch.maximum(a, b), torch.minimum(a, b)
    largest = torch.maximum(high, c)
    second = torch.maximum(low, torch.minimum(high, c))
    return (largest + second).flatten(-2), second.flatten(-2)


def grouped_fit(words: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Σ over rows and groups of the two largest scores of each group: what a 16:32g mask in `order` keeps of
    `words` [W, rows, 32] (order [W, 32]: positions 4q..4q + 3 hold group q)."""
    grouped = words.gather(2, order.unsqueeze(1).expand(-1, words.shape[1], -1))
    return _top_two(grouped.view(*words.shape[:2], 8, 4)).sum((1, 2))


def grouped_partition(words: torch.Tensor, rounds: int = GROUP_SEARCH_ROUNDS,
                      start: torch.Tensor | None = None) -> torch.Tensor:
    """A split of each word's 32 columns into eight groups of four that keeps much of its scores under a 16:32g mask:
    `words` [W, rows, 32] (non-negative scores, the rows sharing the split) -> order [W, 32] (positions 4q..4q + 3
    hold group q). Local search from the plain 2:4 groups (or from `start` [W, 32], an earlier split): each round
    takes, in every word, the swap of two columns of different groups that raises `grouped_fit` most, until none does
    (or `rounds`). Never worse than where it starts; not always the optimum (the split is a combinatorial choice)."""
    count, rows, _ = words.shape
    if grouped_search_setting(words.device) == "triton":
        from .kernels import triton_grouped_search
        order = (torch.arange(32, device=words.device).repeat(count, 1) if start is None
                 else start.to(torch.int64).contiguous().clone())
        triton_grouped_search.grouped_search(words.float().contiguous(), order, rounds, GROUP_SWAPS)
        return order
    swap_i = torch.tensor([i for i, _ in GROUP_SWAPS], device=words.device)
    swap_j = torch.tensor([j for _, j in GROUP_SWAPS], device=words.device)
    order = torch.arange(32, device=words.device).repeat(count, 1) if start is None else start.clone()
    # words a chunk: as many as fit the memory of the chunk sizes' 16-row words (twice as many with 8 rows a split)
    chunk = (_GROUP_CHUNK_CUDA if words.is_cuda else _GROUP_CHUNK) * 16 // max(rows, 1)
    for first in range(0, count, chunk):
        part, sub = words[first:first + chunk], order[first:first + chunk]
        live = torch.arange(part.shape[0], device=words.device)
        for _ in range(rounds):
            scores = part[live]
            placed = scores.gather(2, sub[live].unsqueeze(1).expand(-1, rows, -1))  # [L, rows, 32], in order
            grouped = placed.view(-1, rows, 8, 4)
            base = _top_two(grouped).sum(1)  # [L, 8]
            # swapping the columns at positions i and j: group i / 4 loses its entry i and gains j's value v, and its
            # new top two is (the top two of its other three) + relu(v - the second of those three); so for j's too
            top, second = _others_top_two(grouped)  # [L, rows, 32] each, by position
            gain = (top[:, :, swap_i] + (placed[:, :, swap_j] - second[:, :, swap_i]).clamp_min(0)
                    + top[:, :, swap_j] + (placed[:, :, swap_i] - second[:, :, swap_j]).clamp_min(0)).sum(1) \
                - base[:, swap_i // 4] - base[:, swap_j // 4]  # [L, 448]
            best, pick = gain.max(1)
            moves = best > 1e-6 * base.sum(1).clamp_min(1e-30)
            if not bool(moves.any()):
                break
            live, pick = live[moves], pick[moves]
            i, j = swap_i[pick], swap_j[pick]
            at_i, at_j = sub[live, i], sub[live, j]
            sub[live, i], sub[live, j] = at_j, at_i
    return order


SEARCH_NODES = 10_000  # `_order_by_search`'s groups tried a word before it gives up
_TRIPLES: torch.Tensor | None = None  # the 4960 sets of three of 32 columns, [4960, 3]


def _triples(device: torch.device) -> torch.Tensor:
    global _TRIPLES
    if _TRIPLES is None:
        _TRIPLES = torch.combinations(torch.arange(32), 3)
    return _TRIPLES.to(device)


def grouped_order_of(kept: torch.Tensor, search: bool = True, all_or_none: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A split of each word's columns under which its mask is 16:32g, read off the mask: `kept` [W, rows, 32] (bool,
    the rows sharing the split) -> (order [W, 32], positions 4q..4q + 3 holding group q; found [W], whether every row
    keeps exactly two of every group; at most two in a row that keeps fewer than 16, see `_order_by_search`). Each
    column's kept rows are one base-3 number (digit r: row r), so a group of four is a pair of pairs whose numbers
    add up to all twos. Group by group, the lowest column f not yet placed
    joins the first other column x for which some pair of columns not yet placed completes (f, x), found by binary
    search among the word's sorted pair numbers. Where that first choice leads nowhere or two pairs share a number,
    the word goes to `_orders_by_cover` (the words of a split shared by 8 rows, which many more groups fit, nearly
    all do: the first choice dead-ended on 81% of random 16:32g8 words), what that leaves to the cover again with
    more pairs a number (`_COVER_TIES_WIDE`), and what that leaves is searched with backtracking (`_order_by_search`,
    tens of milliseconds a word on a CPU, results/grouped_readback_cpu.md; `search` False leaves both out and gives
    the cover QUICK_COVER_PASSES passes, for a quick look; `all_or_none` stops searching at the first word with no
    split, for a caller that needs every word's). Words with no such split come back with found False."""
    count, rows, _ = kept.shape
    device = kept.device
    digits = 3 ** torch.arange(rows, dtype=torch.int64, device=device)
    codes = (kept.to(torch.int64) * digits.view(1, -1, 1)).sum(1)  # [W, 32]
    twos = 2 * digits.sum()
    pairs = torch.combinations(torch.arange(32, device=device), 2)  # [496, 2]
    pair_at = torch.zeros(32, 32, dtype=torch.int64, device=device)
    pair_at[pairs[:, 0], pairs[:, 1]] = pair_at[pairs[:, 1], pairs[:, 0]] = torch.arange(len(pairs), device=device)
    column = torch.arange(32, device=device)
    order = torch.zeros(count, 32, dtype=torch.int64, device=device)
    found = torch.ones(count, dtype=torch.bool, device=device)
    for start in range(0, count, 64 * _GROUP_CHUNK):
        part = slice(start, start + 64 * _GROUP_CHUNK)
        numbers = codes[part][:, pairs].sum(2)  # [w, 496]
        sorted_numbers, at = numbers.sort(1)
        placed = torch.zeros(numbers.shape[0], 32, dtype=torch.bool, device=device)
        for group in range(8):
            first = (~placed).to(torch.int8).argmax(1, keepdim=True)  # [w, 1]: the lowest column not yet placed
            need = twos - numbers.gather(1, pair_at[first.squeeze(1)])  # [w, 32]: what completes (first, x)
            where = torch.searchsorted(sorted_numbers, need).clamp(max=len(pairs) - 1)
            rest = pairs[at.gather(1, where)]  # [w, 32, 2]
            ok = (sorted_numbers.gather(1, where) == need) & (column != first) & ~placed \
                & ~placed.gather(1, rest.flatten(1)).view_as(rest).any(2) \
                & (rest != first.unsqueeze(2)).all(2) & (rest != column.view(1, -1, 1)).all(2)
            x = ok.to(torch.int8).argmax(1, keepdim=True)  # [w, 1]
            members = torch.cat([first, x, rest.gather(1, x.unsqueeze(2).expand(-1, 1, 2)).squeeze(1)], 1)
            order[part, 4 * group:4 * group + 4] = members
            placed = placed.scatter(1, members, True)
            found[part] &= ok.any(1)
    found &= (order.sort(1).values == column).all(1)  # every column placed once
    for ties in (_COVER_TIES, _COVER_TIES_WIDE) if search else (_COVER_TIES,):
        left = (~found).nonzero().flatten()
        if len(left):
            covered, solved = _orders_by_cover(kept[left], COVER_PASSES if search else QUICK_COVER_PASSES, ties)
            order[left[solved]], found[left[solved]] = covered[solved], True
    for word in (~found).nonzero().flatten().tolist() if search else ():
        searched = _order_by_search(kept[word].cpu())  # one small step at a time: a GPU's launches cost more
        if searched is not None:
            order[word], found[word] = searched.to(order.device), True
        elif all_or_none:
            break
    return order, found


COVER_PASSES = 32  # `_orders_by_cover`'s passes over the words still unsolved (the later ones choosing at random)
QUICK_COVER_PASSES = 4  # its passes in a quick look (`grouped_order_of(..., search=False)`)
_CHUNK_PASSES = 4  # passes a chunk of words gets before what it leaves is gathered with other chunks' for the rest
_COVER_TIES = 8  # pairs of columns of one number `_orders_by_cover` looks at for each pair that it completes
_COVER_TIES_WIDE = 64  # the same for the few words the first cover leaves (8-row splits: 8 of 131,072 random words in
# the seventy-third session, whose columns repeat so often that the completing pair is not among the first 8 of its
# number; tests' TIED_WORDS)
_COVER_CHUNK = 1024  # words at once: [1024, 496 pairs, 8] candidates of two int64 columns are about 65 MB
_COVER_CHUNK_CUDA = 8192  # on a GPU (about 0.5 GB a tensor of that size), where fewer launches are what saves time


def _orders_by_cover(kept: torch.Tensor, passes: int = COVER_PASSES, ties: int = _COVER_TIES, done: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`grouped_order_of` for words [W, rows, 32] whose masks fit many groups, as an exact cover: every group of four
    columns that keeps two in each row is a candidate, found once as its two lowest columns' pair and the pair of the
    two highest whose base-3 numbers complete it to all twos (the first `ties` pairs of that number); then eight
    times the column in the fewest candidates left is placed with the first of them (on every pass after the first a
    random one), dropping the candidates that overlap it. A word ends solved when all 32 columns are placed; those
    that dead-end are tried again, at most `passes` passes (seeded: the same mask gives the same order):
    _CHUNK_PASSES in each chunk of words, then the rest over what all chunks left, gathered (on a GPU, a chunk's
    passes over its last few words cost launches, not work); `done`, the passes made before (the gathered words'
    call). Rows must keep exactly two of every group, as `grouped_order_of`'s first pass asks. Returns (order [W, 32],
    found [W])."""
    count = kept.shape[0]
    chunk = _COVER_CHUNK_CUDA if kept.device.type == "cuda" else _COVER_CHUNK
    chunk = chunk * _COVER_TIES // max(ties, _COVER_TIES)  # the same memory with more ties a pair
    order = torch.zeros(count, 32, dtype=torch.int64, device=kept.device)
    found = torch.zeros(count, dtype=torch.bool, device=kept.device)
    first = min(passes, _CHUNK_PASSES)
    for start in range(0, count, chunk):
        part = slice(start, start + chunk)
        order[part], found[part] = _cover_chunk(kept[part], range(done, done + first), ties)
    left = (~found).nonzero().flatten()
    if len(left) and passes > first:
        covered, solved = _orders_by_cover(kept[left], passes - first, ties, done + first)
        order[left[solved]], found[left[solved]] = covered[solved], True
    return order, found


def _cover_chunk(kept: torch.Tensor, passes: range, ties: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_orders_by_cover`'s `passes` (by number: the first of all, 0, takes no random choice) over one chunk of words,
    every candidate group of every word found at once (`_cover_passes`). A version that padded the words with more
    than 64 candidates (1% of random 8-row words) apart from the rest, twice the passes' launches, read back slower on
    an H100: 5.8-8.7 us a word against 4.3-6.8 (results/grouped_readback_h100_bucketed.md against
    grouped_readback_h100.md; that commit also numbered the passes across calls, which this one keeps, so the
    padding is the likely but not the measured cause)."""
    count, rows, _ = kept.shape
    device = kept.device
    digits = 3 ** torch.arange(rows, dtype=torch.int64, device=device)
    codes = (kept.to(torch.int64) * digits.view(1, -1, 1)).sum(1)  # [W, 32]
    twos = 2 * digits.sum()
    pairs = torch.combinations(torch.arange(32, device=device), 2)  # [496, 2], a < b
    tie = torch.arange(ties, device=device)
    numbers = codes[:, pairs].sum(2)  # [w, 496]
    w = numbers.shape[0]
    sorted_numbers, at = numbers.sort(1)
    need = twos - numbers
    where = (torch.searchsorted(sorted_numbers, need).unsqueeze(2) + tie).clamp(max=len(pairs) - 1)
    match = sorted_numbers.gather(1, where.flatten(1)).view_as(where) == need.unsqueeze(2)  # [w, 496, ties]
    other = pairs[at.gather(1, where.flatten(1))].view(w, len(pairs), ties, 2)  # (c, d)
    valid = (match & (pairs[:, 1].view(1, -1, 1) < other[..., 0])).view(w, -1)  # b < c: each group once
    generator = torch.Generator(device=device).manual_seed(count * COVER_PASSES + passes.start)  # no two calls alike
    most = max(int(valid.sum(1).max()), 1)
    kept_at = valid.to(torch.int8).topk(most, 1).indices  # [w, most]: every word's candidates first
    candidates = torch.cat([pairs[kept_at // ties],  # (a, b), then (c, d): [w, most, 4]
                            other.view(w, -1, 2).gather(1, kept_at.unsqueeze(2).expand(-1, -1, 2))], 2)
    return _cover_passes(candidates, valid.gather(1, kept_at), passes, generator)


def _cover_passes(candidates: torch.Tensor, live_at_start: torch.Tensor, passes: range,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`_orders_by_cover`'s passes over words of `candidates` [n, most, 4] (the groups that fit, `live_at_start`
    [n, most] marking the real ones): each time the column in the fewest candidates left is placed with the first of
    them (on passes after the first, number 0, a random one), eight times; the words that dead-end go round again."""
    n_words, most, _ = candidates.shape
    device = candidates.device
    order = torch.zeros(n_words, 32, dtype=torch.int64, device=device)
    found = torch.zeros(n_words, dtype=torch.bool, device=device)
    holds = torch.zeros(n_words, most, 32, device=device).scatter_(2, candidates, 1.0)  # float: counted by bmm
    todo = torch.arange(n_words, device=device)
    for attempt in passes:
        every = len(todo) == n_words  # the first pass: no copy of the candidates
        live = live_at_start.clone() if every else live_at_start[todo]
        members, n = holds if every else holds[todo], len(todo)
        placed = torch.zeros(n, 32, dtype=torch.bool, device=device)
        solved = torch.ones(n, dtype=torch.bool, device=device)
        chosen = torch.zeros(n, 8, dtype=torch.int64, device=device)
        for step in range(8):
            counts = torch.bmm(live.unsqueeze(1).float(), members).squeeze(1).masked_fill(placed, most + 1)
            column = counts.argmin(1)  # the most constrained column
            solved &= counts.gather(1, column.unsqueeze(1)).squeeze(1) > 0
            fits = (members.gather(2, column.view(-1, 1, 1).expand(-1, most, 1)).squeeze(2) > 0) & live
            score = fits.float() + (0.5 * torch.rand(fits.shape, generator=generator, device=device)
                                    if attempt else 0.0)
            chosen[:, step] = score.argmax(1)
            placed |= members[torch.arange(n, device=device), chosen[:, step]] > 0
            live &= torch.bmm(members, placed.unsqueeze(2).float()).squeeze(2) == 0
        solved &= placed.all(1)
        done = todo[solved]
        order[done] = candidates[done.unsqueeze(1), chosen[solved]].view(-1, 32)
        found[done] = True
        todo = todo[~solved]
        if not len(todo):
            break
    return order, found


def _order_by_search(kept: torch.Tensor) -> torch.Tensor | None:
    """`grouped_order_of` for one word [rows, 32] by depth-first search over every fitting group; None if none. A row
    that keeps fewer than 16 (a kept weight whose value is zero, which a mask read off the weights cannot tell from a
    pruned one) needs at most two in each group, the others exactly two. Gives up (None) after SEARCH_NODES groups
    tried, so that a mask with much slack cannot make it run for long."""
    counts = kept.to(torch.int8).T  # [32, rows]
    tried = 0
    full = kept.sum(1) == 16  # [rows]
    triples = _triples(kept.device)
    sums = counts[triples].sum(1)  # [4960, rows]

    def extend(placed: torch.Tensor, chosen: list[torch.Tensor]) -> list[torch.Tensor] | None:
        nonlocal tried
        if bool(placed.all()):
            return chosen
        tried += 1
        if tried > SEARCH_NODES:
            return None
        first = int((~placed).to(torch.int8).argmax())
        need = 2 - counts[first]
        fits = (~placed[triples].any(1)) & (triples != first).all(1) \
            & ((sums == need) | (~full & (sums <= need))).all(1)
        for pick in triples[fits]:
            members = torch.cat([torch.tensor([first], device=kept.device), pick])
            result = extend(placed.index_fill(0, members, True), chosen + [members])
            if result is not None:
                return result
        return None

    groups = extend(torch.zeros(32, dtype=torch.bool, device=kept.device), [])
    return None if groups is None else torch.cat(groups)


def grouped_keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """The mask for 16:32g: each 16-row tile's 32-column word split into groups of four by `grouped_partition` on
    its scores, and each row keeping the two largest of every group. Needs a multiple of 16 rows."""
    return grouped_mask_and_split(score, pattern)[0]


# Rows that share a word's split under 16:32g: the kernel's mma.sp tile, 16 (16:32g8: 8, its pattern's
# `split_rows`). A module setting so that benchmarks/grouped_quality_cpu.py --split-rows can measure what fewer rows a
# split would keep under 16:32g (4: a tile's quarters, which no kernel runs); every caller here reads it.
GROUPED_SPLIT_ROWS = PLACED_TILE_ROWS


def split_rows_of(pattern: SparsityPattern) -> int:
    """The rows that share a split under a grouped pattern: its `split_rows`, else `GROUPED_SPLIT_ROWS`."""
    return pattern.split_rows or GROUPED_SPLIT_ROWS


def grouped_mask_and_split(score: torch.Tensor, pattern: SparsityPattern,
                           start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`grouped_keep_mask`'s mask and the split it keeps in (order [words, 32], words tile by tile), the search
    starting from `start` (an earlier call's split, as ADMM's projections pass theirs on) where given."""
    rows, cols = score.shape
    tile = split_rows_of(pattern)
    if tile not in (4, 8, 16) or rows % tile:
        raise SparsityPatternError(f"{pattern} shares each split by {tile!r} rows (4, 8 or 16, dividing the rows); "
                                   f"this weight has {rows} rows")
    words = score.reshape(rows // tile, tile, cols // pattern.m, pattern.m).transpose(1, 2)
    words = words.reshape(-1, tile, pattern.m).float()
    order = grouped_partition(words, start=start)
    grouped = words.gather(2, order.unsqueeze(1).expand(-1, tile, -1)).view(-1, tile, 8, 4)
    kept_grouped = torch.zeros_like(grouped, dtype=torch.bool)
    kept_grouped.scatter_(3, grouped.topk(2, dim=3).indices, True)
    kept = torch.zeros_like(words, dtype=torch.bool)
    kept.scatter_(2, order.unsqueeze(1).expand(-1, tile, -1), kept_grouped.view(-1, tile, 32))
    return kept.view(rows // tile, cols // pattern.m, tile, pattern.m).transpose(1, 2).reshape(rows, cols), order


def magnitude(weight: torch.Tensor, hessian: torch.Tensor | None, pattern: SparsityPattern | str) -> torch.Tensor:
    """Keep the largest |W| per row (or per N:M group); H is ignored."""
    pattern = SparsityPattern.parse(pattern)
    check_inputs(weight, hessian, "none")
    check_pattern(weight, pattern)
    return weight * keep_mask(weight.abs().float(), pattern)


def wanda(weight: torch.Tensor, hessian: torch.Tensor, pattern: SparsityPattern | str) -> torch.Tensor:
    """Wanda: score |W_ij|·‖X_j‖ = |W_ij|·sqrt(H_jj/2·N) (the constant does not change the order), compared within
    each output row (or each N:M group of a row)."""
    pattern = SparsityPattern.parse(pattern)
    check_inputs(weight, hessian, "diagonal")
    check_pattern(weight, pattern)
    score = weight.abs().float() * hessian.diagonal().float().clamp(min=0).sqrt().to(weight.device)
    return weight * keep_mask(score, pattern)


def permutation_groups(pattern: SparsityPattern) -> tuple[int, int]:
    """(group width, weights a group must drop) that a column order for `pattern` is chosen against: N:M's own
    groups, and for 16:32+K the groups of four its 2:4 part keeps two of."""
    if not pattern.m:
        raise SparsityPatternError(f"a column order is chosen for N:M patterns, not {pattern}")
    if pattern.overflow >= 0:
        return 4, 2
    return pattern.m, pattern.m - pattern.n


def dropped_saliency(saliency: torch.Tensor, width: int, drop: int) -> torch.Tensor:
    """Per group of `width` consecutive columns, summed over rows: the `drop` smallest saliencies of each row."""
    groups = saliency.view(saliency.shape[0], -1, width)
    return groups.sort(-1).values[..., :drop].sum(-1).sum(0)


def without_each(groups: torch.Tensor, drop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each column c of each group (last dimension, width > drop >= 1), two numbers of the group without c: the
    sum of its drop - 1 smallest values and its drop-th smallest. A value v put in c's place then makes the group
    drop (the sum of its drop smallest) exactly the first plus min(v, the second): v is among the drop smallest
    only if it is below the drop-th smallest of the rest. One sort per group instead of one per candidate swap."""
    values, where = groups.sort(-1)
    rank = where.argsort(-1)  # each column's place in its group's order
    head = values[..., :drop].sum(-1, keepdim=True)
    kept = torch.where(rank < drop - 1, head - groups, head - values[..., drop - 1:drop])
    edge = torch.where(rank < drop, values[..., drop:drop + 1], values[..., drop - 1:drop])
    return kept, edge


@torch.no_grad()
def balanced_column_order(saliency: torch.Tensor, pattern: SparsityPattern | str, *, rounds: int = 60,
                          options: int = 16, chunk: int = 256, seed: int = 0) -> torch.Tensor:
    """A permutation of the columns (`order`: column i of the new weight is column order[i] of the old) under which
    N:M pruning must drop less saliency (the sum, over rows and groups, of each row's smallest saliencies in a
    group), for an input dimension that the model lets reorder without changing what it computes. Pool & Yu (NeurIPS
    2021) chose such channel permutations for 2:4; this one starts from an interleaving of the columns by total
    saliency (group g gets ranks g, g + G, g + 2G, ...: the strong columns spread over the groups) and then, for
    `rounds`, pairs the groups at random and makes in each pair the best of `options` single-column swaps that lowers
    the pair's dropped saliency. Where the result would drop more than the columns' own order, that order is kept
    (the identity is returned). A heuristic: what it does to the solver's layer loss is measured, not promised."""
    pattern = SparsityPattern.parse(pattern)
    width, _ = permutation_groups(pattern)
    if saliency.shape[1] % width:
        raise SparsityPatternError(f"{saliency.shape[1]} columns do not split into groups of {width}")
    return _block_orders(saliency, pattern, saliency.shape[1], rounds, options, chunk, seed)


def _block_orders(saliency: torch.Tensor, pattern: SparsityPattern, block: int, rounds: int, options: int,
                  chunk: int, seed: int) -> torch.Tensor:
    """`balanced_column_order`'s search run on every run of `block` columns at once, each run on its own: a run's
    groups are paired only with groups of the same run, and a run whose result would drop more than its own order
    keeps that order. Every run draws the same pairings and swap options a round (a search of one run seeded with
    `seed` draws them so), and the pairs of a round are disjoint, so searching the runs together gives each run
    exactly the order its own search would."""
    width, drop = permutation_groups(pattern)
    rows, cols = saliency.shape
    S = saliency.float()
    runs, count = cols // block, block // width  # count: groups a run
    offsets = torch.arange(runs, device=S.device) * block
    within = S.view(rows, runs, block).sum(0).argsort(1, descending=True)  # each run's columns by total saliency
    order = (within.view(runs, width, count).transpose(1, 2).reshape(runs, block) + offsets[:, None]).reshape(-1)
    groups = S[:, order].view(rows, runs * count, width).clone()
    cost = dropped_saliency(groups.view(rows, -1), width, drop)
    gen = torch.Generator().manual_seed(seed)
    pairs_all = [(i, j) for i in range(width) for j in range(width)]
    group_offsets = (torch.arange(runs, device=S.device) * count)[:, None]
    for _ in range(rounds):
        shuffled = torch.randperm(count, generator=gen).to(S.device)
        half = count // 2
        first = (shuffled[:half][None] + group_offsets).reshape(-1)
        second = (shuffled[half:2 * half][None] + group_offsets).reshape(-1)
        picked = (pairs_all if len(pairs_all) <= options else
                  [pairs_all[k] for k in torch.randperm(len(pairs_all), generator=gen)[:options].tolist()])
        ii = torch.tensor([i for i, _ in picked], device=S.device)
        jj = torch.tensor([j for _, j in picked], device=S.device)
        for start in range(0, first.numel(), chunk):  # the pairs are disjoint: chunks can go in any order
            a, b = first[start:start + chunk], second[start:start + chunk]
            ga, gb = groups[:, a], groups[:, b]  # rows x P x width
            kept_a, edge_a = without_each(ga, drop)
            kept_b, edge_b = without_each(gb, drop)
            # group a with its column i swapped for b's column j drops kept_a[i] + min(b_j, edge_a[i]); b likewise
            entering = torch.minimum(gb[..., jj], edge_a[..., ii]) + torch.minimum(ga[..., ii], edge_b[..., jj])
            after = kept_a.sum(0)[:, ii] + kept_b.sum(0)[:, jj] + entering.sum(0)  # P x K
            gain = (cost[a] + cost[b]).unsqueeze(1) - after
            best_gain, best = gain.max(1)
            take = best_gain > 1e-6 * (cost[a] + cost[b]).clamp(min=1e-30)
            if not take.any():
                continue
            a, b, best = a[take], b[take], best[take]
            i, j = ii[best], jj[best]
            column_a, column_b = a * width + i, b * width + j
            order[column_a], order[column_b] = order[column_b].clone(), order[column_a].clone()
            groups.view(rows, -1)[:, column_a], groups.view(rows, -1)[:, column_b] = \
                S[:, order[column_a]], S[:, order[column_b]]
            cost[a] = dropped_saliency(groups[:, a].reshape(rows, -1), width, drop)
            cost[b] = dropped_saliency(groups[:, b].reshape(rows, -1), width, drop)
    own = dropped_saliency(S, width, drop).view(runs, count).sum(1)
    worse = cost.view(runs, count).sum(1) >= own  # these runs keep their own order
    identity = torch.arange(cols, device=S.device).view(runs, block)
    return torch.where(worse[:, None], identity, order.view(runs, block)).reshape(-1)


def grouped_column_order(saliency: torch.Tensor, pattern: SparsityPattern | str, block: int,
                         **search) -> torch.Tensor:
    """`balanced_column_order` within each run of `block` columns, so that no column leaves its run: with int4
    values a run is a scale group (`prune --permute-scope group`), which then keeps its set of columns and so the
    range its scale must cover. `search`: `balanced_column_order`'s options. The runs are searched together, each
    getting the order its own search would (`_block_orders`)."""
    pattern = SparsityPattern.parse(pattern)
    width, _ = permutation_groups(pattern)
    cols = saliency.shape[1]
    if block <= 0 or block % width or cols % block:
        raise SparsityPatternError(f"runs of {block} columns must split {cols} columns and split into {pattern}'s "
                                   f"groups of {width}")
    search = {"rounds": 60, "options": 16, "chunk": 256, "seed": 0, **search}
    return _block_orders(saliency, pattern, block, **search)


def check_percdamp(percdamp: float) -> None:
    """Raise SolverSettingsError unless the damping is a positive finite number: escalation multiplies it by 10,
    which never leaves 0 and never makes NaN or inf usable."""
    if not isinstance(percdamp, (int, float)) or not math.isfinite(percdamp) or percdamp <= 0:
        raise SolverSettingsError(f"percdamp = {percdamp!r} must be a positive finite number (relative to the mean "
                                  f"Hessian diagonal); the usual value is 0.01")


def damped_inverse_cholesky(hessian: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor U of (H + λI)⁻¹ (so (H + λI)⁻¹ = Uᵀ·U), λ = percdamp · mean(diag H).

    If a factorisation fails, λ grows tenfold with one warning per step, up to MAX_DAMPING; past that it raises."""
    return damped_factor(hessian, percdamp)[0]


def damped_factor(hessian: torch.Tensor, percdamp: float, inverse: bool = True) -> tuple[torch.Tensor | None, float]:
    """`damped_inverse_cholesky`'s factor and the λ it took (absolute, after any escalation): the refit solves the
    same damped problem. `inverse=False`: only the λ at which H + λI factorises (factor None), for the refit alone,
    which needs no inverse."""
    check_percdamp(percdamp)
    if not bool(torch.isfinite(hessian).all()):
        raise CalibrationError("the Hessian holds NaN or inf; calibrate again (a layer input was not finite)")
    identity = torch.eye(hessian.shape[0], dtype=hessian.dtype, device=hessian.device)
    mean_diag = hessian.diagonal().mean()
    damping = percdamp
    while True:
        lower, info = torch.linalg.cholesky_ex(hessian + damping * mean_diag * identity)
        if info == 0 and not inverse:
            return None, damping * float(mean_diag)
        if info == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if info == 0:
                return upper, damping * float(mean_diag)
        if damping * 10 > MAX_DAMPING:
            raise CalibrationError(f"the Hessian is singular (not positive definite even with damping "
                                   f"{damping:g}·mean(diag H)); calibrate on more tokens or more varied prompts")
        log.warning("Cholesky failed with damping %g·mean(diag H); retrying with %g", damping, damping * 10)
        damping *= 10


MAX_REFIT_STEPS = 10_000


def check_refit_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_REFIT_STEPS:
        raise SolverSettingsError(f"refit_steps = {steps!r} must be an integer from 0 (no refit) to "
                                  f"{MAX_REFIT_STEPS}, such as 10")


@torch.no_grad()
def refit_kept(X: torch.Tensor, target: torch.Tensor, H: torch.Tensor, damping: float, kept: torch.Tensor,
               steps: int) -> torch.Tensor:
    """The kept weights re-solved for the mask they have, in place on X [rows, cols] (zero where not `kept`):
    each row's kept entries move toward the minimiser of (x − t)·(H + λI)·(x − t)ᵀ over x with the row's zeros
    held, t the row of `target` (the weight before pruning), λ = `damping`. The exact minimiser solves
    (H + λI)_KK·x_K = (t·(H + λI))_K per row; SparseGPT's column loop only approaches it (each column's compensation
    reaches later columns only, and the mask is chosen as it goes). `steps` iterations of conjugate gradients with
    the diagonal as preconditioner, all rows at once (one [rows, cols] x [cols, cols] product each); the loss falls
    at every step, so the result is never worse than X on this objective. Rows stacked from several weights are
    independent, so stacking changes nothing."""
    mask = kept.to(X.dtype)
    inverse_diagonal = 1 / (H.diagonal() + damping)

    def apply(P: torch.Tensor) -> torch.Tensor:  # (P·(H + λI)) ⊙ mask
        return torch.addmm(P, P, H, beta=damping).mul_(mask)

    R = apply(target - X)
    Z = R * inverse_diagonal
    P = Z.clone()
    rz = (R * Z).sum(1, keepdim=True)
    for _ in range(steps):
        Q = apply(P)
        pq = (P * Q).sum(1, keepdim=True)
        alpha = torch.where(pq > 0, rz / pq.clamp_min(torch.finfo(pq.dtype).tiny), 0)
        X.addcmul_(alpha, P)
        R.addcmul_(alpha, Q, value=-1)
        torch.mul(R, inverse_diagonal, out=Z)
        rz_next = (R * Z).sum(1, keepdim=True)
        beta = torch.where(rz > 0, rz_next / rz.clamp_min(torch.finfo(rz.dtype).tiny), 0)
        P.mul_(beta).add_(Z)
        rz = rz_next
    X.mul_(mask)  # exact zeros where pruned
    return X


def refit(weight: torch.Tensor, pruned: torch.Tensor, hessian: torch.Tensor, *, steps: int = 10,
          percdamp: float = 0.01) -> torch.Tensor:
    """Re-solve the kept weights of `pruned` (any solver's result for `weight`; its zeros are the mask, kept) for
    the least reconstruction loss against `hessian`, by `refit_kept` with SparseGPT's damping (escalated, if at all,
    only as far as H + λI needs to factorise; SparseGPT also needs its inverse to). For
    Wanda's and magnitude's masks, whose kept weights are W's own values; `sparsegpt(refit_steps=...)` does the
    same inside its solve. Returns `pruned`'s dtype."""
    return refit_shared([weight], [pruned], hessian, steps=steps, percdamp=percdamp)[0]


def refit_shared(weights: list[torch.Tensor], pruned: list[torch.Tensor], hessian: torch.Tensor, *,
                 steps: int = 10, percdamp: float = 0.01) -> list[torch.Tensor]:
    """`refit` for several weights that read the same input (q/k/v, gate/up), their rows stacked against one
    normalized Hessian and one damping (each weight's result is the one it gets alone: rows are independent)."""
    check_refit_steps(steps)
    if len(weights) != len(pruned) or not weights:
        raise SolverSettingsError(f"refit_shared needs one pruned weight for each weight, got {len(pruned)} for "
                                  f"{len(weights)}")
    for weight, new in zip(weights, pruned):
        check_inputs(weight, hessian)
        if not isinstance(new, torch.Tensor) or new.shape != weight.shape:
            raise SolverSettingsError(f"pruned must have the weight's shape {tuple(weight.shape)}, got "
                                      f"{tuple(new.shape) if isinstance(new, torch.Tensor) else type(new)}")
    compute = torch.float64 if weights[0].dtype == torch.float64 else torch.float32
    H = normalized_hessian(hessian.to(weights[0].device), compute)
    dead = H.diagonal() == 0
    H[dead, dead] = 1
    target = torch.cat([weight.to(compute) for weight in weights]).masked_fill(dead, 0)
    _, damping = damped_factor(H, percdamp, inverse=False)
    X = torch.cat([new.to(compute) for new in pruned]).masked_fill(dead, 0)
    X = refit_kept(X, target, H, damping, X != 0, steps)
    return [part.to(new.dtype) for part, new in zip(X.split([weight.shape[0] for weight in weights]), pruned)]


MAX_ADMM_ITERATIONS = 10_000
# The ADMM penalty ρ: from ADMM_RHO[0] to ADMM_RHO[1] times the mean eigenvalue of H + λI, geometrically over the
# iterations. Small at first, so the weights move freely toward the loss while the projection tries masks; large at
# the end, so the weights meet the mask they settle on. Where a few outlier inputs put the mean far above most of the
# spectrum (SmolLM2's last down_proj: 60x the median) the penalty holds those weights near the first mask and the
# layer loss there stays above SparseGPT's; scaled to the median instead, every layer's loss fell further but the
# model did worse on SmolLM2's dev answers and news text (benchmarks/results/solver_admm_median_rho_smollm2_cpu.md
# against solver_admm_smollm2_cpu.md): the mean's early penalty also regularizes.
ADMM_RHO = (0.1, 1000.0)
# `admm_prune(settle=K)`: once the mask has stayed the same K iterations in a row the rest only move the kept weights
# toward the loss's minimum for that mask; conjugate gradients get there in fewer products (one a step against
# ADMM's two an iteration). On 16 of SmolLM2-135M's linears (text Hessians,
# benchmarks/results/admm_settle_smollm2_cpu.md)
# settle 5 with 10 refit steps ended at 0.997x (2:4) and 0.994x (16:32) the layer loss of 100 full iterations after
# 53 and 52 iterations on average; with the schedule spread over 200, at 0.980x and 0.974x after 84 and 98 (200 full
# iterations: 0.981x and 0.977x). Geometric means.
ADMM_SETTLED_REFIT = 10
# ADMM_SPLITS (settings): what ADMM's 16:32g projection keeps most of when it searches a tile word's split
# (`admm_prune(split=)`, `prune --admm-split`): "squared" (x², the Euclidean projection: the kept set that
# leaves the least of ‖X − D‖²) or "magnitude" (|x|, which the sixty-ninth session's code used, and
# plan-grouped.json's q16g was pruned with). Within a group of four both keep the same two; only the split
# between groups differs. Every other pattern's projection keeps the largest |x| either way (the same mask).
# ADMM_PRODUCTS (settings): how ADMM's two products an iteration with the eigenvectors run (`admm_prune(products=)`):
# float32, or with both operands rounded to TF32 (10 mantissa bits, float32 accumulation): the GPU's tensor cores
# then take them, 6-8x faster on the H100 for Llama-3.1-8B's largest problems (benchmarks/results/admm_parts_h100*.md).
# On a CPU the rounding is emulated (`tf32_round`), so both devices compute alike.


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32's 10 explicit mantissa bits (to nearest, ties away from zero), still float32:
    what a tensor core reads of a float32 operand. Infinities and NaNs are not expected here (checked inputs)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def check_admm_split(split: str) -> None:
    if split not in ADMM_SPLITS:
        raise SolverSettingsError(f"admm split = {split!r}: choose one of {', '.join(ADMM_SPLITS)}")


def check_admm_products(products: str) -> None:
    if products not in ADMM_PRODUCTS:
        raise SolverSettingsError(f"admm products = {products!r}: choose one of {', '.join(ADMM_PRODUCTS)}")


class EigenProducts:
    """(M·Q)·diag(1/s)·Qᵀ, ADMM's solve in the eigenbasis, in float32 or with TF32 operands (`ADMM_PRODUCTS`). On
    CUDA TF32 is cuBLAS's (allowed only around these products, the global setting restored); on a CPU both
    operands are rounded by `tf32_round` and multiplied in float32 (cuBLAS's own conversion may differ from it in
    the last kept bit)."""

    def __init__(self, Q: torch.Tensor, products: str):
        check_admm_products(products)
        self.tf32 = products == "tf32" and Q.dtype == torch.float32
        self.emulate = self.tf32 and not Q.is_cuda
        self.Q = tf32_round(Q) if self.emulate else Q
        self.QT = self.Q.T

    def __call__(self, M: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if not self.tf32:
            return (M @ self.Q).div_(scale) @ self.QT
        if self.emulate:
            return tf32_round((tf32_round(M) @ self.Q).div_(scale)) @ self.QT
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return (M @ self.Q).div_(scale) @ self.QT
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allowed


def check_admm_iterations(iterations: int) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, int) or not 1 <= iterations <= MAX_ADMM_ITERATIONS:
        raise SolverSettingsError(f"admm_iterations = {iterations!r} must be an integer from 1 to "
                                  f"{MAX_ADMM_ITERATIONS}, such as 100")


def check_admm_settle(settle: int) -> None:
    if isinstance(settle, bool) or not isinstance(settle, int) or not 0 <= settle <= MAX_ADMM_ITERATIONS:
        raise SolverSettingsError(f"admm settle = {settle!r} must be an integer from 0 (run every iteration) to "
                                  f"{MAX_ADMM_ITERATIONS}, such as 5")


def symmetric_eigh(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.linalg.eigh` of a symmetric positive definite A; if the solver fails to converge in A's dtype (cuSOLVER
    can on large ill-conditioned float32 matrices), once more in float64, with a warning, the result cast back."""
    try:
        return torch.linalg.eigh(A)
    except torch.linalg.LinAlgError as error:
        if A.dtype == torch.float64:
            raise
        log.warning("eigendecomposition of a %dx%d %s Hessian failed (%s); retrying in float64", A.shape[0],
                    A.shape[1], str(A.dtype).removeprefix("torch."), str(error).splitlines()[0])
        eigenvalues, Q = torch.linalg.eigh(A.double())
        return eigenvalues.to(A.dtype), Q.to(A.dtype)


@torch.no_grad()
def admm_prune(W: torch.Tensor, H: torch.Tensor, damping: float, pattern: SparsityPattern,
               iterations: int, products: str = "float32", settle: int = 0, grid=None,
               grid_from: int = 1, split: str = "squared") -> tuple[torch.Tensor, torch.Tensor, int]:
    """A mask and weights for it by ADMM on the layer loss: minimise (w − t)·(H + λI)·(w − t)ᵀ for every row w of
    W [rows, cols] (t the row itself), subject to the pattern, with λ = `damping`. The problem is split into a free
    copy X and a pattern-feasible copy D, held together by a scaled dual V and the penalty ρ:
    - X = (t·(H + λI) + ρ·(D − V))·(H + λI + ρI)⁻¹, one eigendecomposition of H + λI serving every ρ;
    - D = the pattern's projection of X + V: its largest magnitudes kept (`projection`, `keep_mask`'s mask, so every
      pattern, capped and placed ones included);
    - V = X + V − D.
    ρ grows geometrically (`ADMM_RHO`, relative to the mean eigenvalue), so the mask is free to change early and
    settles late. Unlike SparseGPT's
    column loop, which fixes each group's mask once with the columns after it not yet compensated, every group's
    mask is revisited with the whole row's compensation known. On 16 of SmolLM2-135M's linears (text Hessians,
    benchmarks/results/admm_layers_smollm2_cpu.md) 100 iterations ended at a geometric mean of 0.63x SparseGPT's
    loss at 2:4 and 16:32, against 0.71x for the exact refit of SparseGPT's own mask; the last layer's down_proj,
    whose inputs have a few outlier directions, is the exception (0.92x and 1.17x; `ADMM_RHO`). This follows the
    idea of ALPS (Meng et al., 2024: ADMM for the support, then conjugate gradients for the weights, which is
    `refit_kept` here). Returns D, exactly zero where pruned, and its mask (True where kept); all rows in one product
    a step. `products`: how the two products with the eigenvectors run (`ADMM_PRODUCTS`, `EigenProducts`); float64
    problems always run in float64. `settle` > 0 stops as soon as the projection has returned the same mask `settle`
    times in a row, and then re-solves D's kept weights for that mask by `ADMM_SETTLED_REFIT` conjugate-gradient
    steps (`refit_kept`), which is where the remaining iterations would take them (0 runs every iteration, as
    before). The third value returned is the number of iterations run. `grid` (a function of D and its mask, such
    as `group_grid`): from iteration `grid_from` on, D is also put on that grid, so that the result is both
    pattern-feasible and rounded. An experiment that failed (`benchmarks/results/admm_grid_layer_cpu.md`): on two of
    Qwen2.5-Coder-1.5B's down layers it ended at 2.6-90x the loss of rounding by SparseGPT's loop with ADMM's mask
    fixed, which `admm(quantize=...)` does. `split`: what 16:32g's projection searches each word's split on
    (`ADMM_SPLITS`)."""
    check_admm_split(split)  # before the eigendecomposition, the long part
    power = 2 if split == "squared" else 1
    A = H.clone()
    A.diagonal().add_(damping)
    eigenvalues, Q = symmetric_eigh(A)
    eigenvalues = eigenvalues.clamp_min(damping)  # H + λI ≥ λ; rounding can put the smallest a hair below
    solve = EigenProducts(Q, products)
    G = W @ A
    # 16:32g: each projection's split search starts from the last one's (the scores move little between steps)
    split = None
    if pattern.placement == "groups":
        kept, split = grouped_mask_and_split(W.abs() ** power, pattern)
    else:
        kept = keep_mask(W.abs(), pattern)
    D = W * kept
    V = torch.zeros_like(W)
    first, last = ADMM_RHO
    rho = first * float(eigenvalues.mean())
    growth = (last / first) ** (1 / max(iterations - 1, 1))
    unchanged = 0
    for step in range(1, iterations + 1):
        X = solve(G + rho * (D - V), eigenvalues + rho)
        X += V
        previous = kept
        if split is not None:
            kept, split = grouped_mask_and_split(X.abs() ** power, pattern, split)
        else:
            kept = projection(X.abs(), pattern)
        D = X * kept if grid is None or step < grid_from else grid(X * kept, kept)
        V = X.sub_(D)
        rho *= growth
        if settle:
            unchanged = unchanged + 1 if torch.equal(kept, previous) else 0
            if unchanged == settle:
                if step < iterations:
                    D = refit_kept(D, W, H, damping, kept, ADMM_SETTLED_REFIT)
                break
    return D, kept, step


def group_grid(quantize: str, group: int):
    """For `admm_prune(grid=...)`: each row's groups of `group` columns rounded to the nearest point of their own
    grid (`grid_scale` of the group's largest kept magnitude), pruned weights left at zero."""
    def rounded(D: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        groups = D.view(D.shape[0], -1, group)
        scale = grid_scale(groups.abs().amax(2, keepdim=True), quantize)
        return round_to_grid(groups, scale, quantize).view_as(D) * kept
    return rounded


# The orders in which the column loop can visit W's columns (`sparsegpt(order=...)`): "columns" left to right, as
# SparseGPT and GPTQ do; "hessian" in units of whole N:M groups (single columns for GPTQ), heaviest diag(H) first.
ORDERS = SOLVER_ORDERS


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise SolverSettingsError(f"order = {order!r} is not a solver order; use one of {', '.join(ORDERS)}")


def order_unit(pattern: SparsityPattern | None) -> int:
    """The columns that stay together, in their order, when the loop visits W by `order="hessian"`: an N:M group
    (the mask is chosen per group of M columns); 1 otherwise. int4 scale groups need not stay together: under this
    order their scales are fixed before the loop (`_solve`)."""
    return pattern.m if pattern is not None and pattern.is_nm else 1


def hessian_order(hessian: torch.Tensor, unit: int) -> torch.Tensor:
    """Column indices in units of `unit` consecutive columns, the unit with the largest sum of diag(H) first (ties
    in column order): GPTQ's activation order, kept to whole units so that N:M groups and scale groups survive.
    Visiting the heaviest inputs first leaves their pruning and rounding errors the most later columns to be spread
    over, and the lightest inputs absorb the compensation last."""
    weight = hessian.diagonal().reshape(-1, unit).sum(1)
    units = torch.sort(weight, descending=True, stable=True).indices
    return (units[:, None] * unit + torch.arange(unit, device=units.device)).reshape(-1)


# Signed code range of each supported quantization; the grid is code·scale (symmetric, no zero point).
CODE_RANGES = {"int8": (-128, 127), "int4": (-8, 7)}
# Significant bits of a scale: bfloat16's 8 less those of the largest code magnitude (127: 7, 7: 3; ±128, −8: 1).
SCALE_BITS = {"int8": 8 - 7, "int4": 8 - 3}


def quantization_group(quantize: str | None, group_size: int, in_features: int) -> int | None:
    """The number of input columns that share a scale (in_features for int8, `group_size` for int4), or None for
    no quantization. Raises QuantizationError (one line) for anything else."""
    if quantize is None or quantize == "none":
        return None
    if quantize not in CODE_RANGES:
        raise QuantizationError(f"quantize = {quantize!r} is not supported; use int8, int4 or none")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise QuantizationError(f"group_size = {group_size!r} must be a positive integer such as 128")
    if quantize == "int8":
        return in_features
    if in_features % group_size:
        raise QuantizationError(f"group_size {group_size} does not divide the row length {in_features}; choose a "
                                f"divisor such as {math.gcd(in_features, 128)}")
    return group_size


def grid_scale(absmax: torch.Tensor, quantize: str, float16: bool = False) -> torch.Tensor:
    """Scale of a group with largest magnitude `absmax`: absmax/(top code + ½), so round-to-nearest never clips more
    than half a step, rounded up to SCALE_BITS significant bits; 1 for an all-zero group. `float16`: the weight is
    returned in float16, whose smallest step is 2⁻²⁴, so a smaller scale is rounded up to a multiple of it (every
    code·scale is then exact there too; only groups with |w| below about 1.5e-5 are affected)."""
    bits = SCALE_BITS[quantize]
    mantissa, exponent = torch.frexp(absmax / (CODE_RANGES[quantize][1] + 0.5))
    scale = torch.ldexp(torch.ceil(mantissa * 2**bits), exponent - bits)  # both steps exact
    if float16:
        scale = torch.where(scale < 2.0 ** (bits - 24), torch.ceil(scale * 2.0**24) * 2.0**-24, scale)
    return torch.where(absmax > 0, scale, torch.ones_like(scale))


def round_to_grid(w: torch.Tensor, scale: torch.Tensor, quantize: str) -> torch.Tensor:
    """Nearest grid point code·scale of every w (codes clamped to the range)."""
    low, high = CODE_RANGES[quantize]
    return torch.clamp(torch.round(w / scale), low, high) * scale


# `scale_search`: a group's scale is taken among its largest kept magnitude times each of these (1 = no clipping)
SCALE_SHRINKS = tuple(1 - 0.025 * step for step in range(19))  # 1.0 down to 0.55


def searched_scale(W: torch.Tensor, d: torch.Tensor, kept: torch.Tensor, quantize: str,
                   float16: bool = False) -> torch.Tensor:
    """Per row of W [rows, group], the grid scale among `SCALE_SHRINKS` of the largest kept magnitude with the least
    Σ ((w − q)/d)² over the row's kept weights: d [group] is the column loop's [U]ᵢᵢ, so this is the loss the loop
    charges for rounding the group as it stands (the clipping search of GPTQ's and AWQ's implementations, here
    weighted as the loop weighs it). A smaller scale clips the largest weights and rounds the rest more finely;
    shrink 1, `grid_scale` of the largest kept magnitude, wins ties."""
    kept = kept.to(W.dtype)
    absmax = (W * kept).abs().amax(1)
    weight = kept / d.square()
    best = best_error = None
    for shrink in SCALE_SHRINKS:
        scale = grid_scale(absmax * shrink, quantize, float16)
        error = ((W - round_to_grid(W, scale[:, None], quantize)).square() * weight).sum(1)
        if best is None:
            best, best_error = scale, error
        else:
            better = error < best_error
            best, best_error = torch.where(better, scale, best), torch.minimum(error, best_error)
    return best


def group_kept_estimate(W: torch.Tensor, d: torch.Tensor, pattern: SparsityPattern | None) -> torch.Tensor:
    """The weights of a scale group W [rows, group] that the column loop will likely keep, for `searched_scale`
    where the loop chooses the mask as it goes: the N largest W²/d² of each group of M (N:M patterns whose M divides
    the group), else every weight."""
    if pattern is None or not pattern.is_nm or W.shape[1] % pattern.m:
        return torch.ones_like(W, dtype=torch.bool)
    groups = (W.square() / d.square()).view(W.shape[0], -1, pattern.m)
    kept = torch.zeros_like(groups, dtype=torch.bool)
    kept.scatter_(2, groups.topk(pattern.n, dim=2).indices, True)
    return kept.view_as(W)


def check_rounding_sweeps(sweeps: int) -> None:
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or not 0 <= sweeps <= MAX_ROUNDING_SWEEPS:
        raise SolverSettingsError(f"rounding_sweeps = {sweeps!r} must be an integer from 0 (off) to "
                                  f"{MAX_ROUNDING_SWEEPS}, such as 3")


MAX_ROUNDING_SWEEPS = 1000


@torch.no_grad()
def rounding_sweeps(W: torch.Tensor, target: torch.Tensor, A: torch.Tensor, kept: torch.Tensor,
                    column_scale: torch.Tensor, quantize: str, sweeps: int, block: int = 128) -> torch.Tensor:
    """Coordinate descent on a rounded weight W [rows, cols] (in place, returned): `sweeps` passes over the columns,
    each moving every kept weight of the column to the grid point (its own scale, `column_scale` [rows, cols]) nearest
    the minimiser of (w − t)·A·(w − t)ᵀ in that coordinate with the rest of its row held; t the row of `target`, A the
    damped Hessian. That grid point minimises the one-dimensional quadratic over the grid, so no step raises the loss.
    Pruned weights (not `kept`) stay zero. The column loop spreads each rounding error over later columns as if they
    were all free, and then zeroes the pruned ones; these sweeps re-solve every kept weight with the mask and the
    grid both held, as QuantEase (Behdin et al., 2023) does for dense quantization. The gradient (W − T)·A is kept
    exactly: updated column by column inside a block of `block` columns, once a block for the rest."""
    cols = W.shape[1]
    mask = kept.to(W.dtype)
    G = (W - target) @ A
    diagonal = A.diagonal()
    for _ in range(sweeps):
        for b1 in range(0, cols, block):
            b2 = min(b1 + block, cols)
            before = W[:, b1:b2].clone()
            Gb = G[:, b1:b2].clone()
            Ab = A[b1:b2, b1:b2]
            for j in range(b2 - b1):
                column = W[:, b1 + j]
                best = round_to_grid(column - Gb[:, j] / diagonal[b1 + j], column_scale[:, b1 + j], quantize)
                best.mul_(mask[:, b1 + j])
                Gb.addr_(best - column, Ab[j])
                column.copy_(best)
            G.addmm_(W[:, b1:b2] - before, A[b1:b2])  # the block's own columns get exactly Gb
    return W


@dataclass(frozen=True)
class QuantizedCodes:
    """A weight on a quantization grid as `codes` [out, in] int8 and `scales` [out, in/group_size] float32:
    W[o, i] = codes[o, i] · scales[o, i // group_size] (int8: group_size = in, one scale per row)."""

    codes: torch.Tensor
    scales: torch.Tensor
    quantize: str
    group_size: int

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        scales = self.scales.repeat_interleave(self.group_size, dim=1)
        return (self.codes.to(torch.float32) * scales).to(dtype)


@torch.no_grad()
def quantization_codes(weight: torch.Tensor, quantize: str, group_size: int = 128) -> QuantizedCodes:
    """Codes and scales of a weight whose values lie on a `quantize` grid, such as `sparsegpt(..., quantize=...)`
    returns: for each row (int8) or row group (int4) with largest magnitude a, the scale is a/k for the largest
    code magnitude k for which every value is an in-range integer multiple of it, exactly, and the scale is exact in
    bfloat16 (the solver's own scale always qualifies). Zeros get code 0, so pruned weights stay zero.
    Raises QuantizationError if some group is not on any such grid, or the weight is not a finite [out, in] tensor."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.is_meta:
        raise QuantizationError(f"quantization_codes needs a 2-D weight [out, in] with values, got "
                                f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight)}")
    if not bool(torch.isfinite(weight).all()):
        raise QuantizationError("the weight holds NaN or inf, which is on no quantization grid")
    out, in_features = weight.shape
    if not weight.is_floating_point() or not out or not in_features:
        raise QuantizationError(f"quantization_codes needs a floating-point weight with rows and columns, got "
                                f"{tuple(weight.shape)} {str(weight.dtype).removeprefix('torch.')}")
    group = quantization_group(quantize, group_size, in_features)
    if group is None:
        raise QuantizationError("quantization_codes needs quantize = int8 or int4")
    low, high = CODE_RANGES[quantize]
    values = weight.detach().to(torch.float64).reshape(-1, group)
    absmax = values.abs().amax(1)
    scales = torch.ones_like(absmax)
    codes = torch.zeros_like(values)
    pending = (absmax > 0).nonzero().flatten()
    for k in range(max(-low, high), 0, -1):
        if not len(pending):
            break
        scale = (absmax[pending] / k).to(torch.bfloat16).to(torch.float64)
        candidate = torch.round(values[pending] / scale[:, None])
        fits = ((candidate * scale[:, None] == values[pending]) & (candidate >= low) & (candidate <= high)).all(1)
        done = pending[fits]
        scales[done], codes[done] = scale[fits], candidate[fits]
        pending = pending[~fits]
    if len(pending):
        row, first = divmod(int(pending[0]) * group, in_features)
        raise QuantizationError(f"row {row}, columns {first}..{first + group - 1} are not on an {quantize} grid with "
                                f"group size {group}; put it on the grid first (`sparsedecoding prune --keep-mask "
                                f"--quantize {quantize}` on a pruned model, or solvers.sparsegpt / solvers.gptq with "
                                "quantize=)")
    return QuantizedCodes(codes.to(torch.int8).reshape(out, in_features),
                          scales.to(torch.float32).reshape(out, in_features // group), quantize, group)


def prune_block(WT: torch.Tensor, U1: torch.Tensor, d: torch.Tensor, pattern: SparsityPattern | None,
                segments: tuple[int, ...], pruned1: torch.Tensor, ErrT: torch.Tensor, quantize: str | None = None,
                scaleT: torch.Tensor | None = None, fixedT: torch.Tensor | None = None) -> None:
    """SparseGPT's in-block column loop, in place on the transposed block WT [B, rows] (column i is the row WT[i]).

    Fills `pruned1` [B, rows] (True = pruned; all False for pattern None, plain GPTQ) and `ErrT` [B, rows] (the
    scaled errors spread to later blocks) and leaves the updated weights in WT. With `quantize`, each column's kept
    entries are rounded to the grid of `scaleT` [B, rows] (the scale of each entry's group), its pruned ones set to 0,
    and the combined error spread. `segments` are the row counts of weights stacked on one Hessian: the unstructured
    threshold is taken per segment so stacking never changes a weight's result. `fixedT` [B, rows] (True = pruned)
    fixes the mask instead of choosing it (`keep_zeros`)."""
    pruned1.zero_()
    if fixedT is not None:
        pruned1.copy_(fixedT)
    elif pattern is not None and not pattern.is_nm:
        score = WT.square() / d.square().unsqueeze(1)
        start = 0
        for rows in segments:
            block = score[:, start:start + rows]
            lowest = block.flatten().topk(math.floor(block.numel() * pattern.sparsity + 1e-9), largest=False).indices
            chosen = torch.zeros(block.numel(), dtype=torch.bool, device=block.device)
            chosen.scatter_(0, lowest, torch.ones_like(lowest, dtype=torch.bool))  # no host scalar: graph-safe
            pruned1[:, start:start + rows] = chosen.view(block.shape)
            start += rows
    nm = pattern is not None and pattern.is_nm and fixedT is None
    if quantize is None:
        scale = pruned1.to(WT.dtype) / d.unsqueeze(1)  # 1/[U]_ii where pruned, 0 where kept
    for i in range(WT.shape[0]):
        if nm and i % pattern.m == 0:
            group = slice(i, i + pattern.m)
            score = WT[group].square() / d[group].square().unsqueeze(1)
            pruned1[group] = ~keep_mask(score.T, pattern).T
            if quantize is None:
                scale[group] = pruned1[group].to(WT.dtype) / d[group].unsqueeze(1)
        if quantize is None:
            torch.mul(WT[i], scale[i], out=ErrT[i])
            WT[i:].addr_(U1[i, i:], ErrT[i], alpha=-1)
        else:
            q = round_to_grid(WT[i], scaleT[i], quantize).masked_fill_(pruned1[i], 0)
            torch.div(WT[i] - q, d[i], out=ErrT[i])
            WT[i:].addr_(U1[i, i:], ErrT[i], alpha=-1)
            WT[i].copy_(q)  # exactly on the grid, not q plus rounding residue of the update


class CapturedBlock:
    """`prune_block` for one shape captured as a CUDA graph: the loop issues a few hundred tiny kernels per block, and
    replaying them from a graph removes the per-launch host overhead that otherwise dominates the solver's time."""

    def __init__(self, rows: int, blocksize: int, pattern: SparsityPattern | None, segments: tuple[int, ...],
                 quantize: str | None, dtype: torch.dtype, device: torch.device, fixed: bool = False):
        self.WT = torch.zeros(blocksize, rows, dtype=dtype, device=device)
        self.U1 = torch.eye(blocksize, dtype=dtype, device=device)
        self.d = torch.ones(blocksize, dtype=dtype, device=device)
        self.scaleT = torch.ones(blocksize, rows, dtype=dtype, device=device) if quantize else None
        self.pruned1 = torch.zeros(blocksize, rows, dtype=torch.bool, device=device)
        self.ErrT = torch.zeros(blocksize, rows, dtype=dtype, device=device)
        self.fixedT = torch.zeros(blocksize, rows, dtype=torch.bool, device=device) if fixed else None
        args = (self.WT, self.U1, self.d, pattern, segments, self.pruned1, self.ErrT, quantize, self.scaleT,
                self.fixedT)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside capture, as CUDA graphs require
            prune_block(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            prune_block(*args)

    def __call__(self, WT: torch.Tensor, U1: torch.Tensor, d: torch.Tensor, scaleT: torch.Tensor | None,
                 fixedT: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        self.WT.copy_(WT)
        self.U1.copy_(U1)
        self.d.copy_(d)
        if scaleT is not None:
            self.scaleT.copy_(scaleT)
        if fixedT is not None:
            self.fixedT.copy_(fixedT)
        self.graph.replay()
        return self.WT, self.pruned1, self.ErrT


_captured: dict[tuple, CapturedBlock] = {}


def _column_loop(W: torch.Tensor, U: torch.Tensor, pattern: SparsityPattern | None, segments: tuple[int, ...],
                 quantize: str | None, group: int, blocksize: int, use_graph: bool,
                 scales: torch.Tensor | None = None, fixed: torch.Tensor | None = None,
                 float16: bool = False, column_groups: torch.Tensor | None = None,
                 search: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One left-to-right pass over W's columns in blocks (in place); returns the pruned mask and the scales. With
    `quantize`, a group's scale comes from its weights as they stand when its block starts, as in GPTQ (`search`:
    `searched_scale` on them, else `grid_scale` of their largest magnitude), unless `scales` [rows, cols/group] are
    given (`float16`: scales for a float16 result, `grid_scale`). `column_groups` [cols]: the
    scale group of each column of W (default column // group; the hessian order passes the visited columns' own
    groups). `fixed` [rows, cols] (True = pruned) is the mask to keep instead of choosing one."""
    rows, cols = W.shape
    pruned = torch.zeros(rows, cols, dtype=torch.bool, device=W.device)
    given_scales = scales is not None
    if quantize is not None and not given_scales:
        scales = torch.empty(rows, cols // group, dtype=W.dtype, device=W.device)
    U_diag = U.diagonal()
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        WT, U1, d, scaleT = W[:, i1:i2].T.contiguous(), U[i1:i2, i1:i2], U_diag[i1:i2], None
        fixedT = None if fixed is None else fixed[:, i1:i2].T.contiguous()
        if quantize is not None:
            for g in range(-(-i1 // group) * group, i2, group) if not given_scales else ():
                if search:
                    part, charged = W[:, g:g + group], U_diag[g:g + group]
                    kept = ~fixed[:, g:g + group] if fixed is not None else group_kept_estimate(part, charged, pattern)
                    scales[:, g // group] = searched_scale(part, charged, kept, quantize, float16)
                else:
                    scales[:, g // group] = grid_scale(W[:, g:g + group].abs().amax(1), quantize, float16)
            where = (torch.arange(i1, i2, device=W.device) // group if column_groups is None
                     else column_groups[i1:i2])
            scaleT = scales[:, where].T.contiguous()
        if use_graph:
            key = (rows, i2 - i1, pattern, segments, quantize, W.dtype, W.device, fixed is not None)
            if key not in _captured:
                _captured[key] = CapturedBlock(rows, i2 - i1, pattern, segments, quantize, W.dtype, W.device,
                                               fixed is not None)
            WT, pruned1, ErrT = _captured[key](WT, U1, d, scaleT, fixedT)
        else:
            pruned1, ErrT = torch.empty_like(WT, dtype=torch.bool), torch.empty_like(WT)
            prune_block(WT, U1, d, pattern, segments, pruned1, ErrT, quantize, scaleT, fixedT)
        W[:, i1:i2] = WT.T
        pruned[:, i1:i2] = pruned1.T
        W[:, i2:].addmm_(ErrT.T, U[i1:i2, i2:], alpha=-1)
    W[pruned] = 0  # the in-block update leaves rounding-level residue on pruned entries
    if quantize is not None:
        warn_saturated(W, scales, pruned, quantize, column_groups)
    return pruned, scales


SATURATED_SHARE = 0.1  # of the kept weights' codes at the ends of the range, above which the solve warns


def warn_saturated(W: torch.Tensor, scales: torch.Tensor, pruned: torch.Tensor, quantize: str,
                   column_groups: torch.Tensor | None = None) -> None:
    """One warning when more than SATURATED_SHARE of the kept weights' codes sit at the ends of the code range: the
    error compensation then outgrew the scales (seen with a very small damping and outlier inputs, where GPTQ ended
    several times worse than round-to-nearest), and clipping fed back into the solve. `scales` [rows, groups];
    `column_groups` [cols]: each column's scale group where W's columns are not in their own order (the hessian
    order), else column // group. Counted in blocks of rows, so the extra memory stays a small part of W's."""
    low, high = CODE_RANGES[quantize]
    rows, cols = W.shape
    groups = scales.shape[1]
    ends = kept = 0
    for start in range(0, rows, 1024):
        block = W[start:start + 1024]
        if column_groups is None:
            codes = torch.round(block.view(-1, groups, cols // groups)
                                / scales[start:start + 1024, :, None]).view(-1, cols)
        else:
            codes = torch.round(block / scales[start:start + 1024][:, column_groups])
        live = ~pruned[start:start + 1024]
        ends += int((((codes <= low) | (codes >= high)) & live).sum())
        kept += int(live.sum())
    share = ends / kept if kept else 0.0
    if share > SATURATED_SHARE:
        log.warning("%.0f%% of the kept weights' %s codes sit at the ends of the range: the error compensation "
                    "outgrew the scales (a very small --percdamp with outlier inputs does this); a larger --percdamp "
                    "keeps them in range", 100 * share, quantize)


def normalized_hessian(hessian: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """H / s in `compute` (a new tensor), s the power of four nearest mean(live diag H). Every solver here gives the
    same weights for H and c·H, so dividing by the scale first keeps a float64 H that is tiny or huge inside
    float32's range, and makes the placeholder 1 of a dead input (diag 0) about the live inputs' mean instead of a
    value that can outweigh them by orders of magnitude and swamp the damping. An all-zero H (no input ever reached
    the layer) and an H that is not symmetric (only one triangle would be read) raise CalibrationError."""
    diagonal = hessian.diagonal().to(torch.float64)
    live = diagonal != 0
    if not bool(live.any()):
        raise CalibrationError("the Hessian is zero: no calibration input reached this layer (every input was 0); "
                               "calibrate on other prompts or text")
    # A power of four near the mean: dividing by it is exact and so is its square root in the Cholesky factor, so
    # the weights come out bit for bit as from H itself wherever H was in range. abs: a negative diagonal (not
    # X·Xᵀ) stays negative, for the factorisation to refuse.
    scale = torch.tensor(4.0 ** round(math.log(float(diagonal[live].abs().mean()), 4)), dtype=torch.float64)
    if hessian.dtype == torch.float64 and compute != torch.float64:  # divide before narrowing, by blocks of rows
        H = torch.empty(hessian.shape, dtype=compute, device=hessian.device)
        for start in range(0, hessian.shape[0], 1024):
            H[start:start + 1024] = hessian[start:start + 1024] / scale.to(hessian.device)
    else:
        H = hessian.to(compute) / scale.to(compute)
    size, worst = H.shape[0], 0.0
    for start in range(0, size, 1024):  # in row blocks: H - Hᵀ whole would double the memory of a large layer
        worst = max(worst, float((H[start:start + 1024] - H[:, start:start + 1024].T).abs().max()))
    top = float(H.diagonal().abs().max())
    if worst > 1e-3 * top:
        raise CalibrationError(f"the Hessian is not symmetric (largest |H - Hᵀ| is {worst / top:.3g} of its largest "
                               f"diagonal entry); it must be X·Xᵀ of the layer inputs")
    return H


@torch.no_grad()
def _solve(weights: list[torch.Tensor], hessian: torch.Tensor, pattern: SparsityPattern | None,
           quantize: str | None, group_size: int, blocksize: int, percdamp: float, cuda_graph: bool | None,
           keep_zeros: bool = False, order: str = "columns", refit_steps: int = 0,
           admm_iterations: int = 0, admm_products: str = "float32", admm_settle: int = 0,
           scale_search: bool = False, sweeps: int = 0, admm_split: str = "squared") -> list[torch.Tensor]:
    """SparseGPT (pattern set) or GPTQ (pattern None) on weights stacked by rows, all against one factorisation;
    `keep_zeros`: the mask is the weights' zeros (checked against the N:M pattern), not chosen; `order` and
    `refit_steps`: see `sparsegpt`; `admm_iterations` (with a pattern): the mask and its weights from `admm_prune`
    instead of the unquantized column loop (see `admm`); `scale_search` and `sweeps` (with `quantize`): see
    `sparsegpt`."""
    check_percdamp(percdamp)
    check_order(order)
    check_refit_steps(refit_steps)
    check_rounding_sweeps(sweeps)
    if admm_iterations:
        check_admm_iterations(admm_iterations)
        check_admm_products(admm_products)
        check_admm_settle(admm_settle)
        check_admm_split(admm_split)
        if pattern is None or keep_zeros:
            raise SolverSettingsError("ADMM chooses a mask: it needs a sparsity pattern and a mask not kept")
    for weight in weights:
        check_inputs(weight, hessian)
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize <= 0:
        raise SolverSettingsError(f"blocksize = {blocksize!r} must be a positive integer such as 128")
    if pattern is not None:
        for weight in weights:
            check_pattern(weight, pattern)
            if keep_zeros:
                check_kept_zeros(weight, pattern)
        if pattern.is_nm and blocksize % pattern.m != 0:
            raise SparsityPatternError(f"blocksize {blocksize} must be a multiple of M={pattern.m}")
    group = quantization_group(quantize, group_size, weights[0].shape[1])
    quantize = None if group is None else quantize
    if quantize is None and (scale_search or sweeps):
        raise SolverSettingsError("scale_search and rounding sweeps shape a quantization: they need quantize "
                                  "int8 or int4")
    if cuda_graph and not weights[0].is_cuda:
        raise SolverSettingsError(f"cuda_graph=True captures the column loop as a CUDA graph: the weights must be on "
                                  f"a CUDA device, not {weights[0].device} (None picks it by device)")
    compute = torch.float64 if weights[0].dtype == torch.float64 else torch.float32
    W = torch.cat([weight.to(compute) for weight in weights])
    fixed = W == 0 if keep_zeros else None
    segments = tuple(weight.shape[0] for weight in weights)
    H = normalized_hessian(hessian.to(W.device), compute)
    # 16:32g's split is a search whose rounds stop when no swap helps (a host decision): no CUDA graph for it
    use_graph = (W.is_cuda if cuda_graph is None else cuda_graph) and not (pattern is not None
                                                                             and pattern.placement == "groups")
    float16 = any(weight.dtype == torch.float16 for weight in weights)

    dead = H.diagonal() == 0  # inputs that were always zero: any weight there is free to prune
    H[dead, dead] = 1  # the mean of the live diagonal (normalized_hessian), so the damping is the live inputs'
    W[:, dead] = 0
    visit = column_groups = None
    if order == "hessian":  # the loop runs on W and H with columns permuted; the result is put back in place
        visit = hessian_order(H, order_unit(pattern))
        W, H = W[:, visit], H.index_select(0, visit).index_select(1, visit)
        fixed = None if fixed is None else fixed[:, visit]
        column_groups = visit // group if quantize is not None else None  # each visited column's own scale group
    target = W.clone() if sweeps else None  # what the sweeps fit: the weight before pruning (in the loop's order)
    # ADMM without rounding runs no column loop: only the damping is needed, not the inverse's factor
    U, damping = damped_factor(H, percdamp, inverse=not admm_iterations or quantize is not None)
    refitting = bool(refit_steps) and pattern is not None
    if admm_iterations:
        # The mask and its weights from ADMM on the whole loss (`admm_prune`); then as for the refit: optionally
        # re-solved for the mask, and with `quantize` rounded by the loop below with the mask fixed.
        solved, kept, _ = admm_prune(W, H, damping, pattern, admm_iterations, admm_products, admm_settle,
                                     split=admm_split)
        pruned = ~kept
        if refit_steps:
            solved = refit_kept(solved, W, H, damping, kept, refit_steps)
        W, fixed, refitting = solved, pruned, True
    elif refitting:
        # The mask from the unquantized loop, its kept weights re-solved exactly for it (`refit_kept`); with
        # `quantize` the loop below then rounds them with that mask fixed. The refit minimises the loss over the
        # mask, so the loss of any rounding splits into the refit's loss plus the rounding's own: the quantized
        # pass on the refit weights is GPTQ on the best weights the mask allows.
        refitted = W.clone()
        pruned, _ = _column_loop(refitted, U, pattern, segments, None, group, blocksize, use_graph, fixed=fixed)
        W, fixed = refit_kept(refitted, W, H, damping, ~pruned, refit_steps), pruned
        del refitted
    scales = None
    if quantize == "int8" and pattern is not None or quantize == "int4" and visit is not None:
        # Scales fixed before the loop, from an unquantized solve of the same problem (W itself without pruning).
        # int8 + pruning: one scale per row must cover the kept weights after all of the pruning's compensation,
        # which grows them (by 15-20% at 2:4 on test problems), so a scale set from W up front clips them. int4 in
        # the hessian order: a group's scale cannot wait for the loop to reach the group, whose columns are visited
        # apart; fixed scales let the order move single N:M groups (or columns) instead of whole scale groups.
        first = W  # refitting: already the unrounded solve
        if pattern is not None and not refitting:
            first = W.clone()
            _column_loop(first, U, pattern, segments, None, group, blocksize, use_graph, fixed=fixed)
        if visit is not None:
            first = torch.empty_like(first).index_copy_(1, visit, first)
        if scale_search:  # against the loop's [U]ᵢᵢ of each column, put back in W's own column order
            d = U.diagonal() if visit is None else torch.empty_like(U.diagonal()).index_copy_(0, visit, U.diagonal())
            kept = first != 0 if pattern is not None else torch.ones_like(first, dtype=torch.bool)
            scales = torch.stack([searched_scale(first[:, g:g + group], d[g:g + group], kept[:, g:g + group],
                                                 quantize, float16) for g in range(0, first.shape[1], group)], 1)
        else:
            scales = grid_scale(first.abs().view(first.shape[0], -1, group).amax(2), quantize, float16)
        del first
    if not refitting or quantize is not None:  # unquantized, the refit weights are the result
        pruned, scales = _column_loop(W, U, pattern, segments, quantize, group, blocksize, use_graph, scales, fixed,
                                      float16, column_groups, scale_search)
    if sweeps:
        A = H.clone()
        A.diagonal().add_(damping)
        column_scale = scales[:, column_groups] if column_groups is not None else \
            scales.repeat_interleave(group, dim=1)
        rounding_sweeps(W, target, A, ~pruned, column_scale, quantize, sweeps)
        del A, column_scale, target
    if visit is not None:
        W = torch.empty_like(W).index_copy_(1, visit, W)
    return [part.to(weight.dtype) for part, weight in zip(W.split(segments), weights)]


def sparsegpt_shared(weights: list[torch.Tensor], hessian: torch.Tensor, pattern: SparsityPattern | str, *,
                     quantize: str | None = None, group_size: int = 128, blocksize: int = 128,
                     percdamp: float = 0.01, cuda_graph: bool | None = None,
                     keep_zeros: bool = False, order: str = "columns", refit_steps: int = 0,
                     scale_search: bool = False, rounding_sweeps: int = 0) -> list[torch.Tensor]:
    """`sparsegpt` for several weights that read the same input (q/k/v, gate/up): their rows are stacked and solved
    against one Hessian factorisation, which gives exactly the per-weight results at a fraction of the launches.
    `cuda_graph` (default: on for CUDA tensors) replays the in-block loop from a captured graph; same arithmetic."""
    return _solve(weights, hessian, SparsityPattern.parse(pattern), quantize, group_size, blocksize, percdamp,
                  cuda_graph, keep_zeros, order, refit_steps, scale_search=scale_search, sweeps=rounding_sweeps)


def sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, pattern: SparsityPattern | str, *,
              quantize: str | None = None, group_size: int = 128, blocksize: int = 128,
              percdamp: float = 0.01, keep_zeros: bool = False, order: str = "columns",
              refit_steps: int = 0, scale_search: bool = False, rounding_sweeps: int = 0) -> torch.Tensor:
    """SparseGPT (OBS with lazy block updates). Columns are visited left to right; column i's pruned entries are set
    to zero and the error err = (w_i − q_i)/[U]_ii is spread over the columns j > i by w_j −= err·U_ij, where U is the
    upper Cholesky factor of (H + λI)⁻¹ (inside the block at once, to later blocks in one product per block).
    The mask is chosen from the current (already updated) weights with score w²/[U]_ii²: for unstructured patterns the
    lowest-scoring `sparsity` share of each block of `blocksize` columns (one threshold over the block, all rows), for
    N:M the M − N lowest of each row's group of M columns, chosen when the loop reaches the group.

    `quantize` ("int8" or "int4"; default None) is the paper's joint mode: q_i is also the kept entries rounded to
    the grid (see the module docstring; int4 scales per `group_size` input columns, default 128, set from the
    group's current weights when its block starts; int8 per row from the whole W; fixed before the loop where the
    loop cannot set them as it goes, see `order`), so the error spread is pruning plus rounding. The result's kept
    values are exactly on the grid; `quantization_codes` gives codes and scales.

    `keep_zeros` keeps the mask W already has (its zeros; an N:M pattern, at least M − N zeros in every group of M)
    instead of choosing one. The kept entries are re-solved against H, rounded to the grid with `quantize`, and the
    error is spread over kept entries only: this quantizes a pruned (and repaired) model without touching its mask.

    Computes in float64 if W is float64, else float32; H may be any float dtype; returns W's dtype. `percdamp`
    (λ relative to mean(diag H), default 0.01) must be positive; a failed factorisation raises it tenfold, to 1.

    `order` = "hessian" visits the columns in whole N:M groups, the group with the largest sum of diag(H) first,
    GPTQ's activation order kept to groups; the mask stays N:M in W's own columns. With int4 each scale group's scale
    is then fixed before the loop from an unquantized solve of the same problem (GPTQ's "static groups"), so the
    order need not keep scale groups whole. On SmolLM2-135M it cut the dev KL along the dense model's answers by
    35% at 2:4 and 23% at 16:32 (benchmarks/results/solver_order_smollm2_cpu.md). Default "columns": left to right.

    `refit_steps` (default 0: off) re-solves the kept weights for the chosen mask after the loop, by that many
    conjugate-gradient steps toward the least loss the mask allows (`refit_kept`); with `quantize` the mask comes
    from the unquantized loop and the refit weights are then rounded with it fixed. Stopping early regularizes:
    the exact refit fits the calibration's Hessians closest and moved SmolLM2-135M furthest from text it was not
    calibrated on (benchmarks/results/solver_refit_smollm2_cpu.md and the solver_refit_steps_* reports).

    Two options shape the rounding (with `quantize` only; both off by default):
    - `scale_search`: each scale from `searched_scale`, the clipping among shrunk largest magnitudes that charges the
      loop least for rounding the group (int8's per-row scales and those fixed before the loop are searched on the
      unquantized solve they come from);
    - `rounding_sweeps`: after the loop, that many passes of coordinate descent over the kept weights with mask,
      scales and grid held (`rounding_sweeps`). Each pass lowers the layer loss or leaves it.
    On two of Qwen2.5-Coder-1.5B's down layers with ADMM's 2:4 mask and int4 values the two cut the layer loss on
    the calibration tokens to 0.40-0.56 of the loop's alone (benchmarks/results/int4_rounding_layer_cpu.md), and on
    held-out tokens to 0.81-0.93 (int4_rounding_heldout_cpu.md), yet the whole decode-calibrated model pruned so was
    worse: dev KL +36%, Lee perplexity +52% (quality-rounding-qwen2.5-coder-1.5b/NOTES.md). On text-calibrated
    SmolLM2-135M the whole model gained (Lee perplexity -10%, int4_rounding_model_smollm2_cpu.md), and so it did
    decode-calibrated (int4_rounding_decode_smollm2_cpu.md). On 28 of Qwen's linears they raised the layer loss only
    at each sequence's first position, which decode-calibrated Hessians never hold (int4_rounding_linears_cpu.md);
    with that position fitted too (--first-positions 1) the whole model was still worse with them: dev KL +6.9%, 10
    dev problem-wordings fewer (quality-first-qwen2.5-coder-1.5b/NOTES.md). Both stay off by default."""
    return sparsegpt_shared([weight], hessian, pattern, quantize=quantize, group_size=group_size,
                            blocksize=blocksize, percdamp=percdamp, keep_zeros=keep_zeros, order=order,
                            refit_steps=refit_steps, scale_search=scale_search, rounding_sweeps=rounding_sweeps)[0]


def admm_shared(weights: list[torch.Tensor], hessian: torch.Tensor, pattern: SparsityPattern | str, *,
                iterations: int = 100, quantize: str | None = None, group_size: int = 128, blocksize: int = 128,
                percdamp: float = 0.01, cuda_graph: bool | None = None, order: str = "columns",
                refit_steps: int = 0, products: str = "float32", settle: int = 0, scale_search: bool = False,
                rounding_sweeps: int = 0, split: str = "squared") -> list[torch.Tensor]:
    """`admm` for several weights that read the same input, their rows stacked against one eigendecomposition (each
    weight's result is the one it gets alone, rows being independent, except with `settle` > 0: the stack stops
    when its whole mask has come out the same `settle` times in a row, so a weight whose own mask settled earlier
    runs on with the others and may end with another mask than alone)."""
    check_admm_iterations(iterations)  # here: _solve reads 0 as "no ADMM" and would run SparseGPT
    return _solve(weights, hessian, SparsityPattern.parse(pattern), quantize, group_size, blocksize, percdamp,
                  cuda_graph, order=order, refit_steps=refit_steps, admm_iterations=iterations,
                  admm_products=products, admm_settle=settle, scale_search=scale_search, sweeps=rounding_sweeps,
                  admm_split=split)


def admm(weight: torch.Tensor, hessian: torch.Tensor, pattern: SparsityPattern | str, *, iterations: int = 100,
         quantize: str | None = None, group_size: int = 128, blocksize: int = 128, percdamp: float = 0.01,
         order: str = "columns", refit_steps: int = 0, products: str = "float32", settle: int = 0,
         scale_search: bool = False, rounding_sweeps: int = 0, split: str = "squared") -> torch.Tensor:
    """Prune by ADMM on the whole layer loss (`admm_prune`, `iterations` steps, default 100) instead of SparseGPT's
    one pass over the columns: the same damped, normalized Hessian and the same patterns, but every group's mask is
    revisited while the weights of the whole row move toward the loss. `refit_steps` then re-solves the kept weights
    for the mask (`refit_kept`; ADMM's own weights are close to that already). With `quantize` the kept weights are
    rounded by SparseGPT's loop with ADMM's mask fixed (GPTQ on ADMM's weights; `blocksize`, `group_size`, `order`,
    `scale_search` and `rounding_sweeps` as in `sparsegpt`, read only then). Computes in float64 if W is float64,
    else float32; returns W's dtype. `products` = "tf32" runs the iterations' products with the eigenvectors on
    TF32 operands (see `ADMM_PRODUCTS`; ignored for float64). `split`: what a 16:32g projection searches each
    word's split on, "squared" or "magnitude" (`ADMM_SPLITS`)."""
    return admm_shared([weight], hessian, pattern, iterations=iterations, quantize=quantize, group_size=group_size,
                       blocksize=blocksize, percdamp=percdamp, order=order, refit_steps=refit_steps,
                       products=products, settle=settle, scale_search=scale_search,
                       rounding_sweeps=rounding_sweeps, split=split)[0]


def gptq_shared(weights: list[torch.Tensor], hessian: torch.Tensor, quantize: str = "int8", *,
                group_size: int = 128, blocksize: int = 128, percdamp: float = 0.01,
                cuda_graph: bool | None = None, order: str = "columns", scale_search: bool = False,
                rounding_sweeps: int = 0) -> list[torch.Tensor]:
    """`gptq` for several weights that read the same input, stacked by rows against one factorisation as in
    `sparsegpt_shared` (each weight's result is the one it gets alone)."""
    if quantize not in CODE_RANGES:
        raise QuantizationError(f"gptq needs quantize = int8 or int4, got {quantize!r}")
    return _solve(weights, hessian, None, quantize, group_size, blocksize, percdamp, cuda_graph, order=order,
                  scale_search=scale_search, sweeps=rounding_sweeps)


def gptq(weight: torch.Tensor, hessian: torch.Tensor, quantize: str = "int8", *, group_size: int = 128,
         blocksize: int = 128, percdamp: float = 0.01, order: str = "columns", scale_search: bool = False,
         rounding_sweeps: int = 0) -> torch.Tensor:
    """GPTQ: dense weight rounded to the `quantize` grid column by column, each column's rounding error spread over
    the later columns through the inverse Hessian's Cholesky factor exactly as in `sparsegpt` (which is this loop
    with pruning added). Same grids, settings and result conventions as `sparsegpt(..., quantize=...)`;
    `order` = "hessian" is GPTQ's activation order, one column at a time, heaviest first (int4: with each group's
    scale fixed from W before the loop, GPTQ's "static groups"); `scale_search` and `rounding_sweeps` as in
    `sparsegpt`."""
    return gptq_shared([weight], hessian, quantize, group_size=group_size, blocksize=blocksize,
                       percdamp=percdamp, order=order, scale_search=scale_search,
                       rounding_sweeps=rounding_sweeps)[0]
