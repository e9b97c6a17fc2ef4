"""Decode speed of the engine, dense and sparse side by side in one process. tok/s counts decode steps only
(prefill, which yields the first new token, is excluded), timed by device syncs around the step loop after a warm-up
generation, median over repeats. Achieved bandwidth = weight bytes a step reads (`weight_bytes`: every linear,
packed = values + bitmask, and lm_head; embeddings excluded) / step time, against the copy bandwidth of a large
device-to-device copy (bytes read + written) measured in the same process. Preset runs can make every block linear
int8 or int4 (`quantize`): N:M packed with quantized values, or dense weight-only quantized without a pattern; their
ratio is still against the bf16 dense model. Under tensor parallelism (a `tp` group,
processes started by torchrun) every rank runs the same plan on its shards; weight bytes and bandwidth are then per
GPU, each GPU reading its own shard every step."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import EngineError
from ..kernels import PackedLinear
from ..kernels.quantized import QUANTIZED_FORMATS, check_dense_quantization
from ..kernels.quantized_linear import QuantizedPackedLinear
from ..kernels.sp24_linear import Sp24Linear
from ..patterns import SparsityPattern
from ..solvers import quantization_group
from .config import ModelArgs, preset
from ..kernels.op import MAX_BATCH, dense_int4_setting
from .generate import Engine
from .loading import (build_model, check_dense_copy_batch, engine_shapes, is_prunable, keep_dense_copies,
                      load_model, random_state, require_kernel_pattern, resident_weight_bytes, weight_bytes,
                      weight_format)
from .model import Transformer
from .parallel import ProcessGroup, rank_and_world, smallest

_GIB = 2**30


@dataclass(frozen=True)
class SpeedResult:
    """One (model, weights, batch) measurement."""

    model: str
    weights: str  # "dense", the N:M pattern of the packed block linears, or that + a dense copy from batch B;
    # quantized ones add their format ("2:4 int8", "dense int4 g128")
    batch: int
    decode_steps: int
    seconds: float  # median wall time of the decode steps
    weight_bytes: int  # read per decode step
    setup_seconds: float  # Engine construction: compile, warm-up and CUDA graph capture
    resident_bytes: int = 0  # weights held on the device
    gpus: int = 1  # tensor-parallel ranks; the byte counts are then one GPU's

    @property
    def step_ms(self) -> float:
        return 1000 * self.seconds / self.decode_steps

    @property
    def tokens_per_second(self) -> float:
        """Per sequence; the batch produces `batch` times as many."""
        return self.decode_steps / self.seconds

    @property
    def bandwidth(self) -> float:
        """Weight bytes read per second (bytes/s)."""
        return self.weight_bytes * self.decode_steps / self.seconds


@dataclass(frozen=True)
class NotRun:
    """A configuration that was not measured, and why (for example weights larger than the free GPU memory)."""

    model: str
    weights: str
    reason: str


def copy_bandwidth(device: torch.device, nbytes: int = 2 * _GIB, repeats: int = 10) -> float:
    """Bytes read + written per second by a device-to-device copy of `nbytes` (median of `repeats`)."""
    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * nbytes / statistics.median(times)


def _quantized_bytes(rows: int, columns: int, pattern: SparsityPattern | None, quantize: str,
                     group_size: int, device: torch.device | str = "cpu") -> int:
    """Codes, scales and (N:M) bitmask bytes of a quantized [rows, columns] weight built on `device`."""
    kept = columns if pattern is None else columns * pattern.n // pattern.m
    groups = columns // quantization_group(quantize, group_size, columns)
    # int4 dense in tinygemm's layout: a scale and a zero a group (SPARSEDECODING_DENSE_INT4=tinygemm, and its
    # "auto" off CUDA; on CUDA "auto" takes sp24's layout for the bf16 models these counts are for)
    setting = dense_int4_setting()
    tinygemm = setting == "tinygemm" or setting == "auto" and torch.device(device).type != "cuda"
    scale_bytes = 4 if pattern is None and quantize == "int4" and tinygemm else 2
    mask = 0 if pattern is None else columns // 8
    return rows * (kept * (8 if quantize == "int8" else 4) // 8 + groups * scale_bytes + mask)


def model_bytes(args: ModelArgs, pattern: SparsityPattern | None, element_size: int = 2,
                block_linears: bool = True, tp: ProcessGroup | None = None, quantize: str | None = None,
                group_size: int = 128, head: str | None = None, device: torch.device | str = "cpu") -> int:
    """Bytes of all weights of a preset model (embeddings included), packed block linears when `pattern` is set,
    quantized ones with `quantize` (codes and scales); without the block linears when `block_linears` is False; one
    rank's shards with `tp`; with `head`, lm_head quantized (and untied); built on `device` (which decides the dense
    int4 layout under SPARSEDECODING_DENSE_INT4=auto)."""
    total = 0
    for key, shape in engine_shapes(args, tp).items():
        if key == "output.weight" and head is not None:
            total += _quantized_bytes(*shape, None, head, group_size, device)
            continue
        if key == "output.weight" and args.tie_embeddings or not block_linears and is_prunable(key):
            continue
        if is_prunable(key) and quantize is not None:
            total += _quantized_bytes(*shape, pattern, quantize, group_size, device)
        elif is_prunable(key) and pattern is not None:
            rows, columns = shape
            total += rows * columns * pattern.n // pattern.m * element_size + rows * columns // 8
        else:
            total += shape.numel() * element_size
    return total


def measure(model: Transformer, name: str, weights: str, batch: int, prompt_tokens: int, new_tokens: int,
            repeats: int) -> SpeedResult:
    """Builds a compiled Engine for `batch`, warms it up and times `repeats` generations of `new_tokens` from a
    random prompt (random token ids: never time on zeros)."""
    start = time.perf_counter()
    engine = Engine(model, batch, prompt_tokens + new_tokens, compile=True)
    setup = time.perf_counter() - start
    generator = torch.Generator().manual_seed(batch)
    prompt = torch.randint(model.args.vocab_size, (batch, prompt_tokens), generator=generator)
    engine.generate(prompt, min(new_tokens, 16))
    seconds = statistics.median(engine.generate(prompt, new_tokens).decode_seconds for _ in range(repeats))
    return SpeedResult(model=name, weights=weights, batch=batch, decode_steps=new_tokens - 1, seconds=seconds,
                       weight_bytes=weight_bytes(model, batch), setup_seconds=setup,
                       resident_bytes=resident_weight_bytes(model), gpus=rank_and_world(model.tp)[1])


# One run of a plan: pattern (None: dense), batch sizes, and optionally the batch from which the packed linears use
# a dense copy of their weight (`keep_dense_copies`).
Run = tuple[SparsityPattern | None, list[int]] | tuple[SparsityPattern | None, list[int], int]


def run_label(pattern: SparsityPattern | str | None, dense_from: int | None = None, quantize: str | None = None,
              group_size: int = 128, head: str | None = None) -> str:
    """The weights column of a run: "dense", the pattern, or the pattern with its dense copies; with `quantize`,
    the format added ("2:4 int8", "dense int4 g128"); with `head`, the lm_head's (", int8 head")."""
    suffix = "" if head is None else f", {head} head"
    if quantize is not None:
        return f"{pattern or 'dense'} {quantize}" + (f" g{group_size}" if quantize == "int4" else "") + suffix
    if pattern is None:
        return "dense" + suffix
    return (str(pattern) if dense_from is None else f"{pattern} + dense copy from batch {dense_from}") + suffix


