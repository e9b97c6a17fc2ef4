"""The engine's transformer: a pre-norm decoder with RMSNorm, rotary attention over a static KV cache with grouped
KV heads, and a SwiGLU MLP. q|k|v and gate|up are single fused linears (row concatenation keeps an N:M mask valid,
so a fused linear can be packed like its parts). Every linear is an `nn.Linear` or a `PackedLinear`; the model does
not care which.

With a tensor-parallel process group `tp` (see `parallel`) every block holds its rank's heads and intermediate slice,
attention.out and mlp.down are followed by an all-reduce, and lm_head scores the rank's vocabulary slice before an
all-gather; `tp=None` is one device."""

from __future__ import annotations

import math
import os
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import EngineError
from ..kernels.op import (ATTENTION_MIN_SPAN_DEFAULT, MAX_BATCH, attention_early_reads_setting,
                          attention_min_span_setting, compile_options,
                          fused_attention_setting, inductor_attention_setting, sp24_pdl_setting)
from ..kernels.reference import rms_norm
from .config import ModelArgs
from .parallel import ProcessGroup, all_reduce, gather_vocab, local_args, rank_and_world


class RMSNorm(nn.Module):
    """y = w · x / sqrt(mean(x²) + eps), the mean taken in float32 and the product in the input dtype (as HF does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_frequencies(args: ModelArgs) -> Tensor:
    """Angular frequencies ω_i = θ^(-2i/d) of the head dimension's pairs, with Llama-3 scaling when configured."""
    omega = 1.0 / args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float32) / args.head_dim)
    scaling = args.rope_scaling
    if scaling is None:
        return omega
    context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / omega
    smooth = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    interpolated = (1 - smooth) * omega / scaling.factor + smooth * omega
    scaled = torch.where(wavelength > context / scaling.low_freq_factor, omega / scaling.factor, interpolated)
    return torch.where(wavelength < context / scaling.high_freq_factor, omega, scaled)


def rope_tables(args: ModelArgs, max_seq_len: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of position·ω, [max_seq_len, head_dim], each frequency repeated for both halves of the head."""
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), rope_frequencies(args))
    angles = torch.cat([angles, angles], dim=-1).to(device)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotates each pair (x_i, x_{i+d/2}) of x [B, T, heads, d] by its angle; cos/sin are [T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


# SPARSEDECODING_INDUCTOR_ATTENTION=auto takes `decode_attention` at batch 1 on CUDA for caches up to this many
# positions. 8B preset, 2:4, batch 1, against PyTorch's fused attention: faster with a 272-position cache (1.577x ->
# 1.637x, results/inductor_attention_h200_8b_combo.md) and a 1024-position one (1.495x -> 1.556x), slower with 4096
# (1.326x -> 1.119x, where the fused kernel splits the keys across CTAs): inductor_attention_h200_8b_cache*.md.
AUTO_ATTENTION_MAX_CACHE = 1024


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, mask: Tensor) -> Tensor:
    """scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask) for q [B, kv_heads, group, d] (one new
    position per sequence, the group of query heads of each KV head folded in) against caches [B, kv_heads, S, d]
    and `mask` [group, S], as plain reductions in float32: softmax(q·kᵀ/√d + mask)·v. Inductor compiles them into
    its own kernels, which take part in its programmatic launches where PyTorch's fused attention kernels do not."""
    scores = (q.float()[..., None, :] * k_cache.float()[:, :, None]).sum(-1) * q.shape[-1] ** -0.5 + mask
    return (scores.softmax(-1)[..., None] * v_cache.float()[:, :, None]).sum(-2).to(q.dtype)


