"""16:32g's split search (`solvers.grouped_partition`) as one Triton kernel: every round of every word in one launch.

The torch search takes, in each round, the best swap of two columns of different groups of every word still moving,
for all words at once: about 25 small kernels a round, a host sync to learn whether any word moved, and five
[words, rows, 448] float32 intermediates written and read back. ADMM's 16:32g projection runs it once an iteration
(100 iterations a linear), which made plan-grouped.json's q16g prune take 396 s on an H100 against 195 s for the
same ADMM at 16:32+2 (quality-grouped-qwen2.5-coder-1.5b/NOTES.md).

Here a program takes words one after another and runs each word's rounds to the end before the next: per round it
gathers the word's scores in the current order ([rows, 32]), the two largest of each position's three group-mates
and the group's top-two sums, puts them in the program's scratch slot, reads them back by swap ([rows, 512], the 448
swaps padded) and picks the best gain. The arithmetic is the torch search's: the same max / min networks (exact),
the same sums in the same elementwise order; only the order of the sums over rows and over groups may differ, by
rounding, which can change the pick where two swaps' gains are within a few ulps. Ties go to the lowest swap.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .triton_spmv import interpreted

SWAP_SLOTS = 512  # the 448 swaps across groups, padded to a power of two
PROGRAMS_PER_SM = 8  # persistent programs a multiprocessor: enough to hide the rounds' dependent loads


@triton.jit
def _search_kernel(words, order, swap_i, swap_j, scratch, count, rounds, programs,
                   ROWS: tl.constexpr, SWAPS: tl.constexpr, VALID: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)
    p = tl.arange(0, 32)
    s = tl.arange(0, SWAPS)
    si = tl.load(swap_i + s)
    sj = tl.load(swap_j + s)
    valid = s < VALID
    # each position's three group-mates, in increasing position as `solvers._OTHERS` lists them
    first = (p // 4) * 4
    within = p % 4
    mate0 = first + tl.where(within == 0, 1, 0)
    mate1 = first + tl.where(within <= 1, 2, 1)
    mate2 = first + tl.where(within <= 2, 3, 2)
    slot = scratch + pid.to(tl.int64) * (4 * ROWS * 32)
    cell = r[:, None] * 32 + p[None, :]
    w = pid
    while w < count:
        base_w = words + w.to(tl.int64) * (ROWS * 32)
        order_w = order + w.to(tl.int64) * 32
        n = 0
        while n < rounds:
            o = tl.load(order_w + p)
            placed = tl.load(base_w + r[:, None] * 32 + o[None, :])  # [rows, 32], in order
            a = tl.load(base_w + r[:, None] * 32 + tl.load(order_w + mate0)[None, :])
            b = tl.load(base_w + r[:, None] * 32 + tl.load(order_w + mate1)[None, :])
            c = tl.load(base_w + r[:, None] * 32 + tl.load(order_w + mate2)[None, :])
            high = tl.maximum(a, b)
            low = tl.minimum(a, b)
            largest = tl.maximum(high, c)
            second = tl.maximum(low, tl.minimum(high, c))
            top = largest + second  # the two largest of the other three
            # the group's two largest: the larger of this entry and the mates' largest, then the next
            group_top = tl.maximum(placed, largest) + tl.maximum(tl.minimum(placed, largest), second)
            base = tl.sum(group_top, axis=0)  # [32]: each group's sum over rows, at each of its four positions
            total = tl.sum(tl.where(within == 0, base, 0.0), axis=0)
            tl.store(slot + cell, top)
            tl.store(slot + ROWS * 32 + cell, second)
            tl.store(slot + 2 * ROWS * 32 + cell, placed)
            tl.store(slot + 3 * ROWS * 32 + p, base)
            tl.debug_barrier()
            top_i = tl.load(slot + r[:, None] * 32 + si[None, :])
            top_j = tl.load(slot + r[:, None] * 32 + sj[None, :])
            second_i = tl.load(slot + ROWS * 32 + r[:, None] * 32 + si[None, :])
            second_j = tl.load(slot + ROWS * 32 + r[:, None] * 32 + sj[None, :])
            placed_i = tl.load(slot + 2 * ROWS * 32 + r[:, None] * 32 + si[None, :])
            placed_j = tl.load(slot + 2 * ROWS * 32 + r[:, None] * 32 + sj[None, :])
            per_row = (top_i + tl.maximum(placed_j - second_i, 0.0) + top_j
                       + tl.maximum(placed_i - second_j, 0.0))
            gain = tl.sum(per_row, axis=0) - tl.load(slot + 3 * ROWS * 32 + si) - tl.load(slot + 3 * ROWS * 32 + sj)
            gain = tl.where(valid, gain, float("-inf"))
            best = tl.max(gain, axis=0)
            pick = tl.min(tl.where(gain == best, s, SWAPS), axis=0)  # the lowest swap of the best gain
            tl.debug_barrier()  # every read of this round's scratch done before a store moves the order
            if best > 1e-6 * tl.maximum(total, 1e-30):
                i = tl.sum(tl.where(s == pick, si, 0), axis=0)
                j = tl.sum(tl.where(s == pick, sj, 0), axis=0)
                at_i = tl.sum(tl.where(p == i, o, 0), axis=0)
                at_j = tl.sum(tl.where(p == j, o, 0), axis=0)
                tl.store(order_w + p, tl.where(p == i, at_j, tl.where(p == j, at_i, o)))
                n += 1
            else:
                n = rounds
            tl.debug_barrier()
        w += programs


# the padded swap tables on each device, by the swaps they hold (one list in practice: `solvers.GROUP_SWAPS`)
_SWAP_TABLES: dict[tuple[torch.device, tuple[tuple[int, int], ...]], tuple[torch.Tensor, torch.Tensor]] = {}


def _swap_tables(device: torch.device, swaps: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device, tuple((int(i), int(j)) for i, j in swaps))
    if key not in _SWAP_TABLES:
        pad = [(0, 0)] * (SWAP_SLOTS - len(swaps))
        table = torch.tensor(list(key[1]) + pad, dtype=torch.int32)
        _SWAP_TABLES[key] = (table[:, 0].contiguous().to(device), table[:, 1].contiguous().to(device))
    return _SWAP_TABLES[key]


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`: CUDA, or the Triton interpreter."""
    return device.type == "cuda" or interpreted()


