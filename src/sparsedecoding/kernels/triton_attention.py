"""One Triton kernel for a decode step's attention: rotary embedding of the new query and key, the new key and value
written into the KV cache, and softmax(q·kᵀ/√d)·v over every cached position up to and including the new one.

In the engine's compiled block this replaces four kernels a layer (RoPE with the cache write, scores, softmax,
weighted sum), which at batch 1 take about 10 us of kernel time a layer on the H200 for well under 1 MB of reads
(results/step_profile_h200_8b_int4_h8.md): they are bound by their launches and their few CTAs, not by bytes.

The math, for sequence b, KV head h, query heads g of its group and new position p (read from `input_pos` on the
device, so one CUDA graph serves every step):

    q_g = rope(q_g, p), k_p = rope(k, p)   (each rounded to the cache's dtype, as the compiled model stores them)
    s_j = q_g·k_j / √d for j ≤ p,  y_g = Σ_j softmax(s)_j · v_j

`splits` programs serve each (b, h). The positions before p are cut into contiguous ranges of whole 64-position
tiles, at least `min_span` positions each, and as even as that allows; programs beyond the last range leave at
once. A range's scores are `tl.dot` products of the group's queries (padded to 16 rows) with key tiles,
accumulated with the usual running maximum and sum (Milakov and Gimelshein's online softmax, as in FlashAttention).
With one range its program adds position p from registers and stores y. With several, each writes its running
maximum, sum and weighted values (float32) to scratch, counts itself in a per-(b, h) counter, and the last to arrive
combines the ranges with position p in one unrolled pass (all their loads in flight at once), stores y and resets
the counter. Positions after p are never read, so the work grows with the step's position, not with the
cache's length. Split 0 writes k_p and v_p to the cache; no program reads position p from memory. A position outside
the cache gives NaN outputs and writes nothing (the host cannot check it without a sync). Launched
programmatically, the kernel starts during the qkv kernel's tail; with `early` it reads the position, the rotary
rows and each range's first cache tile before it waits for qkv, so that only the qkv loads lie between that wait
and the first scores.

Differences from `engine.model.decode_attention` (float32 reductions of the same rounded q and k): the score sums
run in tensor-core order, and the softmax weights are rounded to the cache's dtype before they multiply v (as
FlashAttention does), which moves an output by about one unit in the last place of bfloat16."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .op import MAX_BATCH
from .triton_spmv import interpreted

BLOCK_N = 64  # cached positions a loop step
MAX_SPLIT_POSITIONS = 512  # long caches get at least one split per this many positions, whatever the batch
MIN_DOT_ROWS = 16  # tl.dot's smallest operand side: the group's queries are padded to it


@triton.jit
def _rope(x, partner, cos, sin, HALF_SIGN):
    """x·cos + rotate_half(x)·sin for rows of a head (x, partner: the row and its halves swapped), in float32."""
    return x * cos[None, :] + HALF_SIGN[None, :] * partner * sin[None, :]


@triton.jit
def _head_norm(x, partner, weight_ptr, d, partner_d, eps, dtype, HEAD_DIM: tl.constexpr):
    """RMSNorm of each row of a head (x [rows, HEAD_DIM]; partner: the same rows with halves swapped) as the engine's
    q/k norms compute it: the mean of squares in float32, the normalized row rounded to the dtype, then times the
    weight in that dtype. Returns both, in float32."""
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
    weight = tl.load(weight_ptr + d).to(tl.float32)
    weight_partner = tl.load(weight_ptr + partner_d).to(tl.float32)
    x = ((x * scale[:, None]).to(dtype).to(tl.float32) * weight[None, :]).to(dtype).to(tl.float32)
    partner = ((partner * scale[:, None]).to(dtype).to(tl.float32) * weight_partner[None, :]).to(dtype)
    return x, partner.to(tl.float32)


@triton.jit
def _with_new_position(m, total, acc, s_new, v_new):
    """The running weighted sum `acc` and softmax denominator `total` (scores' maximum `m`) with the new position
    (score s_new, value v_new) added."""
    m_all = tl.maximum(m, s_new)
    alpha = tl.exp(m - m_all)
    p_new = tl.exp(s_new - m_all)
    return acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :], total * alpha + p_new


@triton.jit
def _attend_tile(q, keys, values, ok, m, total, acc, scale, DOT_FLOAT32: tl.constexpr):
    """The running maximum `m`, softmax denominator `total` and weighted sum `acc` of the group's queries q with one
    tile of cached keys and values added (positions where `ok` is false skipped). The softmax weights are rounded
    to the cache's dtype before they multiply the values."""
    if DOT_FLOAT32:
        scores = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32))) * scale
    else:
        scores = tl.dot(q, tl.trans(keys)) * scale
    scores = tl.where(ok[None, :], scores, float("-inf"))
    m_next = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp(m - m_next)
    p = tl.exp(scores - m_next[:, None])
    total = total * alpha + tl.sum(p, axis=1)
    if DOT_FLOAT32:
        acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype).to(tl.float32), values.to(tl.float32))
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values)
    return m_next, total, acc


