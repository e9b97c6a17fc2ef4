"""`--calibration-from`: a pruned folder keeps the tokens it was calibrated on (calibration/set.safetensors, out of
the model loaders' *.safetensors), and a later run prunes from that very set instead of drawing a new one (GPU
sampling does not redraw a set bit for bit): no generation, the same tokens, its record named; bad sources are one
error line before any model loads."""

import json

import pytest
import torch

from sparsedecoding import pipeline
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.cli import main
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.pipeline import prune
from sparsedecoding.settings import CALIBRATION_FILE
import test_pipeline
from test_pipeline import config, weights

tiny_folder, prompts_file = test_pipeline.tiny_folder, test_pipeline.prompts_file


def test_a_run_killed_while_copying_the_reused_set_resumes(tiny_folder, prompts_file, tmp_path, monkeypatch):
    """The reused set is written to the work folder whole or not at all: a run killed half-way through that write
    leaves nothing a resume would stop on."""
    first = prune(config(tiny_folder, tmp_path / "first", prompts_file, solver="sparsegpt"), progress=False)
    save = CalibrationSet.save

    def killed_half_way(self, path):
        save(self, path)
        path = str(path)
        with open(path, "r+b") as handle:
            handle.truncate(len(open(path, "rb").read()) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(CalibrationSet, "save", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        prune(config(tiny_folder, tmp_path / "second", prompts_file, solver="sparsegpt", calibration_from=str(first)),
              progress=False)
    monkeypatch.setattr(CalibrationSet, "save", save)
    second = prune(config(tiny_folder, tmp_path / "second", prompts_file, solver="sparsegpt",
                          calibration_from=str(first)), progress=False)
    a, b = CalibrationSet.load(first / CALIBRATION_FILE), CalibrationSet.load(second / CALIBRATION_FILE)
    assert torch.equal(a.input_ids, b.input_ids)


def test_a_second_run_prunes_from_the_first_runs_tokens(tiny_folder, prompts_file, tmp_path, monkeypatch):
    first = prune(config(tiny_folder, tmp_path / "first", prompts_file, solver="sparsegpt"), progress=False)
    kept = first / CALIBRATION_FILE
    assert kept.is_file() and not (first / "calibration.safetensors").exists()
    record = json.loads((first / "sparsedecoding.json").read_text())["calibration"]
    assert record["file"] == CALIBRATION_FILE
    monkeypatch.setattr(pipeline, "build_calibration", lambda *a, **k: pytest.fail("a reused set is not redrawn"))
    second = prune(config(tiny_folder, tmp_path / "second", prompts_file, solver="sparsegpt",
                          calibration_from=str(first)), progress=False)
    a, b = CalibrationSet.load(kept), CalibrationSet.load(second / CALIBRATION_FILE)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.keep, b.keep)
    again = json.loads((second / "sparsedecoding.json").read_text())["calibration"]
    assert again["from"] == str(kept) and again["tokens"] == record["tokens"]
    assert again["from_record"]["prompts_hash"] == record["prompts_hash"]
    assert all(torch.equal(weights(first)[key], tensor) for key, tensor in weights(second).items())  # same solve
    third = prune(config(tiny_folder, tmp_path / "third", prompts_file, solver="wanda", calibration_from=str(kept)),
                  progress=False)  # the file itself, another solver
    assert "from_record" in json.loads((third / "sparsedecoding.json").read_text())["calibration"]
    missing = tmp_path / "no-such-file.jsonl"
    unread = pipeline.unread_options(config(tiny_folder, tmp_path / "x", missing, calibration_from=str(first),
                                            tokens=99, max_new_tokens=7))
    assert {"tokens", "max_new_tokens", "prompts"} <= set(unread)
    prune(config(tiny_folder, tmp_path / "fourth", missing, solver="wanda", calibration_from=str(first)),
          progress=False)  # a prompt file it never reads is not opened


def test_a_source_without_a_set_fails_in_one_line_before_loading(tiny_folder, prompts_file, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    ids = torch.zeros(1, 4, dtype=torch.long)
    CalibrationSet(ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool), "decode").save(
        tmp_path / "foreign.safetensors")
    for source in (tmp_path / "empty", tmp_path / "none.safetensors", prompts_file):
        with pytest.raises(SparseDecodingError, match="--calibration-from .*: no calibration set there"):
            config(tiny_folder, tmp_path / "out", prompts_file, calibration_from=str(source)).check_values()
    with pytest.raises(SparseDecodingError, match="--calibration text would draw new ones"):  # one source only
        config(tiny_folder, tmp_path / "out", prompts_file, calibration="text",
               calibration_from=str(tmp_path / "foreign.safetensors")).check_values()
    assert main(["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "out"),
                 "--calibration-from", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: CalibrationError: --calibration-from")
    assert not (tmp_path / "out").exists()


def test_a_foreign_or_damaged_set_fails_in_one_line_and_leaves_nothing(tiny_folder, prompts_file, tmp_path):
    ids = torch.full((1, 4), 10**6)  # past any tiny vocabulary
    CalibrationSet(ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool), "decode").save(
        tmp_path / "foreign.safetensors")
    with pytest.raises(SparseDecodingError, match="past this model's vocabulary"):
        prune(config(tiny_folder, tmp_path / "a", prompts_file, calibration_from=str(tmp_path / "foreign.safetensors")),
              progress=False)
    (tmp_path / "damaged.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SparseDecodingError, match="not a calibration set"):
        prune(config(tiny_folder, tmp_path / "b", prompts_file, calibration_from=str(tmp_path / "damaged.safetensors")),
              progress=False)
    assert not any(path.name.startswith(("a", "b")) for path in tmp_path.iterdir())


def test_a_file_that_is_no_set_is_refused_before_the_model_loads(tiny_folder, prompts_file, tmp_path, monkeypatch):
    """A model's own weights file given by mistake: a safetensors file, but no calibration set, refused before the
    (possibly long) model load."""
    from sparsedecoding import pipeline

    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    with pytest.raises(SparseDecodingError, match="not a calibration set"):
        prune(config(tiny_folder, tmp_path / "out", prompts_file,
                     calibration_from=str(tiny_folder / "model.safetensors")), progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
