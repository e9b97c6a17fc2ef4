"""The packed kernel inside a transformers model: `sparsify` swaps, in place, every `nn.Linear` whose weight is N:M
sparse in a pattern the kernel runs for a `PackedLinear`; `load_packed` builds the same model from a packed
checkpoint (`sparsedecoding pack`). Either way the result is the transformers model itself, so `generate`, its
static cache and `torch.compile` work as on the dense model: `PackedLinear` calls the kernel through a cached
runner eagerly and through the custom op (with a fake implementation) under torch.compile. Quantized models
(`prune --quantize`, `--quantize-head`) get `QuantizedPackedLinear` and a `DenseQuantizedLinear` lm_head instead:
`load_packed` reads both from the packed checkpoint and its pruning record; `sparsify` reads the record of the
folder the model was loaded from, unless told otherwise. `save_packed` writes such a model as a packed checkpoint.
On CUDA both then tile (`tile="auto"`, the default) what the sparse tensor-core kernel runs, as the engine does: 2:4
linears, and 16:32 ones whose masks fit 16:32+2 (SPARSEDECODING_SP24_SLOTS), become `Sp24Linear`s. In transformers'
`generate` with the compiled decode step that was faster than dense at batch 1 / 4 / 8 / 16 (1.24 / 1.06 / 1.04 /
1.04x on Qwen2.5-Coder-1.5B's shapes in 2:4), where the packed kernels alone gave 1.14 / 0.91 / 0.82 / 0.74x
(benchmarks/results/hf_generate_h200_tiled_random*.md, one run each); `tile=False` keeps the packed modules."""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .errors import (DeviceError, KernelInputError, ModelFileError, ModelNotFoundError, OutputNotWritableError,
                     PackingError, QuantizationError)
from .kernels import PackedLinear, PackedNM, pack_nm
from .kernels.format import nm_pattern
from .kernels.quantized import (QUANTIZED_FORMATS, DenseQuantized, PackedNMQ, check_dense_quantization,
                                check_packed_quantization, pack_nm_quantized)
from .kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
from .kernels.op import KernelChoiceError, kernel_setting, sp24_slots_setting
from .kernels.sp24_linear import Sp24Linear, sp24_problem, tile_where_kernel_runs
from .models import model_file_errors, read_json
from .outputs import PRUNED_MANIFEST, check_not_source, is_tokenizer_file, output_folder
from .packed import (PACKED_MANIFEST, load_packed_checkpoint, packed_manifest, recorded_head_quantization,
                     recorded_quantization, write_packed_state)
from .patterns import PRUNABLE_LINEARS
from .runenv import write_json
from .solvers import quantization_codes

log = logging.getLogger(__name__)
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class SparsifySummary:
    """What `sparsify` did: `swapped` maps each replaced linear's name to its N:M pattern, `kept_dense` names the
    linears left as they were (not N:M sparse, in_features not a multiple of 32, or the output embedding unless
    `head`); `dense_bytes` and `packed_bytes` are the swapped weights' sizes before and after (the quantized lm_head
    included). `quantize` / `head`: the kept values' and lm_head's format ("int8", "int4"), None for bf16."""

    swapped: dict[str, str]
    kept_dense: list[str]
    dense_bytes: int
    packed_bytes: int
    quantize: str | None = None
    head: str | None = None
    tiled: int = 0  # of `swapped`, how many became `Sp24Linear`s (`tile_packed`)

    @property
    def bytes_saved(self) -> int:
        return self.dense_bytes - self.packed_bytes

    def __str__(self) -> str:
        patterns = ", ".join(f"{pattern} x{count}" for pattern, count in sorted(Counter(self.swapped.values()).items()))
        values = "" if self.quantize is None else f", {self.quantize} values"
        head = "" if self.head is None else f", lm_head dense {self.head}"
        tiled = f", {self.tiled} of them tiled for sparse tensor cores" if self.tiled else ""
        return (f"{len(self.swapped)} linears packed ({patterns}{values}){head}{tiled}, {len(self.kept_dense)} kept "
                f"dense; their weights {_sizes(self.dense_bytes, self.packed_bytes, self.bytes_saved)} saved)")


