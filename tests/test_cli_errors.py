"""Each bad input to `sparsedecoding prune` gives one clear error line, a non-zero exit code and no output."""

import json

import pytest

from sparsedecoding.cli import main
from helpers import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("cli") / "model")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("def f(x):\nhello\n")
    return path


def run_prune(capsys, *args):
    code = main(["prune", *map(str, args)])
    err = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in err if line.startswith("error:")]


def assert_clean_failure(code, errors, out, expected):
    assert code == 2
    assert len(errors) == 1 and expected in errors[0], errors
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


@pytest.mark.parametrize("pattern,expected", [("3:2", "SparsityPatternError"), ("4:4", "0 < N < M"),
                                              ("half", "not a sparsity pattern")])
def test_bad_pattern(capsys, tmp_path, tiny_folder, prompts, pattern, expected):
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", prompts, "--out", out, "--pattern", pattern)
    assert_clean_failure(code, errors, out, expected)


def test_missing_model(capsys, tmp_path, prompts):
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tmp_path / "nope", "--prompts", prompts, "--out", out)
    assert_clean_failure(code, errors, out, "ModelNotFoundError")


def test_unsupported_architecture(capsys, tmp_path, prompts):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(folder)
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", folder, "--prompts", prompts, "--out", out)
    assert_clean_failure(code, errors, out, "UnsupportedArchitectureError")


@pytest.mark.parametrize("flags", [["--calibration", "self"], ["--repair-steps", "1"]])
def test_an_architecture_the_engine_refuses_names_gen_backend_hf(capsys, tmp_path, prompts, flags):
    """Self-written data and on-policy repair generate on the engine by default: a model it cannot run is refused
    before any work (not after the layers are solved), and the error says how to generate with hf instead."""
    folder = make_tiny_model(tmp_path / "gelu", hidden_act="gelu")
    prompts.write_text("".join(f"write function {index}\n" for index in range(40)))  # both sides of repair's split
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", folder, "--prompts", prompts, "--out", out, *flags)
    assert_clean_failure(code, errors, out, "activation 'gelu'")
    assert "UnsupportedArchitectureError" in errors[0] and "--gen-backend hf" in errors[0]
    from sparsedecoding.pipeline import check_gen_backend
    from sparsedecoding.settings import PruneConfig

    gelu = json.loads((folder / "config.json").read_text())
    for passes in (dict(calibration="self", gen_backend="hf"), dict(calibration="decode")):  # no engine: no check
        check_gen_backend(PruneConfig(model="m", out="o", **passes), gelu)


@pytest.mark.parametrize("flags", [["--calibration", "self"], ["--repair-steps", "1"]])
@pytest.mark.parametrize("setting", ["SPARSEDECODING_FUSED_ATTENTION", "SPARSEDECODING_INDUCTOR_ATTENTION"])
def test_a_bad_engine_setting_is_refused_before_the_model_loads(capsys, tmp_path, tiny_folder, prompts, monkeypatch,
                                                                flags, setting):
    """Where the engine generates (self-written data, on-policy repair), its environment settings are checked with
    the other inputs, not when it is first built, after the calibration and the solve."""
    import sparsedecoding.pipeline as pipeline

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the bad setting was refused")

    monkeypatch.setattr(pipeline, "load_model", never)
    monkeypatch.setenv(setting, "bogus")
    prompts.write_text("".join(f"write function {index}\n" for index in range(40)))
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", prompts, "--out", out, *flags)
    assert_clean_failure(code, errors, out, f"KernelChoiceError: {setting}='bogus'")


@pytest.mark.parametrize("flags, flag", [
    (["--max-new-tokens", "513"], "--max-new-tokens 513"),  # decode calibration
    (["--calibration", "text", "--text", "TEXT", "--text-seq-len", "600", "--tokens", "1200"], "--text-seq-len 600"),
    (["--calibration", "mix", "--text", "TEXT", "--max-new-tokens", "1000"], "--max-new-tokens 1000"),
    (["--calibration", "self", "--max-new-tokens", "700"], "--max-new-tokens 700"),  # self-written answers
])
def test_lengths_past_the_models_context_are_refused_before_it_loads(capsys, tmp_path, tiny_folder, prompts,
                                                                     monkeypatch, flags, flag):
    """The tiny model has 512 positions: calibrating past them would measure positions it was never trained for."""
    import sparsedecoding.pipeline as pipeline

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the lengths were checked")

    monkeypatch.setattr(pipeline, "load_model", never)
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    prompts.write_text("".join(f"write function {index}\n" for index in range(40)))
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", prompts, "--out", out,
                             *[str(text) if flag_ == "TEXT" else flag_ for flag_ in flags])
    assert_clean_failure(code, errors, out, f"{flag} passes the model's context of 512 positions")


