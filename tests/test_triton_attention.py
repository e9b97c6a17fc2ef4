"""The fused decode attention (`kernels.triton_attention`): output and cache writes against a float64 attention
computed here from the definition, for one and several position ranges, grouped heads (4 and 6 queries a KV head,
as Llama-3.1-8B and Qwen2.5-1.5B), the first position, ranges that end inside a tile, batch 1-3, bf16 and fp16;
under the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the kernel module is imported) and on the GPU;
one clear error per bad input."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels.triton_attention import counters_for, launch  # noqa: E402


def rope64(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def problem(batch, heads, kv_heads, head_dim, cache_len, pos, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    omega = 10000.0 ** (-torch.arange(0, head_dim, 2).double() / head_dim)
    angles = torch.outer(torch.arange(cache_len).double(), omega)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    k_cache = torch.randn(batch, kv_heads, cache_len, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(batch, kv_heads, cache_len, head_dim, generator=g).to(dtype)
    return [t.to(DEVICE) for t in (qkv, cos, sin, k_cache, v_cache)]


def norm64(x, weight, eps, dtype):
    """RMSNorm over the last axis in float64, rounded to `dtype` after normalizing and after the weight (as the
    engine's q/k norms round)."""
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype).double()
    return (normed * weight.double().cpu()).to(dtype).double()


def float64_attention(qkv, cos, sin, k_cache, v_cache, pos, heads, qk_norm=None):
    """y [B, heads·d] and the caches as they should be after the step, from the definition in float64 (q and k
    rounded to the cache's dtype after the rotation, as the model stores them; `qk_norm` (q weight, k weight, eps)
    normalizes each head first)."""
    batch, kv_heads, _, d = k_cache.shape
    dtype = k_cache.dtype
    qkv, cos, sin = qkv.double().cpu(), cos[pos].double().cpu(), sin[pos].double().cpu()
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = q.reshape(batch, heads, d), k.reshape(batch, kv_heads, d)
    if qk_norm is not None:
        q, k = norm64(q, qk_norm[0], qk_norm[2], dtype), norm64(k, qk_norm[1], qk_norm[2], dtype)
    q = rope64(q, cos, sin).to(dtype).double()
    k = rope64(k, cos, sin).to(dtype)
    keys, values = k_cache.cpu().clone(), v_cache.cpu().clone()
    keys[:, :, pos] = k
    values[:, :, pos] = v.view(batch, kv_heads, d).to(dtype)
    group = heads // kv_heads
    kk = keys.double()[:, :, : pos + 1].repeat_interleave(group, dim=1)  # [B, heads, pos+1, d]
    vv = values.double()[:, :, : pos + 1].repeat_interleave(group, dim=1)
    weights = ((q[:, :, None] * kk).sum(-1) / d**0.5).softmax(-1)
    return (weights[..., None] * vv).sum(-2).reshape(batch, heads * d), keys, values