def check_plan(plan: list[Run], new_tokens: int, quantize: str | None = None, group_size: int = 128,
               head: str | None = None) -> None:
    """Refuses patterns the kernel cannot run, batch sizes outside 1..16, dense copies of a dense or quantized
    model, quantization settings the format cannot hold and generations without a decode step, before any model
    is built."""
    if new_tokens < 2:
        raise EngineError(f"{new_tokens} new tokens leave no decode step to time (prefill makes the first); use 2+")
    for name, kind in (("quantize", quantize), ("head", head)):
        if kind is not None and kind not in QUANTIZED_FORMATS:
            raise EngineError(f"{name} {kind!r} is not a weight format; use {' or '.join(QUANTIZED_FORMATS)}")
    if "int4" in (quantize, head) and (group_size <= 0 or group_size % 32):
        raise EngineError(f"--group-size {group_size}: quantized packed weights need a positive multiple of 32 (a "
                          f"mask word must not straddle two scale groups); 128 is the default")
    if head == "int4":
        check_dense_quantization(head, group_size)
    for pattern, batches, *dense_from in plan:
        if pattern is not None:
            require_kernel_pattern(pattern)
        elif dense_from:
            raise EngineError("a dense copy needs packed weights; give the run an N:M pattern")
        if dense_from and (quantize is not None or head is not None):
            raise EngineError("dense copies are kept of bf16 packed weights only; measure them without quantize "
                              "or a quantized head")
        if not all(1 <= batch <= MAX_BATCH for batch in batches):
            raise EngineError(f"batch sizes {batches} must lie in 1..{MAX_BATCH}, the range the N:M kernel serves")
        if dense_from:
            check_dense_copy_batch(dense_from[0])


