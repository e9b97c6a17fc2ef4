"""Many independent sequences decoding at once on the engine's transformer, each in its own cache row ("slot") at its
own position, so that a finished sequence's slot can take a new prompt while the others go on.

The `Engine` decodes equal-length prompts that share one position. Here a static KV cache of R slots × S positions
holds unrelated sequences: the decode step feeds slot r's token at its position pos[r] (RoPE angles gathered at
pos[r], keys and values written at cache[r, :, pos[r]], attention to positions ≤ pos[r]) and picks every slot's next
token on the device. Newcomers are prefilled in groups, right-padded to a common length: causal attention alone keeps
a real position from reading the pads after it, and the pads' keys and values written to the cache stay masked until
decoding overwrites them (a step writes position pos[r] before it attends to it). So a prompt's tokens do not depend
on which prompts share its prefill or its steps, up to the float rounding of another batch shape.

On CUDA the decode step is captured in CUDA graphs, one per active width (R, R/2, R/4, … slots, the active slots
moved to the front when few are left), so a step is one graph launch and the host syncs only when it asks which
slots have finished. The blocks' submodules (norms, fused qkv and gate|up linears, RoPE tables) are the engine's;
only the attention over per-slot positions is written here, `Block.forward` is not used."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import EngineError
from .config import from_hf_config
from .generate import argmax_rows, uniform_noise
from .loading import model_from_hf
from .model import Block, Transformer

_MASK32 = 0xFFFFFFFF
# Widths below this are not worth a graph of their own: the step then costs about what the weights take to read.
_SMALLEST_WIDTH = 8


@dataclass(frozen=True)
class RowSampling:
    """`temperature` 0 is greedy (argmax); otherwise a draw from softmax(logits / temperature) restricted to the
    smallest set of most likely tokens whose probability reaches `top_p` (the most likely token always stays)."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0) or not 0 < self.top_p <= 1:
            raise EngineError(f"sampling needs temperature >= 0 (0 is greedy) and 0 < top_p <= 1, got "
                              f"{self.temperature} and {self.top_p}")


def row_seed(seed: int, prompt: int) -> int:
    """The 32-bit noise stream of prompt number `prompt` under `seed`: its draws do not depend on its slot or on the
    other prompts of the call."""
    return (seed * 0x9E3779B1 + prompt) & _MASK32


def choose(logits: Tensor, sampling: RowSampling, seed: Tensor, count: Tensor) -> Tensor:
    """Next token ids [R] from logits [R, V]: argmax, or inverse-CDF sampling from p = softmax(logits / T). With
    top_p < 1, p is sorted in decreasing order (stable, so ties keep argmax's choice) and only the nucleus stays: the
    prefix whose mass before each token is below top_p. The token is the first one whose cumulative mass exceeds
    u · (kept mass), u uniform from `uniform_noise` keyed by (seed[r], count[r]): one uniform per row, no generator
    state and no host sync, so the step records into a CUDA graph."""
    if sampling.temperature == 0:
        return argmax_rows(logits)
    probs = (logits.float() / sampling.temperature).softmax(-1)
    if sampling.top_p < 1:
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        cumulative = probs.cumsum(-1)
        kept = (cumulative - probs < sampling.top_p).sum(-1, keepdim=True)
    else:
        order, cumulative = None, probs.cumsum(-1)
        kept = torch.full_like(count[:, None], probs.shape[-1])
    target = uniform_noise(seed[:, None], count[:, None], 1, 1) * cumulative.gather(-1, kept - 1)
    # The clamp keeps the draw among the kept tokens where float rounding puts the target on the last edge.
    index = torch.minimum(torch.searchsorted(cumulative, target, right=True), kept - 1)
    return index[:, 0] if order is None else order.gather(-1, index)[:, 0]


