"""Weights for the engine: from an HF safetensors folder (dense, or pruned with zeros kept), from a packed N:M
checkpoint (bf16 values, or int8 / int4 codes and scales), or random from a preset for speed runs. Conversion is two
explicit steps, as in gpt-fast's handlers: (1) build an engine state dict (fused names; each prunable linear a dense
tensor, a `PackedNM`, a `PackedNMQ` or a `DenseQuantized`), then (2) build the model from it, swapping a
`PackedLinear`, `QuantizedPackedLinear` or `DenseQuantizedLinear` in wherever the state holds such a weight. With a
tensor-parallel group `tp` each rank keeps only its shard of every weight (`parallel.shard_weight`); quantized
weights are not split."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from torch import Tensor, nn

from ..errors import EngineError, ModelFileError, ModelNotFoundError
from ..kernels import PackedLinear, PackedNM, pack_nm
from ..kernels.format import kernel_runs, nm_pattern
from ..kernels.op import MAX_BATCH
from ..kernels.quantized import SCALE_DTYPE, DenseQuantized, PackedNMQ
from ..kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
from ..kernels.sp24 import OVER_SLOTS
from ..kernels.sp24_linear import Sp24Linear, tile_for_kernel
from ..models import model_file_errors
from ..solvers import CODE_RANGES, QuantizedCodes, quantization_codes, quantization_group
from ..packed import PACKED_MANIFEST, load_packed_checkpoint, packed_manifest, recorded_head_quantization
from ..patterns import PRUNABLE_LINEARS, SparsityPattern
from .config import ModelArgs, load_hf_config
from .model import Transformer
from .parallel import ProcessGroup, rank_and_world, shard_weight

log = logging.getLogger(__name__)

SparseMode = Literal["none", "auto", "packed"]
SPARSE_MODES: tuple[SparseMode, ...] = ("none", "auto", "packed")
Weight = Tensor | PackedNM | PackedNMQ | DenseQuantized
# The engine modules of the weight formats other than a dense tensor.
_MODULES = {PackedNM: PackedLinear, PackedNMQ: QuantizedPackedLinear, DenseQuantized: DenseQuantizedLinear}

# Engine module -> HF modules whose weights (and biases) it concatenates by rows, in this order.
_HF_SOURCES = {
    "attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention.out": ("self_attn.o_proj",),
    "attention.q_norm": ("self_attn.q_norm",),
    "attention.k_norm": ("self_attn.k_norm",),
    "attention_norm": ("input_layernorm",),
    "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down": ("mlp.down_proj",),
    "mlp_norm": ("post_attention_layernorm",),
}
_HF_TOP_LEVEL = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# Engine linears made of prunable HF linears: attention.qkv, attention.out, mlp.gate_up, mlp.down.
PRUNABLE = tuple(f"{module}.weight" for module, sources in _HF_SOURCES.items()
                 if all(source.rsplit(".", 1)[-1] in PRUNABLE_LINEARS for source in sources))
# N:M group sizes of the kernel patterns, finest first so that ties go to the finer pattern.


def is_prunable(key: str) -> bool:
    """Linears inside decoder blocks; embeddings and lm_head always stay dense."""
    return key.startswith("layers.") and key.endswith(PRUNABLE)


def hf_sources(key: str) -> list[str]:
    """HF tensor names that make up engine tensor `key` (several for a fused linear)."""
    if key in _HF_TOP_LEVEL:
        return [_HF_TOP_LEVEL[key]]
    _, index, rest = key.split(".", 2)
    module, leaf = rest.rsplit(".", 1)
    return [f"model.layers.{index}.{source}.{leaf}" for source in _HF_SOURCES[module]]


def engine_shapes(args: ModelArgs, tp: ProcessGroup | None = None) -> dict[str, torch.Size]:
    """Name and shape of every tensor of the engine model, or of one rank's shards with `tp` (built on the meta
    device, so nothing is allocated)."""
    with torch.device("meta"):
        return {key: tensor.shape for key, tensor in Transformer(args, tp).state_dict().items()}


def load_model(folder: str | Path, sparse: SparseMode = "none", dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cuda", tp: ProcessGroup | None = None) -> Transformer:
    """The engine model of an HF safetensors folder or a packed checkpoint folder (see `model_from_hf`); a tensor
    whose shape does not fit config.json is a ModelFileError (`engine.config.check_model_folder` finds that of an HF
    folder before loading)."""
    folder = Path(folder)
    args = load_hf_config(folder)
    read = _packed_reader(folder) if packed_manifest(folder) else _safetensors_reader(folder)
    if args.tie_embeddings:
        _check_tied_head(folder, read)
    head, group_size = recorded_head_quantization(folder)
    with model_file_errors(folder, "weights"):
        return model_from_hf(args, read, sparse, dtype, device, tp, head=head and (head, group_size))


def model_from_hf(args: ModelArgs, read: Callable[[str], Weight], sparse: SparseMode = "none",
                  dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
                  tp: ProcessGroup | None = None, head: tuple[str, int] | None = None) -> Transformer:
    """The engine model of HF-named weights, `read(name)` giving each (dense, or packed from a packed checkpoint).
    `sparse`: `none` keeps every linear dense (packed weights are unpacked, quantized ones dequantized into
    `dtype`); `auto` packs every block linear whose weight is N:M sparse (see `nm_pattern`) and keeps packed ones,
    quantized or not, as they are; `packed` requires every block linear to be N:M. With `tp`, this rank's shards
    (each weight is read whole and cut on the CPU, so a GPU never holds more than its part); quantized packed
    weights are refused there. `head` ((quantize, group size), from `prune --quantize-head`): unless `sparse` is
    `none`, lm_head runs as that dense quantized weight."""
    if sparse not in SPARSE_MODES:
        raise EngineError(f"--sparse {sparse!r} is not a mode; choose one of {', '.join(SPARSE_MODES)}")
    if sparse != "none" and dtype not in KERNEL_DTYPES:
        raise EngineError(f"packed linears run in bfloat16 or float16, not {dtype}; load with one of those or "
                          f"with --sparse none")
    rank, world = rank_and_world(tp)
    state: dict[str, Weight] = {}
    for key in engine_shapes(args, tp):
        if key == "output.weight" and args.tie_embeddings:
            state[key] = shard_weight(key, state["embed.weight"], args, rank, world)
            continue
        if tp is None:
            weight = concat_rows([_to(read(name), dtype, device) for name in hf_sources(key)], dtype)
        else:
            weight = concat_rows([read(name) for name in hf_sources(key)], dtype)
            if isinstance(weight, PackedNMQ) and sparse != "none":
                raise EngineError(f"{key} is quantized ({weight.quantize}); tensor parallelism does not split "
                                  f"quantized weights: run it on one GPU, or with --sparse none (dequantized)")
            weight = _to(shard_weight(key, _dequantized(weight, dtype), args, rank, world), dtype, device)
        check_finite(", ".join(hf_sources(key)), weight)
        state[key] = _sparsify(key, weight, sparse, dtype) if is_prunable(key) else weight
    if head is not None and sparse != "none":
        state["output.weight"] = _quantized_head(state["output.weight"], *head, dtype, tp)
    _log_packing(state)
    return build_model(args, state, tp)


def check_finite(key: str, weight: Weight) -> None:
    """ModelFileError if `weight` (dense, packed values or quantized scales) holds NaN or inf: such a model
    generates garbage or nothing, silently. One max reduction a tensor, as `models.check_finite_weights`."""
    tensor = weight if isinstance(weight, Tensor) else weight.values if isinstance(weight, PackedNM) \
        else weight.scales  # PackedNMQ, DenseQuantized: integer codes are always finite
    if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor.abs().amax())):
        raise ModelFileError(f"the checkpoint's {key} holds NaN or inf weights, so the model would generate garbage; "
                             f"re-create the checkpoint from a finite model")


def _quantized_head(weight: Tensor, quantize: str, group_size: int, dtype: torch.dtype,
                    tp: ProcessGroup | None) -> DenseQuantized:
    """lm_head as the dense int8 / int4 weight that `prune --quantize-head` put on its grid (codes read back
    exactly: QuantizationError if it is not on that grid)."""
    if tp is not None:
        raise EngineError(f"lm_head is quantized ({quantize}); tensor parallelism does not split quantized weights: "
                          "run it on one GPU, or with --sparse none (its grid values in bf16)")
    log.info("lm_head: dense %s, as prune --quantize-head recorded", quantize)
    return DenseQuantized.from_codes(quantization_codes(weight, quantize, group_size), dtype)


def build_model(args: ModelArgs, state: dict[str, Weight], tp: ProcessGroup | None = None) -> Transformer:
    """The Transformer holding exactly the tensors of `state` (no copies): built on the meta device, the linear of
    each packed or quantized weight swapped for its module (`PackedLinear`, `QuantizedPackedLinear`,
    `DenseQuantizedLinear`), then the dense tensors assigned. With `tp`, `state` holds this rank's shards
    (`parallel.shard_state`)."""
    with torch.device("meta"):
        model = Transformer(args, tp)
    dense = {}
    for key, weight in state.items():
        module_name = key.rsplit(".", 1)[0]
        if type(weight) in _MODULES:
            model.set_submodule(module_name, _MODULES[type(weight)](weight, bias=state.get(module_name + ".bias")))
        elif not (key.endswith(".bias") and type(state.get(module_name + ".weight")) in _MODULES):
            dense[key] = weight
    model.load_state_dict(dense, strict=False, assign=True)
    model.requires_grad_(False)
    # a rank's lm_head is a slice of the embedding, loaded as such; a quantized lm_head is a weight of its own
    if args.tie_embeddings and tp is None and type(model.output) is nn.Linear:
        model.output.weight = model.embed.weight
    leftover = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
    if leftover:
        raise EngineError(f"no weights for {', '.join(leftover[:3])}; the checkpoint does not match its config.json")
    tiled = tile_for_kernel(model)
    if tiled:
        log.info("%d 2:4 linears tiled for sparse tensor cores (sp24)", tiled)
    return model


def random_state(args: ModelArgs, pattern: SparsityPattern | None = None, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cuda", seed: int = 0, tp: ProcessGroup | None = None,
                 quantize: str | None = None, group_size: int = 128, head: str | None = None) -> dict[str, Weight]:
    """Random weights for speed runs, generated on `device` (decode speed does not depend on weight values). With
    an N:M `pattern` every block linear is generated directly in packed form, so a model whose dense weights would
    not fit is never materialised densely. `quantize` ("int8" or "int4", `group_size` columns a scale) makes every
    block linear quantized: a `PackedNMQ` with `pattern`, a `DenseQuantized` without. Linears get std
    1/sqrt(fan-in) so activations stay finite. With `tp`, shards of this rank's shapes are drawn directly (they are
    not slices of one random model); quantized weights are not split. `head` ("int8" or "int4", `group_size` columns
    a scale for int4) makes lm_head a dense quantized weight of its own, untied from the embedding."""
    for kind in (quantize, head):
        if kind is not None and tp is not None:
            raise EngineError(f"{kind} weights run on one GPU: tensor parallelism does not split quantized weights")
    generator = torch.Generator(device).manual_seed(seed)
    rank, world = rank_and_world(tp)
    state: dict[str, Weight] = {}
    for key, shape in engine_shapes(args, tp).items():
        if key == "output.weight" and head is not None:
            state[key] = random_quantized(shape[0], shape[1], None, head, group_size, dtype, device, generator)
        elif key == "output.weight" and args.tie_embeddings:
            state[key] = shard_weight(key, state["embed.weight"], args, rank, world)
        elif key.endswith("norm.weight"):
            state[key] = torch.ones(shape, dtype=dtype, device=device)
        elif is_prunable(key) and quantize is not None:
            state[key] = random_quantized(shape[0], shape[1], pattern, quantize, group_size, dtype, device, generator)
        elif is_prunable(key) and pattern is not None:
            state[key] = random_packed(shape[0], shape[1], pattern, dtype, device, generator)
        else:
            scale = 1.0 if key == "embed.weight" else shape[-1] ** -0.5
            state[key] = torch.randn(shape, dtype=dtype, device=device, generator=generator) * scale
    return state


def random_packed(rows: int, columns: int, pattern: SparsityPattern, dtype: torch.dtype,
                  device: str | torch.device, generator: torch.Generator) -> PackedNM:
    """A random packed N:M weight [rows, columns]. Mask words are drawn from a pool of 4096 random valid words
    (N of every M bits set), which costs little even for a 70B model and gives the kernel no regular pattern."""
    n, m = require_kernel_pattern(pattern)
    bitmask = random_bitmask(rows, columns, n, m, device, generator, pattern.overflow, pattern.placement,
                             pattern.split_rows)
    kept = columns * n // m
    values = torch.randn(rows, kept, dtype=dtype, device=device, generator=generator) * kept**-0.5
    return PackedNM(values=values, bitmask=bitmask, n=n, m=m, shape=(rows, columns))


def random_bitmask(rows: int, columns: int, n: int, m: int, device: str | torch.device,
                   generator: torch.Generator, overflow: int = -1, placement: str = "", split_rows: int = 0) -> Tensor:
    """int32 [rows, columns/32] mask words, each drawn from a pool of 4096 random valid words (N of every M bits
    set): cheap even for a 70B model, and no regular pattern for the kernel. With `overflow` K ≥ 0 (an N:M+K
    pattern), only words whose groups of four keep at most K weights beyond two a group of M (random valid words
    that fit, drawn until the pool is full). With `placement` "groups" (16:32g, rows a multiple of 16), each 16-row
    tile's word takes one of 4096 random splits into groups of four and each row one of 4096 random picks of two
    columns a group; with `split_rows` 8 (16:32g8), each 8 rows' word its own split."""
    if placement == "groups":
        return _random_grouped_bitmask(rows, columns, device, generator, split_rows or 16)
    pool = torch.rand(4096, 32 // m, m, device=device, generator=generator).argsort(-1)[..., :n]
    if overflow >= 0:
        fitting = []
        while sum(len(part) for part in fitting) < 4096:
            draw = torch.rand(16384, 32 // m, m, device=device, generator=generator).argsort(-1)[..., :n]
            fours = torch.zeros(16384, 32 // m, m, device=device).scatter_(2, draw, 1.0).view(16384, 32 // m, -1, 4)
            beyond = (fours.sum(-1) - 2).clamp(min=0).sum(-1)  # [words, groups of M]
            fitting.append(draw[(beyond <= overflow).all(-1)])
        pool = torch.cat(fitting)[:4096]
    bits = (pool + torch.arange(0, 32, m, device=device)[:, None]).flatten(1)
    words = (torch.ones_like(bits) << bits).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words[torch.randint(len(words), (rows, columns // 32), device=device, generator=generator)]


def _random_grouped_bitmask(rows: int, columns: int, device: str | torch.device,
                            generator: torch.Generator, split_rows: int = 16) -> Tensor:
    words = columns // 32
    splits = torch.rand(4096, 32, device=device, generator=generator).argsort(-1)
    picks = (torch.rand(4096, 8, 4, device=device, generator=generator).argsort(-1) < 2).view(4096, 32)
    split = torch.randint(4096, (-(-rows // split_rows), words), device=device, generator=generator)
    out = torch.empty(rows, words, dtype=torch.int32, device=device)
    for r0 in range(0, rows, 2048):  # [2048, words, 32] a chunk
        r1 = min(rows, r0 + 2048)
        columns_at = splits[split[torch.arange(r0, r1, device=device) // split_rows]]  # each position's column
        pick = picks[torch.randint(4096, (r1 - r0, words), device=device, generator=generator)]
        word = ((torch.ones_like(columns_at) << columns_at) * pick).sum(-1)
        out[r0:r1] = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return out


def random_quantized(rows: int, columns: int, pattern: SparsityPattern | None, quantize: str, group_size: int,
                     dtype: torch.dtype, device: str | torch.device,
                     generator: torch.Generator) -> PackedNMQ | DenseQuantized:
    """A random quantized weight [rows, columns]: uniform codes of the whole range, scales giving the weight std
    about 1/sqrt(kept values per row); N:M packed (`PackedNMQ`, mask as `random_packed`) with an N:M `pattern`,
    dense (`DenseQuantized`, activations of `dtype`) without one."""
    group = quantization_group(quantize, group_size, columns)
    low, high = CODE_RANGES[quantize]
    kept = columns if pattern is None else columns * pattern.n // pattern.m
    code_std = (high - low + 1) / 12**0.5
    scales = (0.5 + torch.rand(rows, columns // group, device=device, generator=generator)) * kept**-0.5 / code_std
    if pattern is None:
        codes = torch.randint(low, high + 1, (rows, columns), device=device, generator=generator).to(torch.int8)
        return DenseQuantized.from_codes(QuantizedCodes(codes, scales, quantize, group), dtype)
    n, m = require_kernel_pattern(pattern)
    bitmask = random_bitmask(rows, columns, n, m, device, generator, pattern.overflow, pattern.placement,
                             pattern.split_rows)
    if quantize == "int8":
        codes = torch.randint(low, high + 1, (rows, kept), device=device, generator=generator).to(torch.int8)
    else:  # two codes a byte, and any byte is a valid pair
        codes = torch.randint(0, 256, (rows, kept // 2), device=device, generator=generator).to(torch.uint8)
    return PackedNMQ(codes, scales.to(SCALE_DTYPE), bitmask, n, m, (rows, columns), quantize, group)


def concat_rows(parts: list[Weight], dtype: torch.dtype = torch.bfloat16) -> Weight:
    """Row concatenation of dense or packed weights. Packed parts of one N:M pattern (and, quantized, one
    quantization and group size) stay packed (a row's mask, values, codes and scales do not depend on other rows);
    any other mix is concatenated densely, quantized parts dequantized into `dtype`."""
    if len(parts) == 1:
        return parts[0]
    formats = {(type(p), p.n, p.m, getattr(p, "quantize", None), getattr(p, "group_size", None))
               if isinstance(p, (PackedNM, PackedNMQ)) else None for p in parts}
    first, rows = parts[0], sum(p.shape[0] for p in parts)
    if len(formats) == 1 and isinstance(first, PackedNM):
        return PackedNM(values=torch.cat([p.values for p in parts]), bitmask=torch.cat([p.bitmask for p in parts]),
                        n=first.n, m=first.m, shape=(rows, first.shape[1]))
    if len(formats) == 1 and isinstance(first, PackedNMQ):
        return PackedNMQ(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                         torch.cat([p.bitmask for p in parts]), first.n, first.m, (rows, first.shape[1]),
                         first.quantize, first.group_size)
    return torch.cat([_dequantized(p.to_dense() if isinstance(p, PackedNM) else p, dtype) for p in parts])


def check_dense_copy_batch(from_batch: int) -> None:
    """Raise EngineError unless dense copies from `from_batch` on leave batch 1 on the packed kernel and some batch
    the engine serves on the copies."""
    if not 2 <= from_batch <= MAX_BATCH:
        raise EngineError(f"dense copies from batch {from_batch}: choose 2..{MAX_BATCH} (batch 1 always runs "
                          f"the packed kernel; the engine serves batches up to {MAX_BATCH})")


def keep_dense_copies(model: nn.Module, from_batch: int) -> int:
    """Give every packed linear with 16-bit values (`PackedLinear`, and `Sp24Linear` on the sparse tensor cores) a
    dense copy of its weight, used from `from_batch` sequences on (see their `keep_dense_copy`): batches below it
    decode on the sparse kernels, wider ones as fast as the dense model, for the memory of both. Linears with
    quantized values keep their kernels. Returns the number of linears changed."""
    check_dense_copy_batch(from_batch)
    packed = [module for module in model.modules()
              if isinstance(module, PackedLinear) or (isinstance(module, Sp24Linear) and module.code == 0)]
    if not packed:
        raise EngineError("the model has no packed linear with 16-bit values to keep a dense copy of; load it with "
                          "--sparse auto (and without quantized values)")
    for module in packed:
        module.keep_dense_copy(from_batch)
    return len(packed)


def weight_bytes(model: nn.Module, batch: int = 1) -> int:
    """Bytes a decode step of `batch` sequences reads from weights: every linear (packed: values + bitmask, or its
    dense copy where the batch uses it) and lm_head, bias included; embeddings are excluded because a step reads
    one row per sequence."""
    total = 0
    for module in model.modules():
        if isinstance(module, PackedLinear):
            if module.dense is not None and batch >= module.dense_from_rows:
                total += _nbytes(module.dense)
            else:
                total += _nbytes(module.values) + _nbytes(module.bitmask)
            total += _nbytes(module.bias) if module.bias is not None else 0
        elif isinstance(module, Sp24Linear) and module.dense is not None and batch >= module.dense_from_rows:
            total += _nbytes(module.dense) + (_nbytes(module.bias) if module.bias is not None else 0)
        elif isinstance(module, (QuantizedPackedLinear, DenseQuantizedLinear, Sp24Linear)):
            total += sum(_nbytes(b) for name, b in module.named_buffers(recurse=False) if name != "dense")
        elif isinstance(module, nn.Linear):
            total += sum(_nbytes(p) for p in module.parameters())
    return total


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights the model holds: parameters (tied ones once) and the packed linears' buffers, dense
    copies included; the KV cache and RoPE tables excluded."""
    tensors = {id(p): p for p in model.parameters()}
    for module in model.modules():
        if isinstance(module, PackedLinear):
            tensors.update({id(b): b for b in (module.values, module.bitmask, module.bias, module.dense)
                            if b is not None})
        elif isinstance(module, (QuantizedPackedLinear, DenseQuantizedLinear, Sp24Linear)):
            tensors.update({id(b): b for b in module.buffers(recurse=False)})
    return sum(_nbytes(t) for t in tensors.values())


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dequantized(weight: Weight, dtype: torch.dtype) -> Weight:
    """A PackedNMQ as the dense tensor it stores (exact: the grids are exact in bfloat16); anything else as is."""
    return weight.to_dense(dtype) if isinstance(weight, PackedNMQ) else weight


def _sparsify(key: str, weight: Weight, mode: SparseMode, dtype: torch.dtype) -> Weight:
    # `auto` packs what `nm_pattern` finds (at most half kept); a packed checkpoint keeps the pattern it was packed in.
    if mode == "none":
        return weight.to_dense() if isinstance(weight, PackedNM) else _dequantized(weight, dtype)
    if isinstance(weight, (PackedNM, PackedNMQ)):
        return weight
    pattern = nm_pattern(weight)
    if pattern is not None:
        return pack_nm(weight, *pattern)
    if mode == "packed":
        raise EngineError(f"{key} is not N:M sparse with at most half its weights kept; prune the model to such a "
                          f"pattern first (a denser N:M such as 3:4 runs packed from `sparsedecoding pack --pattern "
                          f"3:4`), or load it with --sparse auto to keep such linears dense")
    return weight


def require_kernel_pattern(pattern: SparsityPattern) -> tuple[int, int]:
    """(N, M) of a pattern the sparse kernel runs, else an EngineError naming the ones it does."""
    if not pattern.is_nm or not kernel_runs(pattern.n, pattern.m):
        raise EngineError(f"the kernel cannot run pattern {pattern}; use N:M with M dividing 32 and 32·N/M a "
                          f"multiple of 8 (2:4, 4:8, 8:16, 16:32)")
    return pattern.n, pattern.m


def _to(weight: Weight, dtype: torch.dtype, device: str | torch.device) -> Weight:
    """On `device`, floating values in `dtype` (codes and scales of a quantized weight keep theirs)."""
    if isinstance(weight, PackedNM):
        return PackedNM(weight.values.to(device=device, dtype=dtype), weight.bitmask.to(device), weight.n, weight.m,
                        weight.shape)
    if isinstance(weight, PackedNMQ):
        return weight.to(device)
    return weight.to(device=device, dtype=dtype)


def weight_format(weight: Weight | nn.Module) -> str:
    """How a block linear's weight (or engine module) is stored: "2:4", "2:4 int8", "dense int4 g128", "dense",
    "16:32+2 int8 (2:4 tiles + overflow slots)"."""
    quantize = getattr(weight, "quantize", None)
    quantized = "" if quantize is None else f" {quantize}" + (f" g{weight.group_size}" if quantize == "int4" else "")
    if isinstance(weight, Sp24Linear) and weight.slotted:
        return f"{weight.n}:{weight.m}+{OVER_SLOTS}{quantized} (2:4 tiles + overflow slots)"
    if isinstance(weight, (PackedNM, PackedNMQ, PackedLinear, QuantizedPackedLinear, Sp24Linear)):
        return f"{weight.n}:{weight.m}{quantized}"
    return "dense" + quantized


def _log_packing(state: dict[str, Weight]) -> None:
    prunable = [weight for key, weight in state.items() if is_prunable(key)]
    packed = [weight for weight in prunable if isinstance(weight, (PackedNM, PackedNMQ))]
    formats = ", ".join(sorted({weight_format(w) for w in packed}))
    log.info("%d of %d block linears packed %s", len(packed), len(prunable), formats)


def _check_tied_head(folder: Path, read: Callable[[str], Weight]) -> None:
    """EngineError when config.json ties the output embedding to the input one but the checkpoint holds an
    lm_head.weight of its own that differs: transformers keeps that stored head, the engine would use the
    embedding, and the two models would silently differ."""
    try:
        head = read("lm_head.weight")
    except EngineError:  # not stored: tied, as the config says
        return
    embedding = read("model.embed_tokens.weight")
    if not isinstance(head, Tensor) or head.shape != embedding.shape or not torch.equal(head, embedding):
        raise EngineError(f"{folder}/config.json says tie_word_embeddings, but the checkpoint holds an lm_head.weight "
                          f"that differs from the input embedding; set tie_word_embeddings to false there")


def _checked_reader(folder: Path, available: Collection[str],
                    get: Callable[[str], Weight]) -> Callable[[str], Weight]:
    def read(name: str) -> Weight:
        if name not in available:
            if f"{name}.values" in available:
                raise EngineError(f"{folder} holds {name} packed but has no {PACKED_MANIFEST}; copy the packed "
                                  f"folder whole, or pack the pruned checkpoint again")
            raise EngineError(f"{folder} has no tensor {name}; the checkpoint does not match its config.json")
        return get(name)

    return read


def _packed_reader(folder: Path) -> Callable[[str], Weight]:
    state, _ = load_packed_checkpoint(folder)
    return _checked_reader(folder, state, state.__getitem__)


def _safetensors_reader(folder: Path) -> Callable[[str], Weight]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{folder} has no *.safetensors files; convert the model to safetensors first")
    index = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            index.update(dict.fromkeys(handle.keys(), file))

    def get(name: str) -> Tensor:
        with safe_open(index[name], framework="pt") as handle:
            return handle.get_tensor(name)

    return _checked_reader(folder, index, get)