class Attention(nn.Module):
    """Causal self-attention that writes the new keys and values into its cache and attends to the whole cache.
    `mask` [group·T, cache length] is added to the scores: 0 where a query may attend, -inf elsewhere (see
    `Transformer.hidden`). `mask` None marks a decode step for the fused kernel (`prepare_decode`); cos and sin are
    then the whole rotary tables."""

    def __init__(self, args: ModelArgs, tp: ProcessGroup | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.qkv = nn.Linear(args.dim, args.qkv_size, bias=args.qkv_bias)
        self.out = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)
        # decode steps through `decode_attention`: "1" at every batch, "auto" at batch 1 on CUDA with a cache of at most
        # AUTO_ATTENTION_MAX_CACHE positions, "0" never
        self.reduction_decode = inductor_attention_setting()
        # decode steps through the fused Triton kernel (`kernels.triton_attention`): decided by `prepare_decode`
        self.fused_setting = fused_attention_setting()
        self.fused_decode = False
        self.fused_pdl = False
        self.fused_early = False
        self.fused_min_span = ATTENTION_MIN_SPAN_DEFAULT
        self.register_buffer("counters", None, persistent=False)

    def prepare_decode(self, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        """Whether decode steps on caches of `batch` sequences take the fused decode-attention kernel (see
        SPARSEDECODING_FUSED_ATTENTION in `kernels.op`), and its arrival counters if so. Triton is imported only
        where the kernel can run."""
        head_dim = self.head_dim
        self.fused_decode, self.counters = False, None
        if (not self.fused_setting or batch > MAX_BATCH
                or dtype not in (torch.bfloat16, torch.float16) or head_dim < 16 or head_dim & (head_dim - 1)):
            return
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
            return
        from ..kernels import triton_attention
        self.counters = triton_attention.counters_for(batch, self.n_kv_heads, device)
        self.fused_min_span = attention_min_span_setting()
        # the kernel waits for qkv itself, so it may start during the qkv kernel's tail, as the sp24 kernels do
        self.fused_pdl = (device.type == "cuda" and not triton_attention.interpreted() and sp24_pdl_setting()
                          and torch.cuda.get_device_capability(device)[0] >= 9)
        # reads ahead of that wait: the position and the cache were written in earlier steps, each of which begins
        # with plain launches (`Transformer.hidden`'s embedding), so their writers have finished
        self.fused_early = self.fused_pdl and attention_early_reads_setting()
        self.fused_decode = True

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, input_pos: Tensor) -> Tensor:
        return self.attend(self.qkv(x), cos, sin, mask, input_pos)

    def attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, input_pos: Tensor) -> Tensor:
        """The rest of `forward` from the qkv projection's output [B, T, qkv_size] on."""
        batch, length, _ = qkv.shape
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        if mask is None:  # a decode step for the fused kernel: cos and sin are the whole tables (`Transformer.hidden`)
            norms = () if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            y = torch.ops.sparsedecoding.decode_attention(qkv.reshape(batch, -1), cos, sin, self.k_cache,
                                                          self.v_cache, input_pos, self.counters, heads,
                                                          self.fused_min_span, self.fused_pdl, *norms,
                                                          early=self.fused_early)
            return all_reduce(self.out(y.view(batch, 1, heads * head_dim)), self.tp)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = q.view(batch, length, heads, head_dim)
        k = k.view(batch, length, kv_heads, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k_cache[:, :, input_pos] = k.transpose(1, 2)
        self.v_cache[:, :, input_pos] = v.view(batch, length, kv_heads, head_dim).transpose(1, 2)
        # Query head h reads KV head h // group. Folding the group into the query axis lets every KV head serve its
        # queries in one SDPA call without materialising repeated keys and values.
        group = heads // kv_heads
        q = q.view(batch, length, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(batch, kv_heads, group * length, head_dim)
        if length == 1 and (self.reduction_decode == "1" or (self.reduction_decode == "auto" and batch == 1
                                                             and qkv.is_cuda
                                                             and self.k_cache.shape[2] <= AUTO_ATTENTION_MAX_CACHE)):
            y = decode_attention(q, self.k_cache, self.v_cache, mask)
        else:
            y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        y = y.view(batch, kv_heads, group, length, head_dim).permute(0, 3, 1, 2, 4)
        return all_reduce(self.out(y.reshape(batch, length, heads * head_dim)), self.tp)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate·x) ⊙ up·x), with gate|up one fused linear."""

    def __init__(self, args: ModelArgs, tp: ProcessGroup | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.gate_up = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)
        self.down = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.finish(self.gate_up(x))

    def finish(self, hidden: Tensor) -> Tensor:
        """The rest of `forward` from the gate_up projection's output on."""
        if not getattr(self.gate_up, "glu", False):  # a GLU-tiled 2:4 gate_up gives silu(gate)·up itself
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        return all_reduce(self.down(hidden), self.tp)


