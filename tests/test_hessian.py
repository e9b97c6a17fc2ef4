import pytest
import torch

from sparsedecoding.calibration import decode_set_from_generations
from sparsedecoding.errors import NonFiniteActivationError
from sparsedecoding.generation import generate, tokenize_prompts
from sparsedecoding.data import chat_format
from sparsedecoding.hessian import HessianAccumulator, KeepMask, accumulate_inputs, collect_hessians, input_groups
from sparsedecoding.models import load_model
from helpers import make_tiny_model


def test_streaming_sum_equals_direct_formula():
    X = torch.randn(100, 8, dtype=torch.float64)
    accumulator = HessianAccumulator(8, torch.float64)
    for chunk in X.split(7):
        accumulator.add(chunk)
    torch.testing.assert_close(accumulator.hessian(), 2 * X.T @ X / 100)


def test_shared_inputs_are_grouped():
    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    assert input_groups(names) == {"self_attn.qkv": names[:3], "self_attn.o_proj": [names[3]],
                                   "mlp.gate_up": names[4:6], "mlp.down_proj": [names[6]]}


def test_masked_rows_are_not_counted():
    linear = torch.nn.Linear(4, 3)
    keep = KeepMask()
    x = torch.randn(2, 5, 4)
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]], dtype=torch.bool)
    with accumulate_inputs({"lin": linear}, keep) as accumulators:
        keep.set(mask)
        linear(x)
    rows = x[mask]
    torch.testing.assert_close(accumulators["lin"].hessian(), 2 * rows.T @ rows / 4)


def test_non_finite_input_raises():
    linear = torch.nn.Linear(4, 3)
    keep = KeepMask()
    with pytest.raises(NonFiniteActivationError, match="NaN/inf"):
        with accumulate_inputs({"lin": linear}, keep):
            keep.set(torch.ones(1, 2, dtype=torch.bool))
            linear(torch.tensor([[[1.0, float("nan"), 0, 0], [0, 0, 0, 0]]]))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_replayed_decode_hessians_equal_hooks_during_kv_cached_generation(tmp_path, arch):
    """The paper's key fact: replaying prompt + generation teacher-forced, keeping generated positions only, gives the
    same layer inputs as the real decode steps of KV-cached generation."""
    model, tokenizer, _ = load_model(make_tiny_model(tmp_path / arch, arch=arch))
    targets = {name: module for name, module in model.named_modules() if name.endswith(("q_proj", "down_proj"))}
    sums = {name: torch.zeros(module.in_features, module.in_features, dtype=torch.float64)
            for name, module in targets.items()}
    counts = dict.fromkeys(targets, 0)

    def make_hook(name):
        def hook(module, args):
            x = args[0]
            if x.shape[1] == 1:  # a decode step (the prefill reads the whole prompt at once)
                rows = x.reshape(-1, x.shape[-1]).double()
                sums[name] += rows.T @ rows
                counts[name] += rows.shape[0]
        return hook

    prompts = ["def add(a, b):", "print('hi')", "x = [i for i in range(10)]", "#", "import os", "while True:"]
    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    # Make the first prompt's fourth greedy token a stop token, so at least one continuation ends at a stop.
    first = generate(model, tokenizer, prompt_ids[:1], max_new_tokens=4, batch_size=1, progress=False)[0]
    model.generation_config.eos_token_id = [first.new_ids[-1]]
    handles = [module.register_forward_pre_hook(make_hook(name)) for name, module in targets.items()]
    # One prompt at a time, so every decode step of the real generation belongs to a live sequence.
    generations = [generate(model, tokenizer, [ids], max_new_tokens=6 + 2 * index, batch_size=1, progress=False)[0]
                   for index, ids in enumerate(prompt_ids)]
    for handle in handles:
        handle.remove()
    assert generations[0].stopped

    calib = decode_set_from_generations(generations, tokenizer.pad_token_id)
    assert len({int(keep.sum()) for keep in calib.keep}) > 1
    replayed = collect_hessians(model, calib, batch_size=4, progress=False)
    for name in targets:
        assert counts[name] == calib.tokens
        torch.testing.assert_close(replayed[name].double(), 2 * sums[name] / counts[name], rtol=1e-5, atol=1e-6)
