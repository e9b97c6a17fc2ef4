"""`sparsify` and `load_packed` on tiny transformers models pruned 2:4 by magnitude: which linears are swapped,
logits against a float64 reference, greedy generation with a static cache, torch.compile tracing, bad inputs.
On CPU the packed layers run the kernel's torch reference (the custom op's CPU implementation)."""

import copy

import pytest
import torch
from torch import nn

from sparsedecoding import SparsifySummary, load_packed, save_packed, sparsify
from sparsedecoding.errors import KernelInputError, ModelNotFoundError, PackingError, QuantizationError
from sparsedecoding.kernels import PackedLinear
from sparsedecoding.packed import pack_checkpoint
from sparsedecoding.solvers import magnitude

from helpers import make_tiny_model, tiny_config

DENSE_LEFT = "model.layers.1.mlp.down_proj"  # left unpruned: sparsify must keep it dense


def pruned_tiny(arch: str, dtype=torch.bfloat16, seed: int = 0, overrides: dict | None = None) -> nn.Module:
    """A tiny random causal LM whose decoder linears (all but DENSE_LEFT) are pruned 2:4 by magnitude;
    `overrides`: config values (`tiny_config`)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **(overrides or {})), dtype=torch.float32)
    prune_all_but_one(model)
    return model.to(dtype).eval()


@torch.no_grad()
def prune_all_but_one(model: nn.Module) -> None:
    """Prune every decoder linear of `model` but DENSE_LEFT 2:4 by magnitude, in place."""
    for name, module in model.model.layers.named_modules(prefix="model.layers"):
        if isinstance(module, nn.Linear) and name != DENSE_LEFT:
            module.weight.copy_(magnitude(module.weight, None, "2:4"))


def decoder_linears(model: nn.Module) -> set[str]:
    return {name for name, module in model.model.layers.named_modules(prefix="model.layers")
            if isinstance(module, nn.Linear | PackedLinear)}


TOKENS = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 11], [8, 8, 30, 101, 2, 55, 19, 90]])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sparsify_swaps_exactly_the_nm_linears_keeping_bias_dtype_and_device(arch):
    model = pruned_tiny(arch)
    before = {name: (module.weight.detach().clone(), module.bias) for name, module in model.named_modules()
              if isinstance(module, nn.Linear)}
    same, summary = sparsify(model)
    assert same is model and isinstance(summary, SparsifySummary)
    assert set(summary.swapped) == decoder_linears(model) - {DENSE_LEFT}
    assert set(summary.swapped.values()) == {"2:4"}
    assert set(summary.kept_dense) == {DENSE_LEFT, "lm_head"}
    for name, module in model.named_modules():
        if name in summary.swapped:
            weight, bias = before[name]
            assert isinstance(module, PackedLinear) and (module.n, module.m) == (2, 4)
            assert torch.equal(module.packed.to_dense(), weight)
            assert module.values.dtype == torch.bfloat16 and module.values.device == weight.device
            assert (bias is None and module.bias is None) or torch.equal(module.bias, bias)
        elif name in summary.kept_dense:
            assert type(module) is nn.Linear and torch.equal(module.weight, before[name][0])
    if arch == "qwen2":  # q, k, v carry biases
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    # 2:4 bf16: 2 bytes a weight dense; packed one bf16 value per two weights + one mask bit per weight
    weights = sum(before[name][0].numel() for name in summary.swapped)
    assert (summary.dense_bytes, summary.packed_bytes) == (2 * weights, weights + weights // 8)
    assert summary.bytes_saved == summary.dense_bytes - summary.packed_bytes > 0
    assert f"{len(summary.swapped)} linears packed (2:4 x{len(summary.swapped)}), 2 kept dense" in str(summary)


def logit_errors(arch: str) -> tuple[float, float, float]:
    """Largest |logit - float64 logit| of the pruned model in bf16 dense, in bf16 sparsified, and the largest
    |float64 logit|."""
    model = pruned_tiny(arch)
    reference = copy.deepcopy(model).double()
    with torch.no_grad():
        exact = reference(TOKENS).logits
        dense = model(TOKENS).logits.double()
        sparsify(model)
        sparse = model(TOKENS).logits.double()
    return float((dense - exact).abs().max()), float((sparse - exact).abs().max()), float(exact.abs().max())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sparsified_logits_match_float64_as_closely_as_the_dense_model(arch):
    """The packed layers sum bf16 products in fp32 like the dense bf16 matmul; the whole model's logits stay as
    close to the float64 model as the dense bf16 model's do (bf16 rounding of every activation dominates)."""
    dense_error, sparse_error, scale = logit_errors(arch)
    assert dense_error < 0.05 * scale  # the bound below is meaningful: bf16 is close to float64 here
    assert sparse_error <= 1.5 * dense_error + 2**-8 * scale


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_generate_with_static_cache_picks_the_dense_models_best_tokens(arch):
    """Each token the sparsified model picks greedily (static cache) is the dense model's argmax at that position,
    up to a bf16-sized tie."""
    model = pruned_tiny(arch)
    dense = copy.deepcopy(model)
    sparsify(model)
    prompt = TOKENS[:, :5]
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                         cache_implementation="static", pad_token_id=0, eos_token_id=None)
    assert out.shape == (2, 13)
    assert_greedy_choices(dense, out, prompt.shape[1])


