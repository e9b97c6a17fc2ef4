"""Generation with a static KV cache: an eager prefill, then decode steps that each read the last token and its
position from static device buffers and write the next ones back. With `compile=True` (CUDA) the step runs compiled
regions and is captured once in a CUDA graph, so a step is one graph launch and the loop never syncs with the host."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import EngineError
from ..kernels.op import MAX_BATCH, fused_greedy_setting, step_tune_setting
from .model import Transformer

log = logging.getLogger(__name__)

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Sampling:
    """`temperature` 0 is greedy (argmax); otherwise tokens are drawn from softmax(logits / temperature), restricted
    to the `top_k` most likely when set. Draws are a pure function of (seed, position, sequence, token id)."""

    temperature: float = 0.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise EngineError(f"temperature {self.temperature} is not a finite number of at least 0; use 0 for "
                              f"greedy or a positive value")
        if self.top_k is not None and self.top_k < 1:
            raise EngineError(f"top_k {self.top_k} must be at least 1")


def _mix32(x: Tensor) -> Tensor:
    """An avalanche hash of 32-bit values held in int64; the multipliers are below 2³¹ so no product overflows."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5F356495) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seed: Tensor, position: Tensor, batch: int, vocab: int) -> Tensor:
    """Uniforms in (0, 1), [batch, vocab], hashed from a counter: no generator state, so sampling is reproducible,
    needs no host sync and records into a CUDA graph. 23 bits per draw: (k + 0.5) / 2²³ is exact in float32 for every
    k, so no draw is 0 or 1 (with 24 bits the largest, 2²⁴ − 0.5, rounds to 2²⁴ and gives 1, whose Gumbel noise is
    infinite: about one row in a hundred per step would take a uniformly random token at a 152k vocabulary)."""
    stream = _mix32(_mix32(seed & _MASK32) ^ (position & _MASK32))
    counter = torch.arange(batch, device=seed.device)[:, None] * vocab + torch.arange(vocab, device=seed.device)
    bits = _mix32(_mix32((stream + counter) & _MASK32))
    return ((bits >> 9).float() + 0.5) / 2**23


