"""`sparsedecoding generate`, `bench` and `check` from the command line: streamed text and one-line errors, bad
requests refused before any model loads."""

import json

import pytest
import torch
from helpers import char_tokenizer, random_hf_model

from sparsedecoding.cli import main


def tiny_folder(tmp_path, arch="llama"):
    hf = random_hf_model(arch)
    hf.generation_config.eos_token_id = [1, 3]
    hf.save_pretrained(tmp_path)
    tokenizer = char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    return hf, tokenizer


def test_generate_streams_the_greedy_continuation(tmp_path, capsys):
    hf, tokenizer = tiny_folder(tmp_path)
    from sparsedecoding.engine import Engine, load_model

    # The engine's own greedy tokens, cut at the first stop token: what streaming must print. (That they equal
    # transformers' up to rounding-sized ties is test_engine's business; exact equality could flake at a tie.)
    prompt = tokenizer("hello", return_tensors="pt")["input_ids"]
    model = load_model(tmp_path, dtype=torch.float32, device="cpu")
    tokens = Engine(model, 1, prompt.shape[1] + 12, compile=False).generate(prompt, 12).tokens[0].tolist()
    stop = next((i for i, token in enumerate(tokens) if token in hf.generation_config.eos_token_id), len(tokens))
    expected_text = tokenizer.decode(tokens[:stop], skip_special_tokens=True)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hello", "--new-tokens", "12",
                 "--device", "cpu", "--dtype", "float32", "--sparse", "none"]) == 0
    assert capsys.readouterr().out == expected_text + "\n"


def one_line_error(capsys, argv, expected):
    capsys.readouterr()  # drop what building the fixture printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_the_presets_named_in_the_help_are_the_engine_presets():
    from sparsedecoding.cli.engine import PRESET_NAMES
    from sparsedecoding.engine.config import PRESETS

    assert set(PRESET_NAMES) == set(PRESETS)


def test_eval_does_not_offer_the_prune_recipe(capsys):
    from sparsedecoding.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["eval", "--model", "m", "--out", "o", "--recipe", "recommended"])
    assert stopped.value.code == 2 and "unrecognized arguments: --recipe" in capsys.readouterr().err


def test_unknown_preset_is_one_line(capsys):
    one_line_error(capsys, ["bench", "--preset", "llama-9b"], "EngineError: unknown preset 'llama-9b'")


def test_unsupported_architecture_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 8}))
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "hi", "--device", "cpu"],
                   "UnsupportedArchitectureError: model_type 'gpt2' is not supported")


def test_dense_weight_under_sparse_packed_is_one_line(tmp_path, capsys):
    tiny_folder(tmp_path)
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "hi", "--device", "cpu",
                            "--sparse", "packed"],
                   "EngineError: layers.0.attention.qkv.weight is not N:M sparse")


def test_pattern_with_a_model_folder_is_refused(tmp_path, capsys):
    one_line_error(capsys, ["bench", "--model", str(tmp_path), "--pattern", "2:4"],
                   "--pattern applies to --preset")


def test_batch_beyond_the_kernel_is_one_line(capsys):
    one_line_error(capsys, ["bench", "--preset", "smollm2-135m", "--batch", "1", "17"],
                   "EngineError: batch sizes [1, 17] must lie in 1..16")


def test_unstructured_pattern_is_one_line(capsys):
    one_line_error(capsys, ["bench", "--preset", "smollm2-135m", "--pattern", "50%"],
                   "EngineError: the kernel cannot run pattern 50%")


def test_dense_copy_threshold_above_every_batch_is_one_line(capsys):
    one_line_error(capsys, ["bench", "--preset", "smollm2-135m", "--batch", "1", "2", "--dense-copy-from-batch", "4"],
                   "EngineError: --dense-copy-from-batch 4 is above every --batch [1, 2]")