def grouped_search(words: torch.Tensor, order: torch.Tensor, rounds: int, swaps: list[tuple[int, int]]) -> None:
    """Run the best-swap search of `solvers.grouped_partition` on `words` [W, rows, 32] (float32, rows 4, 8 or 16)
    from `order` [W, 32] (int64, each row a permutation of 0..31), in place: at most `rounds` swaps a word, each
    the move of `swaps` (pairs of positions in different groups of four) that raises the word's kept score most."""
    if words.dim() != 3 or words.shape[2] != 32 or words.shape[1] not in (4, 8, 16):
        raise KernelInputError(f"grouped_search takes words [W, 4 | 8 | 16, 32]; got {tuple(words.shape)}")
    if words.dtype != torch.float32 or order.dtype != torch.int64:
        raise KernelInputError(f"grouped_search takes float32 words and an int64 order; got {words.dtype} and "
                               f"{order.dtype}")
    if order.shape != (words.shape[0], 32) or order.device != words.device:
        raise KernelInputError(f"grouped_search's order must be [{words.shape[0]}, 32] on {words.device}; got "
                               f"{tuple(order.shape)} on {order.device}")
    if not (words.is_contiguous() and order.is_contiguous()):
        raise KernelInputError("grouped_search takes contiguous words and order")
    if len(swaps) > SWAP_SLOTS:
        raise KernelInputError(f"grouped_search takes at most {SWAP_SLOTS} swaps; got {len(swaps)}")
    count, rows, _ = words.shape
    if count == 0 or rounds <= 0:
        return
    if words.is_cuda:
        programs = min(count, torch.cuda.get_device_properties(words.device).multi_processor_count * PROGRAMS_PER_SM)
    else:
        programs = min(count, 4)
    swap_i, swap_j = _swap_tables(words.device, swaps)
    scratch = torch.empty(programs, 4, rows, 32, dtype=torch.float32, device=words.device)
    _search_kernel[(programs,)](words, order, swap_i, swap_j, scratch, count, rounds, programs,
                                ROWS=rows, SWAPS=SWAP_SLOTS, VALID=len(swaps), num_warps=4)
