import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from sparsedecoding.errors import OutputExistsError, SparseDecodingError
from sparsedecoding.evaluation.humaneval import build_program, check_completions, extract_code, pass_at_1
from sparsedecoding.evaluation.metrics import (distinct_n, longest_repeated_ngram, on_policy_scores, perplexity,
                                               repetition_summary)
from sparsedecoding.evaluation.sandbox import SandboxLimits
from sparsedecoding.evaluation.suite import HARNESS_VERSION, EvalSettings, run_eval
from sparsedecoding.generation import Generation
from sparsedecoding.models import load_model

PROBLEM = {
    "task_id": "Toy/0",
    "prompt": "import math\n\n\ndef double(x):\n    return 2 * x\n\n\ndef hypot_double(a: float, b: float) -> float:\n"
              "    \"\"\"Twice the hypotenuse.\"\"\"\n",
    "entry_point": "hypot_double",
    "test": "def check(candidate):\n    assert candidate(3, 4) == 10\n    assert candidate(0, 0) == 0\n",
}
LIMITS = SandboxLimits(timeout_s=2.0, memory_mb=256)


# --- HumanEval programs -------------------------------------------------------------------------------------------

def test_extract_code_prefers_the_block_defining_the_entry_point():
    answer = "Usage:\n```python\nprint(f(1))\n```\nSolution:\n```python\ndef f(x):\n    return x\n```\n"
    assert extract_code(answer, "f") == "def f(x):\n    return x\n"
    assert extract_code("```py\nx = 1\n```", "f") == "x = 1\n"
    assert extract_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"  # cut off
    assert extract_code("    return x\n", "f") == "    return x\n"  # no block: the text is the code


@pytest.mark.parametrize("completion, passes", [
    # A chat answer with the whole function (helpers and imports come from the prompt).
    ("Sure!\n```python\ndef hypot_double(a, b):\n    return double(math.hypot(a, b))\n```\nIt works.", True),
    # A body that continues the prompt.
    ("    return double(math.hypot(a, b))\n", True),
    ("```python\ndef hypot_double(a, b):\n    return a + b\n```", False),
    ("```python\ndef something_else():\n    return 1\n```", False),  # the stub returns None: tests fail
    # Answers whose code a plain reading misses (the plain wording asks for no fence).
    ("1. The function:\n\n    ```python\n    def hypot_double(a, b):\n        return double(math.hypot(a, b))\n"
     "    ```\n", True),  # a fence indented under a list item
    ("~~~python\ndef hypot_double(a, b):\n    return double(math.hypot(a, b))\n~~~\n", True),
    ("Here is the function:\n\ndef hypot_double(a, b):\n    return double(math.hypot(a, b))\n\n"
     "This doubles the hypotenuse.\n", True),  # no fence, prose around the code
    ("Here is the function:\n\ndef hypot_double(a, b):\n    return a + b\n\nThis adds them.\n", False),
    # A closing fence short of a backtick (2:4-pruned Qwen under the plain wording): the code before it is read.
    ("Here it is:\n```python\ndef hypot_double(a, b):\n    return double(math.hypot(a, b))\n``", True),
    ("```python\ndef hypot_double(a, b):\n    return double(math.hypot(a, b))\n  `\n\n", True),
    ("```python\ndef hypot_double(a, b):\n    return a + b\n``", False),
    ("I cannot write this function.", False),
])
def test_programs_pass_exactly_when_the_answer_is_right(completion, passes):
    (result,) = check_completions([PROBLEM], [completion], LIMITS)
    assert result.passed is passes
    assert result.task_id == "Toy/0" and result.completion == completion


def test_a_program_ends_with_the_tests_and_the_check_call():
    program = build_program(PROBLEM, "```python\ndef hypot_double(a, b):\n    return 0\n```")
    assert program.startswith(PROBLEM["prompt"])
    assert program.endswith(PROBLEM["test"] + "\n\ncheck(hypot_double)\n")
    assert pass_at_1(check_completions([PROBLEM] * 4, ["    return 10.0\n", "    return 0\n"] * 2, LIMITS)) == 0.0


