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
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .errors import ModelNotFoundError, PackingError, QuantizationError, SparsityPatternError
from .kernels.format import PackedNM, kernel_runs, pack_nm
from .kernels.quantized import PackedNMQ, check_packed_quantization, pack_nm_quantized
from .models import check_weight_files, read_json, sha256_file
from .outputs import PRUNED_MANIFEST, output_folder
from .patterns import KERNEL_PATTERNS, PRUNABLE_LINEARS, SparsityPattern

log = logging.getLogger(__name__)

# The packed checkpoint's record (a pruned checkpoint's is outputs.PRUNED_MANIFEST); folders packed before it had its
# name are still read under the old one.
PACKED_MANIFEST = "packed.json"
_OLD_PACKED_MANIFEST = "manifest.json"
FORMAT = "sparsedecoding-packed-nm"
MANIFEST_VERSION = 2  # 2: quantized packed weights; 1 (no version field): values + bitmask only
PRUNABLE = re.compile(rf"^model\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(PRUNABLE_LINEARS)})\.weight$")
# Tried in this order by pattern="auto": the first one a weight satisfies is used (all store the same bytes).
AUTO_PATTERNS = KERNEL_PATTERNS


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
                           f"{', '.join(f'{n}:{m}' for n, m in AUTO_PATTERNS)}")
    return ((parsed.n, parsed.m),)


def _recorded(folder: str | Path, option: str) -> tuple[str | None, int]:
    """(the pruned manifest's solver option `option`, its group size), or (None, 128) where it is none or absent."""
    manifest = Path(folder) / PRUNED_MANIFEST
    options = (read_json(manifest).get("solver_options") or {}) if manifest.is_file() else {}
    quantize = options.get(option, "none")
    return (None, 128) if quantize in (None, "none") else (quantize, int(options.get("group_size", 128)))


def recorded_quantization(folder: str | Path) -> tuple[str | None, int]:
    """(quantize, group_size) that `sparsedecoding prune` recorded for the pruned checkpoint `folder`: ("int8" or
    "int4", its group size) for `prune --quantize`, (None, 128) for an unquantized or foreign folder."""
    return _recorded(folder, "quantize")


def recorded_head_quantization(folder: str | Path) -> tuple[str | None, int]:
    """(quantize, group_size) of lm_head that `sparsedecoding prune --quantize-head` recorded for the pruned
    checkpoint `folder` (or a packed checkpoint of it, which keeps the pruned manifest): ("int8" or "int4", the
    group size), or (None, 128) where lm_head was not quantized."""
    return _recorded(folder, "quantize_head")


def _pack_if_sparse(name: str, weight: torch.Tensor, patterns, quantize: str | None = None,
                    group_size: int = 128) -> tuple[PackedNM | PackedNMQ | None, str]:
    """(the packed weight, ""), or (None, why the last pattern tried did not fit) to keep it dense (auto mode and no
    pattern fits). A non-finite weight is an error in either mode: auto must not quietly keep it dense; so is, with
    `quantize`, a sparse weight off the quantization grid."""
    if not bool(torch.isfinite(weight).all()):
        raise PackingError(f"{name} holds NaN or inf; the checkpoint is corrupt: prune again from a finite model")
    reason = ""
    for n, m in patterns or AUTO_PATTERNS:
        try:
            if quantize is None:
                return pack_nm(weight, n, m), ""
            return pack_nm_quantized(weight, n, m, quantize, group_size), ""
        except QuantizationError as exc:
            raise QuantizationError(f"{name}: {exc}") from exc
        except PackingError as exc:
            if patterns is not None:
                raise PackingError(f"{name}: {exc}") from exc
            reason = str(exc)
    return None, reason


def _nothing_packable(source: Path, refused: tuple[str, str] | None) -> PackingError:
    """The error for a folder in which no tensor would be packed, saying why (a packed copy of a dense model is
    only a slower copy)."""
    patterns = ", ".join(f"{n}:{m}" for n, m in AUTO_PATTERNS)
    if refused is None:
        return PackingError(f"{source} has no decoder linear named like model.layers.N.mlp.up_proj.weight; pack "
                            f"works on llama, qwen2, qwen3 and mistral checkpoints")
    name, reason = refused
    reason = reason.split("; ")[0]  # pack_nm's own advice names one pattern; the advice below names them all
    return PackingError(f"no decoder linear of {source} is sparse in {patterns} (e.g. {name}: {reason}); prune it "
                        f"to one of them first (`sparsedecoding prune --pattern 2:4`)")