def test_sparse_auto_on_the_cpu_runs_dense_and_says_so(tmp_path, capsys, monkeypatch):
    from helpers import prune_in_place

    import sparsedecoding.engine as engine
    from sparsedecoding.patterns import SparsityPattern

    hf, _ = tiny_folder(tmp_path)
    prune_in_place(hf, SparsityPattern.parse("2:4"))
    hf.save_pretrained(tmp_path)
    modes, load = [], engine.load_model
    monkeypatch.setattr(engine, "load_model", lambda *args, **kwargs: modes.append(kwargs["sparse"]) or
                        load(*args, **kwargs))
    argv = ["generate", "--model", str(tmp_path), "--prompt", "hello", "--new-tokens", "4", "--device", "cpu"]
    assert main(argv + ["--sparse", "auto"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "running the dense weights on cpu" in line]
    assert modes == ["none"] and len(notes) == 1
    assert main(argv + ["--sparse", "packed"]) == 0  # asked for explicitly, the packed path still runs
    assert modes == ["none", "packed"]
    assert "running the dense weights" not in capsys.readouterr().err


@pytest.fixture
def no_loading(monkeypatch):
    """Makes loading a model (engine or `check`) fail loudly: a bad request must be refused before that."""
    import sparsedecoding.engine as engine
    import sparsedecoding.evaluation.engine_check as engine_check

    def loads(*args, **kwargs):
        raise AssertionError("the model was loaded before the request was checked")

    monkeypatch.setattr(engine, "load_model", loads)
    monkeypatch.setattr(engine_check, "run", loads)


def packed_folder(tmp_path):
    from helpers import prune_in_place

    from sparsedecoding.patterns import SparsityPattern

    hf, _ = tiny_folder(tmp_path / "pruned")
    prune_in_place(hf, SparsityPattern.parse("2:4"))
    hf.save_pretrained(tmp_path / "pruned")
    assert main(["pack", "--model", str(tmp_path / "pruned"), "--out", str(tmp_path / "packed")]) == 0
    return tmp_path / "packed"


@pytest.mark.parametrize("kind", ["hf", "packed"])
def test_truncated_weights_fail_before_loading(tmp_path, capsys, monkeypatch, kind):
    if kind == "packed":
        folder = packed_folder(tmp_path)
    else:
        folder = tmp_path
        tiny_folder(folder)
    generate = ["generate", "--model", str(folder), "--prompt", "hi", "--new-tokens", "2", "--device", "cpu"]
    assert main(generate) == 0  # the check accepts the whole folder, packed shards included
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    import sparsedecoding.engine as engine

    monkeypatch.setattr(engine, "load_model", lambda *args, **kwargs: pytest.fail("loaded a truncated folder"))
    one_line_error(capsys, generate, "ModelFileError: " + str(weights))
    if kind == "hf":
        one_line_error(capsys, ["check", "--model", str(folder), "--device", "cpu", "--checks", "logits"],
                       "ModelFileError: " + str(weights))


@pytest.mark.parametrize("command", ["generate", "check"])
def test_half_written_config_is_one_line(tmp_path, capsys, no_loading, command):
    tiny_folder(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text()[:100])
    argv = [command, "--model", str(tmp_path), "--device", "cpu"]
    if command == "generate":
        argv += ["--prompt", "hi"]
    one_line_error(capsys, argv, f"ModelFileError: {config} is not valid JSON")


def test_config_without_a_needed_field_is_one_line(tmp_path, capsys, no_loading):
    tiny_folder(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({key: value for key, value in json.loads(config.read_text()).items()
                                  if key != "hidden_size"}))
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "hi", "--device", "cpu"],
                   f"ModelFileError: {config} lacks 'hidden_size'")


@pytest.mark.parametrize("out, expected", [
    ("a-file/report.md", "OutputNotWritableError: cannot create"),
    ("a-folder", "OutputNotWritableError: --out"),
])
def test_check_refuses_an_unwritable_report_before_running(tmp_path, capsys, no_loading, out, expected):
    tiny_folder(tmp_path / "model")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    one_line_error(capsys, ["check", "--model", str(tmp_path / "model"), "--device", "cpu", "--checks", "logits",
                            "--out", str(tmp_path / out)], expected)


def test_check_tokens_in_float32_is_refused_before_loading(tmp_path, capsys, no_loading):
    tiny_folder(tmp_path)
    one_line_error(capsys, ["check", "--model", str(tmp_path), "--device", "cpu", "--checks", "tokens",
                            "--dtype", "float32"], "EngineError: --checks tokens packs the N:M linears")