@pytest.mark.integration
@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes_in_the_sandbox(cache_dir):
    from sparsedecoding.data import humaneval_problems

    problems = humaneval_problems("all")
    as_chat = ["```python\n" + p["prompt"] + p["canonical_solution"] + "```" for p in problems]
    results = check_completions(problems, as_chat)
    assert [r.task_id for r in results if not r.passed] == []


# --- On-policy KL and NLL -----------------------------------------------------------------------------------------

class Bigram(torch.nn.Module):
    """logits of the next token = table[current token]: a model whose distributions are known by hand."""

    def __init__(self, table: list[list[float]]):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


def softmax(row: list[float]) -> list[float]:
    total = sum(math.exp(value) for value in row)
    return [math.exp(value) / total for value in row]


def test_kl_and_nll_match_a_hand_computation_on_a_tiny_vocabulary():
    dense_table = [[0.0, 1.0, 2.0], [1.0, 0.0, -1.0], [0.5, 0.5, 3.0]]
    pruned_table = [[0.0, 0.0, 0.0], [2.0, 0.0, 1.0], [0.5, 0.5, 3.0]]
    dense, pruned = Bigram(dense_table), Bigram(pruned_table)
    # Prompt [0, 1] then the pruned model wrote [2, 0]: token 2 is predicted from 1, token 0 from 2.
    generations = [Generation([0, 1], [2, 0], stopped=False), Generation([2], [1], stopped=True)]
    scores = on_policy_scores(dense, pruned, generations, pad_id=0, batch_size=2)

    def kl(prev: int) -> float:
        p, q = softmax(dense_table[prev]), softmax(pruned_table[prev])
        return sum(pv * (math.log(pv) - math.log(qv)) for pv, qv in zip(p, q))

    def nll(prev: int, token: int) -> float:
        return -math.log(softmax(dense_table[prev])[token])

    assert scores[0].tokens == 2 and scores[1].tokens == 1
    assert scores[0].kl == pytest.approx(kl(1) + kl(2), rel=1e-5)
    assert scores[1].kl == pytest.approx(kl(2), abs=1e-6)  # identical rows: zero
    assert scores[0].dense_nll == pytest.approx(nll(1, 2) + nll(2, 0), rel=1e-5)
    assert scores[1].dense_nll == pytest.approx(nll(2, 1), rel=1e-5)


def test_an_answer_with_no_tokens_scores_nothing():
    dense, pruned = Bigram([[0.0, 1.0, 2.0]] * 3), Bigram([[2.0, 0.0, 1.0]] * 3)
    scores = on_policy_scores(dense, pruned, [Generation([0, 1, 2], [], stopped=False),
                                              Generation([0, 1], [2, 0, 1], stopped=False)], pad_id=0)
    assert (scores[0].kl, scores[0].dense_nll, scores[0].tokens) == (0.0, 0.0, 0)
    assert scores[1].tokens == 3 and scores[1].kl > 0


def random_generations(count: int, seed: int) -> list[Generation]:
    rng = random.Random(seed)
    return [Generation([rng.randrange(4, 100) for _ in range(rng.randint(1, 9))],
                       [rng.randrange(4, 100) for _ in range(rng.randint(1, 12))], stopped=False)
            for _ in range(count)]


def test_kl_is_zero_for_identical_models_and_batching_does_not_change_scores(tiny_pair):
    dense, _, _ = load_model(tiny_pair / "dense")
    other, _, _ = load_model(tiny_pair / "other")
    generations = random_generations(7, seed=3)
    assert all(score.kl == 0.0 for score in on_policy_scores(dense, dense, generations, pad_id=0, batch_size=4))
    batched = on_policy_scores(dense, other, generations, pad_id=0, batch_size=4)
    one_by_one = on_policy_scores(dense, other, generations, pad_id=0, batch_size=1)
    assert all(score.kl > 0 for score in batched)
    for a, b in zip(batched, one_by_one):
        assert a.kl == pytest.approx(b.kl, rel=1e-4) and a.dense_nll == pytest.approx(b.dense_nll, rel=1e-4)


# --- Perplexity and repetition ------------------------------------------------------------------------------------