class Block(nn.Module):
    """One decoder layer. It takes the previous layer's MLP output separately and adds it to the residual stream
    itself, so that a compiled block fuses that addition with its first RMSNorm instead of a kernel of its own.
    With `fuse_norms` (rows, set by `kernels.sp24_linear.tile_for_kernel` when qkv and gate_up are `Sp24Linear`;
    0 off), those two linears take each residual addition and RMSNorm into their kernel (`Sp24Linear.normed`) in
    calls of up to that many rows (tokens): SPARSEDECODING_FUSE_NORM (under auto, 8192 // hidden size, none
    beyond 4096 wide)."""

    def __init__(self, args: ModelArgs, tp: ProcessGroup | None = None) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, tp)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args, tp)
        self.fuse_norms = 0

    def forward(self, x: Tensor, mlp_out: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                input_pos: Tensor) -> tuple[Tensor, Tensor]:
        if self.fuse_norms and x.numel() <= self.fuse_norms * x.shape[-1]:
            norm = self.attention_norm
            qkv, x = self.attention.qkv.normed(x, mlp_out, norm.weight, norm.eps)
            attended = self.attention.attend(qkv, cos, sin, mask, input_pos)
            norm = self.mlp_norm
            hidden, h = self.mlp.gate_up.normed(x, attended, norm.weight, norm.eps)
            return h, self.mlp.finish(hidden)
        x = x + mlp_out
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        return h, self.mlp(self.mlp_norm(h))


def _run_block(block: Block, *inputs: Tensor) -> tuple[Tensor, Tensor]:
    return block(*inputs)


def _run_final_norm(norm: RMSNorm, x: Tensor, mlp_out: Tensor) -> Tensor:
    return norm(x + mlp_out)


