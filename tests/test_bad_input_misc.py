"""Bad input found by an audit in the fifty-third session, each now one `error:` line and exit 2 before any work: seeds
outside int64, non-finite numbers, result files with a value that is not a number or a folder a figure cannot be
written into, `fetch --wheels` that is not a folder, torchrun variables that make no group, a generation longer than
the model's context, and an unknown option, which names its own command's help."""

import json
import shutil

import pytest

from sparsedecoding.cli import main

from helpers import make_tiny_model


def one_line_error(capsys, argv, expected):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.mark.parametrize("seed", ["-1", str(2**63), str(10**23)])
def test_a_seed_outside_int64_is_refused_up_front(capsys, tmp_path, tiny, seed):
    one_line_error(capsys, ["prune", "--model", str(tiny), "--out", str(tmp_path / "out"), "--seed", seed],
                   f"--seed must be in [0, 9223372036854775807], got {seed}")
    one_line_error(capsys, ["generate", "--model", str(tiny), "--prompt", "hi", "--device", "cpu",
                            "--temperature", "1", "--seed", seed],
                   f"EngineError: --seed must be in [0, 9223372036854775807], got {seed}")
    assert not list(tmp_path.iterdir())


def test_a_number_that_is_not_finite_is_called_so(capsys, tmp_path, tiny):
    one_line_error(capsys, ["prune", "--model", str(tiny), "--out", str(tmp_path / "out"), "--temperature", "inf"],
                   "--temperature must be a finite number above 0, got inf")


def test_plot_refuses_a_value_that_is_not_a_number_and_a_folder_it_cannot_write(capsys, tmp_path, monkeypatch):
    from sparsedecoding.analysis import plots

    (tmp_path / "drift.json").write_text(json.dumps({"pruned": "p", "layers": [{"layer": 0, "curve": [0.1, "abc"]}]}))
    one_line_error(capsys, ["analyze", "plot", str(tmp_path)],
                   f"AnalysisResultError: {tmp_path / 'drift.json'} holds 'abc' where a number belongs; re-run")
    (tmp_path / "drift.json").write_text(json.dumps({"pruned": "p", "layers": [{"layer": 0, "curve": [0.1, 0.2]}]}))

    def read_only(data, path, title):
        path.write_bytes(b"half a figure")
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plots, "plot_drift", read_only)
    one_line_error(capsys, ["analyze", "plot", str(tmp_path)],
                   f"AnalysisResultError: cannot write {tmp_path / 'drift.png'} (Permission denied)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["drift.json"]


def test_fetch_wheels_must_be_folders(capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    one_line_error(capsys, ["fetch", "smollm2-135m", "--wheels", str(tmp_path / "none")],
                   f"FetchError: --wheels {tmp_path / 'none'} is not there")
    one_line_error(capsys, ["fetch", "smollm2-135m", "--wheels", str(tmp_path), "--wheels", str(tmp_path / "a-file")],
                   f"FetchError: --wheels {tmp_path / 'a-file'} is a file, not a folder")


@pytest.mark.parametrize("environment, expected", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: a group has at least one process"),
    ({"WORLD_SIZE": "2"}, "RANK is unset"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "5"}, "WORLD_SIZE=2, RANK=0, LOCAL_RANK=5 is not a process"),
])
def test_torchrun_variables_that_make_no_group_are_refused(capsys, monkeypatch, tiny, environment, expected):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    one_line_error(capsys, ["generate", "--model", str(tiny), "--prompt", "hi", "--device", "cpu"],
                   f"EngineError: {expected}")


def test_a_generation_longer_than_the_context_is_refused_before_the_model_loads(capsys, monkeypatch, tiny):
    from sparsedecoding import engine

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(engine, "load_model", never)
    one_line_error(capsys, ["generate", "--model", str(tiny), "--prompt", "hi", "--device", "cpu",
                            "--new-tokens", str(10**12)],
                   "pass the model's context of 512 positions (max_position_embeddings); ask for at most 510")