def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    uniform = Bigram([[0.0] * 5 for _ in range(5)])
    ppl, tokens = perplexity(uniform, [1, 2, 3, 4, 0] * 5 + [1], window=4, batch_size=3)
    assert ppl == pytest.approx(5.0, rel=1e-6)
    assert tokens == 26 - 7  # 7 windows (the last one of 2 tokens), each window's first token is context only


def brute_force_longest_repeat(tokens: list[int]) -> int:
    best = 0
    for i in range(len(tokens)):
        for j in range(i + 1, len(tokens)):
            length = 0
            while j + length < len(tokens) and tokens[i + length] == tokens[j + length]:
                length += 1
            best = max(best, length)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_longest_repeated_ngram_matches_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(3) for _ in range(rng.randint(0, 40))]
    assert longest_repeated_ngram(tokens) == brute_force_longest_repeat(tokens)


def test_distinct_n_and_repetition_summary():
    assert distinct_n([1, 2, 1, 2, 1], 2) == 2 / 4
    assert distinct_n([1, 2, 3], 1) == 1.0
    assert distinct_n([1], 2) is None
    summary = repetition_summary([[1, 2, 1, 2, 1], [7]], ngram_sizes=(2,))
    assert summary == {"distinct_2": 0.5, "longest_repeat": 1.5, "mean_length": 3.0}


# --- The eval command ---------------------------------------------------------------------------------------------