def engine_model(hf_model: nn.Module) -> Transformer:
    """The engine transformer of an in-memory transformers causal LM (Llama and Qwen2 families, Qwen3, Mistral), on its
    device and in its dtype, dense. Single-source tensors (embedding, norms, o and down projections, an untied lm_head)
    are shared with the HF model; the fused q|k|v and gate|up weights are new copies. Raises
    `UnsupportedArchitectureError` for an architecture the engine does not implement."""
    args = from_hf_config(hf_model.config.to_dict())
    state = hf_model.state_dict()
    weight = next(hf_model.parameters())

    def read(name: str) -> Tensor:
        if name not in state:
            raise EngineError(f"the model has no tensor {name}; the engine cannot map its weights")
        return state[name]

    return model_from_hf(args, read, "none", weight.dtype, weight.device)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on x [B, T, heads, d] with per-row angles: cos and sin are [B, T, d] (or [1, T, d] shared by all rows)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def project(block: Block, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Queries [B, T, heads, d], and keys and values [B, T, kv_heads, d] of a block's input x [B, T, dim], after the
    attention norm, the optional q/k norms and RoPE."""
    attention = block.attention
    batch, length, _ = x.shape
    heads, kv_heads, head_dim = attention.n_heads, attention.n_kv_heads, attention.head_dim
    q, k, v = attention.qkv(block.attention_norm(x)).split(
        [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(batch, length, heads, head_dim), k.view(batch, length, kv_heads, head_dim)
    if attention.q_norm is not None:
        q, k = attention.q_norm(q), attention.k_norm(k)
    return rotate(q, cos, sin), rotate(k, cos, sin), v.view(batch, length, kv_heads, head_dim)


def finish(block: Block, x: Tensor, attended: Tensor) -> Tensor:
    """The rest of a block after attention: x + out(attended), then the MLP's residual branch."""
    x = x + block.attention.out(attended.reshape(*x.shape[:2], -1))
    return x + block.mlp(block.mlp_norm(x))


def decode_block(block: Block, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, rows: Tensor,
                 pos: Tensor) -> Tensor:
    """One block for one token per slot: x [n, 1, dim] at positions pos [n] of slots rows [n] (0..n-1). Its key and
    value go to cache[r, :, pos[r]]; the G query heads of a KV head are read as G queries of that head (as the
    engine's attention folds them), under `mask` [n, 1, 1, S], 0 where position ≤ pos[r] and -inf elsewhere."""
    attention = block.attention
    q, k, v = project(block, x, cos, sin)
    attention.k_cache[rows, :, pos] = k[:, 0]
    attention.v_cache[rows, :, pos] = v[:, 0]
    n, kv_heads = x.shape[0], attention.n_kv_heads
    k_cache, v_cache = attention.k_cache[:n], attention.v_cache[:n]
    y = F.scaled_dot_product_attention(q.view(n, kv_heads, -1, attention.head_dim), k_cache, v_cache, attn_mask=mask)
    return finish(block, x, y)


class RowDecoder:
    """R slots of a static KV cache of S positions (`max_seq_len`, rounded up to a multiple of 16) on an engine model
    (the decoder owns its cache: `setup_caches` is called here). Per slot it keeps the token to feed next, its position,
    the tokens generated so far (`out`, `out_width` columns), their count, the noise seed, and whether the sequence
    has finished (a token in `stop_ids`, or `max_new_tokens` tokens).

    `admit` prefills prompts into chosen slots; `run` decodes every slot of the active width one token per step;
    `finished` and `outputs` read the state back (host syncs); `keep` moves chosen slots to the front and narrows the
    active width. Slots holding no sequence step along harmlessly: their position and count stop at the last cache
    position and output column. The caller sizes S ≥ longest prompt + tokens a sequence may run past its end before
    it is collected, and `out_width` likewise.

    graph: capture the decode step of each width in a CUDA graph (default: on CUDA models); eager otherwise."""

    def __init__(self, model: Transformer, slots: int, max_seq_len: int, out_width: int, stop_ids: Sequence[int],
                 max_new_tokens: int, sampling: RowSampling = RowSampling(), graph: bool | None = None) -> None:
        if model.tp is not None:
            raise EngineError("the row decoder runs on one device; build the model without tensor parallelism")
        if slots < 1 or out_width < max_new_tokens or max_new_tokens < 1:
            raise EngineError(f"need at least one slot and out_width >= max_new_tokens >= 1, got {slots}, "
                              f"{out_width} and {max_new_tokens}")
        self.model, self.sampling, self.max_new_tokens = model, sampling, max_new_tokens
        self.device = model.norm.weight.device
        # Whole multiples of 16 positions keep the mask rows aligned for the fused attention kernels.
        model.setup_caches(slots, -(-max_seq_len // 16) * 16)
        self.slots, self.max_seq_len = slots, model.max_seq_len

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.token, self.pos, self.count, self.seed = zeros(slots), zeros(slots), zeros(slots), zeros(slots)
        self.out, self.finished = zeros(slots, out_width), zeros(slots, dtype=torch.bool)
        self.rows = torch.arange(slots, device=self.device)
        self.positions = torch.arange(self.max_seq_len, device=self.device)
        self.stop_ids = torch.tensor(list(stop_ids), dtype=torch.long, device=self.device)
        self.widths = [slots]
        while self.widths[-1] // 2 >= _SMALLEST_WIDTH:
            self.widths.append(self.widths[-1] // 2)
        self.width = slots
        use_graph = self.device.type == "cuda" if graph is None else graph
        if use_graph and self.device.type != "cuda":
            raise EngineError("CUDA graphs need a CUDA model; run the row decoder eagerly on CPU")
        self.graphs = self._capture() if use_graph else None

    @torch.no_grad()
    def admit(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], seeds: Sequence[int],
              pad_id: int = 0) -> None:
        """Prefills `prompts` (non-empty token lists) into `slots` (below the active width) in one forward pass and
        picks each one's first new token from the logits of its last prompt position; `seeds` are their noise
        streams (see `row_seed`)."""
        if not prompts or len(slots) != len(prompts) or len(seeds) != len(prompts):
            raise EngineError("admit needs one slot and one seed per prompt")
        lengths = [len(prompt) for prompt in prompts]
        if min(lengths) < 1 or max(lengths) > self.max_seq_len - 1 or max(slots) >= self.width:
            raise EngineError(f"prompts of 1..{self.max_seq_len - 1} tokens go into slots below {self.width}")
        length = max(lengths)
        ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        ids, where = ids.to(self.device), torch.tensor(list(slots), device=self.device)
        last = torch.tensor(lengths, device=self.device)
        cos, sin = self.model.rope_cos[None, :length], self.model.rope_sin[None, :length]
        x = self.model.embed(ids)
        for block in self.model.layers:
            q, k, v = project(block, x, cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            block.attention.k_cache[where, :, :length] = k
            block.attention.v_cache[where, :, :length] = v
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, enable_gqa=True)
            x = finish(block, x, y.transpose(1, 2))
        hidden = x[torch.arange(len(prompts), device=self.device), last - 1]
        seed = torch.tensor(list(seeds), dtype=torch.long, device=self.device)
        first = choose(self.model.output(self.model.norm(hidden)), self.sampling, seed, torch.zeros_like(seed))
        self.token[where], self.pos[where], self.seed[where] = first, last, seed
        self.count[where] = 1
        self.out[where, 0] = first
        self.finished[where] = self._stops(first) | (self.max_new_tokens <= 1)

    def run(self, steps: int) -> None:
        """`steps` decode steps over the active width, without host syncs."""
        for _ in range(steps):
            if self.graphs is not None:
                self.graphs[self.width].replay()
            else:
                self._step(self.width)

    def finished_slots(self) -> list[bool]:
        """Whether each slot's sequence has finished (one host sync)."""
        return self.finished.tolist()

    def outputs(self, slots: Sequence[int]) -> list[list[int]]:
        """The output columns of `slots`: generated tokens first, then whatever later steps wrote."""
        return self.out[torch.tensor(list(slots), device=self.device)].tolist()

    @torch.no_grad()
    def keep(self, slots: Sequence[int]) -> bool:
        """Moves the state of `slots` (ascending) to slots 0..len-1 and narrows the active width to the smallest one
        that holds them, when that is narrower than the current width; returns whether it did. The other slots are
        dropped (they must hold no sequence that is still wanted)."""
        width = min(w for w in self.widths if w >= max(len(slots), 1))
        if width >= self.width:
            return False
        source = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        kept = len(slots)
        for block in self.model.layers:
            for cache in (block.attention.k_cache, block.attention.v_cache):
                cache[:kept] = cache[source]
        for state in (self.token, self.pos, self.count, self.seed, self.out, self.finished):
            state[:kept] = state[source]
        self.width = width
        return True

    def _stops(self, token: Tensor) -> Tensor:
        return (token[:, None] == self.stop_ids).any(-1)

    @torch.no_grad()
    def _step(self, n: int) -> None:
        """One decode step of slots 0..n-1 on the static buffers: each slot's token goes in at its position, the next
        token is recorded and replaces it, position and count advance (saturating at the cache's and the output's
        last column, which only idle slots reach)."""
        model, rows, token, pos, count = self.model, self.rows[:n], self.token[:n], self.pos[:n], self.count[:n]
        cos, sin = model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]
        mask = torch.zeros(n, self.max_seq_len, dtype=cos.dtype, device=self.device)
        mask = mask.masked_fill(self.positions > pos[:, None], float("-inf"))[:, None, None]
        x = model.embed(token)[:, None]
        for block in model.layers:
            x = decode_block(block, x, cos, sin, mask, rows, pos)
        logits = model.output(model.norm(x[:, 0]))
        chosen = choose(logits, self.sampling, self.seed[:n], count)
        self.out[rows, count] = chosen
        self.finished[:n] |= self._stops(chosen) | (count + 1 >= self.max_new_tokens)
        token.copy_(chosen)
        count.copy_((count + 1).clamp(max=self.out.shape[1] - 1))
        pos.copy_((pos + 1).clamp(max=self.max_seq_len - 1))

    def _capture(self) -> dict[int, torch.cuda.CUDAGraph]:
        # Capture happens before any prompt is admitted, so the warm-up steps' writes land in empty slots. The graphs
        # never run at the same time and keep nothing allocated in their pool between replays, so they share it.
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        for width in self.widths:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(width)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._step(width)
            pool = graph.pool()
            graphs[width] = graph
        return graphs