@triton.jit
def decode_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, y_ptr,
                            stats_ptr, parts_ptr, count_ptr, q_norm_ptr, k_norm_ptr, norm_eps, qkv_stride,
                            cache_len, scale, min_span,
                            KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                            PDL: tl.constexpr, EARLY: tl.constexpr, DOT_FLOAT32: tl.constexpr,
                            QK_NORM: tl.constexpr):
    """Program (b·KV_HEADS + h, split). qkv [B, (heads + 2·KV_HEADS)·HEAD_DIM] rows `qkv_stride` apart; cos/sin
    [cache_len, HEAD_DIM], the whole rotary tables (the kernel reads the new position's rows); caches [B, KV_HEADS,
    cache_len, HEAD_DIM] contiguous; y [B, heads·HEAD_DIM].
    With SPLITS > 1: stats [B·KV_HEADS, SPLITS, 2, GROUP_ROWS] and parts [B·KV_HEADS, SPLITS, GROUP_ROWS, HEAD_DIM]
    float32 scratch, count [B·KV_HEADS] int32, zero between calls. min_span (a multiple of BLOCK_N): the fewest
    positions a range holds. PDL: launched programmatically, so the kernel waits for the one before it; EARLY (with
    PDL): the position, the rotary rows and the range's first cache tile are read before that wait (see `launch`).
    DOT_FLOAT32 (the interpreter only, whose tl.dot misreads 16-bit floats) feeds tl.dot the same values as
    float32."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // KV_HEADS
    h = pid % KV_HEADS
    if PDL and not EARLY:
        # qkv comes from the kernel before: wait for it, and let the next kernel's CTAs start their weight loads
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pos = tl.load(pos_ptr).to(tl.int32)
    # The positions before p in `active` ranges of whole BLOCK_N tiles, at least min_span positions each (the last
    # range may be shorter); programs past them leave at once. One active range: its program stores y itself.
    span = tl.maximum(tl.cdiv(tl.cdiv(pos, SPLITS), BLOCK_N) * BLOCK_N, min_span)
    active = tl.maximum(tl.cdiv(pos, span), 1)
    live = (split < active) & (pos >= 0) & (pos < cache_len)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_N)
    head_base = pid.to(tl.int64) * cache_len * HEAD_DIM
    start = split * span
    end = tl.minimum(start + span, pos)
    # the range's first tile and the rotary rows, loaded together ahead of the rest
    first = start + n < tl.where(live, end, start)  # a comparison: a scalar in a mask trips the interpreter
    first_at = head_base + (start + n)[:, None] * HEAD_DIM + d[None, :]
    first_keys = tl.load(k_cache_ptr + first_at, mask=first[:, None], other=0.0)
    first_values = tl.load(v_cache_ptr + first_at, mask=first[:, None], other=0.0)
    table_row = tl.where(live, pos, 0) * HEAD_DIM
    cos = tl.load(cos_ptr + table_row + d).to(tl.float32)
    sin = tl.load(sin_ptr + table_row + d).to(tl.float32)
    if PDL and EARLY:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if ((pos < 0) | (pos >= cache_len)) & (split == 0):
        # a position outside the cache (the host cannot check it without a sync): y is NaN and nothing is written,
        # instead of a write past the cache
        rows = tl.arange(0, GROUP_ROWS)
        y_rows = y_ptr + b.to(tl.int64) * (KV_HEADS * GROUP * HEAD_DIM) + (h * GROUP + rows)[:, None] * HEAD_DIM
        tl.store(y_rows + d[None, :], tl.full([GROUP_ROWS, HEAD_DIM], float("nan"), y_ptr.dtype.element_ty),
                 mask=(rows < GROUP)[:, None])
    if live:
        half = HEAD_DIM // 2
        partner = (d + half) % HEAD_DIM
        half_sign = tl.where(d < half, -1.0, 1.0)
        dtype = k_cache_ptr.dtype.element_ty

        row = qkv_ptr + b.to(tl.int64) * qkv_stride
        g = tl.arange(0, GROUP_ROWS)
        in_group = g < GROUP
        q_cols = (h * GROUP + g)[:, None] * HEAD_DIM
        q = tl.load(row + q_cols + d[None, :], mask=in_group[:, None], other=0.0).to(tl.float32)
        q_partner = tl.load(row + q_cols + partner[None, :], mask=in_group[:, None], other=0.0).to(tl.float32)
        if QK_NORM:
            q, q_partner = _head_norm(q, q_partner, q_norm_ptr, d, partner, norm_eps, dtype, HEAD_DIM)
        q = _rope(q, q_partner, cos, sin, half_sign).to(dtype)  # [GROUP_ROWS, HEAD_DIM]
        k_col = (KV_HEADS * GROUP + h) * HEAD_DIM
        v_col = (KV_HEADS * GROUP + KV_HEADS + h) * HEAD_DIM
        k_new = tl.load(row + k_col + d).to(tl.float32)
        k_partner = tl.load(row + k_col + partner).to(tl.float32)
        k_new, k_partner = k_new[None, :], k_partner[None, :]
        if QK_NORM:
            k_new, k_partner = _head_norm(k_new, k_partner, k_norm_ptr, d, partner, norm_eps, dtype, HEAD_DIM)
        k_new = _rope(k_new, k_partner, cos, sin, half_sign).to(dtype)  # [1, HEAD_DIM]
        v_new = tl.load(row + v_col + d)

        if split == 0:
            tl.store(k_cache_ptr + head_base + pos * HEAD_DIM + d[None, :], k_new)
            tl.store(v_cache_ptr + head_base + pos * HEAD_DIM + d, v_new)

        m = tl.full([GROUP_ROWS], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_ROWS], tl.float32)
        acc = tl.zeros([GROUP_ROWS, HEAD_DIM], tl.float32)
        if start < end:
            m, total, acc = _attend_tile(q, first_keys, first_values, first, m, total, acc, scale, DOT_FLOAT32)
        for n0 in range(start + BLOCK_N, end, BLOCK_N):
            ok = n0 + n < end
            offsets = head_base + (n0 + n)[:, None] * HEAD_DIM + d[None, :]
            keys = tl.load(k_cache_ptr + offsets, mask=ok[:, None], other=0.0)
            values = tl.load(v_cache_ptr + offsets, mask=ok[:, None], other=0.0)
            m, total, acc = _attend_tile(q, keys, values, ok, m, total, acc, scale, DOT_FLOAT32)

        y_at = y_ptr + b.to(tl.int64) * (KV_HEADS * GROUP * HEAD_DIM) + (h * GROUP + g)[:, None] * HEAD_DIM + d[None, :]
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * scale  # position p, from registers
        # the same store twice: the first test is settled when the kernel is compiled, so one-split launches carry
        # no combining code; the second is the step's own (one active range)
        if SPLITS == 1:
            acc, total = _with_new_position(m, total, acc, s_new, v_new)
            tl.store(y_at, (acc / total[:, None]).to(dtype), mask=in_group[:, None])
        elif active == 1:
            acc, total = _with_new_position(m, total, acc, s_new, v_new)
            tl.store(y_at, (acc / total[:, None]).to(dtype), mask=in_group[:, None])
        else:
            slot = pid * SPLITS + split
            tl.store(stats_ptr + (slot * 2) * GROUP_ROWS + g, m)
            tl.store(stats_ptr + (slot * 2 + 1) * GROUP_ROWS + g, total)
            tl.store(parts_ptr + slot.to(tl.int64) * GROUP_ROWS * HEAD_DIM + g[:, None] * HEAD_DIM + d[None, :], acc,
                     mask=in_group[:, None])
            # every thread's stores before the counter's release; the last program reads them after its acquire
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == active - 1:
                tl.debug_barrier()
                # one pass over the ranges, unrolled: every range's loads are independent of the others' math, so
                # they can all be in flight at once instead of one round trip a range (1.0-1.5x faster than that:
                # results/attention_combine_h200.md)
                m_all = s_new
                total = tl.full([GROUP_ROWS], 1.0, tl.float32)
                acc = tl.zeros([GROUP_ROWS, HEAD_DIM], tl.float32) + v_new.to(tl.float32)[None, :]
                for s in tl.static_range(SPLITS):
                    # masks as comparisons of g (a scalar broadcast into a mask trips the interpreter)
                    stat_rows = g < tl.where(active > s, GROUP_ROWS, 0)
                    value_rows = g < tl.where(active > s, GROUP, 0)
                    other = pid * SPLITS + s
                    m_s = tl.load(stats_ptr + (other * 2) * GROUP_ROWS + g, mask=stat_rows,
                                  other=float("-inf"), cache_modifier=".cg")
                    total_s = tl.load(stats_ptr + (other * 2 + 1) * GROUP_ROWS + g, mask=stat_rows,
                                      other=0.0, cache_modifier=".cg")
                    acc_s = tl.load(parts_ptr + other.to(tl.int64) * GROUP_ROWS * HEAD_DIM
                                    + g[:, None] * HEAD_DIM + d[None, :], mask=value_rows[:, None],
                                    other=0.0, cache_modifier=".cg")
                    m_next = tl.maximum(m_all, m_s)
                    keep = tl.exp(m_all - m_next)
                    weight = tl.exp(m_s - m_next)
                    total = total * keep + total_s * weight
                    acc = acc * keep[:, None] + acc_s * weight[:, None]
                    m_all = m_next
                tl.store(y_at, (acc / total[:, None]).to(dtype), mask=in_group[:, None])
                tl.atomic_xchg(count_ptr + pid, 0, sem="relaxed", scope="gpu")


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_splits(batch: int, kv_heads: int, cache_len: int, device: torch.device) -> int:
    """Position ranges a (sequence, KV head) is split into: enough programs to give every multiprocessor one, and
    at least one range per MAX_SPLIT_POSITIONS cached positions, so that no program walks a long cache alone at
    wide batches; but no more ranges than the cache has BLOCK_N-position tiles. 1 in the interpreter (its programs
    run one at a time)."""
    if device.type != "cuda":
        return 1
    wanted = max(_multiprocessors(device) // (batch * kv_heads), triton.cdiv(cache_len, MAX_SPLIT_POSITIONS), 1)
    return min(wanted, triton.cdiv(cache_len, BLOCK_N))


def counters_for(batch: int, kv_heads: int, device: torch.device) -> torch.Tensor:
    """The zeroed arrival counters one layer's fused decode attention needs (kept with its KV cache)."""
    return torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)