def test_eval_writes_metrics_and_refuses_to_overwrite(tiny_pair, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nreturn the sum\nprint hello\n")
    settings = EvalSettings(metrics=("kl", "repetition"), prompts=str(prompts), max_new_tokens=6)
    out = run_eval(str(tiny_pair / "dense"), tmp_path / "same", settings, reference=str(tiny_pair / "dense"))
    payload = json.loads((out / "metrics.json").read_text())
    metrics = payload["metrics"]
    assert payload["harness"] == HARNESS_VERSION  # results of another harness are told apart
    assert set(payload["environment"]) == {"date", "device", "versions"}
    assert metrics["kl"] == 0.0 and metrics["scored_tokens"] > 0
    assert metrics["task_prompts"]["count"] == 3 and 1 <= metrics["mean_length"] <= 6
    assert not (out / "humaneval.jsonl").exists()  # pass@1 was not asked for
    differing = run_eval(str(tiny_pair / "other"), tmp_path / "other", settings, reference=str(tiny_pair / "dense"))
    assert json.loads((differing / "metrics.json").read_text())["metrics"]["kl"] > 0
    with pytest.raises(OutputExistsError):
        run_eval(str(tiny_pair / "dense"), out, settings, reference=str(tiny_pair / "dense"))


@pytest.mark.parametrize("settings, reference, message", [
    (EvalSettings(metrics=("kl",)), None, "pass --reference"),
    (EvalSettings(metrics=("bleu",)), "dense", "unknown metric"),
    (EvalSettings(metrics=("ppl",), ppl_window=1), None, "--ppl-window must be at least 2"),
    (EvalSettings(metrics=("pass@1",), timeout_s=0), None, "--timeout must be above 0"),
])
def test_bad_settings_fail_before_anything_is_written(tiny_pair, tmp_path, settings, reference, message):
    reference = str(tiny_pair / reference) if reference else None
    with pytest.raises(SparseDecodingError, match=message):
        run_eval(str(tiny_pair / "dense"), tmp_path / "out", settings, reference=reference)
    assert list(tmp_path.iterdir()) == []


def test_the_eval_command_prints_metrics_and_gives_one_error_line_on_bad_input(tiny_pair, tmp_path, capsys):
    from sparsedecoding.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nsort a list\n")
    out = tmp_path / "out"
    base = ["eval", "--model", str(tiny_pair / "other"), "--prompts", str(prompts), "--max-new-tokens", "4", "--out"]
    assert main([*base, str(out), "--reference", str(tiny_pair / "dense"), "--metrics", "kl,repetition"]) == 0
    assert "kl=" in capsys.readouterr().out and (out / "metrics.json").exists()
    for wrong in (["--metrics", "kl"], ["--metrics", "pass@2"], ["--model", str(tmp_path / "missing")]):
        assert main([*base, str(tmp_path / "bad"), *wrong]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1
        assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


def test_pass_at_1_and_perplexity_are_wired_into_the_report(tiny_pair, tmp_path, monkeypatch):
    from sparsedecoding.evaluation import suite

    problems = [dict(PROBLEM, task_id=f"Toy/{index}") for index in range(3)]
    monkeypatch.setattr(suite, "humaneval_problems", lambda split: problems)
    monkeypatch.setattr(suite, "humaneval_prompts", lambda split, wording="fenced": [p["prompt"] for p in problems])
    monkeypatch.setattr(suite, "lee_text", lambda part: "Some held-out news text. " * 20)
    settings = EvalSettings(metrics=("pass@1", "ppl"), max_new_tokens=5, ppl_window=64, timeout_s=2.0)
    out = run_eval(str(tiny_pair / "dense"), tmp_path / "out", settings)
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    records = [json.loads(line) for line in (out / "humaneval.jsonl").read_text().splitlines()]
    # A random tiny model cannot solve the toy problem: every program runs and fails, nothing passes.
    assert metrics["pass@1"] == 0.0 and metrics["humaneval_problems"] == 3
    assert [record["task_id"] for record in records] == ["Toy/0", "Toy/1", "Toy/2"]
    assert all(not record["passed"] and record["error"] and 1 <= record["new_tokens"] <= 5 for record in records)
    assert 1.0 < metrics["ppl"] < 128 * 4 and metrics["ppl_tokens"] > 0  # a random model: near its vocabulary size


def test_eval_without_root_refuses_pass_at_1_before_loading_any_model(tiny_pair, tmp_path, monkeypatch):
    """The sandbox needs root: a non-root pass@1 run must stop before generating anything, not after."""
    import os

    from sparsedecoding.evaluation import suite
    from sparsedecoding.errors import SandboxError

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(suite, "load_model", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    with pytest.raises(SandboxError, match="root"):
        run_eval(str(tiny_pair / "dense"), tmp_path / "out", EvalSettings(metrics=("pass@1",)))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("prompts", ["missing.txt", "empty.txt", "humaneval:bogus"])
def test_a_bad_prompt_source_or_pruning_record_is_refused_before_loading_any_model(tiny_pair, tmp_path, monkeypatch,
                                                                                 prompts):
    from sparsedecoding.evaluation import suite

    (tmp_path / "empty.txt").write_text("")
    source = prompts if prompts.startswith("humaneval") else str(tmp_path / prompts)
    monkeypatch.setattr(suite, "load_model", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    with pytest.raises(SparseDecodingError):
        run_eval(str(tiny_pair / "dense"), tmp_path / "out", EvalSettings(metrics=("repetition",), prompts=source))
    assert not (tmp_path / "out").exists()


def test_a_malformed_pruning_record_is_refused_before_loading_any_model(tiny_pair, tmp_path, monkeypatch):
    import shutil

    from sparsedecoding.evaluation import suite

    folder = tmp_path / "pruned"
    shutil.copytree(tiny_pair / "dense", folder)
    (folder / "sparsedecoding.json").write_text("[1, 2]")
    monkeypatch.setattr(suite, "load_model", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    with pytest.raises(SparseDecodingError, match="sparsedecoding.json"):
        run_eval(str(folder), tmp_path / "out", EvalSettings(metrics=("ppl",)))


def test_kl_and_repetition_use_the_pass_at_1_prompts_in_their_wording(tiny_pair, tmp_path):
    from sparsedecoding.data import humaneval_prompts, prompts_hash

    settings = EvalSettings(metrics=("repetition",), wording="plain", limit=2, max_new_tokens=3)
    out = run_eval(str(tiny_pair / "dense"), tmp_path / "out", settings)
    recorded = json.loads((out / "metrics.json").read_text())["metrics"]["task_prompts"]
    assert recorded["source"] == "humaneval:eval (plain wording)"
    assert recorded["hash"] == prompts_hash(humaneval_prompts("eval", "plain")[:2])
    assert recorded["hash"] != prompts_hash(humaneval_prompts("eval", "fenced")[:2])


def test_a_compiler_warning_neither_prints_nor_changes_which_code_is_used(capsys):
    import warnings

    from sparsedecoding.evaluation.humaneval import _compiles

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under python -W error
        assert _compiles("x = 1\nif x is 1:\n    pass\n")
    assert capsys.readouterr().err == ""
