"""The demo's scores and its reading of them, on a tiny random model (no download)."""

from __future__ import annotations

import copy
import json

import torch

from helpers import char_tokenizer, prune_in_place, random_hf_model
from sparsedecoding.cli.demo import dense_answer_scores, what_it_shows
from sparsedecoding.generation import generate, tokenize_prompts


def greedy_answers(model, tokenizer):
    prompts = tokenize_prompts(tokenizer, ["def add(a, b):", "print('hi')", "x = [1, 2"])
    return generate(model, tokenizer, prompts, 12, batch_size=3, progress=False)


def test_a_model_agrees_with_itself_on_its_greedy_answers_and_pruning_moves_it_away():
    torch.manual_seed(0)
    dense, tokenizer = random_hf_model("llama"), char_tokenizer()
    answers = greedy_answers(dense, tokenizer)
    kl, agree = dense_answer_scores(dense, dense, answers, tokenizer.pad_token_id)
    assert abs(kl) < 1e-5 and agree == 1.0  # greedy tokens are the model's own top-1 choices
    pruned = copy.deepcopy(dense)
    prune_in_place(pruned, "2:4")
    kl, agree = dense_answer_scores(dense, pruned, answers, tokenizer.pad_token_id)
    assert kl > 1e-3 and 0.0 <= agree < 1.0


def row(agree: float, kl: float, ppl: float) -> dict:
    return {"agree": agree, "kl": kl, "ppl": ppl}


def test_the_summary_reads_the_numbers_and_says_when_decode_loses():
    wins = what_it_shows({"text": row(0.58, 1.5, 60.0), "decode": row(0.79, 0.5, 250.0)})
    assert "79%" in wins[0] and "58%" in wins[0] and "3.0x lower KL" in wins[0]
    assert "perplexity lower (60 vs 250)" in wins[1]
    loses = what_it_shows({"text": row(0.80, 0.4, 300.0), "decode": row(0.70, 0.6, 60.0)})
    assert loses == ["Here decode-time calibration did not beat text calibration on held-out prompts (agreement "
                     "70% vs 80%, KL 0.600 vs 0.400)."]


def test_the_demo_runs_on_a_tiny_model_without_warning_about_its_own_settings(tmp_path, caplog):
    """The text-calibrated run does not read the decode run's generation settings; the demo must not warn the
    newcomer about settings they never gave."""
    from sparsedecoding.cli import main
    from helpers import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    with caplog.at_level("WARNING"):
        assert main(["demo", "--model", str(tiny), "--out", str(tmp_path / "demo"), "--tokens", "16",
                     "--eval-prompts", "1", "--eval-new-tokens", "4", "--device", "cpu"]) == 0
    assert "does not read" not in caplog.text
    assert (tmp_path / "demo" / "text" / "sparsedecoding.json").is_file()
    for run in ("decode", "text"):  # the demo keeps SparseGPT (its settings were chosen with it), not prune's admm
        assert json.loads((tmp_path / "demo" / run / "sparsedecoding.json").read_text())["solver"] == "sparsegpt"


def test_the_demo_refuses_calibration_options_it_does_not_run(tmp_path, capsys):
    """The demo runs decode and text calibration itself: another source or its knobs get argparse's one error line
    instead of being taken and ignored; nothing is written."""
    import pytest

    from sparsedecoding.cli import main

    for option in (["--calibration", "self"], ["--mix-ratio", "0.3"], ["--self-meta", "8"]):
        with pytest.raises(SystemExit) as stopped:
            main(["demo", *option, "--out", str(tmp_path / "demo")])
        assert stopped.value.code == 2
        assert f"unrecognized arguments: {option[0]}" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