CASES = [  # batch, heads, kv_heads, head_dim, cache_len, pos, splits, min_span
    (1, 8, 2, 32, 160, 0, 1, 64),  # the first position: nothing cached before it
    (1, 8, 2, 32, 160, 37, 1, 64),  # a range that ends inside its first tile
    (2, 12, 2, 64, 200, 150, 1, 64),  # group 6 (padded to 16 rows), three tiles
    (1, 8, 2, 32, 300, 290, 3, 64),  # three ranges, the last ending inside a tile
    (3, 4, 1, 32, 256, 200, 4, 64),  # one KV head, four ranges, batch 3
    (1, 8, 2, 32, 160, 20, 4, 64),  # fewer positions than one range: one program does it all, the rest leave
    (1, 8, 2, 32, 300, 290, 4, 128),  # ranges of at least 128 positions: three of the four programs have one
    (2, 8, 2, 32, 300, 100, 4, 128),  # one range of 128 covers it: no combining
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,heads,kv_heads,head_dim,cache_len,pos,splits,min_span", CASES)
def test_matches_float64(batch, heads, kv_heads, head_dim, cache_len, pos, splits, min_span, dtype):
    qkv, cos, sin, k_cache, v_cache = problem(batch, heads, kv_heads, head_dim, cache_len, pos, dtype, seed=pos)
    expected, keys, values = float64_attention(qkv, cos, sin, k_cache, v_cache, pos, heads)
    counters = counters_for(batch, kv_heads, qkv.device)
    input_pos = torch.tensor([pos], device=qkv.device)
    y = launch(qkv, cos, sin, k_cache, v_cache, input_pos, counters, heads, splits=splits, min_span=min_span)
    assert y.shape == (batch, heads * head_dim) and y.dtype == dtype
    # the softmax weights are rounded to the cache's dtype before they multiply v: a few units in the last place
    eps = torch.finfo(dtype).eps
    assert float((y.double().cpu() - expected).abs().max()) <= 4 * eps * float(expected.abs().max()) + 4 * eps
    # the new key may differ from the float64 rotation's rounding by one unit in the last place
    assert torch.allclose(k_cache.cpu().double(), keys.double(), rtol=eps, atol=eps)
    assert torch.equal(v_cache.cpu(), values)
    assert int(counters.abs().sum()) == 0  # reset for the next call


@pytest.mark.parametrize("pos,splits", [(64, 1), (64, 2), (900, 2)])
def test_a_position_outside_the_cache_gives_nan_and_writes_nothing(pos, splits):
    """The host cannot check the device-side position without a sync, so the kernel does: a position at or past the
    cache's end gives NaN outputs and leaves the caches as they were."""
    qkv, cos, sin, k_cache, v_cache = problem(1, 8, 2, 32, 64, 3, torch.bfloat16)
    keys, values = k_cache.clone(), v_cache.clone()
    y = launch(qkv, cos, sin, k_cache, v_cache, torch.tensor([pos], device=qkv.device),
               counters_for(1, 2, qkv.device), 8, splits=splits)
    assert bool(torch.isnan(y).all())
    assert torch.equal(k_cache, keys) and torch.equal(v_cache, values)


@pytest.mark.parametrize("splits", [1, 3])
def test_per_head_norms_before_the_rotation_match_float64(splits):
    """Qwen3's q/k norms (an RMSNorm over each head before RoPE) inside the kernel, against float64."""
    qkv, cos, sin, k_cache, v_cache = problem(2, 12, 2, 64, 300, 290, torch.bfloat16, seed=9)
    g = torch.Generator().manual_seed(10)
    qk_norm = ((1 + 0.3 * torch.randn(64, generator=g)).bfloat16().to(DEVICE),
               (1 + 0.3 * torch.randn(64, generator=g)).bfloat16().to(DEVICE), 1e-6)
    expected, keys, _ = float64_attention(qkv, cos, sin, k_cache, v_cache, 290, 12, qk_norm)
    plain, _, _ = float64_attention(qkv, cos, sin, k_cache, v_cache, 290, 12)
    y = launch(qkv, cos, sin, k_cache, v_cache, torch.tensor([290], device=qkv.device),
               counters_for(2, 2, qkv.device), 12, splits=splits, qk_norm=qk_norm)
    eps = torch.finfo(torch.bfloat16).eps
    assert float((y.double().cpu() - expected).abs().max()) <= 4 * eps * float(expected.abs().max()) + 4 * eps
    assert float((y.double().cpu() - plain).abs().max()) > 0.05  # the norms matter here
    assert torch.allclose(k_cache.cpu().double(), keys.double(), rtol=2 * eps, atol=2 * eps)


def test_a_missing_position_fails_the_check():
    """The comparison above notices a kernel that ignored one cached position: rerun with that position's key
    changed after the fact gives an output far from the reference."""
    qkv, cos, sin, k_cache, v_cache = problem(1, 8, 2, 32, 160, 70, torch.bfloat16)
    expected, _, _ = float64_attention(qkv, cos, sin, k_cache, v_cache, 70, 8)
    v_cache[:, :, 5] += 8.0
    y = launch(qkv, cos, sin, k_cache, v_cache, torch.tensor([70], device=qkv.device),
               counters_for(1, 2, qkv.device), 8, splits=2)
    assert float((y.double().cpu() - expected).abs().max()) > 0.05


def test_repeated_steps_match_a_fresh_cache():
    """Several steps in a row on one cache (as the engine runs them) leave the same cache as writing each new key
    and value by hand, and each step's output matches float64."""
    heads, kv_heads, d = 8, 2, 32
    qkv, cos, sin, k_cache, v_cache = problem(1, heads, kv_heads, d, 96, 0, torch.bfloat16)
    k_cache.zero_(), v_cache.zero_()
    counters = counters_for(1, kv_heads, qkv.device)
    for pos in range(0, 70, 23):
        step = problem(1, heads, kv_heads, d, 96, pos, torch.bfloat16, seed=100 + pos)
        expected, keys, values = float64_attention(step[0], step[1], step[2], k_cache, v_cache, pos, heads)
        y = launch(step[0], step[1], step[2], k_cache, v_cache, torch.tensor([pos], device=qkv.device), counters,
                   heads, splits=2)
        assert float((y.double().cpu() - expected).abs().max()) < 0.05
        assert torch.equal(v_cache.cpu(), values)


@pytest.mark.gpu
@pytest.mark.parametrize("pos,splits,min_span", [(0, 1, 64), (37, 1, 64), (150, 1, 64), (290, 3, 64), (290, 4, 64),
                                                 (20, 4, 64), (290, 4, 128), (271, 5, 64)])
def test_early_reads_change_nothing(pos, splits, min_span):
    """Programmatic launches, with the reads ahead of the wait and without, give the same bits as a plain launch:
    output and caches."""
    heads, kv_heads, d = 32, 8, 128
    base = problem(1, heads, kv_heads, d, 320, pos, torch.bfloat16, seed=pos)
    results = []
    for pdl, early in ((False, False), (True, False), (True, True)):
        qkv, cos, sin, k_cache, v_cache = (t.clone() for t in base)
        counters = counters_for(1, kv_heads, qkv.device)
        y = launch(qkv, cos, sin, k_cache, v_cache, torch.tensor([pos], device=qkv.device), counters, heads,
                   splits=splits, min_span=min_span, pdl=pdl, early=early)
        results.append((y, k_cache, v_cache, counters))
    for y, k_cache, v_cache, counters in results[1:]:
        assert torch.equal(y, results[0][0])
        assert torch.equal(k_cache, results[0][1]) and torch.equal(v_cache, results[0][2])
        assert not counters.any()


@pytest.mark.gpu
def test_steps_in_a_cuda_graph_with_early_reads_match_plain_launches():
    """A CUDA graph of decode steps as the engine chains them (a plain kernel advances the position, then each
    layer's attention is launched programmatically with early reads, reading what earlier steps wrote): every
    step's output and the caches equal those of plain launches."""
    heads, kv_heads, d, layers, steps = 32, 8, 128, 4, 6

    def run(pdl, early):
        torch.manual_seed(0)
        qkv = torch.randn(layers, 1, (heads + 2 * kv_heads) * d, device=DEVICE).bfloat16()
        _, cos, sin, _, _ = problem(1, heads, kv_heads, d, 192, 0, torch.bfloat16)
        caches = [torch.randn(2, 1, kv_heads, 192, d, device=DEVICE).bfloat16() for _ in range(layers)]
        counters = [counters_for(1, kv_heads, qkv.device) for _ in range(layers)]
        position = torch.tensor([130], device=DEVICE)
        outputs = []

        def step():  # one attention launch after another, as programmatic launches chain
            for layer in range(layers):
                outputs.append(launch(qkv[layer], cos, sin, caches[layer][0], caches[layer][1], position,
                                      counters[layer], heads, pdl=pdl, early=early))
            position.add_(1)

        step()  # compiles the kernel outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        first = [y.clone() for y in outputs[:layers]]
        seen = []
        for _ in range(steps):
            graph.replay()
            seen.append(torch.stack([y.clone() for y in outputs[layers:]]))
        torch.cuda.synchronize()
        return first, seen, caches

    plain, ours = run(False, False), run(True, True)
    for a, b in zip(plain[0], ours[0]):
        assert torch.equal(a, b)
    for a, b in zip(plain[1], ours[1]):
        assert torch.equal(a, b)
    for a, b in zip(plain[2], ours[2]):
        assert torch.equal(a, b)


def good_inputs():
    qkv, cos, sin, k_cache, v_cache = problem(1, 8, 2, 32, 64, 3, torch.bfloat16)
    return dict(qkv=qkv, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                input_pos=torch.tensor([3], device=qkv.device), counters=counters_for(1, 2, qkv.device), heads=8)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(qkv=a["qkv"][:, :-32]), "qkv must be"),
    (lambda a: a.update(heads=7), "not a multiple"),
    (lambda a: a.update(cos=a["cos"].float()), "share one dtype"),
    (lambda a: a.update(input_pos=torch.tensor([1, 2])), "one new position"),
    (lambda a: a.update(counters=a["counters"][:1]), "counters must be"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :, :32]), "both be"),
    (lambda a: a.update(cos=a["cos"][:16], sin=a["sin"][:16]), "cos and sin"),
    (lambda a: a.update(cos=a["cos"][3]), "cos and sin"),
    (lambda a: a.update(min_span=96), "min_span 96"),
    (lambda a: a.update(qk_norm=(a["cos"][0], a["cos"][0][:16], 1e-6)), "norm weights"),
])
def test_bad_inputs_give_one_clear_error(change, message):
    inputs = good_inputs()
    change(inputs)
    with pytest.raises(KernelInputError, match=message):
        launch(**inputs)


