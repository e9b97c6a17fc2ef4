"""The compiled engine on a GPU: compiled regions + CUDA-graph decode give the eager engine's tokens (divergence
only at a logit tie), the bench runs end to end, and the correctness check passes on a tiny pruned model."""

from dataclasses import replace

import pytest
import torch
from helpers import char_tokenizer, prune_in_place, random_hf_model

from sparsedecoding.engine import PRESETS, Engine, build_model, random_state
from sparsedecoding.engine.bench import NotRun, bench_preset, format_table
from sparsedecoding.evaluation.engine_check import compare_tokens, replay_logits, run
from sparsedecoding.patterns import SparsityPattern

pytestmark = pytest.mark.gpu

# SmolLM2's real shapes (every in_features a multiple of 32) with fewer layers to keep the test short.
ARGS = replace(PRESETS["smollm2-135m"], n_layers=6)


@pytest.mark.parametrize("pattern, batch", [(None, 1), ("2:4", 3)])
def test_compiled_decode_gives_the_eager_tokens(pattern, batch):
    pattern = pattern and SparsityPattern.parse(pattern)
    model = build_model(ARGS, random_state(ARGS, pattern, dtype=torch.bfloat16, device="cuda"))
    prompt = torch.randint(0, ARGS.vocab_size, (batch, 8))
    eager = Engine(model, batch, 40, compile=False).generate(prompt, 32).tokens
    compiled = Engine(model, batch, 40, compile=True).generate(prompt, 32).tokens
    for row in range(batch):
        # Row i of each replay predicts token i of the eager continuation from the same prefix.
        logits = replay_logits(model, prompt[row], eager[row])[7:]
        assert compare_tokens(eager[row], compiled[row], logits, logits).passed


def test_bench_measures_dense_and_sparse_side_by_side():
    results = bench_preset("smollm2-135m", [(None, [1]), (SparsityPattern.parse("2:4"), [1])],
                           torch.device("cuda"), new_tokens=32, repeats=1)
    assert not any(isinstance(r, NotRun) for r in results)
    assert [r.weights for r in results] == ["dense", "2:4"]
    assert all(r.tokens_per_second > 0 and r.decode_steps == 31 for r in results)
    assert results[1].weight_bytes < 0.7 * results[0].weight_bytes
    assert "x |" in format_table(results, 4e12)


def test_bench_cli_writes_the_report_and_its_json_beside_it(tmp_path, capsys):
    """`bench --out R.md` writes the markdown report and R.json: the command, environment, settings and one record
    a row, the ratio against the dense row of the same run."""
    import json

    from sparsedecoding.cli import main

    out = tmp_path / "runs" / "bench.md"
    assert main(["bench", "--preset", "smollm2-135m", "--new-tokens", "32", "--repeats", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["command"].startswith("sparsedecoding bench --preset smollm2-135m")
    assert record["environment"]["device"] == torch.cuda.get_device_name()
    assert record["settings"]["SPARSEDECODING_KERNEL"] == "auto"
    dense, sparse = record["results"]
    assert (dense["weights"], sparse["weights"], dense["vs_dense"]) == ("dense", "2:4", 1.0)
    assert sparse["vs_dense"] == sparse["tokens_per_second_per_sequence"] / dense["tokens_per_second_per_sequence"]
    assert f"| {sparse['vs_dense']:.3f}x |" in out.read_text()


def test_correctness_check_passes_on_a_tiny_pruned_model(tmp_path):
    model = random_hf_model("qwen2")
    prune_in_place(model, "2:4")
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    report = run(tmp_path, ["hello world", "abc"], 24, torch.device("cuda"), compile=True, checks=["logits", "tokens"])
    assert "| NO |" not in report and report.count("| yes |\n") == 4


def test_correctness_check_passes_with_some_linears_left_dense(tmp_path):
    """A model pruned with some linears left dense (as `prune --dense-linears` leaves them): the engine runs layer
    0's q|k|v dense (its k_proj is dense) and layer 1's down dense, packs every other linear (for the Triton or the
    2:4 tensor-core kernel), and its compiled
    CUDA-graph tokens and logits pass the check against transformers."""
    from sparsedecoding.engine.config import load_hf_config
    from sparsedecoding.engine.loading import model_from_hf
    from sparsedecoding.kernels import PackedLinear
    from sparsedecoding.kernels.sp24_linear import Sp24Linear
    from sparsedecoding.models import load_checkpoint

    dense = ["model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"]
    model = random_hf_model("qwen2")
    kept = {name: model.get_submodule(name).weight.clone() for name in dense}
    prune_in_place(model, "2:4")
    with torch.no_grad():
        for name, weight in kept.items():
            model.get_submodule(name).weight.copy_(weight)
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    weights = load_checkpoint(tmp_path, torch.bfloat16).state_dict()
    engine = model_from_hf(load_hf_config(tmp_path), weights.__getitem__, "auto", torch.bfloat16, torch.device("cuda"))
    packed = [[isinstance(module, (PackedLinear, Sp24Linear)) for module in (block.attention.qkv, block.attention.out,
                                                               block.mlp.gate_up, block.mlp.down)]
              for block in engine.layers]
    assert packed == [[False, True, True, True], [True, True, True, False]]
    report = run(tmp_path, ["hello world", "abc"], 24, torch.device("cuda"), compile=True, checks=["logits", "tokens"])
    assert "| NO |" not in report and report.count("| yes |\n") == 4
