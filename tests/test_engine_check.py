"""The correctness check's verdicts: ties, divergences, logit tolerance measured against transformers' own
rounding, and whole runs on a tiny model (passing, and failing once the engine's RoPE is off)."""

import re

import pytest
import torch
from helpers import char_tokenizer, prune_in_place, random_hf_model

from sparsedecoding.cli import main as cli_main
from sparsedecoding.engine import model as engine_model
from sparsedecoding.evaluation.engine_check import compare_logits, compare_tokens, run


def logits_with_gap(gap: float) -> torch.Tensor:
    """3 positions × 5 tokens; at position 2 token 3 leads token 4 by `gap`, at the others token 0 leads by 5."""
    logits = torch.zeros(3, 5)
    logits[:2, 0] = 5.0
    logits[2, 3], logits[2, 4] = 10.0, 10.0 - gap
    return logits


@pytest.fixture
def tiny_folder(tmp_path):
    random_hf_model("qwen2").save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    return tmp_path


@pytest.fixture
def pruned_folder(tmp_path):
    model = random_hf_model("qwen2")
    prune_in_place(model, "2:4")
    model.save_pretrained(tmp_path / "pruned")
    char_tokenizer().save_pretrained(tmp_path / "pruned")
    return tmp_path / "pruned"


def main(argv: list[str]) -> int:
    return cli_main(["check", *argv])


def test_divergence_after_a_tie_passes_and_after_a_clear_margin_fails():
    dense, sparse = torch.tensor([0, 0, 3]), torch.tensor([0, 0, 4])
    tie = compare_tokens(dense, sparse, logits_with_gap(0.1), logits_with_gap(-0.05))
    assert (tie.first_divergence, tie.tie, tie.passed) == (2, True, True)
    assert abs(tie.dense_gap - 0.1) < 1e-6 and abs(tie.max_abs_diff - 0.15) < 1e-6
    clear = compare_tokens(dense, sparse, logits_with_gap(1.0), logits_with_gap(1.0))
    assert (clear.tie, clear.passed) == (False, False)
    same = compare_tokens(dense, dense, logits_with_gap(1.0), logits_with_gap(1.0))
    assert same.passed and same.first_divergence is None and same.equal_fraction == 1.0


def test_a_gap_within_the_measured_rounding_shift_is_a_tie():
    dense, sparse = torch.tensor([0, 0, 3]), torch.tensor([0, 0, 4])
    wide = logits_with_gap(-2.0)  # in the wide dtype token 4 leads by 2: rounding moved the gap by 3
    moved = compare_tokens(dense, sparse, logits_with_gap(1.0), logits_with_gap(1.0), logits_with_gap(1.0), wide)
    assert abs(moved.rounding_shift - 3.0) < 1e-6 and moved.tie and moved.passed
    still = compare_tokens(dense, sparse, logits_with_gap(1.0), logits_with_gap(1.0), logits_with_gap(1.0),
                           logits_with_gap(0.9))
    assert abs(still.rounding_shift - 0.1) < 1e-6 and not still.passed


def test_logit_comparison_flags_large_differences_and_non_tie_misses():
    reference = logits_with_gap(1.0)
    assert compare_logits(reference + 0.01, reference).passed
    assert not compare_logits(reference + 1.0, reference).passed
    swapped = reference.clone()
    swapped[2, 3], swapped[2, 4] = 9.0, 10.0
    assert compare_logits(swapped, reference).unexplained_top1 == 1


def test_engine_error_is_judged_against_transformers_own_rounding_error():
    wide = logits_with_gap(1.0)
    noise = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25]).repeat(3, 1)
    reference = wide + noise  # transformers' own rounding: max error 1
    close = compare_logits(wide - 1.5 * noise, reference, wide)  # error 1.5, yet 2.5 from transformers' logits
    assert close.passed and not close.within_fixed_tolerance
    assert (close.engine_error, close.reference_error) == (1.5, 1.0)
    assert close.allowed_error == pytest.approx(2.0 + torch.finfo(torch.bfloat16).eps * 10.0)
    far = compare_logits(wide + 2.2 * noise, reference, wide)
    assert not far.passed and far.engine_error == pytest.approx(2.2)
    assert compare_logits(wide, wide, wide).passed  # no rounding at all: the slack alone


