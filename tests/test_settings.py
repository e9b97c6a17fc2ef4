"""The settings module: every knob defined once (flag, help with its default, validation), the command line built from
it, one-line errors for bad values before any model work, device choice, and a --help that imports no torch."""

import argparse
import dataclasses
import math
import subprocess
import sys

import pytest

from sparsedecoding import settings
from sparsedecoding.cli import build_parser, main
from sparsedecoding.errors import DeviceError, SparseDecodingError
from sparsedecoding.settings import CompareSettings, EvalSettings, PruneConfig


def subcommands() -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, parser in action.choices.items():
                found[name] = parser
                for inner in parser._actions:  # analyze discrepancy|drift|plot
                    if isinstance(inner, argparse._SubParsersAction):
                        found.update({f"{name} {sub}": p for sub, p in inner.choices.items()})
    return found


def test_every_option_of_every_command_shows_its_default():
    def one_of_required(parser, action):  # bench's --preset / --model: one must be given, neither has a default
        return any(group.required and action in group._group_actions for group in parser._mutually_exclusive_groups)

    missing = [f"{name} {action.option_strings[0]}" for name, parser in subcommands().items()
               for action in parser._actions
               if action.option_strings and action.option_strings[0] != "-h" and not action.required
               and not one_of_required(parser, action) and "default" not in (action.help or "")]
    assert not missing, missing


def test_every_command_has_a_description():
    assert all(parser.description for parser in subcommands().values()), \
        [name for name, parser in subcommands().items() if not parser.description]


def test_prune_flags_are_the_settings_fields_with_their_defaults():
    parser = subcommands()["prune"]
    by_dest = {action.dest: action for action in parser._actions}
    for field in dataclasses.fields(PruneConfig):
        if field.name == "command":
            continue
        action = by_dest[field.name]
        assert action.option_strings == [settings.flag_of(field)]
        if field.default is not dataclasses.MISSING:
            assert action.default == field.default
            if field.metadata["shown"]:
                shown = field.metadata["shown"]
            elif isinstance(field.default, bool):
                shown = "on" if field.default else "off"
            else:
                shown = "none" if field.default is None else str(field.default)
            assert f"(default: {shown})" in action.help
    assert settings.CALIBRATION_TOKENS == PruneConfig(model="m", out="o").tokens


def test_demo_help_shows_the_demo_defaults_and_compare_shares_the_definitions():
    demo = {action.dest: action for action in subcommands()["demo"]._actions}
    from sparsedecoding.cli.demo import DEMO

    for name, value in DEMO.items():
        assert demo[name].default == value and f"(default: {value})" in demo[name].help
    compare = {field.name: field for field in dataclasses.fields(CompareSettings)}
    prune = {field.name: field for field in dataclasses.fields(PruneConfig)}
    assert compare["calib_prompts"].metadata["help"] == prune["prompts"].metadata["help"]
    assert compare["percdamp"].metadata["above"] == prune["percdamp"].metadata["above"] == 0.0
    assert CompareSettings().gen_batch_size == 82 and PruneConfig(model="m", out="o").gen_batch_size == 32


