import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sparsedecoding import compare
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.compare import CompareSettings, run_compare, select
from sparsedecoding.errors import (ModelNotFoundError, OutputNotWritableError, PromptsError, SandboxError,
                                   SparseDecodingError, SparsityPatternError)
from sparsedecoding.evaluation.suite import EvalSettings
from helpers import make_tiny_model

CONFIGS = ["dense", "decode-sparsegpt-2of4", "text-wanda-50pct", "small-cross-sparsegpt-50pct"]


def test_select_filters_by_glob_and_rejects_globs_that_match_nothing():
    assert [config.name for config in select(["*-seq"])] == [
        "text-sparsegpt-2of4-seq", "decode-sparsegpt-2of4-seq", "text-sparsegpt-50pct-seq",
        "decode-sparsegpt-50pct-seq"]
    assert {config.role for config in select(["small-*"])} == {"small"}
    with pytest.raises(SparseDecodingError, match="matches no configuration"):
        select(["dense", "bogus-*"])


@pytest.fixture
def settings(tmp_path):
    make_tiny_model(tmp_path / "main", seed=0)
    make_tiny_model(tmp_path / "small", arch="qwen2", seed=1, hidden_size=32, intermediate_size=64)
    calib = tmp_path / "calib.txt"
    calib.write_text("write a function\nreverse a string\ncount the words\nsort a list\nadd two numbers\n")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("def f(x):\nprint hello\nmultiply a and b\n")
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    return CompareSettings(
        model=str(tmp_path / "main"), small_model=str(tmp_path / "small"), out=str(tmp_path / "report"),
        calib_prompts=str(calib), text=str(text), tokens=40, max_new_tokens=16, gen_batch_size=8, device="cpu",
        evaluation=EvalSettings(metrics=("kl", "repetition"), prompts=str(heldout), max_new_tokens=8,
                                gen_batch_size=8))


