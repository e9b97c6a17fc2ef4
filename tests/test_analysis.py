import datetime
import json
import math
import re

import pytest
import torch

from sparsedecoding.analysis.discrepancy import (discrepancy, module_discrepancies, retained_rank, run_discrepancy,
                                                 summarize)
from sparsedecoding.analysis.drift import layer_inputs_at_steps, measure_drift, plateau_and_rise, run_drift
from sparsedecoding.analysis.plots import redraw
from sparsedecoding.errors import OutputExistsError, SparseDecodingError
from sparsedecoding.generation import generate
from sparsedecoding.models import load_model


def random_hessian(d: int, tokens: int, generator: torch.Generator, scale: torch.Tensor | None = None) -> torch.Tensor:
    X = torch.randn(tokens, d, generator=generator, dtype=torch.float64)
    if scale is not None:
        X = X * scale
    return 2 * X.T @ X / tokens


# --- ε: the worst-case relative gap ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, 6])
def test_epsilon_is_zero_when_the_hessians_agree(k):
    H = random_hessian(6, 50, torch.Generator().manual_seed(k))
    assert discrepancy(H, H, k) == 0.0


def sampled_gap(H_C: torch.Tensor, H_dec: torch.Tensor, k: int, samples: torch.Tensor) -> float:
    """max over sampled δ in the span of H_dec's top-k eigenvectors of |δᵀ(H_C − H_dec)δ| / δᵀH_decδ."""
    eigenvalues, eigenvectors = torch.linalg.eigh(H_dec)
    deltas = eigenvectors[:, -k:] @ samples  # columns: weight changes inside the top-k eigenspace
    gap = ((deltas * ((H_C - H_dec) @ deltas)).sum(0)).abs()
    return float((gap / (deltas * (H_dec @ deltas)).sum(0)).max())


@pytest.mark.parametrize("seed", range(4))
def test_epsilon_matches_a_brute_force_maximisation(seed):
    generator = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.2, 3.0, 7, dtype=torch.float64)  # an uneven spectrum, as activations have
    H_dec, H_C = random_hessian(7, 60, generator, scale), random_hessian(7, 60, generator, scale.flip(0))
    # k = 1: the single direction u₁.
    one = torch.ones(1, 1, dtype=torch.float64)
    assert discrepancy(H_C, H_dec, 1) == pytest.approx(sampled_gap(H_C, H_dec, 1, one), rel=1e-9)
    # k = 2: every direction of the plane, on a fine grid of angles.
    angles = torch.linspace(0, math.pi, 400_001, dtype=torch.float64)
    assert discrepancy(H_C, H_dec, 2) == pytest.approx(
        sampled_gap(H_C, H_dec, 2, torch.stack([angles.cos(), angles.sin()])), rel=1e-8)
    # k = 3: random directions approach the maximum from below.
    exact = discrepancy(H_C, H_dec, 3)
    sampled = sampled_gap(H_C, H_dec, 3, torch.randn(3, 200_000, generator=generator, dtype=torch.float64))
    assert 0.97 * exact <= sampled <= exact * (1 + 1e-9)


def test_epsilon_ignores_a_common_scale_and_flags_rank_deficiency():
    generator = torch.Generator().manual_seed(0)
    H_dec, H_C = random_hessian(6, 40, generator), random_hessian(6, 40, generator)
    assert discrepancy(3 * H_C, 3 * H_dec, 3) == pytest.approx(discrepancy(H_C, H_dec, 3), rel=1e-10)
    low_rank = random_hessian(6, 2, generator)  # 2 tokens: rank 2
    assert math.isfinite(discrepancy(H_C, low_rank, 2))
    assert math.isnan(discrepancy(H_C, low_rank, 3))


def test_retained_rank():
    assert [retained_rank(rho, 64) for rho in (0.01, 0.02, 0.05, 0.10, 0.20, 0.50)] == [1, 2, 4, 7, 13, 32]
    assert retained_rank(0.1, 30) == 3 and retained_rank(1.0, 5) == 5