def _own_code(fn: types.FunctionType) -> types.FunctionType:
    """`fn` with a code object of its own. Dynamo keeps compiled entries, and counts recompiles against its limit
    (8 by default, a hard error under fullgraph), per code object: shared by every model compiled in the process,
    the ninth model or batch size to compile the block failed. Each compile_regions call now starts an empty list,
    freed with the regions it replaces."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Transformer(nn.Module):
    """Embedding, `n_layers` blocks, final RMSNorm and lm_head (`output`, the embedding matrix when tied). `args` is
    the whole model's; `local_args` the shapes of this rank's blocks (the same without `tp`)."""

    def __init__(self, args: ModelArgs, tp: ProcessGroup | None = None) -> None:
        super().__init__()
        world = rank_and_world(tp)[1]
        self.args, self.local_args, self.tp = args, local_args(args, world), tp
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(self.local_args, tp) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size // world, bias=False)
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        self.cache_batch = 0
        self.max_seq_len = 0
        self.cache_version = 0  # bumped by each setup_caches, so that an Engine notices a newer one took the cache
        self.fused_decode = False  # every layer's decode steps take the fused attention kernel (`setup_caches`)
        self._compiled: tuple | None = None

    def setup_caches(self, batch: int, max_seq_len: int, positions: int | None = None) -> None:
        """Allocates zeroed KV caches [batch, kv_heads, max_seq_len, head_dim] per layer and the RoPE tables. Zeros
        matter: masked cache slots are multiplied by zero attention weights, and 0·NaN would poison the output.
        `positions`: how many the caller will use (default all), which must fit a sliding window; slots beyond
        them, padding the cache to a round size, are never attended."""
        window, used = self.args.sliding_window, max_seq_len if positions is None else positions
        if window is not None and used > window:
            raise EngineError(f"{used} positions exceed this model's sliding window of {window}, which the engine "
                              f"does not apply; generate at most {window} positions in all")
        weight = self.norm.weight
        shape = (batch, self.local_args.n_kv_heads, max_seq_len, self.args.head_dim)
        for layer in self.layers:
            layer.attention.k_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            layer.attention.v_cache = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            layer.attention.prepare_decode(batch, weight.device, weight.dtype)
        self.fused_decode = all(layer.attention.fused_decode for layer in self.layers)
        self.rope_cos, self.rope_sin = rope_tables(self.args, max_seq_len, weight.dtype, weight.device)
        self.cache_batch, self.max_seq_len = batch, max_seq_len
        self.cache_version += 1

    def compile_regions(self) -> None:
        """Compiles one block and the final norm with torch.compile (static shapes, Inductor's defaults, plus the
        options of SPARSEDECODING_COMBO_KERNELS and SPARSEDECODING_INDUCTOR_PDL: `kernels.op.compile_options`).
        Dynamo treats a block's parameters and buffers as graph inputs, so every layer reuses one compiled graph and
        compile time does not grow with depth; the caller captures the whole decode step in a CUDA graph to remove
        launch overhead. Inductor options that benchmark candidates while compiling (gpt-fast's coordinate-descent
        tuning) stay off: the benchmark would pay them at each of its compilations. Each call compiles copies of the
        region functions with code objects of their own (`_own_code`), so Dynamo's recompile limit applies to this
        call's engine alone, not to every model and batch compiled in the process. An engine built again on the same
        model and batch traces the block again (no source builds engines in a loop); whether Inductor's FX graph
        cache, on by default, shortens that was not timed."""
        options = compile_options()
        self._compiled = (torch.compile(_own_code(_run_block), fullgraph=True, dynamic=False, options=options),
                          torch.compile(_own_code(_run_final_norm), fullgraph=True, dynamic=False, options=options))

    def forward(self, tokens: Tensor, input_pos: Tensor, compiled: bool = False) -> Tensor:
        """Logits [B, T, vocab] for tokens [B, T] at cache positions input_pos [T]; writes their keys and values."""
        return self.logits(self.hidden(tokens, input_pos, compiled))

    def logits(self, hidden: Tensor) -> Tensor:
        """lm_head over the whole vocabulary (every rank's slice gathered)."""
        return gather_vocab(self.output(hidden), self.tp)

    def hidden(self, tokens: Tensor, input_pos: Tensor, compiled: bool = False) -> Tensor:
        """Final-normed hidden states [B, T, dim]; `compiled` runs the regions from `compile_regions`."""
        if tokens.shape[0] != self.cache_batch:
            raise EngineError(f"a batch of {tokens.shape[0]} sequences does not match the KV cache's batch of "
                              f"{self.cache_batch}; call setup_caches with the batch size first")
        run_block, run_final_norm = self._compiled if compiled else (_run_block, _run_final_norm)
        if tokens.shape[1] == 1 and self.fused_decode:
            # the fused decode-attention kernel reads the new position's rotation from the tables and needs no mask:
            # two index kernels and five mask kernels a step fewer
            return self._run_layers(run_block, run_final_norm, tokens, self.rope_cos, self.rope_sin, None, input_pos)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        # Built once per call as an additive mask in the layout of the folded query axis (group copies of the
        # [T, S] causal mask), so that no block spends a kernel converting or repeating it.
        group = self.args.n_heads // self.args.n_kv_heads
        allowed = torch.arange(self.max_seq_len, device=input_pos.device) <= input_pos[:, None]
        mask = torch.zeros(allowed.shape, dtype=cos.dtype, device=cos.device).masked_fill(~allowed, float("-inf"))
        mask = mask.repeat(group, 1)
        return self._run_layers(run_block, run_final_norm, tokens, cos, sin, mask, input_pos)

    def _run_layers(self, run_block, run_final_norm, tokens: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                    input_pos: Tensor) -> Tensor:
        x = self.embed(tokens)
        mlp_out = torch.zeros_like(x)
        for layer in self.layers:
            x, mlp_out = run_block(layer, x, mlp_out, cos, sin, mask, input_pos)
        return run_final_norm(self.norm, x, mlp_out)
