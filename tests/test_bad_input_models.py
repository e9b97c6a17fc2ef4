"""Broken model folders, prompt files and cached data: each gives one `error:` line, exit code 2, no traceback and no
OUT or OUT.partial, before any generation or calibration. A model folder is refused whether transformers would crash
on it (a config value it rejects, a tokenizer it cannot read, weights of other shapes) or load it quietly with a
tensor left at random (a missing tensor, a token id that fails only once generation starts)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsedecoding import models, solvers
from sparsedecoding.cli import main
from sparsedecoding.errors import FetchError, ModelFileError
from sparsedecoding.packed import PRUNABLE
from helpers import make_tiny_model


def edit_json(folder: Path, name: str, **values) -> None:
    path = folder / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def edit_weights(folder: Path, change) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def without_tokenizer(folder: Path) -> None:
    for path in folder.glob("tokenizer*"):
        path.unlink()


# Damage done to a copy of a good folder, and what the error line must say.
BROKEN = {
    "hidden-96": (lambda f: edit_json(f, "config.json", hidden_size=96), "has shape [128, 64] where it implies"),
    "tensor-130x64": (lambda f: edit_weights(f, lambda t: t.update({"model.layers.0.mlp.up_proj.weight":
                                                                    torch.zeros(130, 64)})),
                      "model.layers.0.mlp.up_proj.weight has shape [130, 64]"),
    "layers-two": (lambda f: edit_json(f, "config.json", num_hidden_layers="two"), "num_hidden_layers"),
    "heads-0": (lambda f: edit_json(f, "config.json", num_attention_heads=0), "ZeroDivisionError"),
    "no-tokenizer": (without_tokenizer, "the tokenizer cannot be loaded"),
    "tokenizer-{}": (lambda f: (f / "tokenizer.json").write_text("{}"), "the tokenizer cannot be loaded"),
    "generation-config-list": (lambda f: (f / "generation_config.json").write_text("[1, 2]"),
                               "generation_config.json holds a JSON list"),
    "eos-x": (lambda f: edit_json(f, "generation_config.json", eos_token_id="x"), "eos_token_id is 'x'"),
    "missing-tensor": (lambda f: edit_weights(f, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
                       "lacks model.layers.1.mlp.up_proj.weight"),
    "extra-tensor": (lambda f: edit_weights(f, lambda t: t.update({"model.extra.weight": torch.zeros(2)})),
                     "holds model.extra.weight, which the model has no place for"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def pruned(tiny, tmp_path_factory) -> Path:
    """The tiny model with its decoder linears magnitude-pruned to 2:4: what `pack` takes."""
    folder = Path(shutil.copytree(tiny, tmp_path_factory.mktemp("pruned") / "pruned"))
    edit_weights(folder, lambda tensors: tensors.update(
        {name: solvers.magnitude(weight, None, "2:4") for name, weight in tensors.items() if PRUNABLE.match(name)}))
    return folder


@pytest.fixture(autouse=True)
def _quiet(cache_dir):
    """A private cache, and no transformers loading bars on stderr (they would hide a second error line)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


def broken_copy(source: Path, tmp_path: Path, damage: str) -> Path:
    folder = Path(shutil.copytree(source, tmp_path / damage))
    BROKEN[damage][0](folder)
    return folder


def one_error_line(capsys, argv: list, expected: str, out: Path | None = None) -> str:
    """Runs the CLI: exit 2, exactly one stderr line, `error: ...` containing `expected`; OUT and OUT.partial absent."""
    capsys.readouterr()
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], lines
    if out is not None:
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    return lines[0]


def prune_argv(model: Path, out: Path, prompts: Path, *extra) -> list:
    return ["prune", "--model", model, "--out", out, "--prompts", prompts, "--tokens", "64", "--max-new-tokens", "8",
            "--device", "cpu", *extra]


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("def f(x):\nhello\n")
    return path


@pytest.mark.parametrize("damage", BROKEN)
@pytest.mark.parametrize("command", ["prune", "generate", "check"])
def test_a_broken_model_folder_is_one_model_file_error_before_any_work(capsys, tmp_path, tiny, prompts, damage,
                                                                       command):
    folder, out = broken_copy(tiny, tmp_path, damage), tmp_path / "out"
    argv = {"prune": prune_argv(folder, out, prompts),
            "generate": ["generate", "--model", folder, "--prompt", "hi", "--new-tokens", "2", "--device", "cpu",
                         "--dtype", "float32", "--sparse", "none"],
            "check": ["check", "--model", folder, "--checks", "logits", "--new-tokens", "2", "--prompt", "hi",
                      "--device", "cpu", "--dtype", "float32"]}[command]
    line = one_error_line(capsys, argv, BROKEN[damage][1], out)
    assert "ModelFileError" in line