def pack_checkpoint(hf_dir: str | Path, out_dir: str | Path, pattern: str | None = None,
                    overwrite: bool = False, quantize: str | None = None, group_size: int = 128) -> dict:
    """Convert the HF folder `hf_dir` to a packed checkpoint in `out_dir` and return its manifest.

    `pattern`: "2:4" (or another N:M) packs every prunable decoder linear with it and fails on one that is not
    that sparse; None or "auto" packs each prunable linear with the first of 2:4, 4:8, 8:16, 16:32 it satisfies
    and keeps the others dense. `overwrite` replaces an existing `out_dir`; without it OutputExistsError.
    `quantize` ("int8" or "int4", default None) stores each packed weight's kept values as codes and scales; the
    weights must lie on that grid (`prune --quantize`), int4 with `group_size` (a multiple of 32) columns a scale."""
    source, out = Path(hf_dir), Path(out_dir)
    if quantize is not None:
        check_packed_quantization(quantize, group_size)
    patterns = _requested_patterns(pattern, quantize)
    if not source.is_dir():
        raise ModelNotFoundError(f"{source} is not a folder with .safetensors weights; pass an HF model folder")
    shards = check_weight_files(source)
    with output_folder(out, overwrite) as partial:
        manifest = _write_packed(source, shards, partial, patterns, pattern or "auto", quantize, group_size)
    return manifest


def _write_packed(source: Path, shards: list[Path], out: Path, patterns, requested: str, quantize: str | None,
                  group_size: int) -> dict:
    tensors_info: dict[str, dict] = {}
    refused = None  # the first prunable tensor kept dense, and why
    for shard in shards:
        written: dict[str, torch.Tensor] = {}
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
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
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "model.safetensors.index.json":
            shutil.copy2(path, out / path.name)
    manifest = {
        "format": FORMAT,
        "version": MANIFEST_VERSION,
        "pattern": requested,
        "quantize": quantize or "none",
        "patterns": sorted({info["pattern"] for info in tensors_info.values() if "pattern" in info}),
        "source": {"dir": str(source.resolve()),
                   "safetensors_sha256": {shard.name: sha256_file(shard) for shard in shards}},
        "tensors": tensors_info,
    }
    (out / PACKED_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def packed_manifest(folder: Path) -> Path | None:
    """The manifest file of a packed checkpoint folder (under its current or its old name), None for another folder."""
    for name in (PACKED_MANIFEST, _OLD_PACKED_MANIFEST):
        if (folder / name).is_file():
            return folder / name
    return None


def load_packed_checkpoint(checkpoint_dir: str | Path, device: str | torch.device = "cpu"
                           ) -> tuple[dict[str, torch.Tensor | PackedNM | PackedNMQ], dict]:
    """(state, manifest): every tensor of the original checkpoint by its original name, as a PackedNM (or, where
    quantized, a PackedNMQ) where it was packed (shape and popcounts checked) and as a dense tensor elsewhere."""
    folder = Path(checkpoint_dir)
    manifest_path = packed_manifest(folder)
    if manifest_path is None:
        raise ModelNotFoundError(f"{folder} has no {PACKED_MANIFEST}; create it with `sparsedecoding pack`")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise PackingError(f"{manifest_path} is not a packed-checkpoint manifest (format {manifest.get('format')!r})")
    version = manifest.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= MANIFEST_VERSION:
        raise PackingError(f"{manifest_path} has manifest version {version!r}; this sparsedecoding reads versions 1 to "
                           f"{MANIFEST_VERSION}: update it, or pack the checkpoint again")
    by_file: dict[str, list[str]] = {}
    for name, info in manifest["tensors"].items():
        by_file.setdefault(info["file"], []).append(name)
    state: dict[str, torch.Tensor | PackedNM | PackedNMQ] = {}
    for file, names in by_file.items():
        tensors = load_file(str(folder / file), device=str(device))
        for name in names:
            info = manifest["tensors"][name]
            if "pattern" in info:
                n, m = (int(v) for v in info["pattern"].split(":"))
                if "quantize" in info:
                    state[name] = PackedNMQ.from_state_dict(tensors, name, n, m, tuple(info["shape"]),
                                                            info["quantize"], int(info["group_size"]))
                else:
                    state[name] = PackedNM.from_state_dict(tensors, name, n, m, tuple(info["shape"]))
            elif name in tensors and list(tensors[name].shape) == info["shape"]:
                state[name] = tensors[name]
            else:
                raise PackingError(f"{folder / file} lacks {name} of shape {info['shape']} listed in the manifest")
    return state, manifest