def _sizes(dense: int, packed: int, saved: int) -> str:
    """"D -> P (S" in one unit, the largest the dense size fills (KiB, MiB or GiB), so a tiny model's line reads."""
    unit = next((unit for unit in (3, 2) if dense >= 2**(10 * unit)), 1)
    name, scale = ("KiB", "MiB", "GiB")[unit - 1], 2**(10 * unit)
    return f"{dense / scale:.1f} {name} -> {packed / scale:.1f} {name} ({saved / scale:.1f} {name}"


def _output_embedding(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def sparsify(model: nn.Module, *, quantize: str | None = "auto", group_size: int | None = None,
             head: str | None = "auto", tile: bool | str = "auto") -> tuple[nn.Module, SparsifySummary]:
    """Replace in place every `nn.Linear` of `model` whose weight satisfies a kernel-supported N:M pattern
    (`kernels.format.nm_pattern`: the sparsest of the 2:4, 4:8, 8:16, 16:32 families that holds with at most
    half the weights kept, detected from the zeros) with a `PackedLinear` holding the same weight packed, the same
    bias, dtype and device. The output embedding (lm_head, often tied to the input embedding) and linears that are
    not N:M sparse stay as they were (a warning names decoder linears left dense beside swapped ones). Save the
    result with `save_packed` (a packed checkpoint that `load_packed` reads back): the model's `save_pretrained`
    raises PackingError, for it would write packed buffers that `from_pretrained` does not read.
    Returns the model and a `SparsifySummary`.

    A model that `prune --quantize` made holds its kept weights on an int8 / int4 grid: with `quantize` (and, for
    int4, its `group_size`) they become `QuantizedPackedLinear`s holding the codes read back exactly. With `head`
    ("int8" or "int4", as `prune --quantize-head` rounded it) lm_head becomes a `DenseQuantizedLinear` and the
    config says it is untied (the input embedding keeps its own weight). "auto" (the default for both) takes
    what the pruning record (`sparsedecoding.json`) of the folder the model was loaded from says, and None where
    there is none; None packs bf16 values and keeps lm_head as it is. `group_size` defaults to the record's, else
    128.

    `tile` ("auto", True or False): see `tile_packed`; with True, where the kernel cannot run (CPU weights, no CUDA
    build) is an error before anything changes.

    Raises PackingError when no linear is N:M sparse (the model was not pruned, or not to an N:M pattern) or a
    quantization setting is not one the kernels run, KernelInputError when a sparse linear's weight is not bfloat16
    or float16 (the kernel's dtypes; call `model.to(torch.bfloat16)` first), QuantizationError when a weight is off
    its grid: all before changing anything."""
    _check_model(model, "sparsify")
    _check_tile(tile, _device_of(model))
    given_group = group_size
    quantize, head, group_size = _resolve_quantization(model, quantize, head, group_size)
    if given_group is not None and "int4" not in (quantize, head):
        log.warning("sparsify: group_size=%s is unused (it sets the scales of int4 values or an int4 lm_head; here "
                    "the values are %s and lm_head %s)", given_group, quantize or "bf16", head or "unchanged")
    if quantize is not None:
        check_packed_quantization(quantize, group_size)
    if head is not None:
        if head not in QUANTIZED_FORMATS:
            raise PackingError(f"head = {head!r} is not a quantized lm_head format; use int8 or int4")
        check_dense_quantization(head, group_size)
    output = _output_embedding(model)
    plan: dict[str, tuple[nn.Linear, tuple[int, int]]] = {}
    kept: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or isinstance(module, (PackedLinear, Sp24Linear)):
            continue
        pattern = None if module is output else nm_pattern(module.weight.detach())
        if pattern is None:
            kept.append(name)
        else:
            plan[name] = (module, pattern)
    if not plan:
        raise _nothing_sparse(model, kept)
    wrong = {name: module.weight.dtype for name, (module, _) in plan.items()
             if module.weight.dtype not in _KERNEL_DTYPES}
    if wrong:
        name, dtype = next(iter(wrong.items()))
        raise KernelInputError(f"{name} holds {dtype} weights; the sparse kernel runs bfloat16 or float16: call "
                               "model.to(torch.bfloat16) before sparsify")
    broken = next((name for name, (module, _) in plan.items() if not bool(torch.isfinite(module.weight).all())), None)
    if broken is not None:
        raise PackingError(f"{broken} holds NaN or inf; the model is corrupt: prune again from a finite model")
    _warn_kept_decoder_linears(plan, kept)
    # quantized: every weight's codes first (each may be off its grid), so that an error leaves the model unchanged
    codes = {name: _grid_packed(name, module.weight.detach(), n, m, quantize, group_size)
             for name, (module, (n, m)) in plan.items()} if quantize is not None else {}
    head_module = _quantized_head_module(model, output, head, group_size) if head is not None else None
    tied = output is not None and output.weight is getattr(model.get_input_embeddings(), "weight", None)
    swapped: dict[str, str] = {}
    dense_bytes = packed_bytes = 0
    for name, (module, (n, m)) in plan.items():
        weight = module.weight.detach()
        bias = module.bias.detach() if module.bias is not None else None
        packed = QuantizedPackedLinear(codes.pop(name), bias) if quantize is not None else \
            PackedLinear(pack_nm(weight, n, m), bias)
        model.set_submodule(name, packed)
        swapped[name] = f"{n}:{m}"
        dense_bytes += weight.numel() * weight.element_size()
        packed_bytes += sum(t.numel() * t.element_size() for t in packed.buffers() if t is not packed.bias)
    if head_module is not None:
        if not tied:  # a tied head's weight stays, as the input embedding
            dense_bytes += output.weight.numel() * output.weight.element_size()
        packed_bytes += sum(t.numel() * t.element_size() for t in head_module.buffers() if t is not head_module.bias)
        _set_head(model, head_module)
        kept = [name for name in kept if model.get_submodule(name) is not head_module]
    tiled = tile_packed(model, tile)
    _refuse_save_pretrained(model)
    return model, SparsifySummary(swapped, kept, dense_bytes, packed_bytes, quantize, head, tiled)


def _refuse_save_pretrained(model: nn.Module) -> None:
    """transformers' `save_pretrained` on a model holding packed modules writes their buffers (values, bitmask,
    codes), which `from_pretrained` does not read: it would load that folder with those linears randomly
    initialised, with a warning only. On such a model it raises instead, naming `save_packed`."""
    def refused(*args, **kwargs):
        raise PackingError(f"this {type(model).__name__} holds packed linears (sparsify / load_packed): "
                           "save_pretrained would write a folder that from_pretrained loads with those linears "
                           "random; save it with sparsedecoding.save_packed(model, folder), which load_packed reads")
    model.save_pretrained = refused


def _nothing_sparse(model: nn.Module, kept: list[str]) -> PackingError:
    """sparsify's error for a model with no linear to swap, saying which of the reasons applies."""
    kind = type(model).__name__
    swapped = (PackedLinear, Sp24Linear, QuantizedPackedLinear, DenseQuantizedLinear)
    if any(isinstance(module, swapped) for module in model.modules()):
        return PackingError(f"this {kind} is already sparsified: its N:M linears are packed modules")
    narrow = [name for name in kept if model.get_submodule(name).in_features % 32]
    why = (f"; {len(narrow)} of them, e.g. {narrow[0]}, have in_features not a multiple of 32, which the packed "
           "format needs") if narrow else ""
    return PackingError(f"no linear of this {kind} is N:M sparse ({len(kept)} dense linears{why}); prune the model "
                        "to an N:M pattern such as 2:4 first (sparsedecoding prune)")


def _warn_kept_decoder_linears(plan: dict, kept: list[str]) -> None:
    """Warn once when decoder linears stay dense beside swapped ones (a weight that lost its pattern, or keeps more
    than half of some group): the summary counts them, the log says which."""
    stray = [name for name in kept if name.rsplit(".", 1)[-1] in PRUNABLE_LINEARS]
    if stray:
        log.warning("%d decoder linears are not N:M sparse at half their weights or fewer and stay dense beside the "
                    "%d swapped (e.g. %s; `prune --dense-linears` leaves such linears on purpose)", len(stray),
                    len(plan), stray[0])


def _check_model(model, call: str) -> None:
    """PackingError for something that is not a model with its weights loaded."""
    if not isinstance(model, nn.Module):
        raise PackingError(f"{call} takes a torch.nn.Module (a transformers model); got {type(model).__name__}")
    meta = next((name for name, parameter in model.named_parameters() if parameter.is_meta), None)
    if meta is not None:
        raise PackingError(f"{meta} is on the meta device, with no values: load the weights (from_pretrained, or "
                           f"load_state_dict(..., assign=True)) before {call}")


def _check_tile(tile: bool | str, device: str | torch.device | None = None) -> None:
    """KernelChoiceError for a `tile` other than "auto", True and False; with True and a `device` (where the model
    is or will be), KernelInputError unless it is CUDA and the sparse tensor-core kernel runs here."""
    if not (isinstance(tile, bool) or (isinstance(tile, str) and tile == "auto")):
        raise KernelChoiceError(f"tile={tile!r}; use 'auto' (the default), True or False")
    if tile is True and device is not None:
        device = torch.device(device)
        problem = (f"the model is on {device}, and the kernel runs on CUDA" if device.type != "cuda"
                   else sp24_problem())
        if problem is not None:
            raise KernelInputError(f"tile=True: the sparse tensor-core kernel cannot run this model here ({problem}); "
                                   "use tile='auto' or False")


def _device_of(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def tile_packed(model: nn.Module, tile: bool | str = "auto") -> int:
    """Swap, in place, the packed linears the sparse tensor-core kernel runs for `Sp24Linear`s, as the engine does
    (`kernels.sp24_linear.tile_model`): on CUDA, 2:4 ones, and under SPARSEDECODING_SP24_SLOTS (1, the default)
    16:32 ones whose masks fit 16:32+2. "auto" tiles them where the kernel runs here and SPARSEDECODING_KERNEL is
    auto (its default; `triton` or `cuda` keep the packed kernels), and otherwise keeps the packed modules, with the
    reason logged once as a warning when the kernel cannot be built; True tiles them and raises KernelInputError
    where the kernel cannot run; False tiles nothing. Returns how many linears were tiled."""
    _check_model(model, "tile_packed")
    _check_tile(tile, _device_of(model))
    if tile is False or (tile == "auto" and kernel_setting() != "auto"):
        return 0
    return tile_where_kernel_runs(model, sp24_slots_setting())


def _resolve_quantization(model: nn.Module, quantize: str | None, head: str | None,
                          group_size: int | None) -> tuple[str | None, str | None, int]:
    """`sparsify`'s settings with "auto" replaced by the pruning record of the model's source folder (logged)."""
    recorded: tuple[tuple[str | None, int], tuple[str | None, int]] = ((None, 128), (None, 128))
    folder = str(getattr(model, "name_or_path", "") or "")
    if (quantize == "auto" or head == "auto") and folder and Path(folder).is_dir():
        recorded = (recorded_quantization(folder), recorded_head_quantization(folder))
    if quantize == "auto":
        quantize = recorded[0][0]
    if head == "auto":
        head = recorded[1][0]
    if group_size is None:
        group_size = next((group for kind, group in recorded if kind is not None), 128)
    if any(kind is not None for kind, _ in recorded):
        log.info("sparsify: %s values, %s lm_head (as %s records; pass quantize=None, head=None for bf16)",
                 quantize or "bf16", head or "unchanged", Path(folder) / "sparsedecoding.json")
    return quantize, head, group_size


def _grid_packed(name: str, weight: torch.Tensor, n: int, m: int, quantize: str, group_size: int) -> PackedNMQ:
    try:
        return pack_nm_quantized(weight, n, m, quantize, group_size)
    except QuantizationError as exc:
        raise QuantizationError(f"{name}: {exc} (sparsify's quantize and group_size must be the ones the model "
                                f"was pruned with: --quantize {quantize}"
                                f"{f' --group-size {group_size}' if quantize == 'int4' else ''} here; quantize=None "
                                "packs bf16 values)") from exc


def _quantized_head_module(model: nn.Module, output: nn.Module | None, head: str,
                           group_size: int) -> DenseQuantizedLinear:
    """lm_head's weight (on a `head` grid) as a DenseQuantizedLinear; QuantizationError off the grid."""
    if not isinstance(output, nn.Linear):
        raise PackingError(f"this {type(model).__name__} has no linear output embedding to quantize")
    weight = output.weight.detach()
    if weight.dtype not in _KERNEL_DTYPES:
        raise KernelInputError(f"lm_head holds {weight.dtype} weights; the quantized head runs bfloat16 or float16: "
                               "call model.to(torch.bfloat16) before sparsify")
    try:
        grid = quantization_codes(weight, head, group_size)
    except QuantizationError as exc:
        raise QuantizationError(f"lm_head: {exc} (was the model pruned with --quantize-head {head}?)") from exc
    bias = output.bias.detach() if output.bias is not None else None
    return DenseQuantizedLinear(DenseQuantized.from_codes(grid, weight.dtype), bias)


def _set_head(model: nn.Module, head: DenseQuantizedLinear) -> None:
    """Put `head` where the output embedding is, untied: the config says so, so that transformers does not tie the
    input embedding's weight over it."""
    name = next(name for name, module in model.named_modules() if module is _output_embedding(model))
    model.set_submodule(name, head)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
    # transformers also keeps the tied pairs it found at post_init; tie_weights(recompute_mapping=False) reads them
    tied_keys = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied_keys, dict):
        tied_keys.pop(f"{name}.weight", None)


def load_packed(folder: str | Path, device: str | torch.device = "cpu", tile: bool | str = "auto",
                dtype: torch.dtype | None = None) -> nn.Module:
    """The transformers causal LM of a packed checkpoint folder (written by `sparsedecoding pack`) with a
    `PackedLinear` wherever the checkpoint holds a packed weight (a `QuantizedPackedLinear` where it holds codes,
    and lm_head a `DenseQuantizedLinear` where `prune --quantize-head` recorded one): the model `sparsify` makes
    from the pruned folder, without ever holding those weights dense. `dtype` (bfloat16 or float16) casts the
    checkpoint's floating tensors and packed values; None (the default) keeps the checkpoint's own, whose packed
    values must then be in a dtype the kernels run. Raises ModelNotFoundError / PackingError for a folder that is not
    a packed checkpoint, is damaged, does not match its config.json, or holds float32 packed values without `dtype`
    (the packed kernels take bfloat16 or float16), and QuantizationError for a recorded quantized lm_head that is
    off its grid. Load it on the device it runs on (an int4 head's layout is the device's); on CUDA the linears the
    sparse tensor-core kernel runs are then tiled as `sparsify` tiles them (`tile`, see `tile_packed`; with True, a
    device or build the kernel cannot run on is an error before loading).

    Save such a model with `save_packed` (its `save_pretrained` raises PackingError: it would write the packed
    modules' buffers, which `from_pretrained` does not read back)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device={device!r} is not a device ({exc}); use cpu, cuda or cuda:N") from None
    _check_tile(tile, device)
    if dtype is not None and dtype not in _KERNEL_DTYPES:
        given = f"the string {dtype!r}; pass torch.{dtype}" if isinstance(dtype, str) else f"{dtype}"
        raise KernelInputError(f"dtype={given}: the packed kernels run torch.bfloat16 or torch.float16")
    if not isinstance(folder, (str, Path)) or not Path(folder).is_dir():
        what = "not a folder" if isinstance(folder, (str, Path)) and Path(folder).exists() else "not there" \
            if isinstance(folder, (str, Path)) else f"a {type(folder).__name__}, not a path"
        raise ModelNotFoundError(f"{folder} is {what}; pass the folder `sparsedecoding pack` or save_packed wrote")
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    state, _ = load_packed_checkpoint(folder, device)
    state, dtype = _in_kernel_dtype(folder, state, dtype)
    packed = {name.removesuffix(".weight"): weight for name, weight in state.items()
              if isinstance(weight, PackedNM | PackedNMQ)}
    head, group_size = recorded_head_quantization(folder)
    # every weight is assigned from the checkpoint below: no_init_weights skips the random initialisation
    with model_file_errors(Path(folder), "config"), no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    if (Path(folder) / "generation_config.json").is_file():  # stop tokens, sampling defaults: as from_pretrained
        with model_file_errors(Path(folder), "generation config"):
            model.generation_config = GenerationConfig.from_pretrained(folder)
    for name, weight in packed.items():
        module = QuantizedPackedLinear if isinstance(weight, PackedNMQ) else PackedLinear
        model.set_submodule(name, module(weight, state.get(f"{name}.bias")))
    dense = {name: tensor for name, tensor in state.items() if not isinstance(tensor, PackedNM | PackedNMQ)}
    result = model.load_state_dict(dense, strict=False, assign=True)
    model.tie_weights()  # a tied output embedding is not in the checkpoint: it shares the input embedding
    output = _output_embedding(model)
    tied = {f"{name}.weight" for name, module in model.named_modules() if module is output
            and output.weight is model.get_input_embeddings().weight}
    missing = [key for key in result.missing_keys if key.rsplit(".", 1)[0] not in packed and key not in tied]
    if missing or result.unexpected_keys:
        raise PackingError(f"{folder} does not match its config.json: missing {missing[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]}")
    if head is not None:  # prune --quantize-head: lm_head is on that grid and untied
        _set_head(model, _quantized_head_module(model, output, head, group_size))
    model = model.to(device).eval().requires_grad_(False)
    tile_packed(model, tile)
    _refuse_save_pretrained(model)
    return model


# files of a model folder that save_packed carries over beside the weights it writes: tokenizer, chat template,
# model card (never weights, their indexes or code)
_CARRIED_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".md")
_WRITTEN_FILES = {"config.json", "generation_config.json", PACKED_MANIFEST, PRUNED_MANIFEST}


def save_packed(model: nn.Module, out: str | Path, *, tokenizer=None, overwrite: bool = False) -> Path:
    """Write a sparsified (`sparsify`) or `load_packed` transformers model as a packed checkpoint folder, the form
    `load_packed`, the engine and the CLI read (what `sparsedecoding pack` writes from a pruned folder), and
    return its path. (Such a model's `save_pretrained` raises: it would write packed buffers that `from_pretrained`
    cannot read.)
    A `torch.compile` wrapper is saved as the model it wraps.

    Packed linears (`PackedLinear`, `QuantizedPackedLinear`, and `Sp24Linear`s, untiled exactly, one at a time) are
    stored as values or codes with their bitmasks, every other tensor dense; a quantized lm_head
    (`DenseQuantizedLinear`) is stored as its dequantized weight. The pruning record (`sparsedecoding.json`: the
    source folder's, or a new one) says how the values and lm_head are quantized, as the model holds them, so that
    `load_packed` quantizes the head again and `sparsify` of the folder's dense weights (quantize "auto") makes the
    same modules. config.json and the generation config come from the model; the tokenizer is `tokenizer` if given
    (and then none of the source folder's tokenizer files), else the tokenizer files of the folder the model was
    loaded from, if any; with neither, a warning says the folder has no tokenizer. Other text files of that folder
    (a model card) are carried over; never weights or code.

    The folder is written as OUT.partial and renamed when complete. Raises PackingError for a model that is not a
    transformers model, has no packed linear or one the engine fused (a gate|up `Sp24Linear`), or whose values and
    int4 head use different group sizes; ModelFileError for a source pruning record that is not one;
    OutputExistsError for an existing `out` without `overwrite`; OutputNotWritableError for an `out` that cannot be
    made or is the folder the model came from: all before writing anything."""
    if not isinstance(out, (str, Path)):
        raise OutputNotWritableError(f"save_packed writes to a folder path; got {type(out).__name__}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise PackingError(f"tokenizer={type(tokenizer).__name__}: pass a transformers tokenizer (with "
                           "save_pretrained), or None to carry the model folder's")
    out = Path(out)
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if not callable(getattr(getattr(model, "config", None), "save_pretrained", None)):
        raise PackingError(f"save_packed writes transformers models; this {type(model).__name__} is not one (the "
                           "engine's models are built from a packed folder: save that one)")
    packed = {name: module for name, module in model.named_modules()
              if isinstance(module, PackedLinear | QuantizedPackedLinear | Sp24Linear)}
    if not packed:
        raise PackingError(f"this {type(model).__name__} holds no packed linear: sparsify it first (or save the pruned "
                           "model with save_pretrained and pack that folder: sparsedecoding pack)")
    fused = next((name for name, module in packed.items() if isinstance(module, Sp24Linear) and module.glu), None)
    if fused is not None:
        raise PackingError(f"{fused} is a fused gate|up layer of the engine, not a transformers linear; save the "
                           "model sparsify or load_packed made")
    source = Path(str(getattr(model, "name_or_path", "") or ""))
    source = source if str(source) not in ("", ".") and source.is_dir() else None
    if source is not None:
        check_not_source(out, source)
    output = _output_embedding(model)
    head = output if isinstance(output, DenseQuantizedLinear) else None
    record = _saved_record(source, head, _values_quantization(packed.values()))
    carried = [path for path in (source.iterdir() if source is not None else ())
               if path.is_file() and path.suffix in _CARRIED_SUFFIXES and path.name not in _WRITTEN_FILES
               and not path.name.endswith(".index.json") and packed_manifest(source) != path
               and not (tokenizer is not None and is_tokenizer_file(path.name))]
    with output_folder(out, overwrite) as partial:
        if tokenizer is None and not any(is_tokenizer_file(path.name) for path in carried):
            log.warning("save_packed: no tokenizer given and none found beside the model (%s); the folder %s will "
                        "hold none, which the CLI needs: pass tokenizer=", source or "no source folder", out)
        state, dtypes = _packed_state(model, packed, head)
        write_packed_state(partial, state, dtypes, {"model": str(getattr(model, "name_or_path", "") or ""),
                                                    "saved_by": "sparsedecoding.save_packed"})
        for path in carried:
            shutil.copy2(path, partial / path.name)
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
        model.config.save_pretrained(partial)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(partial)
        if record is not None:
            write_json(partial / PRUNED_MANIFEST, record)
    return out


def _values_quantization(modules) -> tuple[str, int] | None:
    """(format, int4 group size or 0) of the packed linears' kept values, None for bf16; PackingError for a mix."""
    kinds = {(getattr(module, "quantize", None), module.group_size if getattr(module, "quantize", None) == "int4"
              else 0) for module in modules}
    if len(kinds) > 1:
        held = ", ".join(sorted(f"{kind or 'bf16'}{f' g{group}' if group else ''}" for kind, group in kinds))
        raise PackingError(f"the packed linears hold values in several formats ({held}); a packed checkpoint holds "
                           "one")
    kind, group = next(iter(kinds))
    return None if kind is None else (kind, group)


def _packed_state(model: nn.Module, packed: dict[str, nn.Module], head: DenseQuantizedLinear | None
                  ) -> tuple[dict, dict[str, str]]:
    """(every tensor of `model` by its transformers name, packed weights as PackedNM / PackedNMQ on the CPU and a
    quantized lm_head dequantized; the dtype each PackedNMQ's weight takes). Walks the modules' own parameters and
    persistent buffers rather than `state_dict`, which would untile every Sp24Linear a second time and hold all of
    them at once. The output embedding's weight is left out where it is the input embedding's (tied), as
    save_pretrained leaves it; other tensors sharing storage are copied (safetensors refuses shared storage)."""
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    embedding = getattr(inputs, "weight", None)
    dtype = embedding.dtype if isinstance(embedding, torch.Tensor) else torch.bfloat16
    state: dict[str, object] = {}
    dtypes: dict[str, str] = {}
    seen: set[int] = set()
    held: set[int] = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if name in packed or module is head:
            weight = module.to_dense(dtype) if module is head else module.packed.to("cpu")
            state[f"{prefix}weight"] = weight
            if isinstance(weight, PackedNMQ):
                dtypes[f"{prefix}weight"] = str(dtype)
            tensors = {"bias": module.bias} if module.bias is not None else {}
        else:
            tensors = {**module._parameters, **{key: value for key, value in module._buffers.items()
                                                if key not in module._non_persistent_buffers_set}}
        for key, tensor in tensors.items():
            if tensor is None:
                continue
            if id(tensor) in held:  # the same tensor under a second name: the tied output embedding
                if tensor is embedding:
                    continue
                tensor = tensor.clone()
            held.add(id(tensor))
            if tensor.numel() and tensor.untyped_storage().data_ptr() in seen:
                tensor = tensor.clone()
            seen.add(tensor.untyped_storage().data_ptr())
            state[f"{prefix}{key}"] = tensor.detach()
    return state, dtypes


def _saved_record(source: Path | None, head: DenseQuantizedLinear | None,
                  values: tuple[str, int] | None) -> dict | None:
    """The pruning record save_packed writes: the source folder's, with its value and lm_head quantization set to
    what the model holds; a record of only those where the model holds quantized values or head and the source has
    no record; None where neither."""
    record = None
    if source is not None and (source / PRUNED_MANIFEST).is_file():
        record = read_json(source / PRUNED_MANIFEST)
        if not isinstance(record, dict) or not isinstance(record.get("solver_options", {}), dict):
            raise ModelFileError(f"{source / PRUNED_MANIFEST} is not a pruning record (a JSON object with "
                                 "solver_options); restore it")
    if record is None and head is None and values is None:
        return None
    groups = {group for kind, group in ((values or (None, 0)), ((head.quantize, head.group_size) if head else
                                                                 (None, 0))) if kind == "int4"}
    if len(groups) > 1:
        raise PackingError(f"the values and lm_head are int4 with different group sizes ({sorted(groups)}); the "
                           "pruning record holds one")
    record = dict(record or {})
    options = dict(record.get("solver_options") or {})
    options["quantize"] = values[0] if values else "none"
    options["quantize_head"] = head.quantize if head is not None else "none"
    if groups:
        options["group_size"] = next(iter(groups))
    record["solver_options"] = options
    return record


def _in_kernel_dtype(folder: str | Path, state: dict, dtype: torch.dtype | None) -> tuple[dict, torch.dtype]:
    """(`state` with its floating tensors and packed values in `dtype`, that dtype); with `dtype` None, `state` as
    it is and the dtype the kernels will run: that of the packed values (the first floating tensor's for codes),
    PackingError where it is not bfloat16 or float16 or the packed values disagree. Other tensors (float32 norms,
    say) load in their own dtype, as from_pretrained loads them."""
    if dtype is None:
        values = {weight.values.dtype for weight in state.values() if isinstance(weight, PackedNM)}
        found = values or {next((weight.dtype for weight in state.values()
                                 if isinstance(weight, torch.Tensor) and weight.is_floating_point()), None)}
        if len(found) != 1 or next(iter(found)) not in _KERNEL_DTYPES:
            held = ", ".join(sorted(str(kind).removeprefix("torch.") for kind in found))
            raise PackingError(f"{folder} holds {held} {'packed values' if values else 'tensors'}; the packed kernels "
                               "run bfloat16 or float16: pass dtype=torch.bfloat16 to load_packed to load it in "
                               "bfloat16")
        return state, next(iter(found))

    def cast(weight):
        if isinstance(weight, PackedNM):
            return PackedNM(weight.values.to(dtype), weight.bitmask, weight.n, weight.m, weight.shape)
        return weight.to(dtype) if isinstance(weight, torch.Tensor) and weight.is_floating_point() else weight

    return {name: cast(weight) for name, weight in state.items()}, dtype
