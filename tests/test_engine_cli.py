"""`sparsedecoding generate` and `bench` from the command line: streamed text and one-line errors."""

import json

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
