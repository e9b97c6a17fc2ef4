"""One Triton kernel for the end of a greedy decode step: each sequence's next token, the argmax of its logits, written
into the engine's token buffer, and the position advanced by one.

In a decode step captured in a CUDA graph these took seven small kernels after the lm_head at batch 1 (the two-stage
argmax of `engine.generate.two_stage_argmax`: a maximum per chunk, the chunk's argmax, a gather and two kernels of index
arithmetic; the copy into the token buffer; the position's increment), about 20 us of kernel time a step on the H200
(results/step_profile_h200_8b_int4_h8_fused_attention.md; matched to the code by their kernel names, not traced),
each launched plainly after the one before.

Programs (sequence, chunk of BLOCK logits). Each finds its chunk's maximum and the first position holding it, and
the last program of a sequence to finish (counted with an atomic counter that it resets) picks the first chunk
holding the sequence's maximum and stores that position. The result is torch.argmax's: the first maximum, and NaN
counts as larger than every number (the first NaN wins). Program (0, 0) advances the position: no program reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .triton_spmv import interpreted

BLOCK = 2048  # logits a program reads


@triton.jit
def _first_maximum(values, positions, none):
    """(the maximum of `values` with NaN above everything, the first of `positions` holding it); `none`: a position
    larger than all of them."""
    nan = values != values
    first_nan = tl.min(tl.where(nan, positions, none))
    clean = tl.where(nan, float("-inf"), values)
    top = tl.max(clean)
    first_top = tl.min(tl.where(clean == top, positions, none))
    has_nan = first_nan < none
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first_top)


@triton.jit
def greedy_kernel(logits_ptr, logits_stride, vocab, token_ptr, position_ptr, values_ptr, indices_ptr, count_ptr,
                  CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr):
    """token[row] = argmax(logits[row, :vocab]) for program (row, chunk); program (0, 0) adds one to position[0].
    values / indices: float32 / int32 scratch [rows, CHUNKS]; count: int32 [rows], zero between calls."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    logits = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + offsets, mask=offsets < vocab,
                     other=float("-inf")).to(tl.float32)
    top, first = _first_maximum(logits, offsets, vocab)
    if (row == 0) & (chunk == 0):
        tl.store(position_ptr, tl.load(position_ptr) + 1)
    if CHUNKS == 1:
        tl.store(token_ptr + row, first.to(tl.int64))
    else:
        tl.store(values_ptr + row * CHUNKS + chunk, top)
        tl.store(indices_ptr + row * CHUNKS + chunk, first)
        # the stores before the counter's release; the last program reads them after its acquire
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu")
        if arrived == CHUNKS - 1:
            tl.debug_barrier()
            c = tl.arange(0, CHUNKS_P2)
            tops = tl.load(values_ptr + row * CHUNKS + c, mask=c < CHUNKS, other=float("-inf"),
                           cache_modifier=".cg")
            firsts = tl.load(indices_ptr + row * CHUNKS + c, mask=c < CHUNKS, other=vocab, cache_modifier=".cg")
            _, best = _first_maximum(tops, firsts, vocab)
            tl.store(token_ptr + row, best.to(tl.int64))
            tl.atomic_xchg(count_ptr + row, 0, sem="relaxed", scope="gpu")


@dataclass
class GreedyScratch:
    """What the kernel keeps between calls for `rows` sequences of `vocab` logits: per-chunk maxima and positions,
    and the arrival counters (zero between calls)."""

    rows: int
    vocab: int
    values: torch.Tensor
    indices: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def create(cls, rows: int, vocab: int, device: torch.device) -> GreedyScratch:
        chunks = triton.cdiv(vocab, BLOCK)
        return cls(rows, vocab, torch.empty(rows * chunks, dtype=torch.float32, device=device),
                   torch.empty(rows * chunks, dtype=torch.int32, device=device),
                   torch.zeros(rows, dtype=torch.int32, device=device))


def check_inputs(logits: torch.Tensor, token: torch.Tensor, position: torch.Tensor, scratch: GreedyScratch) -> None:
    """KernelInputError naming the first input `greedy_step` cannot take."""
    if logits.dim() != 2 or logits.stride(1) != 1 or logits.dtype not in (torch.bfloat16, torch.float16,
                                                                           torch.float32):
        raise KernelInputError(f"logits must be [rows, vocab] in bf16, fp16 or fp32 with unit column stride; got "
                               f"{tuple(logits.shape)} {logits.dtype}")
    rows, vocab = logits.shape
    if (rows, vocab) != (scratch.rows, scratch.vocab):
        raise KernelInputError(f"logits [{rows}, {vocab}] do not match the scratch for [{scratch.rows}, "
                               f"{scratch.vocab}]")
    if token.shape != (rows, 1) or token.dtype != torch.long or not token.is_contiguous():
        raise KernelInputError(f"token must be a contiguous int64 [{rows}, 1]; got {tuple(token.shape)} {token.dtype}")
    if position.shape != (1,) or position.dtype != torch.long:
        raise KernelInputError(f"position must be int64 [1]; got {tuple(position.shape)} {position.dtype}")
    devices = {t.device for t in (logits, token, position, scratch.counters)}
    if len(devices) != 1:
        raise KernelInputError(f"greedy_step's inputs are on several devices: {sorted(map(str, devices))}")


def greedy_step(logits: torch.Tensor, token: torch.Tensor, position: torch.Tensor, scratch: GreedyScratch) -> None:
    """token[:, 0] = logits.argmax(-1) (torch's indices: the first maximum, NaN above everything) and position += 1,
    in one launch, on the device, without a sync."""
    check_inputs(logits, token, position, scratch)
    rows, vocab = logits.shape
    chunks = triton.cdiv(vocab, BLOCK)
    greedy_kernel[(rows, chunks)](logits, logits.stride(0), vocab, token, position, scratch.values, scratch.indices,
                                  scratch.counters, CHUNKS=chunks, CHUNKS_P2=triton.next_power_of_2(chunks),
                                  BLOCK=BLOCK, num_warps=4)


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`: CUDA, or the Triton interpreter."""
    return device.type == "cuda" or interpreted()