def assert_greedy_choices(model: nn.Module, out: torch.Tensor, prompt_length: int) -> None:
    """Every token of `out` after the prompt is `model`'s argmax given the tokens before it, up to a bf16-sized
    tie (1/64 of the largest logit)."""
    with torch.no_grad():
        logits = model(out).logits[:, prompt_length - 1:-1].float()
    chosen = logits.gather(-1, out[:, prompt_length:, None])[..., 0]
    assert (chosen >= logits.max(-1).values - 2**-6 * logits.abs().max()).all()


def test_packed_linear_traces_into_one_graph_under_torch_compile():
    """Dynamo traces a sparsified decoder layer without a graph break (the custom op and its fake
    implementation); AOT autograd's functionalisation runs the op, and the result equals eager."""
    model = pruned_tiny("llama")
    sparsify(model)
    mlp = model.model.layers[0].mlp
    x = torch.randn(1, 3, 64).bfloat16()
    compiled = torch.compile(mlp, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), mlp(x))


@pytest.mark.slow
def test_generate_compiles_the_sparsified_decode_step_in_one_graph():
    """transformers' own compiled decode step (static cache, CompileConfig fullgraph=True; AOT eager backend on
    CPU) runs the sparsified model without a graph break and picks the tokens the uncompiled model picks."""
    from transformers.generation import CompileConfig

    model, _ = sparsify(pruned_tiny("qwen2"))
    config = CompileConfig(fullgraph=True, backend="aot_eager", dynamic=False)
    config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    prompt = TOKENS[:, :5]
    settings = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                    cache_implementation="static")
    compiled = model.generate(prompt, compile_config=config, **settings)
    assert hasattr(model, "_compiled_call")
    assert torch.equal(compiled, model.generate(prompt, disable_compile=True, **settings))


def test_load_packed_builds_the_model_sparsify_makes(tmp_path):
    """A pruned folder packed with `pack_checkpoint` loads as the transformers model with the same PackedLinear
    modules, tensors, logits and generation config as the pruned folder loaded by transformers and sparsified; the
    tied output embedding is restored."""
    from transformers import AutoModelForCausalLM

    for arch, tied in (("qwen2", True), ("llama", False)):
        make_tiny_model(tmp_path / f"{arch}-dense", arch=arch, tie_word_embeddings=tied)
        model = AutoModelForCausalLM.from_pretrained(tmp_path / f"{arch}-dense", dtype=torch.bfloat16)
        prune_all_but_one(model)
        model.generation_config.eos_token_id = [3]  # differs from config.json's [1, 3]
        model.save_pretrained(tmp_path / f"{arch}-pruned")
        pack_checkpoint(tmp_path / f"{arch}-pruned", tmp_path / f"{arch}-packed")
        loaded = load_packed(tmp_path / f"{arch}-packed")
        sparsified, _ = sparsify(model.eval())
        assert type(loaded) is type(sparsified)
        packed_names = {name for name, m in loaded.named_modules() if isinstance(m, PackedLinear)}
        assert packed_names == {name for name, m in sparsified.named_modules() if isinstance(m, PackedLinear)}
        assert packed_names == decoder_linears(loaded) - {DENSE_LEFT}
        expected = sparsified.state_dict()
        assert set(loaded.state_dict()) == set(expected)
        assert all(torch.equal(t, expected[k]) for k, t in loaded.state_dict().items())
        assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
        assert loaded.generation_config.eos_token_id == sparsified.generation_config.eos_token_id == [3]
        with torch.no_grad():
            assert torch.equal(loaded(TOKENS).logits, sparsified(TOKENS).logits)