@pytest.mark.parametrize("field,value,expected", [
    ("batch_size", 0, "--batch-size must be at least 1, got 0"),
    ("blocksize", 0, "--blocksize must be at least 1"),
    ("gen_batch_size", 0, "--gen-batch-size must be at least 1"),
    ("max_new_tokens", 0, "--max-new-tokens must be at least 1"),
    ("n_prompts", 0, "--n-prompts must be at least 1"),
    ("percdamp", 0.0, "--percdamp must be in (0, 1]"),
    ("percdamp", -0.5, "--percdamp must be in (0, 1]"),
    ("percdamp", math.nan, "--percdamp must be a finite number in (0, 1], got nan"),
    ("percdamp", 2.0, "--percdamp must be in (0, 1]"),
    ("temperature", 0.0, "--temperature must be above 0"),
    ("temperature", math.inf, "--temperature must be a finite number above 0, got inf"),
    ("top_p", 0.0, "--top-p must be in (0, 1]"),
    ("top_p", 1.5, "--top-p must be in (0, 1]"),
    ("mix_ratio", 1.0, "--mix-ratio must be in (0, 1)"),
    ("solver", "obs", "--solver 'obs' is not one of admm, sparsegpt, wanda, magnitude"),
    ("samples_per_prompt", 0, "--samples-per-prompt must be in [1, 4096], got 0"),
    ("recipe", "best", "--recipe 'best' is not one of none, recommended"),
    ("gen_backend", "vllm", "--gen-backend 'vllm' is not one of engine, hf"),
])
def test_a_bad_value_is_one_line_before_anything_is_loaded(tmp_path, field, value, expected):
    config = PruneConfig(model=str(tmp_path / "not-loaded"), out=str(tmp_path / "out"), **{field: value})
    with pytest.raises(SparseDecodingError) as caught:
        config.validate()
    assert str(caught.value) == expected or str(caught.value).startswith(expected)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("argv,expected", [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--percdamp", "nan"], "--percdamp must be a finite number in (0, 1], got nan"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--device", "tpu"], "DeviceError: --device 'tpu' is not a device"),
])
def test_the_prune_command_reports_bad_values_in_one_line_and_writes_nothing(tmp_path, capsys, argv, expected):
    out = tmp_path / "out"
    code = main(["prune", "--model", str(tmp_path / "not-loaded"), "--out", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err
    assert not out.exists() and not out.with_name("out.partial").exists()


@pytest.mark.parametrize("flag, value", [("--solver", "obs"), ("--gen-backend", "vllm")])
def test_a_usage_mistake_is_one_error_line_and_exit_2(capsys, flag, value):
    with pytest.raises(SystemExit) as caught:
        main(["prune", "--model", "m", "--out", "o", flag, value])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: argument {flag}: invalid choice: '{value}'")
    assert err[0].endswith("(see `sparsedecoding prune --help`)")


def test_the_gen_backend_choices_are_the_generators_and_engine_is_the_default():
    from sparsedecoding.batchgen import BACKENDS

    assert set(settings.GEN_BACKENDS) == set(BACKENDS) and PruneConfig(model="m", out="o").gen_backend == "engine"


def test_eval_and_compare_settings_check_their_ranges():
    with pytest.raises(SparseDecodingError, match="--eval-batch-size must be at least 1"):
        EvalSettings(gen_batch_size=0).validate(has_reference=True)
    with pytest.raises(SparseDecodingError, match="--timeout must be a finite number above 0"):
        EvalSettings(timeout_s=math.nan).validate(has_reference=True)
    with pytest.raises(SparseDecodingError, match="--tokens must be at least 1"):
        CompareSettings(tokens=0).validate()
    with pytest.raises(SparseDecodingError, match="--eval-batch-size"):
        CompareSettings(evaluation=EvalSettings(gen_batch_size=0)).validate()


def test_pick_device_refuses_what_is_not_there(monkeypatch):
    import torch

    from sparsedecoding.runenv import pick_device

    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match="--device 'tpu' is not a device; choose auto, cpu, cuda or cuda:N"):
        pick_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="--device cuda needs CUDA"):
        pick_device("cuda")
    with pytest.raises(DeviceError, match="--device cuda:1 needs CUDA"):
        pick_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match="has 1 CUDA device"):
        pick_device("cuda:1")


@pytest.mark.parametrize("argv", [["--help"], ["prune", "--help"]])
def test_help_imports_neither_torch_nor_transformers(argv):
    probe = ("import sys; from sparsedecoding.cli import main\n"
             "try:\n    main(%r)\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))" % argv)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_evaluation_analysis_and_engine_do_not_import_the_pruning_orchestration():
    import ast
    from pathlib import Path

    import sparsedecoding

    root = Path(sparsedecoding.__file__).parent
    found = []
    for package in ("evaluation", "analysis", "engine"):
        for path in (root / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [alias.name for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                if any(name.rsplit(".", 1)[-1] in ("pipeline", "compare") for name in names):
                    found.append(f"{package}/{path.name}")
    assert not found, found


def test_the_demo_checks_its_settings_before_fetching_or_removing_anything(tmp_path, capsys, monkeypatch):
    from sparsedecoding import models

    monkeypatch.setattr(models, "resolve_model", lambda name: pytest.fail("fetched before checking the settings"))
    out = tmp_path / "demo"
    out.mkdir()
    (out / "demo.json").write_text("{}")  # an earlier demo: it would be replaced
    assert main(["demo", "--out", str(out), "--gen-batch-size", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: SparseDecodingError: --gen-batch-size must be at "
                                                            "least 1, got 0"]
    assert (out / "demo.json").exists()


def test_the_recommended_recipe_fills_the_fields_left_at_their_defaults(tmp_path):
    """Issue 11's dev pick: 16:32 (the default pattern), 4 sampled continuations per prompt at 0.7 / 0.95, 32k
    tokens; a value given explicitly is kept."""
    config = PruneConfig(model="m", out=str(tmp_path / "out"), recipe="recommended")
    assert (config.pattern, config.do_sample, config.samples_per_prompt, config.temperature, config.top_p,
            config.tokens) == ("16:32", True, 4, 0.7, 0.95, 32768)
    config.check_values()
    mine = PruneConfig(model="m", out=str(tmp_path / "out"), recipe="recommended", tokens=4096, temperature=0.9)
    assert (mine.tokens, mine.temperature, mine.samples_per_prompt) == (4096, 0.9, 4)
    plain = PruneConfig(model="m", out=str(tmp_path / "out"))
    assert (plain.do_sample, plain.samples_per_prompt, plain.tokens) == (False, 1, 16384)