def two_stage_argmax(scores: Tensor) -> Tensor:
    """scores.argmax(-1) for [B, V], the same indices (the first maximum; NaN counts as the maximum, as in torch) in
    two reductions: the maxima of up to 256 equal chunks of each row, then the first chunk holding the row's
    maximum. A vocabulary without a power-of-two factor of at least 16 takes the plain argmax."""
    rows, vocab = scores.shape
    chunks = min(256, vocab & -vocab)  # the largest power of two dividing vocab, at most 256
    if chunks < 16:
        return scores.argmax(-1)
    values, inside = scores.reshape(rows, chunks, vocab // chunks).max(-1)
    chunk = values.argmax(-1, keepdim=True)
    return (chunk * (vocab // chunks) + inside.gather(-1, chunk)).squeeze(-1)


# (vocabulary, dtype, device) -> whether `two_stage_argmax` timed faster than torch.argmax there. Neither wins
# everywhere, and the vocabulary decides, not the rows (results/argmax_h200.md, batch 1, 4 and 16 alike): at
# Llama-3.1's 128,256 torch's single reduction takes 27 us and the two stages 11 us; at Qwen2.5's 151,936 torch
# takes 9 us and the two stages 14 us. Keyed without the rows, the batch generator's prefill (a new row count at
# each admission) is timed once, not once per count.
_TWO_STAGE_FASTER: dict[tuple, bool] = {}
_TIMED_ROWS = 4  # rows of the random scores the choice is timed on


def _time_argmax(rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> bool:
    """True if the two stages are faster than torch.argmax on random [rows, vocab] scores (CUDA-graph replays)."""
    from ..kernels.autotune import replay_ms

    generator = torch.Generator(device=device).manual_seed(0)
    scores = [torch.randn(rows, vocab, device=device, generator=generator).to(dtype) for _ in range(2)]
    for tensor in scores:  # the first calls outside the timed graphs
        two_stage_argmax(tensor), tensor.argmax(-1)
    return replay_ms(two_stage_argmax, scores) < replay_ms(lambda tensor: tensor.argmax(-1), scores)


def argmax_rows(scores: Tensor) -> Tensor:
    """scores.argmax(-1) for [B, V] (the same indices) by whichever of torch.argmax and `two_stage_argmax` timed
    faster for this vocabulary, dtype and GPU; timed once, at the first call outside a CUDA-graph capture (the
    engine's warm-up), and remembered. A first call during a capture, and every call on the CPU, takes
    torch.argmax."""
    if not scores.is_cuda or scores.dim() != 2:
        return scores.argmax(-1)
    key = (scores.shape[1], scores.dtype, scores.device)
    if key not in _TWO_STAGE_FASTER:
        if torch.cuda.is_current_stream_capturing():
            return scores.argmax(-1)
        _TWO_STAGE_FASTER[key] = _time_argmax(_TIMED_ROWS, *key)
    return two_stage_argmax(scores) if _TWO_STAGE_FASTER[key] else scores.argmax(-1)


def sample(logits: Tensor, sampling: Sampling, seed: Tensor, position: Tensor) -> Tensor:
    """Next token ids [B] from logits [B, vocab]: argmax, or the Gumbel-max trick argmax(logits/T + G) with
    G = -log(-log U), which draws exactly from softmax(logits/T)."""
    if sampling.temperature == 0:
        return argmax_rows(logits)
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None:
        kth = scores.topk(min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    gumbel = -torch.log(-torch.log(uniform_noise(seed, position, *scores.shape)))
    return argmax_rows(scores + gumbel)


@dataclass(frozen=True)
class Generation:
    """Generated token ids [B, new_tokens] on the CPU, and the wall time of the decode steps alone (prefill, which
    produces the first new token, is excluded), measured from a device sync after prefill to one after the last
    step."""

    tokens: Tensor
    decode_seconds: float

    @property
    def decode_steps(self) -> int:
        return self.tokens.shape[1] - 1


class Engine:
    """Generation for up to `batch` equal-length prompts of up to `max_seq_len` positions in all (prompt + new
    tokens; the cache rounds it up to a multiple of 16). The engine owns the model's KV cache: a newer Engine on
    the same model makes this one unusable.

    compile: compile the model's regions and capture the decode step in a CUDA graph (CUDA only); the warm-up and
    capture happen here, once per (model, batch). Eager mode runs the same step function without either."""

    def __init__(self, model: Transformer, batch: int, max_seq_len: int, sampling: Sampling = Sampling(),
                 compile: bool = False) -> None:
        if not 1 <= batch <= MAX_BATCH:
            raise EngineError(f"batch {batch} is outside 1..{MAX_BATCH}, the range the N:M kernel serves")
        self.model, self.batch, self.sampling, self.compiled = model, batch, sampling, compile
        # Whole multiples of 16 positions keep the attention mask rows aligned for the fused attention kernels.
        model.setup_caches(batch, -(-max_seq_len // 16) * 16, positions=max_seq_len)
        self.cache_version = model.cache_version
        self.device = model.norm.weight.device
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.seed = torch.zeros(1, dtype=torch.long, device=self.device)
        # SPARSEDECODING_FUSED_GREEDY: a greedy step ends with one kernel (argmax into `token`, `position` advanced);
        # its scratch is made at the first step (before any capture), for the logits' width
        self.fused_greedy = sampling.temperature == 0 and fused_greedy_setting()
        if self.fused_greedy:
            from ..kernels import triton_greedy

            self.fused_greedy = triton_greedy.available(self.device)
            self._greedy_kernel = triton_greedy
        self.greedy_scratch = None
        self.graph = None
        self.step_choices = []  # with SPARSEDECODING_STEP_TUNE: how each 2:4 problem's launch was chosen
        if compile:
            if self.device.type != "cuda":
                raise EngineError("compile=True captures CUDA graphs and needs a CUDA model; use eager mode on CPU")
            model.compile_regions()
            self.graph = self._capture()
            if step_tune_setting() and model.tp is None:
                from .step_tune import tune_step

                self.step_choices = tune_step(self)
                for choice in self.step_choices:
                    log.info("step tuning: %s", choice.line())

    @property
    def max_seq_len(self) -> int:
        """Positions a request may use: the cache's, or fewer where a sliding window ends them first."""
        window = self.model.args.sliding_window
        return self.model.max_seq_len if window is None else min(self.model.max_seq_len, window)

    def generate(self, prompt: Tensor, new_tokens: int, seed: int = 0) -> Generation:
        """Generates `new_tokens` for each row of prompt [B, T] without any host sync inside the decode loop."""
        steps = self.stream(prompt, new_tokens, seed)
        tokens = torch.empty(self.batch, new_tokens, dtype=torch.long, device=self.device)
        tokens[:, 0] = next(steps)
        _synchronize(self.device)
        start = time.perf_counter()
        for i, token in enumerate(steps, start=1):
            tokens[:, i] = token
        _synchronize(self.device)
        return Generation(tokens=tokens[: prompt.shape[0]].cpu(), decode_seconds=time.perf_counter() - start)

    def stream(self, prompt: Tensor, new_tokens: int, seed: int = 0) -> Iterator[Tensor]:
        """Yields the next token of every cache row, [batch] on the device, `new_tokens` times: first from prefill,
        then one per decode step. A yielded tensor is the engine's buffer: read it before resuming the iterator."""
        self._prefill(prompt, new_tokens, seed)
        yield self.token[:, 0]
        for _ in range(new_tokens - 1):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
            yield self.token[:, 0]

    @torch.no_grad()
    def _prefill(self, prompt: Tensor, new_tokens: int, seed: int) -> None:
        if self.model.cache_version != self.cache_version:
            raise EngineError("another Engine was built on this model since; use that one or build a new one")
        rows, length = prompt.shape
        if rows > self.batch:
            raise EngineError(f"a batch of {rows} prompts is larger than the KV cache ({self.batch} sequences); "
                              f"build the Engine with batch={rows}")
        if length < 1 or new_tokens < 1 or length + new_tokens > self.max_seq_len:
            raise EngineError(f"a prompt of {length} tokens plus {new_tokens} new tokens does not fit the KV cache "
                              f"of {self.max_seq_len} positions; build the Engine with a larger max_seq_len")
        # Spare cache rows decode a copy of the first prompt, so that every step keeps the static batch shape.
        prompt = torch.cat([prompt, prompt[:1].expand(self.batch - rows, length)]).to(self.device)
        positions = torch.arange(length, device=self.device)
        logits = self.model.logits(self.model.hidden(prompt, positions)[:, -1])
        self.seed.fill_(seed)
        self.token.copy_(sample(logits, self.sampling, self.seed, positions[-1:])[:, None])
        self.position.fill_(length)

    @torch.no_grad()
    def _step(self) -> None:
        """One decode step on the static buffers: the token at `position` goes in, the next token replaces it and
        the position advances."""
        logits = self.model(self.token, self.position, compiled=self.compiled)[:, -1]
        if self.fused_greedy:
            if self.greedy_scratch is None:
                self.greedy_scratch = self._greedy_kernel.GreedyScratch.create(*logits.shape, self.device)
            self._greedy_kernel.greedy_step(logits, self.token, self.position, self.greedy_scratch)
            return
        self.token.copy_(sample(logits, self.sampling, self.seed, self.position)[:, None])
        self.position += 1

    def _capture(self) -> torch.cuda.CUDAGraph:
        # Warm-up runs on a side stream, as capture requires, and compiles and autotunes every kernel first. Its
        # writes to cache slots are harmless: each generation writes a slot before any query can read it.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return self.capture()

    def capture(self) -> torch.cuda.CUDAGraph:
        """A CUDA graph of one decode step as the kernels launch now (compiled and tuned already: `step_tune`
        captures the step again with other launches)."""
        graph = torch.cuda.CUDAGraph()
        # Split over GPUs, NCCL's watchdog thread polls the events of earlier collectives while this thread
        # captures; in the default "global" mode such a call from another thread invalidates the capture.
        mode = "global" if self.model.tp is None else "thread_local"
        with torch.cuda.graph(graph, capture_error_mode=mode):
            self._step()
        return graph


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