@pytest.mark.parametrize("content", ["", "\n  \n", '{"prompt": ""}\n'])
def test_empty_prompt_file(capsys, tmp_path, tiny_folder, content):
    path = tmp_path / ("prompts.jsonl" if content.startswith("{") else "prompts.txt")
    path.write_text(content)
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", path, "--out", out)
    assert_clean_failure(code, errors, out, "PromptsError")


def test_missing_prompt_file(capsys, tmp_path, tiny_folder):
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", tmp_path / "none.jsonl", "--out", out)
    assert_clean_failure(code, errors, out, "does not exist")


def test_zero_decode_tokens(capsys, tmp_path, tiny_folder, prompts):
    folder = tmp_path / "stops-at-once"
    make_tiny_model(folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = list(range(128))  # every token ends generation: nothing is ever read back
    (folder / "generation_config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", folder, "--prompts", prompts, "--out", out)
    assert_clean_failure(code, errors, out, "no decode tokens")


def test_non_finite_activations(capsys, tmp_path, prompts):
    from safetensors.torch import load_file, save_file

    folder = make_tiny_model(tmp_path / "nan")
    tensors = load_file(str(folder / "model.safetensors"))
    # finite weights (non-finite ones are refused at load) whose norm output overflows float32 in layer 0's inputs
    tensors["model.layers.0.input_layernorm.weight"].fill_(3e38)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", folder, "--prompts", prompts, "--out", out, "--calibration", "text",
                             "--tokens", "64")
    assert_clean_failure(code, errors, out, "NonFiniteActivationError")


def test_existing_output_needs_overwrite(capsys, tmp_path, tiny_folder, prompts):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, errors = run_prune(capsys, "--model", tiny_folder, "--prompts", prompts, "--out", out)
    assert code == 2 and len(errors) == 1 and "--overwrite" in errors[0]
    assert (out / "keep.txt").read_text() == "mine"
    code = main(["prune", "--model", str(tiny_folder), "--prompts", str(prompts), "--out", str(out), "--overwrite",
                 "--tokens", "8", "--max-new-tokens", "8"])
    assert code == 0 and not (out / "keep.txt").exists() and (out / "sparsedecoding.json").exists()


def test_text_needs_a_budget(capsys, tmp_path, tiny_folder, prompts):
    out = tmp_path / "out"
    code, errors = run_prune(capsys, "--model", tiny_folder, "--out", out, "--calibration", "text", "--tokens", "0")
    assert_clean_failure(code, errors, out, "--tokens")


def test_the_cli_logs_its_own_progress_and_other_libraries_only_from_warnings():
    """A command's INFO lines are shown; another library's INFO (torch's compile-cache statistics at exit, say) is
    not, unless -v."""
    import subprocess
    import sys
    from pathlib import Path

    script = ("import logging, sys\nfrom sparsedecoding.cli import fetch, main\n"
              "def run(args):\n"
              "    logging.getLogger('torch._subclasses.fake_tensor').info('cache statistics')\n"
              "    logging.getLogger('torch._subclasses.fake_tensor').warning('a real warning')\n"
              "    logging.getLogger('sparsedecoding.models').info('our progress')\n"
              "    return 0\n"
              "fetch.run = run\nsys.exit(main(sys.argv[1:]))\n")
    source = str(Path(__file__).resolve().parents[1] / "src")
    for flags, shown in (([], {"our progress", "a real warning"}),
                         (["-v"], {"our progress", "a real warning", "cache statistics"})):
        done = subprocess.run([sys.executable, "-c", script, *flags, "fetch", "smollm2-135m"], capture_output=True,
                              text=True, env={"PYTHONPATH": source, "PATH": "/usr/bin:/bin"}, timeout=120)
        assert done.returncode == 0, done.stderr
        said = {message for message in ("our progress", "a real warning", "cache statistics") if message in done.stderr}
        assert said == shown, (flags, done.stderr)