@pytest.mark.slow
def test_compare_runs_the_grid_with_equal_budgets_and_resumes(settings, monkeypatch):
    report = run_compare(settings, CONFIGS)
    folder = report.parent
    results = {name: json.loads((folder / "configs" / f"{name}.json").read_text()) for name in CONFIGS}
    assert results["dense"]["metrics"]["kl"] == 0.0 and results["dense"]["pruning"] is None
    for name in CONFIGS[1:]:
        assert results[name]["metrics"]["kl"] > 0
        assert results[name]["pruning"]["calibration"]["tokens"] == 40  # the same budget for every source
    assert results["text-wanda-50pct"]["pruning"]["pattern"] == "50%"
    assert results["decode-sparsegpt-2of4"]["pruning"]["max_relative_error"] > 0

    # The cross-model set: the main model's continuations, in the small model's tokens.
    cross = CalibrationSet.load(folder / "calibration" / "small-cross.safetensors")
    stats = json.loads((folder / "calibration" / "small-cross.json").read_text())
    assert cross.tokens == 40 and stats["generated_by"] == settings.model
    table = report.read_text()
    assert all(f"| {name} |" in table for name in CONFIGS)

    # A second run finds every result and prunes nothing; the report is rebuilt.
    monkeypatch.setattr(compare, "pruned_copy", lambda *args: pytest.fail("a finished configuration ran again"))
    assert run_compare(settings, CONFIGS).read_text() == table

    # The figures are drawn from quality.json, one per model role.
    pytest.importorskip("matplotlib")
    from sparsedecoding.analysis.plots import redraw

    assert [path.name for path in redraw(folder)] == ["quality-main.png", "quality-small.png"]
    assert (folder / "quality-main.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_setting_added_later_counts_as_its_default_in_an_older_folder(settings):
    run_compare(settings, ["dense"])
    settings_file = Path(settings.out) / "settings.json"
    stored = json.loads(settings_file.read_text())
    del stored["mix_ratio"]  # as written before the mix source existed
    settings_file.write_text(json.dumps(stored))
    run_compare(settings, ["dense"])  # same settings: accepted
    settings.mix_ratio = 0.25
    with pytest.raises(SparseDecodingError, match="mix_ratio"):
        run_compare(settings, ["dense"])


@pytest.mark.parametrize("steps,accepted", [(0, True), (5, False)])
def test_a_removed_setting_in_an_older_folder_counts_only_at_its_off_value(settings, steps, accepted):
    run_compare(settings, ["dense"])
    settings_file = Path(settings.out) / "settings.json"
    stored = json.loads(settings_file.read_text())
    settings_file.write_text(json.dumps({**stored, "refine_steps": steps, "refine_lr": 1e-5}))
    if accepted:
        run_compare(settings, ["dense"])
    else:
        with pytest.raises(SparseDecodingError, match="refine_steps=5"):
            run_compare(settings, ["dense"])


def test_a_report_folder_refuses_other_settings(settings):
    run_compare(settings, ["dense"])
    settings.tokens = 80
    with pytest.raises(SparseDecodingError, match="tokens"):
        run_compare(settings, ["dense"])


def test_the_compare_command_lists_the_grid(capsys):
    from sparsedecoding.cli import main

    assert main(["compare", "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert names == [config.name for config in select(None)] and len(names) == len(set(names)) == 22


def test_pruning_a_copy_leaves_the_dense_model_untouched(tmp_path):
    from sparsedecoding.calibration import text_calibration
    from sparsedecoding.compare import GridConfig, pruned_copy, prune_config
    from sparsedecoding.models import load_model

    dense, tokenizer, folder = load_model(make_tiny_model(tmp_path / "main"))
    before = {name: weight.clone() for name, weight in dense.state_dict().items()}
    calib = text_calibration(tokenizer, "Some calibration text for a tiny model. " * 20, token_budget=64, seq_len=32)
    settings = CompareSettings(model=str(folder), out=str(tmp_path / "report"), tokens=64)
    config = prune_config(settings, GridConfig("text-sparsegpt-2of4", "main", "text"), folder)
    pruned, outcome = pruned_copy(dense, calib, config)
    assert all(torch.equal(weight, before[name]) for name, weight in dense.state_dict().items())
    q = pruned.model.layers[0].self_attn.q_proj.weight
    assert (q.reshape(q.shape[0], -1, 4) != 0).sum(-1).max() == 2  # 2:4 in every group
    assert len(outcome["layers"]) == 2 * 7


def test_text_and_mix_get_as_many_tokens_as_decode_produced(settings):
    settings.tokens = 10_000  # far more than 5 prompts x 15 decode steps can give
    folder = run_compare(settings, ["decode-sparsegpt-2of4", "text-sparsegpt-2of4", "mix-sparsegpt-2of4"]).parent
    tokens = {name: json.loads((folder / "configs" / f"{name}.json").read_text())["pruning"]["calibration"]["tokens"]
              for name in ("decode-sparsegpt-2of4", "text-sparsegpt-2of4", "mix-sparsegpt-2of4")}
    assert tokens["decode-sparsegpt-2of4"] < 10_000
    assert len(set(tokens.values())) == 1


def no_model_loading(*args, **kwargs):
    pytest.fail("a model was loaded before every input was checked")


@pytest.mark.parametrize("field,configs,error", [
    ("model", ["dense"], ModelNotFoundError),
    ("model", ["small-cross-sparsegpt-2of4"], ModelNotFoundError),  # the cross set needs the main model
    ("small_model", ["dense", "small-dense"], ModelNotFoundError),
    ("calib_prompts", ["dense", "decode-sparsegpt-2of4"], PromptsError),
    ("text", ["dense", "text-wanda-50pct"], PromptsError),
    ("evaluation.prompts", ["dense"], PromptsError),
])
def test_bad_input_is_refused_before_any_model_is_loaded_or_anything_written(settings, tmp_path, monkeypatch, field,
                                                                            configs, error):
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    missing = str(tmp_path / "missing.txt")
    if field == "evaluation.prompts":
        settings.evaluation = replace(settings.evaluation, prompts=missing)
    else:
        setattr(settings, field, missing)
    with pytest.raises(error, match="missing.txt"):
        run_compare(settings, configs)
    assert not Path(settings.out).exists()


def test_a_pattern_the_model_does_not_fit_is_refused_before_any_work(settings, tmp_path, monkeypatch):
    settings.model = str(make_tiny_model(tmp_path / "odd", intermediate_size=66))  # down_proj: 66 columns
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    with pytest.raises(SparsityPatternError, match="down_proj has 66"):
        run_compare(settings, ["dense", "decode-wanda-2of4"])
    assert not Path(settings.out).exists()


def test_the_sandbox_of_pass_at_1_is_checked_before_any_work(settings, monkeypatch):
    from sparsedecoding.evaluation import sandbox

    settings.evaluation = replace(settings.evaluation, metrics=("pass@1", "kl"))
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    with pytest.raises(SandboxError, match="needs root"):
        run_compare(settings, ["dense"])
    assert not Path(settings.out).exists()


@pytest.mark.parametrize("out", ["/sys/q", "FILE/q", "FILE", "/proc", ""])
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(settings, tmp_path, monkeypatch, out):
    monkeypatch.chdir(tmp_path)  # where an empty --out would write
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    settings.out = out.replace("FILE", str(tmp_path / "file"))
    with pytest.raises(OutputNotWritableError if out else SparseDecodingError, match="--out"):
        run_compare(settings, ["dense"])
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("which", ["model", "small_model"])
def test_a_report_folder_that_is_a_model_folder_is_refused_before_any_work(settings, monkeypatch, which):
    """The report folder gains settings.json, configs/ and calibration/: never in a model's own folder, nor in a
    folder that holds one."""
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    for out in (getattr(settings, which), str(Path(getattr(settings, which)).parent)):
        before = sorted(Path(out).rglob("*"))
        settings.out = out
        with pytest.raises(OutputNotWritableError, match="would overwrite the input"):
            run_compare(settings, ["dense", "small-dense"])
        assert sorted(Path(out).rglob("*")) == before


@pytest.mark.parametrize("file,text", [
    ("settings.json", ""), ("settings.json", "[]"), ("settings.json", "{"),
    ("configs/dense.json", "{}"), ("configs/dense.json", "[]"), ("calibration/main-decode.json", ""),
])
def test_a_report_folder_with_a_broken_file_is_refused_naming_it(settings, monkeypatch, file, text):
    out = Path(settings.out)
    for sub in ("calibration", "configs"):
        (out / sub).mkdir(parents=True)
    (out / "settings.json").write_text(json.dumps(settings.comparable()))
    (out / file).write_text(text)
    before = sorted(out.rglob("*"))
    monkeypatch.setattr(compare, "load_model", no_model_loading)
    with pytest.raises(SparseDecodingError, match=re.escape(str(out / file)) + ".*(use another --out|delete it)"):
        run_compare(settings, ["dense", "decode-sparsegpt-2of4"])
    assert sorted(out.rglob("*")) == before


@pytest.mark.parametrize("configs", ["", ",", " , "])
def test_the_compare_command_refuses_an_empty_selection(tmp_path, capsys, configs):
    from sparsedecoding.cli import main

    out = tmp_path / "report"
    assert main(["compare", "--configs", configs, "--model", str(tmp_path / "missing"), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: SparseDecodingError: --configs names no configuration") and error.count("\n") == 1
    assert not out.exists()


def stored_result(name: str, calibration, harness=None, kl=0.5) -> dict:
    result = {"name": name, "config": {"role": "main", "calibration": calibration}, "pruning": None,
              "metrics": {"kl": kl, "pass@1": 0.25},
              "environment": {"date": "2026-12-05", "device": "CPU", "versions": {"torch": "x"}}}
    return result if harness is None else {**result, "harness": harness}


def test_the_report_marks_results_of_an_older_harness_and_non_finite_metrics(settings, caplog):
    from sparsedecoding.evaluation.suite import HARNESS_VERSION
    from sparsedecoding.runenv import write_json

    report = compare.Report(settings)
    report.create()
    write_json(report.result_file("dense"), stored_result("dense", None, harness=HARNESS_VERSION))
    write_json(report.result_file("decode-sparsegpt-2of4"),
               stored_result("decode-sparsegpt-2of4", "decode", harness=HARNESS_VERSION, kl=float("nan")))
    text = compare.write_report(report).read_text()
    assert "older harness" not in text
    assert re.search(r"\| decode-sparsegpt-2of4 \| decode \|.*\| n/a \|", text)  # NaN was stored as null
    json.loads((Path(settings.out) / "quality.json").read_text(), parse_constant=pytest.fail)

    write_json(report.result_file("text-sparsegpt-2of4"), stored_result("text-sparsegpt-2of4", "text"))
    text = compare.write_report(report).read_text()
    assert "## Results of an older harness" in text
    assert f"1 of 3 results (text-sparsegpt-2of4) were evaluated by an older harness than version " \
           f"{HARNESS_VERSION} (not recorded (before the fiftieth session): 1, version {HARNESS_VERSION}: 2" in text
    with caplog.at_level("WARNING"):
        run_compare(settings, ["dense", "decode-sparsegpt-2of4", "text-sparsegpt-2of4"])  # all done: nothing runs
    assert "text-sparsegpt-2of4 were evaluated by an older harness" in caplog.text


def test_calibrating_on_the_split_pass_at_1_scores_is_refused(settings):
    from sparsedecoding.data import shares_problems

    assert shares_problems("humaneval:all", "eval") and shares_problems("humaneval:calib", "dev")
    assert not shares_problems("humaneval:calib", "eval") and not shares_problems("humaneval:fit", "dev")
    assert not shares_problems("prompts.txt", "eval")
    with pytest.raises(SparseDecodingError, match="--calib-prompts humaneval:eval holds problems of the split"):
        replace(settings, calib_prompts="humaneval:eval").validate()
    replace(settings, calib_prompts="humaneval:eval", evaluation=replace(settings.evaluation, split="dev")).validate()


def test_the_report_names_a_solver_order_or_refit_away_from_the_default(settings):
    from sparsedecoding.evaluation.suite import HARNESS_VERSION
    from sparsedecoding.runenv import write_json

    for changes, expected, absent in (({}, "SparseGPT damping 0.01. ", "refit"),
                                      ({"solver_order": "hessian", "refit_steps": 10},
                                       "SparseGPT damping 0.01, columns in the hessian order, kept weights refit by "
                                       "10 steps. ", None)):
        changed = replace(settings, out=str(Path(settings.out) / str(len(changes))), **changes)
        report = compare.Report(changed)
        report.create()
        write_json(report.result_file("dense"), stored_result("dense", None, harness=HARNESS_VERSION))
        text = compare.write_report(report).read_text()
        assert expected in text
        assert absent is None or absent not in text