def test_an_unknown_option_names_its_commands_help(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--no-such-option"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == \
        "error: unrecognized arguments: --no-such-option (see `sparsedecoding demo --help`)"


@pytest.mark.parametrize("value, expected", [
    ("-5", "argument --tokens: must be 0 (every decode token generated) or a budget of at least 1, got -5"),
    ("abc", "argument --tokens: must be a whole number, got 'abc'"),
])
def test_tokens_below_zero_or_not_a_number_say_what_tokens_takes(capsys, tmp_path, value, expected):
    with pytest.raises(SystemExit) as stopped:
        main(["prune", "--model", str(tmp_path), "--out", str(tmp_path / "out"), "--tokens", value])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {expected} (see `sparsedecoding prune --help`)"


def test_check_refuses_a_bad_engine_setting_before_loading(capsys, monkeypatch, tiny):
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "bogus")
    one_line_error(capsys, ["check", "--model", str(tiny)], "KernelChoiceError: SPARSEDECODING_KERNEL='bogus'")


def test_eval_and_drift_refuse_generations_longer_than_the_context_before_loading(capsys, monkeypatch, tmp_path,
                                                                                  tiny):
    from sparsedecoding import models
    from sparsedecoding.analysis import drift
    from sparsedecoding.evaluation import suite

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for module in (models, drift, suite):
        monkeypatch.setattr(module, "load_model", never)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    one_line_error(capsys, ["eval", "--model", str(tiny), "--out", str(tmp_path / "eval"), "--metrics",
                            "repetition", "--prompts", str(prompts), "--max-new-tokens", "100000", "--device", "cpu"],
                   "--max-new-tokens 100000 passes the model's context of 512 positions")
    one_line_error(capsys, ["eval", "--model", str(tiny), "--out", str(tmp_path / "eval"), "--metrics", "ppl",
                            "--ppl-window", "2048", "--device", "cpu"],
                   "--ppl-window 2048 passes the model's context of 512 positions")
    copy = shutil.copytree(tiny, tmp_path / "copy")  # drift refuses a model against itself
    one_line_error(capsys, ["analyze", "drift", "--dense", str(tiny), "--pruned", str(copy), "--prompts",
                            str(prompts), "--steps", "99999999999", "--out", str(tmp_path / "drift"), "--no-plot"],
                   "DriftSettingsError: --steps 99999999999 passes the model's context of 512 positions")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy", "prompts.txt"]