def test_model_without_sparse_linear_is_refused_unchanged():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.bfloat16)
    with pytest.raises(PackingError, match="no linear of this LlamaForCausalLM is N:M sparse.*prune the model"):
        sparsify(model)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_float32_model_is_refused_before_any_swap():
    model = pruned_tiny("llama", dtype=torch.float32)
    with pytest.raises(KernelInputError, match=r"float32 weights.*model.to\(torch.bfloat16\)"):
        sparsify(model)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_load_packed_refuses_a_folder_that_is_not_packed(tmp_path):
    make_tiny_model(tmp_path / "dense")
    with pytest.raises(ModelNotFoundError, match="sparsedecoding pack"):
        load_packed(tmp_path / "dense")


def test_a_non_finite_weight_is_refused_by_name_before_any_swap():
    model = pruned_tiny("llama")
    model.model.layers[1].mlp.up_proj.weight.data[0, 0] = float("inf")
    with pytest.raises(PackingError, match=r"model\.layers\.1\.mlp\.up_proj holds NaN or inf"):
        sparsify(model, tile=False)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_save_pretrained_of_a_sparsified_or_loaded_packed_model_raises_naming_save_packed(tmp_path):
    """transformers would write the packed buffers, and from_pretrained would load that folder with those linears
    random (a warning only): the model refuses, and save_packed then load_packed round-trips it."""
    model, _ = sparsify(pruned_tiny("llama"), tile=False)
    with pytest.raises(PackingError, match="save_packed"):
        model.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    save_packed(model, tmp_path / "packed")
    loaded = load_packed(tmp_path / "packed", tile=False)
    with pytest.raises(PackingError, match="save_packed"):
        loaded.save_pretrained(tmp_path / "hf")
    x = torch.tensor([[5, 6, 7]])
    assert torch.equal(model(x).logits, loaded(x).logits)


def test_sparsify_says_why_nothing_is_swapped():
    model, _ = sparsify(pruned_tiny("llama"), tile=False)
    with pytest.raises(PackingError, match="already sparsified"):
        sparsify(model, tile=False)
    quantized, _ = sparsify(quantized_tiny("int8"), quantize="int8", group_size=32, tile=False)
    with pytest.raises(PackingError, match="already sparsified"):  # QuantizedPackedLinear modules
        sparsify(quantized, quantize="int8", group_size=32, tile=False)
    narrow = pruned_tiny("llama", overrides={"hidden_size": 80, "intermediate_size": 80, "head_dim": 20})
    with pytest.raises(PackingError, match=r"in_features not a multiple of 32"):
        sparsify(narrow, tile=False)


def nearly_pruned_folder(tmp_path) -> tuple[nn.Module, str]:
    """(the model, the broken linear's name): a pruned tiny llama saved to tmp_path / "pruned" with one weight of
    one 2:4 linear set back, so that linear keeps 3 of 4 in a group (more than half) and must stay dense
    everywhere."""
    model = pruned_tiny("llama")
    broken = "model.layers.0.mlp.up_proj"
    weight = model.get_submodule(broken).weight.data
    weight[0, int((weight[0, :4] == 0).nonzero()[0])] = 0.5
    model.save_pretrained(tmp_path / "pruned")
    return model, broken


