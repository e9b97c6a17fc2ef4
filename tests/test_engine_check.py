"""The correctness check's verdicts: ties, divergences, logit tolerance, and a whole run on a tiny pruned model."""

import torch
from test_engine import random_hf_model
from tiny_models import char_tokenizer

from sparsedecoding.engine.check import compare_logits, compare_tokens, run
from sparsedecoding.patterns import SparsityPattern


def logits_with_gap(gap: float) -> torch.Tensor:
    """3 positions × 5 tokens; at position 2 token 3 leads token 4 by `gap`, at the others token 0 leads by 5."""
    logits = torch.zeros(3, 5)
    logits[:2, 0] = 5.0
    logits[2, 3], logits[2, 4] = 10.0, 10.0 - gap
    return logits


def test_divergence_after_a_tie_passes_and_after_a_clear_margin_fails():
    dense, sparse = torch.tensor([0, 0, 3]), torch.tensor([0, 0, 4])
    tie = compare_tokens(dense, sparse, logits_with_gap(0.1), logits_with_gap(-0.05))
    assert (tie.first_divergence, tie.tie, tie.passed) == (2, True, True)
    assert abs(tie.dense_gap - 0.1) < 1e-6 and abs(tie.max_abs_diff - 0.15) < 1e-6
    clear = compare_tokens(dense, sparse, logits_with_gap(1.0), logits_with_gap(1.0))
    assert (clear.tie, clear.passed) == (False, False)
    same = compare_tokens(dense, dense, logits_with_gap(1.0), logits_with_gap(1.0))
    assert same.passed and same.first_divergence is None and same.equal_fraction == 1.0


def test_logit_comparison_flags_large_differences_and_non_tie_misses():
    reference = logits_with_gap(1.0)
    assert compare_logits(reference + 0.01, reference).passed
    assert not compare_logits(reference + 1.0, reference).passed
    swapped = reference.clone()
    swapped[2, 3], swapped[2, 4] = 9.0, 10.0
    assert compare_logits(swapped, reference).unexplained_top1 == 1


def test_check_run_reports_passes_on_a_tiny_pruned_model(tmp_path):
    random_hf_model("qwen2").save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    report = run(tmp_path, SparsityPattern.parse("2:4"), ["hello world"], 10, torch.device("cpu"), compile=False,
                 checks=["logits", "tokens"])
    assert "## Dense engine vs transformers" in report and "## Sparse engine vs dense engine" in report
    assert "| NO |" not in report