def test_decode_closer_than_text_shows_in_the_summary():
    generator = torch.Generator().manual_seed(1)
    H_dec, H_text, H_decode = {}, {}, {}
    for layer in range(3):
        base = random_hessian(8, 400, generator)
        H_dec[f"l{layer}.q"] = H_dec[f"l{layer}.k"] = base  # shared input: one object
        H_decode[f"l{layer}.q"] = H_decode[f"l{layer}.k"] = base + 0.05 * random_hessian(8, 400, generator)
        H_text[f"l{layer}.q"] = H_text[f"l{layer}.k"] = base + 0.5 * random_hessian(8, 400, generator)
    records = module_discrepancies(H_dec, H_text, H_decode, rhos=(0.25, 0.5))
    assert [record["module"] for record in records] == list(H_dec)
    assert records[0]["eps_text"] == records[1]["eps_text"]  # q and k share their Hessians
    summary = summarize(records, rhos=(0.25, 0.5))
    for row in summary:
        assert row["modules"] == 6 and row["rank_deficient"] == 0
        assert row["median_ratio"] > 2 and row["decode_smaller_share"] == 1.0


# --- drift ----------------------------------------------------------------------------------------------------------

def test_replayed_layer_inputs_equal_the_kv_cached_decode(tiny_pair):
    """The documented fact the analysis rests on, checked with left padding (prompts of different lengths)."""
    model, tokenizer, _ = load_model(tiny_pair / "dense")
    decoded = {index: [] for index in range(len(model.model.layers))}

    def make_hook(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if hidden.shape[1] == 1:  # a decode step (prefill passes the whole prompt)
                decoded[index].append(hidden[:, 0].clone())
        return hook

    handles = [layer.register_forward_pre_hook(make_hook(index), with_kwargs=True)
               for index, layer in enumerate(model.model.layers)]
    prompts = [[11, 12], [5, 6, 7, 8, 9, 10]]  # already in generate's (length) order, so rows line up
    generations = generate(model, tokenizer, prompts, max_new_tokens=9, batch_size=2, progress=False)
    for handle in handles:
        handle.remove()
    assert all(len(gen.consumed_ids) >= 8 for gen in generations)
    replayed = layer_inputs_at_steps(model, generations, steps=8, pad_id=0)
    for index, steps in decoded.items():
        torch.testing.assert_close(replayed[index], torch.stack(steps, 1)[:, :8], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_drift_is_zero_for_identical_models_and_positive_otherwise(tiny_pair):
    dense, tokenizer, _ = load_model(tiny_pair / "dense")
    other, _, _ = load_model(tiny_pair / "other")
    prompts = ["def f(x):", "hello", "print the sum of a list"]
    same = measure_drift(dense, dense, tokenizer, prompts, steps=6, batch_size=2, progress=False)
    assert all(value == 0.0 for layer in same["layers"] for value in layer["curve"])
    assert same["same_tokens_share"] == 1.0 and same["prompts_per_step"][0] == 3
    apart = measure_drift(dense, other, tokenizer, prompts, steps=6, batch_size=2, progress=False)
    decoded_steps = sum(count > 0 for count in apart["prompts_per_step"])
    assert decoded_steps > 0
    assert all(value > 0 for layer in apart["layers"] for value in layer["curve"][:decoded_steps])


def test_plateau_and_the_step_reaching_ninety_percent():
    curve = [0.1, 0.5, 0.85, 0.95, 1.0, 1.0, 1.0, 1.0]
    assert plateau_and_rise(curve) == (1.0, 4)
    assert plateau_and_rise([0.2] * 8) == (pytest.approx(0.2), 1)


# --- the commands ---------------------------------------------------------------------------------------------------

def test_run_drift_writes_a_report_and_a_plot_that_can_be_redrawn(tiny_pair, tmp_path):
    out = run_drift(str(tiny_pair / "dense"), str(tiny_pair / "other"), tmp_path / "drift",
                    prompts=str(prompts_file(tmp_path)), steps=8, batch_size=4, progress=False)
    payload = json.loads((out / "drift.json").read_text())
    assert len(payload["layers"]) == 2 and len(payload["layers"][0]["curve"]) == 8
    assert "reaches 90% of its plateau" in (out / "drift.md").read_text()
    assert payload["environment"]["device"] and payload["environment"]["date"] == datetime.date.today().isoformat()
    assert re.search(r"- date: \d{4}-\d\d-\d\d\n- device: .+\n- software: torch .+\n- command: `",
                     (out / "drift.md").read_text())
    (out / "drift.png").unlink()
    assert [path.read_bytes()[:8] for path in redraw(out)] == [b"\x89PNG\r\n\x1a\n"]
    with pytest.raises(OutputExistsError):
        run_drift(str(tiny_pair / "dense"), str(tiny_pair / "other"), out, prompts=str(prompts_file(tmp_path)))


def prompts_file(folder, lines=("def add(a, b):", "sort a list", "hello world", "x = 1")):
    path = folder / "prompts.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_run_discrepancy_on_a_tiny_model(tiny_pair, tmp_path):
    heldout = prompts_file(tmp_path)
    calib = tmp_path / "calib.txt"
    calib.write_text("write a function\nreverse a string\ncount words\n")
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = run_discrepancy(str(tiny_pair / "dense"), tmp_path / "disc", heldout=str(heldout), calib_prompts=str(calib),
                          text=str(text), tokens=48, max_new_tokens=24, rhos=(0.05, 0.5))
    payload = json.loads((out / "discrepancy.json").read_text())
    assert payload["calibration"]["decode"]["tokens"] == payload["calibration"]["text"]["tokens"] == 48
    assert len(payload["modules"]) == 2 * 7 and len(payload["summary"]) == 2
    assert (out / "discrepancy.png").exists() and "ε_text/ε_decode" in (out / "discrepancy.md").read_text()
    assert payload["environment"]["date"] == datetime.date.today().isoformat()
    assert "- device: " in (out / "discrepancy.md").read_text()


def test_discrepancy_refuses_the_same_prompts_for_both_roles(tiny_pair, tmp_path):
    prompts = prompts_file(tmp_path)
    with pytest.raises(SparseDecodingError, match="same list"):
        run_discrepancy(str(tiny_pair / "dense"), tmp_path / "disc", heldout=str(prompts), calib_prompts=str(prompts),
                        plot=False)
    assert not (tmp_path / "disc").exists()


def test_the_analyze_commands(tiny_pair, tmp_path, capsys):
    from sparsedecoding.cli import main

    out = tmp_path / "drift"
    args = ["analyze", "drift", "--dense", str(tiny_pair / "dense"), "--pruned", str(tiny_pair / "other"), "--prompts",
            str(prompts_file(tmp_path)), "--steps", "6", "--no-plot", "--out", str(out)]
    assert main(args) == 0
    assert "| layer | plateau |" in capsys.readouterr().out and not (out / "drift.png").exists()
    # the record names the arguments main was given, not pytest's own command line
    assert json.loads((out / "drift.json").read_text())["command"] == ["sparsedecoding", *args]
    assert main(["analyze", "plot", str(out)]) == 0 and (out / "drift.png").exists()
    assert main(["analyze", "plot", str(tmp_path)]) == 2
    assert "holds no discrepancy.json, drift.json or quality.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse rejects a malformed list before anything runs
        main(["analyze", "discrepancy", "--model", str(tiny_pair / "dense"), "--rhos", "0.1,x",
              "--out", str(tmp_path / "d")])


# --- bad input: one error line, before any model loads ----------------------------------------------------------------

def no_model_loading(monkeypatch, module):
    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")
    monkeypatch.setattr(module, "load_model", load_model)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    return err


@pytest.mark.parametrize("option, value, message", [
    ("--tokens", "0", "must be at least 1"), ("--tokens", "-1", "must be at least 1"),
    ("--max-new-tokens", "0", "must be at least 1"), ("--gen-batch-size", "0", "must be at least 1"),
    ("--batch-size", "0", "must be at least 1"),
    ("--seed", "-1", f"must be in [0, {2**63 - 1}]"), ("--seed", str(2**63), f"must be in [0, {2**63 - 1}]")])
def test_discrepancy_refuses_bad_counts_and_seeds_before_loading(tiny_pair, tmp_path, monkeypatch, capsys, option,
                                                                 value, message):
    import sparsedecoding.analysis.discrepancy as module
    from sparsedecoding.cli import main

    no_model_loading(monkeypatch, module)
    calib = tmp_path / "calib.txt"
    calib.write_text("write a function\n")
    out = tmp_path / "disc"
    assert main(["analyze", "discrepancy", "--model", str(tiny_pair / "dense"), "--calib-prompts", str(calib),
                 "--heldout", str(prompts_file(tmp_path)), f"{option}={value}", "--no-plot", "--out", str(out)]) == 2
    assert f"DiscrepancySettingsError: {option} {message}, got {value}" in one_error_line(capsys)
    assert not out.exists() and not out.with_name("disc.partial").exists()


@pytest.mark.parametrize("option, value", [("--batch-size", "0"), ("--batch-size", "-2"), ("--limit", "0"),
                                           ("--limit", "-1")])
def test_drift_refuses_a_batch_size_or_limit_below_one_before_loading(tiny_pair, tmp_path, monkeypatch, capsys,
                                                                        option, value):
    import sparsedecoding.analysis.drift as module
    from sparsedecoding.cli import main

    no_model_loading(monkeypatch, module)
    out = tmp_path / "drift"
    assert main(["analyze", "drift", "--dense", str(tiny_pair / "dense"), "--pruned", str(tiny_pair / "other"),
                 "--prompts", str(prompts_file(tmp_path)), f"{option}={value}", "--no-plot", "--out", str(out)]) == 2
    assert f"DriftSettingsError: {option} must be at least 1" in one_error_line(capsys)
    assert not out.exists()


def test_drift_checks_the_pruned_model_before_loading_the_dense_one(tiny_pair, tmp_path, monkeypatch, capsys):
    import sparsedecoding.analysis.drift as module
    from sparsedecoding.cli import main

    no_model_loading(monkeypatch, module)
    missing = tmp_path / "no-such-model"
    assert main(["analyze", "drift", "--dense", str(tiny_pair / "dense"), "--pruned", str(missing),
                 "--prompts", str(prompts_file(tmp_path)), "--no-plot", "--out", str(tmp_path / "drift")]) == 2
    err = one_error_line(capsys)
    assert "ModelNotFoundError" in err and str(missing) in err


@pytest.mark.parametrize("name, content, problem", [
    ("drift.json", "", "is empty"),
    ("drift.json", '{"pruned": "p", "layers": [{"layer": 0, "curve": [0.1, 0.', "is not valid JSON"),
    ("drift.json", '{"pruned": "p", "layers": [{"layer": 0}]}', "lacks layers[].curve"),
    ("discrepancy.json", "{}", "lacks model, summary[].rho"),
    ("discrepancy.json", '{"model": "m", "summary": []}', "has nothing to draw"),
    ("quality.json", "{}", "lacks settings.model"),
    ("quality.json", '{"settings": {"model": "m", "small_model": "s", "tokens": 8}, "results": [{"name": "dense"}]}',
     "lacks results[].config.role"),
])
def test_plot_names_a_broken_result_file_and_says_to_rerun(tmp_path, capsys, name, content, problem):
    from sparsedecoding.cli import main

    (tmp_path / name).write_text(content)
    assert main(["analyze", "plot", str(tmp_path)]) == 2
    err = one_error_line(capsys)
    assert f"AnalysisResultError: {tmp_path / name} {problem}" in err and "re-run `sparsedecoding " in err
    assert not list(tmp_path.glob("*.png"))


def strict_json(text: str):
    """Parse as a standard-JSON reader does: NaN and Infinity are refused."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_result_files_are_standard_json_with_null_for_non_finite_numbers(tmp_path):
    from sparsedecoding.outputs import write_jsonl
    from sparsedecoding.runenv import write_json

    payload = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (2, math.nan), "e": "nan", "f": 3}
    write_json(tmp_path / "x.json", payload)
    assert strict_json((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.5, None, {"c": None}],
                                                              "d": [2, None], "e": "nan", "f": 3}
    write_jsonl(tmp_path / "x.jsonl", [payload, {"g": math.nan}])
    lines = (tmp_path / "x.jsonl").read_text().splitlines()
    assert [strict_json(line) for line in lines][1] == {"g": None}


def test_plot_draws_result_files_whose_unreached_values_are_null(tmp_path):
    from sparsedecoding.runenv import write_json

    drift = tmp_path / "drift"
    drift.mkdir()
    write_json(drift / "drift.json", {"pruned": "p", "layers": [{"layer": 0, "curve": [0.1, 0.2, math.nan]},
                                                                 {"layer": 1, "curve": [0.3, math.nan, math.nan]}]})
    assert "null" in (drift / "drift.json").read_text()
    assert [path.read_bytes()[:8] for path in redraw(drift)] == [b"\x89PNG\r\n\x1a\n"]
    disc = tmp_path / "disc"
    disc.mkdir()
    row = {"rho": 0.5, "median_ratio": 1.2, "ratio_q1": math.nan, "ratio_q3": math.nan, "decode_smaller_share": 0.6}
    write_json(disc / "discrepancy.json", {"model": "m", "summary": [row, {**row, "rho": 0.05,
                                                                             "median_ratio": math.nan}]})
    assert [path.read_bytes()[:8] for path in redraw(disc)] == [b"\x89PNG\r\n\x1a\n"]