def check_inputs(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, input_pos: torch.Tensor, counters: torch.Tensor, heads: int) -> None:
    """KernelInputError naming the first input the fused decode attention cannot take."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise KernelInputError(f"KV caches must both be [batch, kv_heads, positions, head_dim]; got "
                               f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    batch, kv_heads, _, head_dim = k_cache.shape
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise KernelInputError(f"head_dim {head_dim}: the fused decode attention needs a power of two >= 16")
    if heads % kv_heads:
        raise KernelInputError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    width = (heads + 2 * kv_heads) * head_dim
    if qkv.shape != (batch, width) or qkv.stride(1) != 1:
        raise KernelInputError(f"qkv must be [batch, {width}] with unit column stride for a cache of batch {batch}; "
                               f"got {tuple(qkv.shape)}")
    if batch > MAX_BATCH:
        raise KernelInputError(f"batch {batch}: the fused decode attention runs 1 to {MAX_BATCH} sequences")
    tables = (k_cache.shape[2], head_dim)
    if cos.shape != tables or sin.shape != tables or not (cos.is_contiguous() and sin.is_contiguous()):
        raise KernelInputError(f"cos and sin must be the contiguous rotary tables [{tables[0]}, {head_dim}] (one row "
                               f"per cache position); got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if qkv.dtype not in (torch.bfloat16, torch.float16) or {t.dtype for t in (cos, sin, k_cache, v_cache)} != {
            qkv.dtype}:
        raise KernelInputError(f"qkv, cos, sin and the caches must share one dtype, bfloat16 or float16; got "
                               f"{qkv.dtype}, {cos.dtype}, {sin.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise KernelInputError("KV caches must be contiguous")
    if input_pos.numel() != 1 or input_pos.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(f"input_pos must hold the one new position as an integer; got "
                               f"{tuple(input_pos.shape)} {input_pos.dtype}")
    if counters.shape != (batch * kv_heads,) or counters.dtype != torch.int32:
        raise KernelInputError(f"counters must be int32 [{batch * kv_heads}] (`counters_for`); got "
                               f"{tuple(counters.shape)} {counters.dtype}")
    devices = {t.device for t in (qkv, cos, sin, k_cache, v_cache, input_pos, counters)}
    if len(devices) != 1:
        raise KernelInputError("the fused decode attention's inputs are on several devices: "
                               f"{sorted(map(str, devices))}")


def launch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           input_pos: torch.Tensor, counters: torch.Tensor, heads: int, splits: int | None = None,
           min_span: int = BLOCK_N, pdl: bool = False, early: bool = False,
           qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
    """y [batch, heads·head_dim]; writes the new key and value into the caches at input_pos. `splits` None:
    `choose_splits`. `min_span`: the fewest positions a range holds, a multiple of BLOCK_N (the engine's is
    SPARSEDECODING_ATTENTION_MIN_SPAN). `pdl` launches programmatically (compute capability 9.0 and up, not the
    interpreter): the kernel may start while the one before it on the stream (qkv's) runs, and waits for it.
    `early` (with `pdl`; the engine's SPARSEDECODING_ATTENTION_EARLY_READS): the position, the rotary rows and the
    first tile of each range's cached keys and values are read before that wait, two round trips fewer after it.
    So the caller must make sure that whatever wrote input_pos and those cache positions has finished before the
    kernel ahead of this one starts. In the engine it has: they were written in earlier steps, and each step
    begins with plain launches (the embedding's), which start only once all earlier work on the stream is done.
    The rotary tables are constant. `qk_norm`: (q weight, k weight, eps) of per-head RMSNorms applied before the
    rotation (Qwen3)."""
    check_inputs(qkv, cos, sin, k_cache, v_cache, input_pos, counters, heads)
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        head_dim = k_cache.shape[-1]
        if q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,) or {q_weight.dtype, k_weight.dtype} != {
                qkv.dtype} or q_weight.device != qkv.device or k_weight.device != qkv.device:
            raise KernelInputError(f"q/k norm weights must be [{head_dim}] in {qkv.dtype} on {qkv.device}; got "
                                   f"{tuple(q_weight.shape)} {q_weight.dtype} and {tuple(k_weight.shape)} "
                                   f"{k_weight.dtype}")
    if min_span < BLOCK_N or min_span % BLOCK_N:
        raise KernelInputError(f"min_span {min_span}: use a positive multiple of {BLOCK_N}")
    batch, kv_heads, cache_len, head_dim = k_cache.shape
    group = heads // kv_heads
    group_rows = max(MIN_DOT_ROWS, triton.next_power_of_2(group))
    if splits is None:
        splits = choose_splits(batch, kv_heads, cache_len, qkv.device)
    y = torch.empty(batch, heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    if splits > 1:
        stats = torch.empty(batch * kv_heads * splits * 2 * group_rows, dtype=torch.float32, device=qkv.device)
        parts = torch.empty(batch * kv_heads * splits * group_rows * head_dim, dtype=torch.float32,
                            device=qkv.device)
    else:
        stats = parts = y  # never touched with one split
    options = {"launch_pdl": True} if pdl and not interpreted() else {}
    q_weight, k_weight, eps = qk_norm if qk_norm is not None else (y, y, 0.0)  # weights unread without norms
    decode_attention_kernel[(batch * kv_heads, splits)](
        qkv, cos, sin, k_cache, v_cache, input_pos, y, stats, parts, counters, q_weight, k_weight, float(eps),
        qkv.stride(0), cache_len, head_dim ** -0.5, min_span, KV_HEADS=kv_heads, GROUP=group, GROUP_ROWS=group_rows,
        HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, SPLITS=splits, PDL=bool(options), EARLY=bool(options) and early,
        DOT_FLOAT32=interpreted(),
        QK_NORM=qk_norm is not None, num_warps=4, **options)
    return y


@torch.library.custom_op("sparsedecoding::decode_attention", mutates_args=("k_cache", "v_cache", "counters"))
def decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, input_pos: torch.Tensor, counters: torch.Tensor, heads: int,
                     min_span: int, pdl: bool, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                     norm_eps: float = 0.0, early: bool = False) -> torch.Tensor:
    """`launch` as an operator torch.compile keeps whole (it mutates the caches and the counters); `q_norm` and
    `k_norm` (both or neither): the per-head RMSNorm weights applied before the rotation, with `norm_eps`."""
    qk_norm = None if q_norm is None else (q_norm, k_norm, norm_eps)
    return launch(qkv, cos, sin, k_cache, v_cache, input_pos, counters, heads, min_span=min_span, pdl=pdl,
                  early=early, qk_norm=qk_norm)


@decode_attention.register_fake
def _(qkv, cos, sin, k_cache, v_cache, input_pos, counters, heads, min_span, pdl, q_norm=None, k_norm=None,
      norm_eps=0.0, early=False):
    return qkv.new_empty(qkv.shape[0], heads * k_cache.shape[-1])