def test_sparsify_pack_and_load_packed_keep_the_same_linears_dense(tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    _, broken = nearly_pruned_folder(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", dtype=torch.bfloat16).eval()
    with caplog.at_level("WARNING"):
        sparsified, summary = sparsify(model, tile=False)
    assert broken in summary.kept_dense and broken not in summary.swapped
    assert "stay dense beside the" in caplog.text and broken in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        pack_checkpoint(tmp_path / "pruned", tmp_path / "packed")
    assert "2 of 14 decoder linears are kept dense" in caplog.text
    loaded = load_packed(tmp_path / "packed", tile=False)
    assert {name for name, m in loaded.named_modules() if isinstance(m, PackedLinear)} == set(summary.swapped)
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS).logits, sparsified(TOKENS).logits)


def test_load_packed_casts_a_float32_checkpoint_only_when_asked(tmp_path):
    from transformers import AutoModelForCausalLM

    pruned_tiny("llama", dtype=torch.float32).save_pretrained(tmp_path / "pruned")
    pack_checkpoint(tmp_path / "pruned", tmp_path / "packed")
    with pytest.raises(PackingError, match=r"holds float32 packed values.*dtype=torch\.bfloat16"):
        load_packed(tmp_path / "packed")
    with pytest.raises(KernelInputError, match="dtype=torch.float64"):
        load_packed(tmp_path / "packed", dtype=torch.float64)
    model = load_packed(tmp_path / "packed", dtype=torch.bfloat16, tile=False)
    assert all(t.dtype == torch.bfloat16 for t in model.state_dict().values() if t.is_floating_point())
    reference, _ = sparsify(AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", dtype=torch.bfloat16), tile=False)
    out = model.generate(TOKENS[:1], max_new_tokens=3, do_sample=False)
    assert torch.equal(out, reference.generate(TOKENS[:1], max_new_tokens=3, do_sample=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_load_packed_onto_cuda_without_cuda_is_one_clear_error(tmp_path):
    pruned_tiny("llama").save_pretrained(tmp_path / "pruned")
    pack_checkpoint(tmp_path / "pruned", tmp_path / "packed")
    with pytest.raises(PackingError, match="no CUDA device"):
        load_packed(tmp_path / "packed", device="cuda", tile=False)


@pytest.mark.gpu
def test_cuda_sparsified_model_runs_the_kernel_eagerly_and_in_compiled_generate():
    """On CUDA: logits through the Triton kernel (16 rows) as close to float64 as the dense bf16 model's, and
    transformers' compiled decode step (inductor, CUDA graphs, fullgraph) picks the eager model's best tokens."""
    model = pruned_tiny("qwen2").cuda()
    reference = copy.deepcopy(model).double()
    tokens = TOKENS.cuda()
    with torch.no_grad():
        exact = reference(tokens).logits
        dense_error = float((model(tokens).logits.double() - exact).abs().max())
        sparsify(model)
        sparse_error = float((model(tokens).logits.double() - exact).abs().max())
    assert sparse_error <= 1.5 * dense_error + 2**-8 * float(exact.abs().max())
    assert_compiled_generate_is_greedy(model, tokens)


@pytest.mark.gpu
def test_cuda_sparsify_tiles_2of4_linears_by_default_and_load_packed_too(tmp_path):
    """On CUDA, `sparsify` with its default tile="auto" makes every 2:4 linear of a model shaped for sp24's tiles
    an `Sp24Linear` (the one left dense stays nn.Linear), with logits as close to float64 as the dense bf16 model's;
    eager calls at batch 1 give the same product as tile=False's packed model up to rounding; `load_packed` of the
    packed checkpoint on CUDA ends in the same modules; transformers' compiled decode step picks the eager model's
    best tokens."""
    from sparsedecoding.kernels.sp24_linear import Sp24Linear

    model = pruned_tiny("qwen2", overrides=TILEABLE).cuda()
    tokens = TOKENS.cuda()
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(tokens).logits
        bound = 1.5 * float((model(tokens).logits.double() - exact).abs().max()) + 2**-8 * float(exact.abs().max())
        packed, packed_summary = sparsify(copy.deepcopy(model), tile=False)
        tiled, summary = sparsify(copy.deepcopy(model))
        assert packed_summary.tiled == 0 and summary.tiled == len(summary.swapped) == 13
        assert {type(tiled.get_submodule(name)) for name in summary.swapped} == {Sp24Linear}
        assert isinstance(tiled.get_submodule(DENSE_LEFT), nn.Linear)
        assert float((tiled(tokens).logits.double() - exact).abs().max()) <= bound
        x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
        name = "model.layers.0.self_attn.q_proj"
        torch.testing.assert_close(tiled.get_submodule(name)(x), packed.get_submodule(name)(x), rtol=2**-7, atol=2**-7)
    model.cpu().save_pretrained(tmp_path / "pruned")
    pack_checkpoint(tmp_path / "pruned", tmp_path / "packed")
    loaded = load_packed(tmp_path / "packed", device="cuda")
    assert {name for name, m in loaded.named_modules() if isinstance(m, Sp24Linear)} == set(summary.swapped)
    assert_compiled_generate_is_greedy(tiled, tokens)


def test_sparsify_tile_setting_on_cpu():
    """On CPU, tile="auto" (the default) tiles nothing and says so in the summary; tile=True is refused before
    anything changes (the kernel runs on CUDA), as is a value other than "auto", True and False, by `sparsify`,
    `load_packed` and `tile_packed`; `load_packed(device="cuda", tile=True)` where the kernel cannot run is refused
    before the folder is read."""
    from sparsedecoding import tile_packed
    from sparsedecoding.kernels.op import KernelChoiceError
    from sparsedecoding.kernels.sp24_linear import sp24_problem

    model, summary = sparsify(pruned_tiny("qwen2", overrides=TILEABLE))
    assert summary.tiled == 0 and "tiled" not in str(summary)
    assert tile_packed(model) == 0 and tile_packed(model, False) == 0
    untouched = pruned_tiny("qwen2", overrides=TILEABLE)
    with pytest.raises(KernelInputError, match="tile=True.*cpu"):
        sparsify(untouched, tile=True)
    assert not any(isinstance(m, PackedLinear) for m in untouched.modules())
    for bad in ("yes", 1, None):
        with pytest.raises(KernelChoiceError, match="tile="):
            sparsify(untouched, tile=bad)
        with pytest.raises(KernelChoiceError, match="tile="):
            load_packed("/nonexistent", tile=bad)
    with pytest.raises(KernelInputError, match="tile=True.*CUDA"):
        load_packed("/nonexistent", tile=True)
    if sp24_problem() is not None:  # a CUDA device the kernel cannot run on: refused before the folder is read
        with pytest.raises(KernelInputError, match="tile=True.*cannot run"):
            load_packed("/nonexistent", device="cuda", tile=True)
    with pytest.raises(KernelInputError, match="tile=True"):
        tile_packed(model, True)


def assert_compiled_generate_is_greedy(model: nn.Module, tokens: torch.Tensor) -> None:
    """transformers' compiled decode step (inductor, CUDA graphs, fullgraph) on the first 5 tokens of each row, 8
    new ones with a static cache, picks the eager model's best tokens (inductor rounds norms and attention its own
    way, so choices are compared, not logits)."""
    from transformers.generation import CompileConfig

    prompt = tokens[:, :5]
    settings = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                    cache_implementation="static")
    compiled = model.generate(prompt, compile_config=CompileConfig(fullgraph=True), **settings)
    assert hasattr(model, "_compiled_call") and compiled.shape == (2, 13)
    assert_greedy_choices(model, compiled, prompt.shape[1])


def quantized_tiny(quantize: str, tied: bool = False, **overrides) -> nn.Module:
    """A tiny random qwen2 model whose decoder linears are pruned 2:4 with kept values on a `quantize` grid (32
    columns a scale for int4) and whose lm_head is on the int8 grid, as `prune --quantize Q --quantize-head int8`
    leaves them (here on an identity Hessian); `tied`: lm_head shares the input embedding (both on the grid);
    `overrides`: config values (`tiny_config`)."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding import solvers

    torch.manual_seed(0)
    config = tiny_config("qwen2", tie_word_embeddings=tied, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, nn.Linear):
                eye = torch.eye(module.in_features)
                module.weight.copy_(solvers.sparsegpt(module.weight, eye, "2:4", quantize=quantize, group_size=32))
        model.lm_head.weight.copy_(solvers.gptq(model.lm_head.weight, torch.eye(config.hidden_size), "int8"))
    return model.to(torch.bfloat16).eval()


# every decoder linear's in_features a multiple of 512 and out_features of 16: no padding in sp24's tiled layout,
# so `tile_model` takes all 14 (at hidden 64 each would pad to 4-8 times its bytes, past MAX_PADDING)
TILEABLE = dict(hidden_size=512, intermediate_size=1024)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_sparsified_linears_are_tiled_for_sp24_when_their_padding_is_small(quantize):
    """`tile_model` takes every `QuantizedPackedLinear` `sparsify` makes (CPU: the tiled layers multiply by their
    weight densified, giving the packed model's logits up to rounding), and none of the 64-wide model's, whose tiles
    would be mostly padding."""
    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tileable, tile_model

    small, _ = sparsify(quantized_tiny(quantize), quantize=quantize, group_size=32, head="int8")
    reasons = {tileable(m, require_cuda=False) for name, m in small.named_modules() if name.endswith("proj")}
    assert reasons and all(reason.startswith("shape ") and "pads to the kernel's tiles" in reason for reason in reasons)
    assert tile_model(small, require_cuda=False) == 0
    model, summary = sparsify(quantized_tiny(quantize, **TILEABLE), quantize=quantize, group_size=32, head="int8")
    with torch.no_grad():
        packed = model(TOKENS).logits
        assert tile_model(model, require_cuda=False) == len(summary.swapped) == 14
        assert {type(model.get_submodule(name)) for name in summary.swapped} == {Sp24Linear}
        # the same products summed in another order: bf16 activations round apart by a few units in the last place
        torch.testing.assert_close(model(TOKENS).logits, packed, rtol=2**-6, atol=2**-8 * float(packed.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_cuda_quantized_sparsified_model_matches_its_grid_and_compiles_in_generate(quantize):
    """On CUDA: `sparsify(quantize=Q, head="int8")` of a model on those grids (shaped for sp24's tiles: TILEABLE)
    gives logits as close to float64 as the bf16 grid model's (the kernels dequantize exactly): untiled
    (tile=False), tiled by `tile_model` afterwards, and tiled by `sparsify` itself (tile=True: all 14); and
    transformers' compiled decode step picks the eager model's best tokens."""
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tile_model

    grid = quantized_tiny(quantize, **TILEABLE).cuda()
    tokens = TOKENS.cuda()
    with torch.no_grad():
        exact = copy.deepcopy(grid).double()(tokens).logits
        bound = 1.5 * float((grid(tokens).logits.double() - exact).abs().max()) + 2**-8 * float(exact.abs().max())
        for tile in (False, "tile_model", "sparsify"):
            model, summary = sparsify(copy.deepcopy(grid), quantize=quantize, group_size=32, head="int8",
                                      tile=tile == "sparsify")
            assert len(summary.swapped) == 14 and isinstance(model.lm_head, DenseQuantizedLinear)
            assert summary.tiled == (14 if tile == "sparsify" else 0)
            if tile == "tile_model":
                assert tile_model(model) == 14
            assert sum(isinstance(m, QuantizedPackedLinear) for m in model.modules()) == (14 if not tile else 0)
            assert sum(isinstance(m, Sp24Linear) for m in model.modules()) == (14 if tile else 0)
            assert float((model(tokens).logits.double() - exact).abs().max()) <= bound
    assert_compiled_generate_is_greedy(model, tokens)


def test_a_quantized_model_survives_dtype_moves_retying_and_saving(tmp_path):
    """After `sparsify(quantize=, head=)`: `.half()` keeps the packed scales in bfloat16 and the model runs; a tied
    lm_head stays a DenseQuantizedLinear through transformers' `tie_weights(recompute_mapping=False)`; the summary
    does not count the tied head's weight as saved (the embedding keeps it); the state dict has no float
    `lm_head.weight` that a transformers reload could take for the codes."""
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear

    untied, summary_untied = sparsify(quantized_tiny("int8"), quantize="int8", group_size=32, head="int8")
    model, summary = sparsify(quantized_tiny("int8", tied=True), quantize="int8", group_size=32, head="int8")
    head_bytes = 128 * 64 * 2
    assert summary_untied.dense_bytes - summary.dense_bytes == head_bytes
    assert summary.packed_bytes == summary_untied.packed_bytes
    model.tie_weights(recompute_mapping=False)
    assert isinstance(model.lm_head, DenseQuantizedLinear) and type(model.model.embed_tokens) is nn.Embedding
    assert "lm_head.weight" not in model.state_dict() and "lm_head.qweight" in model.state_dict()
    with torch.no_grad():
        before = model(TOKENS).logits.float()
        model.half()
        assert all(m.scales.dtype == torch.bfloat16 for m in model.modules() if isinstance(m, QuantizedPackedLinear))
        after = model(TOKENS).logits.float()
    torch.testing.assert_close(after, before, rtol=0.05, atol=0.05)


def test_an_int4_head_laid_out_for_one_device_refuses_another(monkeypatch):
    """tinygemm's int4 layout is the device's, so a head built on CPU in it refuses input on another device with one
    clear error instead of a kernel's (the meta device stands in for CUDA: no GPU needed)."""
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "tinygemm")
    from sparsedecoding import solvers
    from sparsedecoding.kernels.quantized import DenseQuantized
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear

    weight = solvers.gptq(torch.randn(64, 128), torch.eye(128), "int4", group_size=32).bfloat16()
    head = DenseQuantizedLinear(DenseQuantized.from_codes(solvers.quantization_codes(weight, "int4", 32)))
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    torch.testing.assert_close(head(x).float(), (x.float() @ weight.float().T), rtol=0.02, atol=0.05)
    with pytest.raises(KernelInputError, match="laid out for cpu, not meta"):
        head(x.to("meta"))


@pytest.mark.parametrize("settings,error,match", [
    (dict(quantize="int3"), PackingError, "int3.*not a packed format"),
    (dict(quantize="int4", group_size=48), PackingError, "multiple of 32"),
    (dict(head="int4", group_size=16), PackingError, "dense int4 kernel takes 32, 64, 128, 256"),
    (dict(quantize="int8"), QuantizationError, "model.layers.0.self_attn.q_proj: .*--quantize int8"),
    (dict(head="int8"), QuantizationError, "lm_head: .*--quantize-head int8"),
])
def test_quantization_settings_and_weights_off_their_grid_are_refused_before_any_swap(settings, error, match):
    """`sparsify(quantize=..., head=...)` of a model whose weights are not on a grid (magnitude-pruned bf16), or with a
    format or group size the kernels do not run: one error, the model unchanged."""
    model = pruned_tiny("llama")
    with pytest.raises(error, match=match):
        sparsify(model, **settings)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert all(type(m) is nn.Linear for name, m in model.named_modules() if name.endswith(("proj", "lm_head")))


def test_the_summary_line_reads_on_a_tiny_model_and_a_large_one():
    """Sizes in one unit, the largest the dense size fills: a tiny model's line is not "0.1 MiB -> 0.1 MiB"."""
    _, summary = sparsify(pruned_tiny("llama"))
    dense_kib = summary.dense_bytes / 1024
    assert f"their weights {dense_kib:.1f} KiB -> {summary.packed_bytes / 1024:.1f} KiB" in str(summary)
    large = SparsifySummary({"a": "2:4"}, [], 2499 * 2**20, 1405 * 2**20)
    assert str(large).endswith("their weights 2.4 GiB -> 1.4 GiB (1.1 GiB saved)")


def test_a_group_size_nothing_uses_is_named_in_a_warning(caplog):
    with caplog.at_level("WARNING", logger="sparsedecoding.swap"):
        sparsify(pruned_tiny("llama"), quantize=None, group_size=7)
    assert "group_size=7 is unused" in caplog.text