def engine_logits(monkeypatch, setting, compiled, steps=5, qk_norm=False):
    """Logits of a prefill and `steps` decode steps of a tiny bf16 Llama (4 query heads, 2 KV heads, head size 16)
    at batch 2, with SPARSEDECODING_FUSED_ATTENTION=`setting`; `qk_norm`: a Qwen3-like one, its per-head q/k norm
    weights random."""
    from sparsedecoding.engine import build_model, random_state
    from sparsedecoding.engine.config import ModelArgs

    args = ModelArgs(architecture="qwen3" if qk_norm else "llama", vocab_size=96, dim=64, n_layers=2, n_heads=4,
                     n_kv_heads=2, head_dim=16, intermediate_size=96, norm_eps=1e-5, rope_theta=10000.0,
                     qk_norm=qk_norm)
    monkeypatch.setenv("SPARSEDECODING_FUSED_ATTENTION", setting)
    torch.manual_seed(0)
    model = build_model(args, random_state(args, None, torch.bfloat16, DEVICE))
    if qk_norm:
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for layer in model.layers:
                for norm in (layer.attention.q_norm, layer.attention.k_norm):
                    norm.weight.copy_(1 + 0.3 * torch.randn(16, generator=g))
    model.setup_caches(2, 80)
    assert all(layer.attention.fused_decode == (setting == "1") for layer in model.layers)
    assert model.fused_decode == (setting == "1")  # decode steps then build no mask and index no rotary table
    if compiled:
        model.compile_regions()
    tokens = torch.randint(0, 96, (2, 70), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    logits = [model(tokens[:, :64], torch.arange(64, device=DEVICE), compiled)]
    for pos in range(64, 64 + steps):
        logits.append(model(tokens[:, pos:pos + 1], torch.tensor([pos], device=DEVICE), compiled))
    return torch.cat(logits, dim=1).float(), model


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_engine_decodes_alike_with_the_fused_kernel(compiled, qk_norm, monkeypatch):
    """A tiny model's decode-step logits with the fused kernel stay within bf16 rounding of the unfused path's, and
    its caches hold the same keys and values (compiled: the operator inside a torch.compile'd block; qk_norm: the
    kernel applies Qwen3's per-head norms)."""
    if compiled and DEVICE == "cpu":
        pytest.importorskip("torch._inductor")
    fused, fused_model = engine_logits(monkeypatch, "1", compiled, qk_norm=qk_norm)
    plain, plain_model = engine_logits(monkeypatch, "0", compiled, qk_norm=qk_norm)
    assert float((fused - plain).abs().max()) < 0.05 * float(plain.abs().max())
    for a, b in zip(fused_model.layers, plain_model.layers):
        assert float((a.attention.k_cache.float() - b.attention.k_cache.float()).abs().max()) < 0.05
        assert torch.equal(a.attention.counters, torch.zeros_like(a.attention.counters))


def test_splits_cover_the_multiprocessors_and_bound_each_range(monkeypatch):
    from sparsedecoding.kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_multiprocessors", lambda device: 132)
    cuda = torch.device("cuda")
    assert triton_attention.choose_splits(1, 8, 272, cuda) == 5  # 16 wanted, but the cache has 5 tiles
    assert triton_attention.choose_splits(1, 8, 4096, cuda) == 16  # one program a multiprocessor
    assert triton_attention.choose_splits(16, 8, 4096, cuda) == 8  # at most 512 positions a range
    assert triton_attention.choose_splits(16, 8, 272, cuda) == 1
    assert triton_attention.choose_splits(1, 8, 4096, torch.device("cpu")) == 1  # the interpreter


def test_the_compiled_block_writes_the_caches_in_place(monkeypatch):
    """Inductor keeps the operator's cache writes in place: the decode step's generated code calls the operator and
    copies or clones no tensor (a functionalized copy of each layer's caches would cost more than the kernel)."""
    import re

    from torch._inductor.utils import run_and_get_code

    _, model = engine_logits(monkeypatch, "1", compiled=True, steps=0)
    step = torch.tensor([[3], [4]], device=DEVICE)
    _, codes = run_and_get_code(lambda: model(step, torch.tensor([64], device=DEVICE), True))
    code = "\n".join(codes)
    assert "sparsedecoding.decode_attention" in code
    assert not re.search(r"\.copy_\(|\bclone\(", code)


@pytest.mark.parametrize("value,expected", [(None, 64), ("256", 256), ("100", None), ("0", None), ("x", None)])
def test_the_min_span_setting_takes_multiples_of_64(value, expected, monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, attention_min_span_setting

    if value is None:
        monkeypatch.delenv("SPARSEDECODING_ATTENTION_MIN_SPAN", raising=False)
    else:
        monkeypatch.setenv("SPARSEDECODING_ATTENTION_MIN_SPAN", value)
    if expected is None:
        with pytest.raises(KernelChoiceError, match="multiple of 64"):
            attention_min_span_setting()
    else:
        assert attention_min_span_setting() == expected


@pytest.mark.parametrize("name,value", [("SPARSEDECODING_FUSED_ATTENTION", "yes"),
                                        ("SPARSEDECODING_ATTENTION_MIN_SPAN", "96"),
                                        ("SPARSEDECODING_ATTENTION_EARLY_READS", "yes")])
def test_bad_attention_settings_fail_where_the_cli_checks_them(name, value, monkeypatch):
    """`op.settings()`, which the CLI calls before loading anything, names the bad value in one error."""
    from sparsedecoding.kernels.op import KernelChoiceError, settings

    monkeypatch.setenv(name, value)
    with pytest.raises(KernelChoiceError, match=f"{name}='{value}'"):
        settings()
