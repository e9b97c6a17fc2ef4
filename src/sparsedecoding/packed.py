"""Packed N:M checkpoints: a pruned HF model folder (safetensors, zeros kept) with every N:M sparse decoder linear
stored as values + bitmask (see `kernels.format`), everything else dense, and a JSON manifest.

Layout of the output folder: one safetensors shard per source shard, same file name; a packed weight `NAME`
becomes `NAME.values` and `NAME.bitmask`; `packed.json` records the requested pattern, each tensor's shape,
dtype and (for packed ones) pattern, and the sha256 of every source safetensors file; the source's other files
(config, tokenizer) are copied so the folder is a complete model. The folder is written as `OUT.partial` and
renamed to OUT only when complete.

Quantized packing (`quantize` int8 or int4) stores a packed weight as `NAME.codes`, `NAME.scales` and
`NAME.bitmask` (`kernels.quantized.PackedNMQ`) and records `quantize` and `group_size` with its pattern. The
manifest's `version` is MANIFEST_VERSION; manifests without one (written before quantized packing) are version 1
and still load."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from .errors import ModelFileError, ModelNotFoundError, PackingError, QuantizationError, SparsityPatternError
from .kernels.format import PackedNM, kernel_runs, nm_pattern, pack_nm
from .kernels.quantized import QUANTIZED_FORMATS, PackedNMQ, check_packed_quantization, pack_nm_quantized
from .models import check_model_files, read_json, sha256_file
from .outputs import PRUNED_MANIFEST, check_output, output_folder
from .patterns import KERNEL_PATTERNS, PRUNABLE_LINEARS, SparsityPattern

log = logging.getLogger(__name__)

# The packed checkpoint's record (a pruned checkpoint's is outputs.PRUNED_MANIFEST); folders packed before it had its
# name are still read under the old one.
PACKED_MANIFEST = "packed.json"
_OLD_PACKED_MANIFEST = "manifest.json"
FORMAT = "sparsedecoding-packed-nm"
MANIFEST_VERSION = 2  # 2: quantized packed weights; 1 (no version field): values + bitmask only
# the dtypes a safetensors file holds, as the manifest names them
STORED_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float8_e4m3fn",
                 "float8_e5m2", "float16", "bfloat16", "float32", "float64")
_PACKED_DTYPES = ("bfloat16", "float16", "float32")  # kernels.format.PACKABLE_DTYPES by name
PRUNABLE = re.compile(rf"^model\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(PRUNABLE_LINEARS)})\.weight$")


def _requested_patterns(pattern: str | None, quantize: str | None = None) -> tuple[tuple[int, int], ...] | None:
    """The N:M patterns to try, or None for "auto"/None (detect per weight, keep non-N:M weights dense). A quantized
    pack must be one the quantized kernel runs: values in bf16 still run densified, codes would run nowhere."""
    if pattern is None or pattern == "auto":
        return None
    parsed = SparsityPattern.parse(pattern)
    if not parsed.is_nm:
        raise SparsityPatternError(f"{pattern!r} — packing needs an N:M pattern such as 2:4, or 'auto'")
    if quantize is not None and not kernel_runs(parsed.n, parsed.m):
        raise PackingError(f"the quantized kernel cannot run {parsed}: it needs M dividing 32 and 32·N/M a multiple of "
                           f"8; pack with --pattern auto (a sparser weight packs under 2:4) or one of "
                           f"{', '.join(f'{n}:{m}' for n, m in KERNEL_PATTERNS)}")
    return ((parsed.n, parsed.m),)


def _recorded(folder: str | Path, option: str) -> tuple[str | None, int]:
    """(the pruned manifest's solver option `option`, its group size), or (None, 128) where it is none or absent."""
    manifest = Path(folder) / PRUNED_MANIFEST
    record = read_json(manifest) if manifest.is_file() else {}
    options = (record.get("solver_options") or {}) if isinstance(record, dict) else None
    if not isinstance(options, dict):
        raise ModelFileError(f"{manifest} is not a pruning record (a JSON object with solver_options); restore it or "
                             f"prune again")
    quantize, group_size = options.get(option, "none"), options.get("group_size", 128)
    if quantize in (None, "none"):
        return None, 128
    if quantize not in QUANTIZED_FORMATS or type(group_size) is not int:
        raise ModelFileError(f"{manifest} records {option} {quantize!r} with group size {group_size!r}, which this "
                             f"sparsedecoding does not know; restore it or prune again")
    return quantize, group_size


def recorded_quantization(folder: str | Path) -> tuple[str | None, int]:
    """(quantize, group_size) that `sparsedecoding prune` recorded for the pruned checkpoint `folder`: ("int8" or
    "int4", its group size) for `prune --quantize`, (None, 128) for an unquantized or foreign folder."""
    return _recorded(folder, "quantize")


def recorded_head_quantization(folder: str | Path) -> tuple[str | None, int]:
    """(quantize, group_size) of lm_head that `sparsedecoding prune --quantize-head` recorded for the pruned
    checkpoint `folder` (or a packed checkpoint of it, which keeps the pruned manifest): ("int8" or "int4", the
    group size), or (None, 128) where lm_head was not quantized."""
    return _recorded(folder, "quantize_head")


_ISFINITE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _pack_if_sparse(name: str, weight: torch.Tensor, patterns, quantize: str | None = None,
                    group_size: int = 128) -> tuple[PackedNM | PackedNMQ | None, str]:
    """(the packed weight, ""), or in auto mode (`patterns` None: the pattern `nm_pattern` finds) (None, why it is
    kept dense). A non-finite weight is an error in either mode: auto must not quietly keep it dense; so is, with
    `quantize`, a sparse weight off the quantization grid."""
    # isfinite has no float8 kernels: those (which pack_nm then refuses by dtype) are checked through float32
    finite = torch.isfinite(weight if weight.dtype in _ISFINITE_DTYPES or not weight.is_floating_point()
                            else weight.float())
    if not bool(finite.all()):
        raise PackingError(f"{name} holds NaN or inf; the checkpoint is corrupt: prune again from a finite model")
    if patterns is None:
        found = nm_pattern(weight) if weight.dim() == 2 else None
        if found is None:
            return None, _why_dense(weight)
        patterns = (found,)
    (n, m), = patterns
    try:
        if quantize is None:
            return pack_nm(weight, n, m), ""
        return pack_nm_quantized(weight, n, m, quantize, group_size), ""
    except (PackingError, QuantizationError) as exc:
        raise type(exc)(f"{name}: {exc}") from exc


def _why_dense(weight: torch.Tensor) -> str:
    """Why `nm_pattern` found no pattern for a prunable weight, for the error when nothing at all is packable."""
    if weight.dim() == 2 and weight.numel() == 0:
        return f"its shape {tuple(weight.shape)} has no rows or no columns"
    if weight.dim() != 2 or weight.shape[1] % 32:
        return f"in_features {tuple(weight.shape)[1:]} is not a multiple of 32, which the packed format needs"
    most = int((weight != 0).view(weight.shape[0], -1, 32).sum(-1).max())
    return f"a group of 32 columns keeps {most} weights, more than half"


def _nothing_packable(source: Path, refused: tuple[str, str] | None) -> PackingError:
    """The error for a folder in which no tensor would be packed, saying why (a packed copy of a dense model is
    only a slower copy)."""
    patterns = ", ".join(f"{n}:{m}" for n, m in KERNEL_PATTERNS)
    if refused is None:
        return PackingError(f"{source} has no decoder linear named like model.layers.N.mlp.up_proj.weight; pack "
                            f"works on llama, qwen2, qwen3 and mistral checkpoints")
    name, reason = refused
    return PackingError(f"no decoder linear of {source} is N:M sparse at half its weights or fewer, as {patterns} "
                        f"(e.g. {name}: {reason}); prune it to one of them first (`sparsedecoding prune --pattern "
                        f"2:4`)")


def pack_checkpoint(hf_dir: str | Path, out_dir: str | Path, pattern: str | None = None,
                    overwrite: bool = False, quantize: str | None = None, group_size: int = 128) -> dict:
    """Convert the HF folder `hf_dir` to a packed checkpoint in `out_dir` and return its manifest.

    `pattern`: "2:4" (or another N:M) packs every prunable decoder linear with it and fails on one that is not
    that sparse; None or "auto" packs each prunable linear in the sparsest pattern the kernel runs that it
    satisfies with at most half its weights kept (`kernels.format.nm_pattern`, as `sparsify` and the engine choose)
    and keeps the others dense. `overwrite` replaces an existing `out_dir`; without it OutputExistsError.
    `quantize` ("int8" or "int4", default None) stores each packed weight's kept values as codes and scales; the
    weights must lie on that grid (`prune --quantize`), int4 with `group_size` (a multiple of 32) columns a scale."""
    source, out = Path(hf_dir), Path(out_dir)
    if quantize is not None:
        check_packed_quantization(quantize, group_size)
    patterns = _requested_patterns(pattern, quantize)
    if not source.is_dir():
        raise ModelNotFoundError(f"{source} is not a folder with .safetensors weights; pass an HF model folder")
    out = check_output(out, overwrite, inputs=(source,))  # before the model's files are read through
    if packed_manifest(source) is not None:
        raise PackingError(f"{source} is already a packed checkpoint ({packed_manifest(source).name}); load_packed, "
                           f"generate, bench and eval read it as it is")
    shards = check_model_files(source)  # a broken config is refused, not copied into a "complete" checkpoint
    if patterns is None:
        _check_something_packs(source, shards)
    with output_folder(out, overwrite) as partial:
        manifest = _write_packed(source, shards, partial, patterns, pattern or "auto", quantize, group_size)
    return manifest


def _check_something_packs(source: Path, shards: list[Path]) -> None:
    """In auto mode, PackingError before anything is written when no prunable tensor would be packed (a dense model
    given by mistake); reads prunable tensors only until the first packable one, which is usually the first."""
    refused = None
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in filter(PRUNABLE.match, f.keys()):
                weight = f.get_tensor(name)
                if weight.dim() == 2 and nm_pattern(weight) is not None:
                    return
                refused = refused or (name, _why_dense(weight))
    raise _nothing_packable(source, refused)


def _write_packed(source: Path, shards: list[Path], out: Path, patterns, requested: str, quantize: str | None,
                  group_size: int) -> dict:
    tensors_info: dict[str, dict] = {}
    refused = None  # the first prunable tensor kept dense, and why
    total = 0
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            total += len(f.keys())
    # a bar on a terminal only (disable=None): an 8B model takes minutes here, and a log or a test sees no bar lines
    with tqdm(total=total, desc="packing", unit="tensor", disable=None) as bar:
        for shard in shards:
            written: dict[str, torch.Tensor] = {}
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    bar.update()
                    tensor = f.get_tensor(name)
                    dtype = str(tensor.dtype).removeprefix("torch.")
                    info = {"file": shard.name, "shape": list(tensor.shape), "dtype": dtype}
                    packed, reason = (_pack_if_sparse(name, tensor, patterns, quantize, group_size)
                                      if PRUNABLE.match(name) else (None, ""))
                    if reason and refused is None:
                        refused = name, reason
                    if packed is None:
                        written[name] = tensor.contiguous()
                    else:
                        written.update(packed.state_dict(name))
                        info["pattern"] = packed.pattern
                        if isinstance(packed, PackedNMQ):
                            info.update(quantize=packed.quantize, group_size=packed.group_size)
                    tensors_info[name] = info
            save_file(written, str(out / shard.name), metadata={"format": FORMAT})
            log.info("wrote %s: %d tensor(s) packed", shard.name,
                     sum(info["file"] == shard.name and "pattern" in info for info in tensors_info.values()))
    if not any("pattern" in info for info in tensors_info.values()):
        raise _nothing_packable(source, refused)
    if refused is not None:
        prunable = [info for name, info in tensors_info.items() if PRUNABLE.match(name)]
        log.warning("%d of %d decoder linears are kept dense (e.g. %s: %s)",
                    sum("pattern" not in info for info in prunable), len(prunable), *refused)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "model.safetensors.index.json":
            shutil.copy2(path, out / path.name)
    source_record = {"dir": str(source.resolve()),
                     "safetensors_sha256": {shard.name: sha256_file(shard) for shard in shards}}
    return _write_manifest(out, requested, quantize, tensors_info, source_record)


def _write_manifest(out: Path, requested: str, quantize: str | None, tensors_info: dict[str, dict],
                    source: dict) -> dict:
    manifest = {
        "format": FORMAT,
        "version": MANIFEST_VERSION,
        "pattern": requested,
        "quantize": quantize or "none",
        "patterns": sorted({info["pattern"] for info in tensors_info.values() if "pattern" in info}),
        "source": source,
        "tensors": tensors_info,
    }
    (out / PACKED_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def write_packed_state(out: Path, state: dict[str, torch.Tensor | PackedNM | PackedNMQ], dtypes: dict[str, str],
                       source: dict, shard_bytes: int = 4 * 2**30) -> dict:
    """Write `state` (every tensor of a model by its transformers name: dense tensors, and `PackedNM` /
    `PackedNMQ` for packed weights) into the existing folder `out` as a packed checkpoint's safetensors shards (in
    order, a new shard once one would pass `shard_bytes`) and its manifest, and return the manifest. `dtypes`
    gives, for each `PackedNMQ`, the dtype its dequantized weight takes (codes hold none); `source` is recorded as
    the manifest's "source". What `sparsedecoding.save_packed` writes with; the caller adds config and tokenizer."""
    def size(tensor) -> int:
        parts = tensor.state_dict("w").values() if isinstance(tensor, PackedNM | PackedNMQ) else (tensor,)
        return sum(part.numel() * part.element_size() for part in parts)

    kinds = sorted({tensor.quantize for tensor in state.values() if isinstance(tensor, PackedNMQ)})
    if len(kinds) > 1:
        raise PackingError(f"the packed weights hold {' and '.join(kinds)} codes; a packed checkpoint holds one kind")
    shards: list[list[str]] = [[]]
    held = 0
    for name, tensor in state.items():
        if shards[-1] and held + size(tensor) > shard_bytes:
            shards.append([])
            held = 0
        shards[-1].append(name)
        held += size(tensor)
    tensors_info: dict[str, dict] = {}
    for index, names in enumerate(shards, 1):
        file = "model.safetensors" if len(shards) == 1 else f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        written: dict[str, torch.Tensor] = {}
        for name in names:
            tensor = state[name]
            if isinstance(tensor, PackedNM | PackedNMQ):
                parts = {key: part.detach().cpu().contiguous() for key, part in tensor.state_dict(name).items()}
                written.update(parts)
                dtype = dtypes[name] if isinstance(tensor, PackedNMQ) else str(tensor.values.dtype)
                info = {"file": file, "shape": list(tensor.shape), "dtype": dtype.removeprefix("torch."),
                        "pattern": tensor.pattern}
                if isinstance(tensor, PackedNMQ):
                    info.update(quantize=tensor.quantize, group_size=tensor.group_size)
            else:
                written[name] = tensor.detach().cpu().contiguous()
                info = {"file": file, "shape": list(tensor.shape),
                        "dtype": str(tensor.dtype).removeprefix("torch.")}
            tensors_info[name] = info
        save_file(written, str(out / file), metadata={"format": FORMAT})
    return _write_manifest(out, "auto", kinds[0] if kinds else None, tensors_info, source)


def packed_manifest(folder: Path) -> Path | None:
    """The manifest file of a packed checkpoint folder (under its current or its old name), None for another folder.
    A file under the old, generic name counts only when it says it is a packed-checkpoint manifest, so an HF folder
    that ships some other manifest.json still loads as the HF folder it is."""
    if (folder / PACKED_MANIFEST).is_file():
        return folder / PACKED_MANIFEST
    old = folder / _OLD_PACKED_MANIFEST
    if old.is_file():
        try:
            record = json.loads(old.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if isinstance(record, dict) and record.get("format") == FORMAT:
            return old
    return None


def _read_manifest(path: Path) -> dict:
    """The packed manifest at `path`, its structure checked (it decides which bytes are read as what); PackingError
    naming what is wrong, so a damaged folder fails with one line rather than deep in the loader."""
    def broken(what: str) -> PackingError:
        return PackingError(f"{path} is damaged ({what}); pack the pruned checkpoint again")

    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise broken(f"not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise broken(f"a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise PackingError(f"{path} is not a packed-checkpoint manifest (format {manifest.get('format')!r})")
    version = manifest.get("version", 1)
    if type(version) is not int or not 1 <= version <= MANIFEST_VERSION:
        raise PackingError(f"{path} has manifest version {version!r}; this sparsedecoding reads versions 1 to "
                           f"{MANIFEST_VERSION}: update it, or pack the checkpoint again")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, dict) or not tensors:
        raise broken("no \"tensors\" object")
    for name, info in tensors.items():
        if not isinstance(info, dict) or not isinstance(info.get("file"), str) or "/" in info["file"]:
            raise broken(f"tensor {name!r} names no file of the folder")
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(type(size) is int and size >= 0 for size in shape):
            raise broken(f"tensor {name!r} has shape {shape!r}")
        if info.get("dtype") not in STORED_DTYPES:
            raise broken(f"tensor {name!r} has dtype {info.get('dtype')!r}")
        if "pattern" in info:
            pattern = info["pattern"]
            parts = pattern.split(":") if isinstance(pattern, str) else []
            if len(shape) != 2 or len(parts) != 2 or not all(part.isascii() and part.isdigit() for part in parts):
                raise broken(f"packed tensor {name!r} has pattern {pattern!r} and shape {shape!r}")
            if "quantize" in info and type(info.get("group_size")) is not int:
                raise broken(f"packed tensor {name!r} is quantized with group size {info.get('group_size')!r}")
            if info["dtype"] not in _PACKED_DTYPES:  # the dtype its values (or, quantized, its dequantization) take
                raise broken(f"packed tensor {name!r} has dtype {info['dtype']!r}; packed weights are "
                             f"{', '.join(_PACKED_DTYPES)}")
    return manifest


def load_packed_checkpoint(checkpoint_dir: str | Path, device: str | torch.device = "cpu"
                           ) -> tuple[dict[str, torch.Tensor | PackedNM | PackedNMQ], dict]:
    """(state, manifest): every tensor of the original checkpoint by its original name, as a PackedNM (or, where
    quantized, a PackedNMQ) where it was packed (shape and popcounts checked) and as a dense tensor elsewhere."""
    folder = Path(checkpoint_dir)
    manifest_path = packed_manifest(folder)
    if manifest_path is None:
        raise ModelNotFoundError(f"{folder} has no {PACKED_MANIFEST}; create it with `sparsedecoding pack`")
    manifest = _read_manifest(manifest_path)
    by_file: dict[str, list[str]] = {}
    for name, info in manifest["tensors"].items():
        by_file.setdefault(info["file"], []).append(name)
    state: dict[str, torch.Tensor | PackedNM | PackedNMQ] = {}
    for file, names in by_file.items():
        tensors = _load_shard(folder / file, device)
        for name in names:
            info = manifest["tensors"][name]
            if "pattern" in info:
                n, m = (int(v) for v in info["pattern"].split(":"))
                if "quantize" in info:
                    state[name] = PackedNMQ.from_state_dict(tensors, name, n, m, tuple(info["shape"]),
                                                            info["quantize"], int(info["group_size"]))
                else:
                    state[name] = PackedNM.from_state_dict(tensors, name, n, m, tuple(info["shape"]))
                    _check_stored_dtype(folder / file, f"{name}.values", state[name].values, info["dtype"])
            elif name in tensors and list(tensors[name].shape) == info["shape"]:
                state[name] = _check_stored_dtype(folder / file, name, tensors[name], info["dtype"])
            else:
                raise PackingError(f"{folder / file} lacks {name} of shape {info['shape']} listed in the manifest")
    return state, manifest


def _check_stored_dtype(path: Path, name: str, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """`tensor`, if it has the dtype the manifest lists for it; else PackingError (a tensor whose bytes were
    re-labelled would otherwise load as garbage that no finiteness check sees, integers having no NaN)."""
    if str(tensor.dtype).removeprefix("torch.") != dtype:
        raise PackingError(f"{path} stores {name} as {str(tensor.dtype).removeprefix('torch.')}, but "
                           f"{path.parent / PACKED_MANIFEST} lists {dtype}; the folder is corrupt: pack it again")
    return tensor


def _load_shard(path: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """The tensors of one packed shard; PackingError when it is missing or not a whole safetensors file."""
    try:
        present = path.is_file()
    except OSError as exc:  # a name the file system cannot hold (too long, say)
        raise PackingError(f"{path.parent / PACKED_MANIFEST} lists a file that cannot exist ({exc})") from None
    if not present:
        raise PackingError(f"{path} is missing, though {path.parent / PACKED_MANIFEST} lists tensors in it; copy the "
                           f"whole folder")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise PackingError(f"cannot load {path.parent} onto {device}: this machine has no CUDA device")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError) as exc:
        raise PackingError(f"{path} is not a readable safetensors file ({exc}); it may be truncated: copy it "
                           f"again") from None
