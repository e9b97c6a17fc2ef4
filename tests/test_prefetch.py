"""L2 prefetch of the next linear (`kernels.prefetch`): on CPU, the plan's byte ranges, the registry, the forward
order of a model's linears, the module swap, and the setting's validation; on GPU, prefetching changes no bit of
the sp24 kernel's output, the standalone launch runs inside a CUDA graph, and a chained engine model decodes the
tokens of the same model without it."""

from __future__ import annotations

import weakref

import pytest
import torch

from sparsedecoding.engine.config import ModelArgs
from sparsedecoding.engine.loading import build_model, random_state

from sparsedecoding.kernels import prefetch
from sparsedecoding.kernels.op import KernelChoiceError
from sparsedecoding.kernels.prefetch import (NO_PREFETCH, L2Prefetch, PrefetchingLinear, chain_prefetch, plan_for,
                                             prefetch_setting, set_plan)
from sparsedecoding.patterns import SparsityPattern

TINY = ModelArgs(architecture="llama", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 intermediate_size=96, norm_eps=1e-5, rope_theta=10000.0)


def test_plan_splits_the_budget_over_the_largest_three_tensors_in_proportion():
    tensors = [torch.zeros(n, dtype=torch.uint8) for n in (1000, 3000, 64, 8000)]
    plan = L2Prefetch(tensors, 6000)
    assert [t.numel() for t in plan.tensors] == [8000, 3000, 1000]
    assert list(plan.lengths) == [4000, 1488, 496]  # half of each, rounded down to 16 bytes
    assert list(plan.pointers) == [t.data_ptr() for t in plan.tensors]
    assert plan.nbytes == 4000 + 1488 + 496
    whole = L2Prefetch(tensors[:2], 10**9)
    assert list(whole.lengths) == [3000 // 16 * 16, 1000 // 16 * 16, 0]
    assert NO_PREFETCH.nbytes == 0 and list(NO_PREFETCH.lengths) == [0, 0, 0]


def test_registry_refuses_cpu_targets_and_drops_plans_of_dead_sources():
    source = torch.zeros(64)
    with pytest.raises(KernelChoiceError, match="cannot be prefetched"):
        set_plan(source, L2Prefetch([torch.zeros(64)], 128))
    assert plan_for(source) is NO_PREFETCH
    plan = L2Prefetch([torch.zeros(64)], 128)
    prefetch._plans[source.data_ptr()] = (weakref.ref(source), plan)  # as set_plan stores a CUDA one
    try:
        assert plan_for(source) is plan
        prefetch._plans[source.data_ptr()] = (lambda: None, plan)  # the source tensor is gone
        assert plan_for(source) is NO_PREFETCH
        assert source.data_ptr() not in prefetch._plans
    finally:
        prefetch._plans.pop(source.data_ptr(), None)


def test_linears_come_in_forward_order():
    model = build_model(TINY, random_state(TINY, SparsityPattern.parse("2:4"), device="cpu"))
    names = [name for name, _ in prefetch._linears(model)]
    per_layer = ["attention.qkv", "attention.out", "mlp.gate_up", "mlp.down"]
    assert names == [f"layers.{i}.{n}" for i in range(TINY.n_layers) for n in per_layer] + ["output"]


def test_prefetching_linear_shares_the_parameters_and_computes_the_linear():
    linear = torch.nn.Linear(32, 24)
    module = PrefetchingLinear.from_linear(linear)
    assert module.weight is linear.weight and module.bias is linear.bias
    x = torch.randn(3, 32)
    torch.testing.assert_close(module(x), linear(x), rtol=0, atol=0)
    back = module.to_linear()
    assert type(back) is torch.nn.Linear and back.weight is linear.weight


def test_chain_refuses_when_the_kernel_cannot_run(monkeypatch):
    from sparsedecoding.kernels import cuda_mma, sp24

    def unavailable():
        raise cuda_mma.CudaKernelUnavailableError("no CUDA GPU")
    monkeypatch.setattr(sp24, "load", unavailable)
    model = build_model(TINY, random_state(TINY, None, device="cpu"))
    assert chain_prefetch(model, 0) == 0
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_L2_PREFETCH.*no CUDA GPU"):
        chain_prefetch(model, 1 << 20)


@pytest.mark.parametrize("value,expected", [("", 0), ("0", 0), ("16", 16 << 20), (" 32 ", 32 << 20)])
def test_setting_is_mib(value, expected, monkeypatch):
    monkeypatch.setenv("SPARSEDECODING_L2_PREFETCH", value)
    assert prefetch_setting() == expected


@pytest.mark.parametrize("value", ["-1", "lots", "1.5"])
def test_bad_setting_raises(value, monkeypatch):
    monkeypatch.setenv("SPARSEDECODING_L2_PREFETCH", value)
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_L2_PREFETCH"):
        prefetch_setting()


@pytest.mark.parametrize("command", [["bench", "--preset", "llama-3.1-8b"], ["generate", "--model", "nowhere",
                                                                             "--prompt", "hi"]])
def test_cli_refuses_a_bad_prefetch_setting_before_any_work(command, monkeypatch, capsys):
    from sparsedecoding.cli import main

    monkeypatch.setenv("SPARSEDECODING_L2_PREFETCH", "lots")
    assert main(command) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "SPARSEDECODING_L2_PREFETCH='lots'" in errors[0]


def test_bench_refuses_a_negative_budget(capsys):
    from sparsedecoding.cli import main

    assert main(["bench", "--preset", "llama-3.1-8b", "--l2-prefetch", "-4"]) == 2
    assert "--l2-prefetch" in capsys.readouterr().err


# --- GPU ------------------------------------------------------------------------------------------------------------

def _tiled(out, in_features, kind, seed):
    from sparsedecoding.kernels.sp24 import tile
    from test_sp24 import _packed_on_gpu

    return tile(_packed_on_gpu(kind, out, in_features, seed)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("budget", [16, 1000, 1 << 30])
def test_sp24_output_is_the_same_with_a_prefetch(kind, budget):
    from sparsedecoding.kernels.sp24 import Sp24Launch

    generator = torch.Generator().manual_seed(budget)
    w = _tiled(1040, 1024, kind, seed=1)
    following = _tiled(512, 2048, kind, seed=2)
    plan = L2Prefetch([following.a, following.meta] + ([following.scales] if following.scales is not None else []),
                      budget)
    for batch in (1, 5, 16):
        x = torch.randn(batch, 1024, generator=generator).bfloat16().cuda()
        for splits in (1, 3):
            launch = Sp24Launch(x, w, splits)
            assert torch.equal(launch(x, w, plan), launch(x, w))


@pytest.mark.gpu
def test_standalone_prefetch_runs_in_a_cuda_graph():
    weight = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    plan = L2Prefetch([weight], 3 << 20)
    graph = torch.cuda.CUDAGraph()
    prefetch.launch(plan, weight.device)  # outside capture first
    with torch.cuda.graph(graph):
        prefetch.launch(plan, weight.device)
    graph.replay()
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_chained_engine_decodes_the_same_tokens(pattern, monkeypatch):
    """Qwen2.5-Coder-1.5B's shapes, 4 layers, dense or 2:4 (tiled): the compiled CUDA-graph decode with every
    linear prefetching the next gives the tokens of the same model without prefetch (divergence only at a logit
    tie)."""
    from dataclasses import replace

    from sparsedecoding.engine import PRESETS, Engine
    from sparsedecoding.evaluation.engine_check import compare_tokens, replay_logits
    from sparsedecoding.kernels.sp24_linear import Sp24Linear

    args = replace(PRESETS["qwen2.5-coder-1.5b"], n_layers=4)
    monkeypatch.setenv("SPARSEDECODING_L2_PREFETCH", "0")
    model = build_model(args, random_state(args, pattern and SparsityPattern.parse(pattern), device="cuda"))
    prompt = torch.randint(0, args.vocab_size, (3, 8))
    plain = Engine(model, 3, 40, compile=True).generate(prompt, 32).tokens
    linked = chain_prefetch(model, 4 << 20)
    assert linked == 4 * 4
    sources = [m for m in model.modules() if isinstance(m, (Sp24Linear, PrefetchingLinear))]
    assert all(plan_for(prefetch._source(m)).nbytes > 0 for m in sources[:-1])
    if pattern:
        assert sum(isinstance(m, Sp24Linear) for m in model.modules()) == 4 * 4
    torch._dynamo.reset()
    chained = Engine(model, 3, 40, compile=True).generate(prompt, 32).tokens
    chain_prefetch(model, 0)
    assert not any(isinstance(m, PrefetchingLinear) for m in model.modules())
    for row in range(3):
        logits = replay_logits(model, prompt[row], plain[row])[7:]
        assert compare_tokens(plain[row], chained[row], logits, logits).passed