@pytest.mark.parametrize("damage", ["tokenizer-{}", "hidden-96", "missing-tensor"])
def test_prune_of_a_model_that_fails_to_load_leaves_no_work_folder(capsys, tmp_path, tiny, prompts, monkeypatch,
                                                                   damage):
    """Past the up-front checks (switched off here), loading converts what transformers raises, and the work
    folder is made only after the model loaded (a folder kept for resuming is a run's that was interrupted)."""
    from sparsedecoding import pipeline

    monkeypatch.setattr(models, "check_hf_folder", lambda folder: None)
    monkeypatch.setattr(pipeline, "WorkDir", lambda *args: pytest.fail("the work folder was made before loading"))
    folder, out = broken_copy(tiny, tmp_path, damage), tmp_path / "out"
    assert "ModelFileError" in one_error_line(capsys, prune_argv(folder, out, prompts), "", out)


def test_load_model_refuses_what_transformers_would_leave_at_random(tmp_path, tiny, monkeypatch):
    """The loading info: a checkpoint without one of its tensors is a ModelFileError, not a random layer; a tied
    lm_head, which the checkpoint does not store, is not missing."""
    monkeypatch.setattr(models, "check_hf_folder", lambda folder: None)
    with pytest.raises(ModelFileError, match="lacks model.layers.1.mlp.up_proj.weight"):
        models.load_model(broken_copy(tiny, tmp_path, "missing-tensor"))
    tied = make_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    model, _, _ = models.load_model(tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_tied_model_and_a_stale_rotary_buffer_pass_the_folder_checks(tmp_path):
    """A tied lm_head is not stored; old checkpoints stored each layer's inv_freq, which transformers skips."""
    folder = make_tiny_model(tmp_path / "tied", arch="qwen2", tie_word_embeddings=True)
    edit_weights(folder, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}))
    assert models.resolve_model(folder) == folder
    models.load_model(folder)


@pytest.mark.parametrize("damage", ["hidden-96", "tensor-130x64"])
def test_the_engine_loader_refuses_weights_of_other_shapes(tmp_path, tiny, damage):
    from sparsedecoding.engine import load_model

    with pytest.raises(ModelFileError, match="the weights cannot be loaded"):
        load_model(broken_copy(tiny, tmp_path, damage), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("ids, good", [(3, True), ([1, 3], True), (None, True), ("x", False), ([1, "2"], False),
                                       (True, False), (1.5, False)])
def test_special_token_ids_must_be_ids(tmp_path, tiny, ids, good):
    folder = Path(shutil.copytree(tiny, tmp_path / "copy"))
    edit_json(folder, "generation_config.json", pad_token_id=ids)
    if good:
        models.check_token_ids(folder)
    else:
        with pytest.raises(ModelFileError, match="pad_token_id"):
            models.check_token_ids(folder)


@pytest.fixture
def latin(tmp_path) -> Path:
    path = tmp_path / "latin.txt"
    path.write_bytes(b"caf\xe9\nhello\n")
    return path


def test_a_prompt_file_that_is_not_utf8_is_one_prompts_error(capsys, tmp_path, tiny, latin):
    out = tmp_path / "out"
    for argv in (prune_argv(tiny, out, latin),
                 prune_argv(tiny, out, tmp_path / "unused.txt", "--calibration", "self", "--self-sources",
                            f"{latin}=1"),
                 ["eval", "--model", tiny, "--out", out, "--prompts", latin, "--metrics", "repetition",
                  "--device", "cpu"],
                 ["analyze", "discrepancy", "--model", tiny, "--heldout", latin, "--out", out, "--device", "cpu",
                  "--no-plot"]):
        line = one_error_line(capsys, argv, "is not UTF-8 text (byte 0xe9 at offset 3)", out)
        assert "PromptsError" in line


def write_humaneval(cache: Path, content: bytes) -> Path:
    path = cache / "data" / "HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("content, cause", [
    (b"not gzip", "BadGzipFile"),
    (gzip.compress(b'{"task_id": 1}\n'), "line 1 is not a problem"),
    (gzip.compress(b"[1, 2]\n"), "line 1 is not a problem"),
    (gzip.compress(b"{not json\n"), "line 1 is not JSON"),
    (gzip.compress(b""), "it holds no problems"),
    (gzip.compress(b'{"task_id": "a"}\n' * 100)[:30], "EOFError"),
], ids=["not-gzip", "no-prompt", "not-an-object", "not-json", "empty", "cut-short"])
def test_a_damaged_cached_humaneval_says_to_delete_it(cache_dir, content, cause):
    from sparsedecoding.data import humaneval_problems

    path = write_humaneval(cache_dir, content)
    with pytest.raises(FetchError, match=rf"{path} is damaged \({cause}.*delete it and it is fetched again"):
        humaneval_problems("calib")