@pytest.mark.parametrize("flags, expected", [
    (["--new-tokens", "0"], "--new-tokens must be at least 1, got 0"),
    (["--new-tokens", "-3"], "--new-tokens must be at least 1, got -3"),
    (["--prompt", ""], "--prompt is empty"),
    (["--temperature", "-1"], "--temperature -1.0 must be a finite number"),
    (["--temperature", "nan"], "--temperature nan must be a finite number"),
    (["--temperature", "inf"], "--temperature inf must be a finite number"),
    (["--top-k", "0"], "--top-k must be at least 1, got 0"),
    (["--sparse", "packed", "--dtype", "float32"], "--sparse packed runs N:M linears packed"),
])
def test_bad_generate_request_is_refused_before_loading(tmp_path, capsys, no_loading, flags, expected):
    tiny_folder(tmp_path)
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "hi", "--device", "cpu", *flags],
                   "EngineError: " + expected)


def test_prompt_without_tokens_is_refused_before_loading(tmp_path, capsys, no_loading):
    from tokenizers import pre_tokenizers

    _, tokenizer = tiny_folder(tmp_path)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # a blank prompt has no tokens
    tokenizer.save_pretrained(tmp_path)
    one_line_error(capsys, ["generate", "--model", str(tmp_path), "--prompt", "  ", "--device", "cpu"],
                   "EngineError: --prompt '  ' encodes to no tokens")


def test_generate_stops_at_config_json_eos_when_the_generation_config_names_none(tmp_path):
    """A generation_config.json without eos_token_id: the stop ids come from config.json (then the tokenizer), as
    the hf path's `models.stop_token_ids` takes them, instead of none at all."""
    from transformers import GenerationConfig

    from helpers import make_tiny_model
    from sparsedecoding.cli.engine import _stop_ids
    from sparsedecoding.models import load_tokenizer

    folder = make_tiny_model(tmp_path / "m")
    GenerationConfig(pad_token_id=0).save_pretrained(folder)  # no eos_token_id
    assert _stop_ids(folder, load_tokenizer(folder)) == {1, 3}


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_sampling_refuses_a_temperature_that_is_not_finite_and_non_negative(temperature):
    from sparsedecoding.engine import Sampling
    from sparsedecoding.errors import EngineError

    with pytest.raises(EngineError, match="finite number of at least 0"):
        Sampling(temperature)


@pytest.mark.parametrize("pattern, expected", [
    ("3:2", "'3:2' — N must satisfy 0 < N < M"),
    ("abc", "'abc' is not a sparsity pattern"),
    ("16:32+9", "'16:32+9' — N:M+K needs a 50% pattern"),
])
def test_bench_shows_the_pattern_error(capsys, pattern, expected):
    one_line_error(capsys, ["bench", "--preset", "llama-3.1-8b", "--pattern", pattern],
                   "SparsityPatternError: " + expected)


@pytest.mark.parametrize("flags, expected", [
    (["--prompt-tokens", "0"], "EngineError: --prompt-tokens 0"),
    (["--prompt-tokens", "-4"], "EngineError: --prompt-tokens -4"),
    (["--repeats", "0"], "EngineError: --repeats 0"),
    (["--repeats", "-1"], "EngineError: --repeats -1"),
    (["--out", "{tmp}/a-file/report.md"], "OutputNotWritableError: cannot create"),
    (["--out", "{tmp}/report.json"], "EngineError: --out {tmp}/report.json names the markdown report"),
    (["--out", "{tmp}/taken.md"], "OutputNotWritableError: --out {tmp}/taken.json is a folder"),
])
def test_bad_bench_request_is_refused_before_gpu_work(tmp_path, capsys, flags, expected):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "taken.json").mkdir()  # where the JSON beside taken.md would go
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    one_line_error(capsys, ["bench", "--preset", "smollm2-135m", *flags], expected.format(tmp=tmp_path))


def test_bench_checks_the_model_folder_before_gpu_work(tmp_path, capsys):
    one_line_error(capsys, ["bench", "--model", str(tmp_path / "missing")], "ModelNotFoundError: ")
    tiny_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)
    one_line_error(capsys, ["bench", "--model", str(tmp_path)], "ModelFileError: ")
