"""Outputs never destroy inputs and never half-fail: an --out that is, holds or is built over an input (or a report
over a file of the model) is refused before any work; the demo removes nothing before its inputs are checked and
replaces an earlier demo only once the new one is written; whatever an earlier run left at OUT.partial (a file, a
link) is cleared without following it, or refused up front; a name too long for the filesystem is one clear error,
one that fits (with .partial) is taken; and drift refuses two models of different shapes before loading either.
Each runs the CLI in-process on tiny models."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sparsedecoding.cli import main
from helpers import char_tokenizer, make_tiny_model, prune_in_place


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny llama folder (`tiny`) and a 2:4 magnitude-pruned copy (`2:4`, what `pack` reads)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("models")
    tiny = make_tiny_model(root / "tiny")
    pruned = AutoModelForCausalLM.from_pretrained(tiny)
    prune_in_place(pruned, "2:4")
    pruned.save_pretrained(root / "2:4")
    char_tokenizer().save_pretrained(root / "2:4")
    return {"tiny": tiny, "2:4": root / "2:4"}


@pytest.fixture(autouse=True)
def _no_progress_bars():
    """transformers draws a loading bar on stderr; it is not an error line, and it would hide a second one."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


def one_line_error(capsys, argv: list, expected: str) -> str:
    """Run the CLI; it must fail with exit code 2 and exactly one stderr line, `error: ...` holding `expected`."""
    capsys.readouterr()
    assert main([str(part) for part in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and expected in err, err
    return err


def listing(folder: Path) -> list[tuple[str, int]]:
    """Every path under `folder` with its modification time: equal before and after means nothing was touched."""
    return sorted((str(path.relative_to(folder)), path.lstat().st_mtime_ns) for path in folder.rglob("*"))


def prompts_file(folder: Path) -> Path:
    path = folder / "prompts.txt"
    path.write_text("def add(a, b):\nsort a list\n")
    return path


def gguf_in(folder: Path) -> Path:
    """A file named like a GGUF (never read: the refusal comes first)."""
    path = folder / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


# Settings under which each command finishes in a second or two on the tiny model.
EVAL = ["--metrics", "repetition", "--limit", "1", "--max-new-tokens", "2", "--device", "cpu"]
PRUNE = ["--calibration", "text", "--tokens", "8", "--device", "cpu"]
DRIFT = ["--steps", "4", "--limit", "1", "--no-plot", "--device", "cpu", "--overwrite"]

# Each command's argv from `m`, a copy of the tiny model in a scratch folder, and `t`, the tiny model elsewhere.
ONTO_INPUT = {
    "eval-model": lambda m, t: ["eval", "--model", m, "--out", m, "--overwrite", *EVAL],
    "eval-model-parent": lambda m, t: ["eval", "--model", m, "--out", m.parent, "--overwrite", *EVAL],
    "eval-reference-parent": lambda m, t: ["eval", "--model", t, "--reference", m, "--out", m.parent, "--overwrite",
                                           *EVAL],
    "eval-prompts": lambda m, t: ["eval", "--model", t, "--out", m, "--overwrite", *EVAL, "--prompts",
                                  prompts_file(m)],
    "eval-model-is-partial": lambda m, t: ["eval", "--model", m, "--out", m.with_name("m"), *EVAL],
    "eval-gguf-parent": lambda m, t: ["eval", "--model", gguf_in(m), "--out", m, "--overwrite", *EVAL],
    "discrepancy-model": lambda m, t: ["analyze", "discrepancy", "--model", m, "--out", m, "--overwrite",
                                       "--no-plot", "--device", "cpu"],
    "drift-pruned": lambda m, t: ["analyze", "drift", "--dense", t, "--pruned", m, "--out", m, *DRIFT],
    "drift-dense": lambda m, t: ["analyze", "drift", "--dense", m, "--pruned", t, "--out", m.parent, *DRIFT],
}


@pytest.mark.parametrize("name", ONTO_INPUT)
def test_an_out_over_an_input_is_refused_before_any_work(capsys, tmp_path, models, name):
    """`--overwrite` replaces --out: where --out (or OUT.partial, which is cleared first) is or holds a model, a
    reference or a prompt file, that would delete the input. One line, and the scratch folder untouched."""
    scratch = tmp_path / "scratch"
    model = Path(shutil.copytree(models["tiny"], scratch / ("m.partial" if name.endswith("partial") else "m")))
    argv = ONTO_INPUT[name](model, models["tiny"])
    before = listing(scratch)
    one_line_error(capsys, argv, "would overwrite the input")
    assert listing(scratch) == before


@pytest.mark.parametrize("argv", [lambda m: ["check", "--model", m, "--out", m / "config.json", "--device", "cpu"],
                                  lambda m: ["bench", "--model", m, "--out", m / "tokenizer.md"]],
                         ids=["check-over-config", "bench-json-over-tokenizer"])
def test_a_report_over_a_file_of_the_model_is_refused_before_any_work(capsys, tmp_path, models, argv):
    """check and bench write their report (bench: and a .json beside it) after reading the model: over one of its
    files that would destroy it."""
    model = Path(shutil.copytree(models["tiny"], tmp_path / "m"))
    before = listing(model)
    one_line_error(capsys, argv(model), "would overwrite a file of the model folder")
    assert listing(model) == before


@pytest.fixture
def earlier_demo(tmp_path, models) -> Path:
    """A folder an earlier demo wrote (its mark, a pruned model) with a file of the user's beside them."""
    folder = tmp_path / "demo"
    shutil.copytree(models["tiny"], folder / "decode")
    (folder / "demo.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    return folder


DEMO = ["--tokens", "16", "--eval-prompts", "1", "--eval-new-tokens", "4", "--device", "cpu"]


@pytest.mark.parametrize("model", ["nope", "decode"])
def test_the_demo_checks_its_model_before_it_removes_an_earlier_demo(capsys, earlier_demo, model):
    """A missing model, or one read from the folder the demo would replace: one line, the earlier demo intact."""
    before = listing(earlier_demo)
    spec = earlier_demo / model if model == "decode" else model
    one_line_error(capsys, ["demo", "--model", spec, "--out", earlier_demo, *DEMO],
                   "would overwrite the input" if model == "decode" else "ModelNotFoundError")
    assert listing(earlier_demo) == before


def test_the_demo_replaces_an_earlier_demo_only_once_the_new_one_is_written(capsys, monkeypatch, earlier_demo, models):
    """A demo that fails while pruning leaves the earlier one as it was (and no OUT.partial); one that finishes
    replaces it whole. Pruning is stood in for by copies of the tiny model with a pruning record."""
    from sparsedecoding import pipeline
    from sparsedecoding.errors import CalibrationError

    def failing(config, progress=True):
        raise CalibrationError("stopped on purpose")

    def copying(config, progress=True):
        out = Path(shutil.copytree(models["tiny"], config.out))
        (out / pipeline.PRUNED_MANIFEST).write_text(json.dumps({"calibration": {"tokens": config.tokens or 16}}))
        return out

    before = listing(earlier_demo)
    monkeypatch.setattr(pipeline, "prune", failing)
    argv = ["demo", "--model", models["tiny"], "--out", earlier_demo, *DEMO]
    one_line_error(capsys, argv, "stopped on purpose")
    assert listing(earlier_demo) == before and not Path(f"{earlier_demo}.partial").exists()
    monkeypatch.setattr(pipeline, "prune", copying)
    assert main([str(part) for part in argv]) == 0
    assert sorted(path.name for path in earlier_demo.iterdir()) == ["decode", "demo.json", "text"]
    assert not Path(f"{earlier_demo}.partial").exists()


def partial_of(out: Path, kind: str) -> Path | None:
    """Put what an interrupted run (or a user) may leave at OUT.partial: a file, a link to a folder holding a file
    (returned: it must survive), or a dangling link."""
    partial = out.with_name(out.name + ".partial")
    if kind == "file":
        partial.write_text("left over")
        return None
    target = out.with_name("target")
    if kind == "link":
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    partial.symlink_to(target, target_is_directory=True)
    return target if kind == "link" else None


@pytest.mark.parametrize("kind", ["file", "link", "dangling"])
@pytest.mark.parametrize("command", ["prune", "pack", "eval"])
def test_a_file_or_link_at_out_partial_is_removed_never_followed(tmp_path, models, command, kind):
    out = tmp_path / "out"
    kept = partial_of(out, kind)
    argv = {"prune": ["prune", "--model", models["tiny"], *PRUNE], "pack": ["pack", "--model", models["2:4"]],
            "eval": ["eval", "--model", models["tiny"], *EVAL]}[command]
    assert main([str(part) for part in argv + ["--out", out]]) == 0
    assert out.is_dir() and not os.path.lexists(f"{out}.partial")
    if kept is not None:
        assert [path.name for path in kept.iterdir()] == ["keep.txt"]


def test_an_out_partial_that_cannot_be_removed_is_refused_before_any_work(capsys, monkeypatch, tmp_path, models):
    """A stale OUT.partial folder that will not go (a read-only folder inside it; root ignores permission bits, so
    the failure is stood in for) is one line before the model loads, not a FileExistsError after the work."""
    from sparsedecoding.evaluation import suite

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    def refusing(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    out = tmp_path / "out"
    (tmp_path / "out.partial" / "stuck").mkdir(parents=True)
    monkeypatch.setattr(suite, "load_model", no_loading)
    monkeypatch.setattr(shutil, "rmtree", refusing)
    one_line_error(capsys, ["eval", "--model", models["tiny"], "--out", out, *EVAL], "cannot remove")
    assert not out.exists()


def long_name(folder: Path, extra: int) -> Path:
    """A name `extra` bytes over what fits with `.partial` added (this filesystem's limit, usually 255)."""
    return folder / ("n" * (os.pathconf(folder, "PC_NAME_MAX") - len(".partial") + extra))


@pytest.mark.parametrize("extra, argv", [
    (1, lambda m, out: ["prune", "--model", m, *PRUNE, "--out", out]),
    (1, lambda m, out: ["pack", "--model", m, "--out", out]),
    (1, lambda m, out: ["eval", "--model", m, "--out", out, *EVAL]),
    (50, lambda m, out: ["prune", "--model", m, *PRUNE, "--out", out]),
    (50, lambda m, out: ["prune", "--model", m, *PRUNE, "--out", out / "sub"]),
    (50, lambda m, out: ["check", "--model", m, "--out", out]),
    (50, lambda m, out: ["bench", "--model", m, "--out", out]),
    (50, lambda m, out: ["compare", "--out", out, "--configs", "dense"]),
], ids=["prune", "pack", "eval", "prune-over", "prune-parent", "check", "bench", "compare"])
def test_a_name_too_long_is_one_line(capsys, tmp_path, models, extra, argv):
    """OUT.partial one byte over the limit, or a name (of OUT or of a folder above it) over it outright."""
    one_line_error(capsys, argv(models["2:4"], long_name(tmp_path, extra)), "OutputNotWritableError")
    assert list(tmp_path.iterdir()) == []


def test_the_longest_name_that_fits_with_partial_is_taken(tmp_path, models):
    out = long_name(tmp_path, 0)
    assert main(["pack", "--model", str(models["2:4"]), "--out", str(out)]) == 0
    assert (out / "packed.json").is_file() and [path.name for path in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("change", [dict(hidden_size=96), dict(num_hidden_layers=3), dict(vocab_size=160)])
def test_drift_refuses_models_of_other_shapes_before_loading_them(capsys, monkeypatch, tmp_path, models, change):
    from sparsedecoding.analysis import drift

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    other = make_tiny_model(tmp_path / "other", **change)  # a whole model of another shape
    config = json.loads((models["tiny"] / "config.json").read_text())
    monkeypatch.setattr(drift, "load_model", no_loading)
    key = next(iter(change))
    err = one_line_error(capsys, ["analyze", "drift", "--dense", models["tiny"], "--pruned", other, "--out",
                                  tmp_path / "out", *DRIFT], "DriftSettingsError")
    assert f"{key} {config[key]} vs {change[key]}" in err
    assert not (tmp_path / "out").exists()


# Each command's argv for an --out `o`, from the tiny model `t` and its 2:4 copy `p`.
OUT_COMMANDS = {
    "prune": lambda o, t, p: ["prune", "--model", t, "--out", o, *PRUNE, "--solver", "magnitude"],
    "pack": lambda o, t, p: ["pack", "--model", p, "--out", o],
    "eval": lambda o, t, p: ["eval", "--model", t, "--out", o, *EVAL],
    "drift": lambda o, t, p: ["analyze", "drift", "--dense", t, "--pruned", p, "--out", o, *DRIFT[:-1]],
}


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_an_out_through_a_missing_folder_and_dotdot_is_the_folder_it_lands_on(capsys, monkeypatch, tmp_path, models,
                                                                             command):
    """`missing/../keep`: making OUT.partial would create `missing`, and the rename at the end would land on `keep`.
    Checked as `keep`: it exists, so without --overwrite it is refused, untouched and with nothing created."""
    monkeypatch.chdir(tmp_path)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "data.txt").write_text("important")
    before = listing(tmp_path)
    one_line_error(capsys, OUT_COMMANDS[command]("missing/../keep", models["tiny"], models["2:4"]), "keep exists")
    assert listing(tmp_path) == before and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", OUT_COMMANDS)
@pytest.mark.parametrize("out", ["", ".", "/", "..", "sub/.."])
def test_an_out_that_names_no_folder_of_its_own_is_one_line(capsys, monkeypatch, tmp_path, models, command, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    before = listing(tmp_path)
    err = one_line_error(capsys, OUT_COMMANDS[command](out, models["tiny"], models["2:4"]), "--out ")
    assert "names no folder of its own" in err or out == "" and "--out is empty" in err, err  # pack: Path("") is .
    assert listing(tmp_path) == before


@pytest.mark.parametrize("command", OUT_COMMANDS)
@pytest.mark.parametrize("target", ["dangling", "folder"])
@pytest.mark.parametrize("given", ["link", "missing/../link"])
def test_an_out_that_is_a_symbolic_link_is_refused_before_any_work(capsys, monkeypatch, tmp_path, models, command,
                                                                   target, given):
    """The rename at the end cannot replace a link with a folder, nor --overwrite remove one: refused up front, the
    link and what it points to untouched."""
    monkeypatch.chdir(tmp_path)
    pointed = tmp_path / "pointed"
    if target == "folder":
        pointed.mkdir()
        (pointed / "data.txt").write_text("important")
    link = tmp_path / "link"
    link.symlink_to(pointed)
    before = listing(tmp_path)
    argv = OUT_COMMANDS[command](given, models["tiny"], models["2:4"])
    one_line_error(capsys, [*argv, "--overwrite"] if command != "drift" else argv, "is a symbolic link")
    assert listing(tmp_path) == before and not (tmp_path / "missing").exists()