def test_an_empty_cached_humaneval_is_refused_before_the_model_loads(capsys, cache_dir, tmp_path, tiny,
                                                                      monkeypatch):
    """Not the misleading 'generation produced no decode tokens' after loading and generating."""
    from sparsedecoding import pipeline

    monkeypatch.setattr(pipeline, "load_model", lambda *args: pytest.fail("loaded before the prompts were read"))
    write_humaneval(cache_dir, gzip.compress(b""))
    out = tmp_path / "out"
    line = one_error_line(capsys, prune_argv(tiny, out, "humaneval:calib"), "holds no problems", out)
    assert "FetchError" in line


PACK_BROKEN = {
    "config-not-utf8": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00garbage"), "is not valid JSON"),
    "model-type-foobar": (lambda f: edit_json(f, "config.json", model_type="foobar"), "'foobar'"),
    "hidden-96": (lambda f: edit_json(f, "config.json", hidden_size=96), "where it implies"),
    "config-list": (lambda f: (f / "config.json").write_text("[]"), "holds a JSON list"),
    "no-tokenizer": (without_tokenizer, "the tokenizer cannot be loaded"),
}


@pytest.mark.parametrize("damage", PACK_BROKEN)
def test_pack_refuses_a_broken_folder_before_writing(capsys, tmp_path, pruned, damage):
    folder = Path(shutil.copytree(pruned, tmp_path / damage))
    PACK_BROKEN[damage][0](folder)
    out = tmp_path / "packed"
    one_error_line(capsys, ["pack", "--model", folder, "--out", out], PACK_BROKEN[damage][1], out)


def test_pack_of_a_sound_folder_still_packs(capsys, tmp_path, pruned):
    assert main(["pack", "--model", str(pruned), "--out", str(tmp_path / "packed")]) == 0
    assert (tmp_path / "packed" / "config.json").is_file()


def test_eval_pass_at_1_with_a_damaged_humaneval_fails_before_the_model_loads(capsys, cache_dir, tmp_path, tiny,
                                                                               monkeypatch):
    from sparsedecoding.evaluation import suite

    monkeypatch.setattr(suite, "load_model", lambda *args: pytest.fail("loaded before HumanEval was read"))
    write_humaneval(cache_dir, b"not gzip")
    out = tmp_path / "out"
    line = one_error_line(capsys, ["eval", "--model", tiny, "--out", out, "--metrics", "pass@1", "--device", "cpu"],
                          "is damaged (BadGzipFile", out)
    assert "FetchError" in line


def test_a_folder_is_checked_once_until_a_file_of_it_changes(tmp_path, monkeypatch):
    """resolve_model then load_model check a folder once in a process; a folder damaged after it passed is checked
    again (its files' sizes and times are part of what was checked) and refused."""
    folder = make_tiny_model(tmp_path / "tiny")
    calls = []
    original = models.check_loadable
    monkeypatch.setattr(models, "check_loadable", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    models.resolve_model(str(folder))
    models.resolve_model(str(folder))
    assert len(calls) == 1
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))
    with pytest.raises(ModelFileError, match="where it implies"):
        models.resolve_model(str(folder))
    assert len(calls) == 2


@pytest.mark.parametrize("sparse", ["none", "auto"])
@pytest.mark.parametrize("model", ["tiny", "pruned"])
def test_generate_refuses_nan_weights_in_one_line(capsys, tmp_path, tiny, pruned, sparse, model):
    """A NaN weight makes the engine generate garbage or nothing, silently: like prune, pack and eval, generate
    names the tensor instead (dense or as the packed values `--sparse auto` makes of a 2:4 weight)."""
    folder = Path(shutil.copytree({"tiny": tiny, "pruned": pruned}[model], tmp_path / "nan"))

    def poison(tensors):
        tensors["model.layers.1.mlp.up_proj.weight"][3, 4] = float("nan")
    edit_weights(folder, poison)
    line = one_error_line(capsys, ["generate", "--model", folder, "--prompt", "hi", "--new-tokens", "2", "--device",
                                   "cpu", "--dtype", "bfloat16", "--sparse", sparse, "--no-compile"],
                          "model.layers.1.mlp.up_proj.weight holds NaN or inf")
    assert "ModelFileError" in line