@pytest.mark.parametrize("settings, expected", [
    (dict(tokens="many"), "--tokens must be a whole number, got 'many'"),
    (dict(blocksize="128"), "--blocksize must be a whole number, got '128'"),
    (dict(pattern=None), "--pattern must be text, got None"),
    (dict(do_sample="yes"), "--sample must be True or False, got 'yes'"),
])
def test_prune_settings_of_the_wrong_type_are_refused_before_loading(tmp_path, tiny, settings, expected):
    """PruneConfig built in Python takes any value; a wrong type is one error before the model loads (a string
    token budget once failed after loading and left OUT.partial). A SparsityPattern is taken as its text."""
    from sparsedecoding import SparsityPattern
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.pipeline import PruneConfig, prune

    with pytest.raises(SparseDecodingError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        prune(PruneConfig(model=str(tiny), out=str(tmp_path / "out"), calibration="text", **settings))
    assert list(tmp_path.iterdir()) == []
    config = PruneConfig(model=str(tiny), out=str(tmp_path / "out"), pattern=SparsityPattern.parse("2:4"))
    assert config.pattern == "2:4" and str(config.check_values()) == "2:4"


def test_python_api_calls_with_the_wrong_things_are_one_project_error(tmp_path, tiny):
    """What an API audit passed in by mistake, each refused by the project's own error with what to pass instead,
    before any work (nothing written, the model unchanged)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sparsedecoding import load_packed, save_packed, sparsify, tile_packed
    from sparsedecoding.errors import (DeviceError, KernelInputError, ModelNotFoundError, OutputNotWritableError,
                                       PackingError)
    from sparsedecoding.kernels import PackedLinear, nm_spmv, pack_nm
    from helpers import tiny_config

    with pytest.raises(PackingError, match="sparsify takes a torch.nn.Module"):
        sparsify(None)
    with pytest.raises(PackingError, match="tile_packed takes a torch.nn.Module"):
        tile_packed(torch.zeros(3))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.bfloat16)
    with pytest.raises(PackingError, match="is on the meta device, with no values: load the weights"):
        sparsify(meta)
    assert not any(isinstance(m, PackedLinear) for m in meta.modules())

    weight = torch.zeros(16, 64, dtype=torch.bfloat16)
    weight[:, ::2] = 1
    packed = pack_nm(weight, 2, 4)
    x = torch.ones(1, 64, dtype=torch.bfloat16)
    with pytest.raises(KernelInputError, match="x must be a torch.Tensor"):
        nm_spmv(x.tolist(), packed)
    with pytest.raises(KernelInputError, match="nm_spmv takes the weight as a PackedNM"):
        nm_spmv(x, weight)
    with pytest.raises(KernelInputError, match=r"PackedLinear takes a PackedNM; got Tensor \(a dense weight: "):
        PackedLinear(weight)
    with pytest.raises(KernelInputError, match=r"bias must be a tensor \[16\] .* got \(7,\)"):
        PackedLinear(packed, torch.zeros(7))
    with pytest.raises(KernelInputError, match="a whole number of rows; got '4'"):
        PackedLinear(packed).keep_dense_copy("4")

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.copy_(torch.zeros(128, 64).index_fill_(1, torch.arange(0, 64, 2), 1))
    model, _ = sparsify(model)
    with pytest.raises(OutputNotWritableError, match="save_packed writes to a folder path; got NoneType"):
        save_packed(model, None)
    with pytest.raises(PackingError, match="tokenizer=str: pass a transformers tokenizer"):
        save_packed(model, tmp_path / "saved", tokenizer="abc")
    assert not list(tmp_path.iterdir())
    save_packed(model, tmp_path / "saved")
    (tmp_path / "a-file").write_text("")
    for folder, message in ((tmp_path / "none", "is not there"), (tmp_path / "a-file", "is not a folder"),
                            (None, "is a NoneType, not a path")):
        with pytest.raises(ModelNotFoundError, match=message):
            load_packed(folder)
    with pytest.raises(DeviceError, match="device='gpu' is not a device"):
        load_packed(tmp_path / "saved", device="gpu")
    with pytest.raises(KernelInputError, match="the string 'bfloat16'; pass torch.bfloat16"):
        load_packed(tmp_path / "saved", dtype="bfloat16")
    assert isinstance(load_packed(tmp_path / "saved").model.layers[0].mlp.up_proj, PackedLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, PackedLinear)


def test_solver_and_packing_inputs_without_values_are_refused():
    import torch

    from sparsedecoding import solvers
    from sparsedecoding.errors import PackingError, QuantizationError, SolverSettingsError
    from sparsedecoding.kernels import pack_nm

    with pytest.raises(SolverSettingsError, match="hessian is on the meta device"):
        solvers.sparsegpt(torch.randn(8, 32), torch.empty(32, 32, device="meta"), "2:4")
    for weight in (torch.empty(8, 0), torch.ones(8, 32, dtype=torch.int32)):
        with pytest.raises(QuantizationError, match="needs a floating-point weight with rows and columns"):
            solvers.quantization_codes(weight, "int8")
    with pytest.raises(PackingError, match="weight is on the meta device"):
        pack_nm(torch.empty(16, 64, dtype=torch.bfloat16, device="meta"), 2, 4)


@pytest.mark.parametrize("argv", [
    lambda m, o, t, p: ["prune", "--model", m, "--out", o, "--calibration", "mix", "--text", t, "--prompts", p,
                        "--tokens", "64", "--device", "cpu", "--solver", "magnitude"],
    lambda m, o, t, p: ["prune", "--model", m, "--out", o, "--calibration", "text", "--text", t, "--tokens", "64",
                        "--device", "cpu", "--solver", "magnitude"],
    lambda m, o, t, p: ["analyze", "discrepancy", "--model", m, "--out", o, "--text", t, "--heldout", p,
                        "--calib-prompts", p + "2", "--tokens", "64", "--no-plot", "--device", "cpu"],
], ids=["prune-mix", "prune-text", "discrepancy"])
def test_a_text_too_short_for_its_share_is_refused_before_any_generation(capsys, monkeypatch, tmp_path, tiny, argv):
    """The text's tokens are counted as soon as the tokenizer is loaded, not after the model has written its decode
    calibration (a discrepancy run's text gets as many tokens as its decode set: at most --tokens)."""
    from transformers.utils import logging as hf_logging

    from sparsedecoding import calibration, generation

    hf_logging.disable_progress_bar()  # its loading bar is no error line
    monkeypatch.setattr(generation, "generate", lambda *a, **k: pytest.fail("generation ran before the text check"))
    monkeypatch.setattr(calibration, "generate", lambda *a, **k: pytest.fail("generation ran before the text check"))
    text, prompts = tmp_path / "short.txt", tmp_path / "p.txt"
    text.write_text("three words only")
    prompts.write_text("def f(x):\nhello\n")
    (tmp_path / "p.txt2").write_text("sort a list\nadd two numbers\n")
    out = tmp_path / "out"
    try:
        one_line_error(capsys, [str(part) for part in argv(tiny, out, text, str(prompts))],
                       "CalibrationError: the calibration text has")
    finally:
        hf_logging.enable_progress_bar()
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_a_pattern_is_recorded_as_parsed_and_only_ascii_digits_parse():
    from sparsedecoding.errors import SparsityPatternError
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.settings import PruneConfig

    assert [PruneConfig(model="m", out="o", pattern=text).pattern for text in (" 2:4", "2 :4", " dense ")] == \
        ["2:4", "2:4", "dense"]
    for text in ("２:４", "٢:٤", "５０%"):  # int() reads these digits; the pattern syntax does not
        with pytest.raises(SparsityPatternError):
            SparsityPattern.parse(text)


def test_unread_sampling_and_recipe_fields_are_named_under_text_calibration(tmp_path):
    from sparsedecoding.pipeline import unread_options
    from sparsedecoding.settings import PruneConfig

    plain = PruneConfig(model="m", out="o", calibration="text", do_sample=True, temperature=0.5)
    assert {"do_sample", "temperature"} <= set(unread_options(plain))
    recipe = PruneConfig(model="m", out="o", calibration="text", recipe="recommended")
    assert {"prompts", "do_sample", "samples_per_prompt", "temperature", "top_p"} <= set(unread_options(recipe))
    assert unread_options(PruneConfig(model="m", out="o", recipe="recommended")) == []


def test_pack_group_size_is_checked_and_an_unread_one_is_named(capsys, tmp_path, tiny, caplog):
    from helpers import prune_in_place
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny)
    prune_in_place(model, "2:4")
    model.save_pretrained(tmp_path / "p")
    for name in tiny.glob("tokenizer*"):
        (tmp_path / "p" / name.name).write_bytes(name.read_bytes())
    for size in ("0", "-32", "48"):
        one_line_error(capsys, ["pack", "--model", str(tmp_path / "p"), "--out", str(tmp_path / "o"), "--group-size",
                                size], "--group-size")
    assert not (tmp_path / "o").exists()
    with caplog.at_level("WARNING"):
        assert main(["pack", "--model", str(tmp_path / "p"), "--out", str(tmp_path / "o"), "--group-size", "64"]) == 0
    assert "--group-size 64 is not read" in caplog.text


@pytest.mark.parametrize("what, make, expected", [
    ("folder", lambda p: p.mkdir(), "is a folder"),
    ("device", None, "is not a regular file"),
    ("binary", lambda p: p.write_bytes(b"PK\x03\x04\x00\x00binary"), "holds NUL bytes"),
])
def test_a_text_or_prompt_path_says_what_is_wrong_with_it(tmp_path, what, make, expected):
    from sparsedecoding.data import read_prompts, read_text_file
    from sparsedecoding.errors import PromptsError

    path = tmp_path / what if make else __import__("pathlib").Path("/dev/null")
    if make:
        make(path)
    with pytest.raises(PromptsError, match=expected):
        read_text_file(path)
    if what != "binary":  # prompt files are UTF-8, refused as such
        with pytest.raises(PromptsError, match=expected):
            read_prompts(path)


def test_the_demo_names_its_own_token_flag(capsys, tmp_path):
    one_line_error(capsys, ["demo", "--tokens", "0", "--out", str(tmp_path / "d")],
                   "--tokens must be at least 1 for the demo")
    assert not (tmp_path / "d").exists()


def test_drift_of_a_model_against_itself_is_refused(capsys, tmp_path, tiny):
    one_line_error(capsys, ["analyze", "drift", "--dense", str(tiny), "--pruned", str(tiny), "--out",
                            str(tmp_path / "d"), "--steps", "4", "--limit", "1", "--no-plot", "--device", "cpu"],
                   "--dense and --pruned are the same model")
    assert not (tmp_path / "d").exists()


def test_an_all_reduce_choice_outside_torchrun_is_named_as_unread(monkeypatch, caplog):
    import torch

    from sparsedecoding.engine.parallel import start_from_env

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with caplog.at_level("WARNING"), start_from_env(torch.device("cpu"), "one-shot") as (group, _):
        assert group is None
    assert "--all-reduce one-shot is not read" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"), start_from_env(torch.device("cpu"), "auto"):
        pass
    assert "not read" not in caplog.text