def check_timing(prompt_tokens: int, repeats: int) -> None:
    """Refuses an empty prompt and a measurement without a timed generation, before any model is built."""
    if prompt_tokens < 1:
        raise EngineError(f"--prompt-tokens {prompt_tokens}: prefill needs a prompt of at least 1 token")
    if repeats < 1:
        raise EngineError(f"--repeats {repeats}: the median needs at least 1 timed generation")


def check_group_size(args: ModelArgs, quantize: str | None, group_size: int, head: str | None = None) -> None:
    """QuantizationError unless int4's `group_size` divides the row length of every block linear of `args` (and of
    lm_head with a quantized `head`)."""
    for key, shape in engine_shapes(args).items():
        if is_prunable(key) and quantize is not None:
            quantization_group(quantize, group_size, shape[1])
        elif key == "output.weight" and head is not None:
            quantization_group(head, group_size, shape[1])


def bench_preset(name: str, plan: list[Run], device: torch.device, prompt_tokens: int = 16, new_tokens: int = 256,
                 repeats: int = 3, tp: ProcessGroup | None = None, quantize: str | None = None,
                 group_size: int = 128, head: str | None = None) -> list[SpeedResult | NotRun]:
    """For each (pattern or None for dense, batch sizes[, dense copy from batch]) of `plan`: random weights of
    preset `name` built on the device, then one measurement per batch size. With `quantize` ("int8" or "int4",
    `group_size` columns a scale) every block linear is quantized: N:M packed with codes and scales, or dense
    weight-only quantized for a run without a pattern; with `head`, lm_head is dense int8 / int4 as well (as
    `prune --quantize-head` makes it). A model whose weights do not fit the free memory is reported
    as not run instead of being attempted. With `tp`, each rank builds and measures its shards (the smallest free
    memory of the ranks decides, so that all take the same path)."""
    args = preset(name)
    check_plan(plan, new_tokens, quantize, group_size, head)
    check_timing(prompt_tokens, repeats)
    check_group_size(args, quantize, group_size, head)
    world = rank_and_world(tp)[1]
    results: list[SpeedResult | NotRun] = []
    for pattern, batches, *dense_from in plan:
        label = run_label(pattern, *dense_from, quantize=quantize, group_size=group_size, head=head)
        needed = model_bytes(args, pattern, tp=tp, quantize=quantize, group_size=group_size, head=head,
                             device=device) \
            + _working_memory(args, max(batches), prompt_tokens + new_tokens, world)
        if dense_from:
            needed += model_bytes(args, None, tp=tp) - model_bytes(args, None, block_linears=False, tp=tp)
        free, total = torch.cuda.mem_get_info(device)
        free = smallest(free, tp, device)
        if needed > free:
            results.append(NotRun(name, label, f"needs {needed / 1e9:.1f} GB (weights + cache + 2 GiB working "
                                               f"memory); {free / 1e9:.1f} GB of {total / 1e9:.1f} GB are free"))
            continue
        model = build_model(args, random_state(args, pattern, device=device, tp=tp, quantize=quantize,
                                               group_size=group_size, head=head), tp)
        if dense_from:
            keep_dense_copies(model, dense_from[0])
        results += [measure(model, name, label, batch, prompt_tokens, new_tokens, repeats) for batch in batches]
        del model
        release_memory()
    return results


def bench_folder(folder: Path, batches: list[int], device: torch.device, prompt_tokens: int = 16,
                 new_tokens: int = 256, repeats: int = 3, dense_from: int | None = None,
                 tp: ProcessGroup | None = None) -> list[SpeedResult | NotRun]:
    """The folder's weights dense (`--sparse none`) and with its N:M linears packed (`--sparse auto`); with
    `dense_from`, the packed model again with dense copies from that batch on, at the batches that use them."""
    check_timing(prompt_tokens, repeats)
    results: list[SpeedResult | NotRun] = []
    for sparse in ("none", "auto"):
        model = load_model(folder, sparse=sparse, device=device, tp=tp)
        label = "dense" if sparse == "none" else _packed_label(model)
        if label is None:
            results.append(NotRun(folder.name, "sparse", "no block linear is N:M sparse; prune the model first"))
        else:
            results += [measure(model, folder.name, label, batch, prompt_tokens, new_tokens, repeats)
                        for batch in batches]
            if sparse == "auto" and dense_from is not None and max(batches) >= dense_from:
                keep_dense_copies(model, dense_from)
                results += [measure(model, folder.name, run_label(label, dense_from), batch, prompt_tokens,
                                    new_tokens, repeats) for batch in batches if batch >= dense_from]
        del model
        release_memory()
    return results