def test_check_run_reports_passes_on_a_tiny_pruned_model(pruned_folder):
    report = run(pruned_folder, ["hello world"], 10, torch.device("cpu"), compile=False, checks=["logits", "tokens"])
    assert "## Dense engine vs transformers" in report and "## Sparse engine vs dense engine" in report
    assert "| NO |" not in report


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.slow
def test_check_fails_an_engine_whose_rope_is_off_by_ten_percent(tiny_folder, monkeypatch, dtype):
    prompts = ["hello world", "abc"]
    report = run(tiny_folder, prompts, 10, torch.device("cpu"), compile=False, checks=["logits"], dtype=dtype)
    assert report.count("| yes |\n") == 2 and "| NO |" not in report
    exact = engine_model.rope_frequencies
    monkeypatch.setattr(engine_model, "rope_frequencies", lambda args: 1.1 * exact(args))
    report = run(tiny_folder, prompts, 10, torch.device("cpu"), compile=False, checks=["logits"], dtype=dtype)
    assert report.count("| NO |\n") == 2


def test_check_without_the_wide_reference_uses_the_fixed_rule(tiny_folder):
    report = run(tiny_folder, ["hello world"], 10, torch.device("cpu"), compile=False, checks=["logits"],
                 wide_reference=False)
    assert "reference: none (fixed rule)" in report and "Pass (fixed rule)" in report and "| NO |" not in report


@pytest.mark.slow
def test_command_line_passes_the_dtype_and_the_reference_choice(tiny_folder, tmp_path):
    out = tmp_path / "report.md"
    common = ["--model", str(tiny_folder), "--checks", "logits", "--new-tokens", "4", "--device", "cpu", "--out",
              str(out)]
    assert main([*common, "--dtype", "float32"]) == 0
    assert "- weights: float32;" in out.read_text() and "transformers in float32 and float64" in out.read_text()
    assert main([*common, "--no-wide-reference"]) == 0
    assert "- weights: bfloat16;" in out.read_text() and "Pass (fixed rule)" in out.read_text()


@pytest.mark.parametrize("pruned,extra,message", [
    (False, [], "no block linear of .* is N:M sparse"),  # an unpruned model has nothing to pack
    (True, ["--dtype", "float32"], "float32"),  # packed linears need a 16-bit dtype
])
def test_a_tokens_check_it_cannot_run_is_one_line_and_writes_nothing(tiny_folder, pruned_folder, tmp_path, capsys,
                                                                      pruned, extra, message):
    out = tmp_path / "report.md"
    model = pruned_folder if pruned else tiny_folder
    assert main(["--model", str(model), "--new-tokens", "4", "--device", "cpu", "--out", str(out), *extra]) == 2
    stderr = capsys.readouterr().err.strip().splitlines()  # transformers' loading bars come first
    errors = [line for line in stderr if line.startswith("error:")]
    assert errors == stderr[-1:] and errors[0].startswith("error: EngineError") and re.search(message, errors[0])
    assert not out.exists()


def test_a_failed_check_exits_1_with_its_report_and_a_line_saying_so(tiny_folder, monkeypatch, tmp_path, capsys):
    """A script or CI must see a failed check in the exit status: the report is still printed and written, then one
    stderr line counts the rows that did not pass."""
    exact = engine_model.rope_frequencies
    monkeypatch.setattr(engine_model, "rope_frequencies", lambda args: 1.1 * exact(args))
    out = tmp_path / "report.md"
    assert main(["--model", str(tiny_folder), "--checks", "logits", "--new-tokens", "4", "--device", "cpu",
                 "--prompt", "hello world", "--prompt", "abc", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "| NO |" in captured.out and "| NO |" in out.read_text()
    assert captured.err.strip().splitlines()[-1] == "check failed: 2 rows of the report did not pass"
    report, failed = run(tiny_folder, ["abc"], 4, torch.device("cpu"), compile=False, checks=["logits"], verdict=True)
    assert failed == 1 and "| NO |" in report
    monkeypatch.setattr(engine_model, "rope_frequencies", exact)
    assert run(tiny_folder, ["abc"], 4, torch.device("cpu"), compile=False, checks=["logits"], verdict=True)[1] == 0