def release_memory() -> None:
    """Drops compiled code (it holds no weights, but the per-code recompile limit counts every model), collects
    engines and their CUDA graphs, and returns the cached blocks to the driver before the next model."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def _dense_rows(results: list[SpeedResult | NotRun]) -> dict[tuple[str, int, int], SpeedResult]:
    return {(r.model, r.batch, r.gpus): r for r in results if isinstance(r, SpeedResult) and r.weights == "dense"}


def results_records(results: list[SpeedResult | NotRun], copy_bytes_per_second: float) -> list[dict]:
    """The rows of `format_table` as records for a JSON file (units in the keys; `vs_dense` null where the run has
    no dense row of the same model, batch and GPUs; a row not measured has `not_run` with the reason)."""
    dense = _dense_rows(results)
    records = []
    for r in results:
        if isinstance(r, NotRun):
            records.append({"model": r.model, "weights": r.weights, "not_run": r.reason})
            continue
        base = dense.get((r.model, r.batch, r.gpus))
        records.append({
            "model": r.model, "weights": r.weights, "batch": r.batch, "gpus": r.gpus, "decode_steps": r.decode_steps,
            "seconds": r.seconds, "ms_per_step": r.step_ms, "tokens_per_second_per_sequence": r.tokens_per_second,
            "tokens_per_second_total": r.batch * r.tokens_per_second,
            "vs_dense": r.tokens_per_second / base.tokens_per_second if base else None,
            "weight_bytes_per_step": r.weight_bytes, "bytes_per_second": r.bandwidth,
            "fraction_of_copy": r.bandwidth / copy_bytes_per_second, "resident_bytes": r.resident_bytes,
            "setup_seconds": r.setup_seconds})
    return records


def format_table(results: list[SpeedResult | NotRun], copy_bytes_per_second: float) -> str:
    """Markdown table; the ratio is against the dense result of the same model, batch and number of GPUs."""
    dense = _dense_rows(results)
    lines = [f"Copy bandwidth (device-to-device, read + write): {copy_bytes_per_second / 1e12:.2f} TB/s", ""]
    if any(isinstance(r, SpeedResult) and r.gpus > 1 for r in results):
        lines += ["Rows marked TP=N ran tensor-parallel over N GPUs: weight GB/step, achieved TB/s, % of copy and "
                  "weights held are per GPU (each reads its own shard every step); tok/s is the model's.", ""]
    lines += ["| model | weights | batch | ms/step | tok/s per seq | tok/s total | vs dense | weight GB/step | "
              "achieved TB/s | % of copy | weights held GB | compile+capture s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if isinstance(r, NotRun):
            lines.append(f"| {r.model} | {r.weights} | | | not run: {r.reason} | | | | | | | |")
            continue
        base = dense.get((r.model, r.batch, r.gpus))
        ratio = f"{r.tokens_per_second / base.tokens_per_second:.3f}x" if base else "n/a"
        model = r.model if r.gpus == 1 else f"{r.model} TP={r.gpus}"
        lines.append(
            f"| {model} | {r.weights} | {r.batch} | {r.step_ms:.3f} | {r.tokens_per_second:.1f} | "
            f"{r.batch * r.tokens_per_second:.1f} | {ratio} | {r.weight_bytes / 1e9:.2f} | {r.bandwidth / 1e12:.2f} | "
            f"{100 * r.bandwidth / copy_bytes_per_second:.0f}% | {r.resident_bytes / 1e9:.2f} | "
            f"{r.setup_seconds:.1f} |")
    return "\n".join(lines) + "\n"


def _working_memory(args: ModelArgs, batch: int, max_seq_len: int, world: int = 1) -> int:
    cache = 2 * args.n_layers * batch * args.n_kv_heads // world * max_seq_len * args.head_dim * 2
    return cache + 2 * _GIB


def _packed_label(model: Transformer) -> str | None:
    formats = sorted({weight_format(module) for module in model.modules()
                      if isinstance(module, (PackedLinear, QuantizedPackedLinear, Sp24Linear))})
    return "+".join(formats) or None
