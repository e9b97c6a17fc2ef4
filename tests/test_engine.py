"""The engine's model math against transformers on tiny random models (CPU, float32 unless packed), KV-cache
equivalence, sparse loading through the reference kernel, random preset weights and the generation loop."""

from dataclasses import replace

import pytest
import torch
from helpers import prune_in_place, random_hf_model, saved, tiny_config

from sparsedecoding.engine import (Engine, Sampling, build_model, keep_dense_copies, load_model, random_state,
                                  resident_weight_bytes, weight_bytes)
from sparsedecoding.engine.bench import check_plan, model_bytes
from sparsedecoding.evaluation.engine_check import compare_tokens, replay_logits
from sparsedecoding.engine.config import ModelArgs, from_hf_config
from sparsedecoding.engine.generate import sample, uniform_noise
from sparsedecoding.engine.loading import concat_rows
from sparsedecoding.kernels.format import nm_pattern
from sparsedecoding.engine.model import rope_frequencies
from sparsedecoding.errors import EngineError
from sparsedecoding.kernels import PackedLinear, PackedNM, pack_nm
from sparsedecoding.kernels.format import bitmask_to_bits
from sparsedecoding.packed import pack_checkpoint
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import magnitude

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
CASES = {
    "llama-llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama-tied-mqa": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "qwen2-qkv-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qk-norm-wide-heads": ("qwen3", {"head_dim": 32}),
    "mistral-gqa": ("mistral", {}),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case, tmp_path):
    arch, overrides = CASES[case]
    hf = random_hf_model(arch, **overrides)
    model = load_model(saved(hf, tmp_path), dtype=torch.float32, device="cpu")
    tokens = torch.randint(0, 128, (2, 40))
    model.setup_caches(2, 48)
    ours = model(tokens, torch.arange(40))
    torch.testing.assert_close(ours, hf(tokens).logits, atol=1e-4, rtol=1e-4)


def test_llama3_scaling_case_covers_all_three_bands():
    args = from_hf_config(tiny_config("llama", rope_parameters=LLAMA3_ROPE).to_dict())
    scaled, plain = rope_frequencies(args), rope_frequencies(replace(args, rope_scaling=None))
    kept, stretched = scaled == plain, torch.isclose(scaled, plain / 8)
    assert kept.any() and stretched.any() and (~kept & ~stretched).any()


def test_prefill_then_decode_steps_equal_a_full_forward(tmp_path):
    model = load_model(saved(random_hf_model("qwen3"), tmp_path), dtype=torch.float32, device="cpu")
    tokens = torch.randint(0, 128, (2, 12))
    model.setup_caches(2, 16)
    full = model(tokens, torch.arange(12))
    model.setup_caches(2, 16)
    steps = [model(tokens[:, :5], torch.arange(5))]
    steps += [model(tokens[:, t:t + 1], torch.tensor([t])) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def assert_same_greedy_tokens_up_to_a_tie(prompt, expected, tokens, expected_logits, logits) -> None:
    """`tokens` equal `expected` (greedy continuations of `prompt`), or first differ where the model that chose
    `expected` had its two candidates within a rounding-sized tie (`evaluation.engine_check.is_tie`): two correct
    implementations may round a tie either way. Logits: [prompt + continuation - 1, vocab] from replaying `expected`."""
    start = len(prompt) - 1
    result = compare_tokens(expected, tokens, expected_logits[start:], logits[start:])
    assert result.passed, result


def test_engine_greedy_tokens_equal_transformers_generate(tmp_path):
    hf = random_hf_model("llama", rope_parameters=LLAMA3_ROPE)
    model = load_model(saved(hf, tmp_path), dtype=torch.float32, device="cpu")
    prompt = torch.randint(2, 128, (2, 7))
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[:, 7:]
    # A cache of 3 rows: the spare row decodes a copy of the first prompt and is dropped.
    generation = Engine(model, batch=3, max_seq_len=32).generate(prompt, 20)
    assert generation.tokens.shape == expected.shape
    assert generation.decode_steps == 19 and generation.decode_seconds > 0
    for row in range(2):
        sequence = torch.cat([prompt[row], expected[row]])[None]
        assert_same_greedy_tokens_up_to_a_tie(prompt[row], expected[row], generation.tokens[row],
                                              hf(sequence).logits[0, :-1],
                                              replay_logits(model, prompt[row], expected[row]))


def pruned_folder(tmp_path, arch="qwen2", pattern="2:4"):
    hf = random_hf_model(arch)
    prune_in_place(hf, SparsityPattern.parse(pattern))
    return saved(hf, tmp_path / "pruned"), hf


def test_sparse_auto_packs_every_block_linear_and_matches_transformers(tmp_path):
    folder, hf = pruned_folder(tmp_path)
    sparse = load_model(folder, sparse="auto", dtype=torch.bfloat16, device="cpu")
    packed = [m for m in sparse.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 2 * 4 and {(m.n, m.m) for m in packed} == {(2, 4)}
    assert isinstance(sparse.output, torch.nn.Linear) and isinstance(sparse.embed, torch.nn.Embedding)
    prompt, continuation = torch.randint(0, 128, (6,)), torch.randint(0, 128, (10,))
    # Replay: prefill (dense product of the unpacked weight), then 1-row decode steps through the reference kernel.
    ours = replay_logits(sparse, prompt, continuation)
    reference = hf(torch.cat([prompt, continuation])[None]).logits[0, :-1]
    torch.testing.assert_close(ours, reference, atol=0.05 * reference.abs().max().item(), rtol=0)


def test_sparse_and_dense_engines_agree_on_pruned_weights(tmp_path):
    folder, _ = pruned_folder(tmp_path, arch="llama")
    prompt = torch.randint(0, 128, (1, 5))
    dense = load_model(folder, sparse="none", dtype=torch.bfloat16, device="cpu")
    sparse = load_model(folder, sparse="auto", dtype=torch.bfloat16, device="cpu")
    dense_tokens = Engine(dense, 1, 20).generate(prompt, 12).tokens[0]
    sparse_tokens = Engine(sparse, 1, 20).generate(prompt, 12).tokens[0]
    assert_same_greedy_tokens_up_to_a_tie(prompt[0], dense_tokens, sparse_tokens,
                                          replay_logits(dense, prompt[0], dense_tokens),
                                          replay_logits(sparse, prompt[0], dense_tokens))


def test_packed_checkpoint_loads_like_its_pruned_folder(tmp_path):
    folder, _ = pruned_folder(tmp_path)
    pack_checkpoint(folder, tmp_path / "packed")
    tokens = torch.randint(0, 128, (1, 9))
    for sparse in ("auto", "none"):
        from_folder = load_model(folder, sparse=sparse, dtype=torch.bfloat16, device="cpu")
        from_packed = load_model(tmp_path / "packed", sparse=sparse, dtype=torch.bfloat16, device="cpu")
        for model in (from_folder, from_packed):
            model.setup_caches(1, 9)
        assert torch.equal(from_packed(tokens, torch.arange(9)), from_folder(tokens, torch.arange(9)))
    assert isinstance(from_packed.layers[0].mlp.down, torch.nn.Linear)  # --sparse none unpacks


def test_sparse_packed_refuses_a_dense_linear(tmp_path):
    folder = saved(random_hf_model("llama"), tmp_path)
    with pytest.raises(EngineError, match=r"layers\.0\.attention\.qkv\.weight is not N:M sparse"):
        load_model(folder, sparse="packed", dtype=torch.bfloat16, device="cpu")


def test_packing_needs_a_kernel_dtype(tmp_path):
    folder, _ = pruned_folder(tmp_path)
    with pytest.raises(EngineError, match="bfloat16 or float16"):
        load_model(folder, sparse="auto", dtype=torch.float32, device="cpu")


def test_nm_pattern_finds_the_finest_pattern_the_kernel_runs():
    weight = torch.randn(64, 128)
    assert nm_pattern(weight) is None
    assert nm_pattern(magnitude(weight, None, "2:4")) == (2, 4)
    assert nm_pattern(magnitude(weight, None, "16:32")) == (16, 32)
    assert nm_pattern(magnitude(weight, None, "3:8")) == (4, 8)  # 32·3/8 = 12 values per word: not a kernel shape
    assert nm_pattern(magnitude(torch.randn(64, 48), None, "2:4")) is None  # in_features not a multiple of 32
    assert nm_pattern(magnitude(weight, None, "1:4")) == (1, 4)
    # more than half kept somewhere: not a pruned weight, stays dense (3:4 and 24:32 would run but save little)
    assert nm_pattern(magnitude(weight, None, "3:4")) is None
    almost = magnitude(weight, None, "2:4")
    almost[0, (almost[0, :4] == 0).nonzero()[0]] = 1.0
    assert nm_pattern(almost) is None


def test_row_concatenation_keeps_packed_parts_packed():
    parts = [pack_nm(magnitude(torch.randn(rows, 64), None, "2:4"), 2, 4) for rows in (8, 4, 4)]
    fused = concat_rows(parts)
    assert isinstance(fused, PackedNM) and fused.shape == (16, 64)
    assert torch.equal(fused.to_dense(), torch.cat([p.to_dense() for p in parts]))
    mixed = concat_rows([parts[0], pack_nm(magnitude(torch.randn(4, 64), None, "4:8"), 4, 8)])
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (12, 64)


TINY = ModelArgs(architecture="llama", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 intermediate_size=96, norm_eps=1e-5, rope_theta=10000.0)


@pytest.mark.parametrize("pattern", ["2:4", "8:16", "16:32"])
def test_random_packed_weights_keep_n_of_every_m(pattern):
    pattern = SparsityPattern.parse(pattern)
    state = random_state(TINY, pattern, dtype=torch.bfloat16, device="cpu")
    packed = {key: w for key, w in state.items() if isinstance(w, PackedNM)}
    assert len(packed) == 4 * TINY.n_layers
    for weight in packed.values():
        rows, columns = weight.shape
        groups = bitmask_to_bits(weight.bitmask).view(rows, columns // pattern.m, pattern.m).sum(-1)
        assert bool((groups == pattern.n).all())
    model = build_model(TINY, state)
    model.setup_caches(1, 8)
    assert torch.isfinite(model(torch.randint(0, 96, (1, 8)), torch.arange(8)).float()).all()


def test_weight_bytes_count_packed_values_masks_and_lm_head():
    model = build_model(TINY, random_state(TINY, SparsityPattern.parse("2:4"), dtype=torch.bfloat16, device="cpu"))
    linears = 2 * (TINY.qkv_size * 64 + 64 * 64 + 2 * 96 * 64 + 64 * 96)  # weights per layer × layers
    assert weight_bytes(model) == linears // 2 * 2 + linears // 8 + 96 * 64 * 2
    embeddings_and_norms = (96 * 64 + 64 * 5) * 2
    assert model_bytes(TINY, SparsityPattern.parse("2:4")) == weight_bytes(model) + embeddings_and_norms


def test_dense_copies_serve_wide_batches_and_cost_their_memory(tmp_path):
    folder, _ = pruned_folder(tmp_path, arch="llama")
    model = load_model(folder, sparse="auto", dtype=torch.bfloat16, device="cpu")
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    read_packed, held_packed = weight_bytes(model, 4), resident_weight_bytes(model)
    prompt = torch.randint(0, 128, (4, 5))
    before = {batch: Engine(model, batch, 20).generate(prompt[:batch], 8).tokens for batch in (2, 4)}
    assert keep_dense_copies(model, 3) == len(packed) == 2 * 4
    dense_bytes = sum(m.dense.numel() * 2 for m in packed)
    packed_bytes = sum(m.values.numel() * 2 + m.bitmask.numel() * 4 for m in packed)
    assert resident_weight_bytes(model) == held_packed + dense_bytes
    assert weight_bytes(model, 2) == read_packed and weight_bytes(model, 3) == read_packed - packed_bytes + dense_bytes
    assert all("dense" not in key for key in model.state_dict())  # a cache, never saved
    x = torch.randn(3, packed[0].in_features, dtype=torch.bfloat16)
    assert torch.equal(packed[0](x), torch.nn.functional.linear(x, packed[0].packed.to_dense()))
    # the batch below the threshold still runs the packed kernel (CPU: its reference), so its tokens are unchanged
    assert torch.equal(Engine(model, 2, 20).generate(prompt[:2], 8).tokens, before[2])
    # the wider batch runs the dense copies: the same products as the dense model's
    dense = load_model(folder, sparse="none", dtype=torch.bfloat16, device="cpu")
    assert torch.equal(Engine(model, 4, 20).generate(prompt, 8).tokens,
                       Engine(dense, 4, 20).generate(prompt, 8).tokens)
    for outside in (1, 17):
        with pytest.raises(EngineError, match="choose 2..16"):
            keep_dense_copies(model, outside)
    with pytest.raises(EngineError, match="no packed linear"):
        keep_dense_copies(dense, 3)
    with pytest.raises(EngineError, match="needs packed weights"):
        check_plan([(None, [4], 3)], 16)
    with pytest.raises(EngineError, match="choose 2..16"):
        check_plan([(SparsityPattern.parse("2:4"), [4], 1)], 16)


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (2.0, None), (1.0, 3)])
def test_sampling_draws_from_the_softmax_at_the_temperature(temperature, top_k):
    """`sample` on 40,000 copies of one row (each row its own noise): token frequencies match softmax(logits/T),
    renormalised over the top k where given."""
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    draws = sample(logits.expand(40000, -1), Sampling(temperature=temperature, top_k=top_k), torch.tensor([7]),
                   torch.tensor([3]))
    frequencies = torch.bincount(draws, minlength=5) / len(draws)
    expected = logits / temperature
    if top_k is not None:
        expected = expected.masked_fill(expected < expected.topk(top_k).values[-1], float("-inf"))
    torch.testing.assert_close(frequencies, expected.softmax(-1), atol=0.01, rtol=0)


def test_uniform_noise_never_reaches_zero_or_one():
    noise = uniform_noise(torch.tensor([3]), torch.tensor([1]), batch=256, vocab=152064)
    assert float(noise.min()) > 0 and float(noise.max()) < 1
    assert bool(torch.isfinite(-torch.log(-torch.log(noise))).all())


def test_sampling_is_reproducible_per_seed_and_respects_top_k():
    logits = torch.randn(3, 50)
    sampling = Sampling(temperature=1.0, top_k=5)
    draws = [sample(logits, sampling, torch.tensor([s]), torch.tensor([p])) for s in range(4) for p in range(25)]
    top5 = logits.topk(5).indices
    assert all(bool((d[:, None] == top5).any(-1).all()) for d in draws)
    again = sample(logits, sampling, torch.tensor([0]), torch.tensor([0]))
    assert torch.equal(again, draws[0])
    assert len({tuple(d.tolist()) for d in draws}) > 50
    assert torch.equal(sample(logits, Sampling(), torch.tensor([0]), torch.tensor([0])), logits.argmax(-1))


def test_engine_sampling_depends_only_on_the_seed(tmp_path):
    model = load_model(saved(random_hf_model("llama"), tmp_path), dtype=torch.float32, device="cpu")
    engine = Engine(model, 2, 24, Sampling(temperature=1.0))
    prompt = torch.randint(0, 128, (2, 4))
    first, second = engine.generate(prompt, 16, seed=1).tokens, engine.generate(prompt, 16, seed=1).tokens
    assert torch.equal(first, second)
    assert not torch.equal(first, engine.generate(prompt, 16, seed=2).tokens)


def test_engine_refuses_requests_its_cache_cannot_hold(tmp_path):
    model = build_model(TINY, random_state(TINY, None, dtype=torch.float32, device="cpu"))
    engine = Engine(model, batch=2, max_seq_len=16)
    with pytest.raises(EngineError, match="batch of 3 prompts is larger than the KV cache"):
        engine.generate(torch.zeros(3, 4, dtype=torch.long), 4)
    with pytest.raises(EngineError, match="does not fit the KV cache of 16 positions"):
        engine.generate(torch.zeros(2, 10, dtype=torch.long), 7)
    with pytest.raises(EngineError, match="outside 1..16"):
        Engine(model, batch=17, max_seq_len=16)
    Engine(model, batch=1, max_seq_len=16)
    with pytest.raises(EngineError, match="another Engine"):
        engine.generate(torch.zeros(2, 4, dtype=torch.long), 4)


def test_sliding_window_limits_the_cache():
    model = build_model(replace(TINY, sliding_window=8), random_state(TINY, None, torch.float32, "cpu"))
    with pytest.raises(EngineError, match="sliding window of 8"):
        model.setup_caches(1, 9)


def test_a_request_inside_the_window_is_served_though_the_cache_is_rounded_past_it():
    """The Engine rounds its cache up to 16 positions; a window of 24 still serves 19 positions, and refuses a
    request beyond the window even where the rounded cache (32) would hold it."""
    model = build_model(replace(TINY, sliding_window=24), random_state(TINY, None, torch.float32, "cpu"))
    engine = Engine(model, batch=1, max_seq_len=19)
    assert engine.max_seq_len == 24 and model.max_seq_len == 32
    engine.generate(torch.zeros(1, 7, dtype=torch.long), 12)
    with pytest.raises(EngineError, match="does not fit"):
        engine.generate(torch.zeros(1, 20, dtype=torch.long), 8)


def test_a_tied_config_beside_its_own_different_lm_head_is_refused(tmp_path):
    import json

    folder = saved(random_hf_model("llama", tie_word_embeddings=False), tmp_path / "untied")
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="lm_head.weight that differs from the input embedding"):
        load_model(folder, dtype=torch.float32, device="cpu")


def test_check_refuses_a_packed_folder_rather_than_compare_random_weights(tmp_path):
    from sparsedecoding.evaluation.engine_check import run

    model = random_hf_model("llama")
    prune_in_place(model, "2:4")
    pack_checkpoint(saved(model, tmp_path / "pruned"), tmp_path / "packed")
    with pytest.raises(EngineError, match="is a packed checkpoint"):
        run(tmp_path / "packed", ["hi"], 2, torch.device("cpu"), False, ["logits"], torch.float32)


@pytest.mark.parametrize("vocab", [128256, 151936, 49152, 32000, 1000, 257])
def test_two_stage_argmax_gives_torchs_index(vocab):
    """two_stage_argmax: the index torch.argmax gives, ties (first maximum), NaN and -inf rows included, for
    vocabularies with a large, a small and no usable power-of-two factor."""
    from sparsedecoding.engine.generate import two_stage_argmax

    generator = torch.Generator().manual_seed(vocab)
    scores = torch.randn(6, vocab, generator=generator).bfloat16()  # bf16: many exact ties
    scores[1] = 0.0  # a constant row: index 0
    scores[2, vocab // 2] = scores[2, vocab - 1] = 99.0  # a tie across chunks
    scores[3, vocab // 3] = float("nan")
    scores[3, vocab - 2] = float("nan")
    scores[4] = float("-inf")
    scores[5, -1] = 99.0  # the last index
    for dtype in (torch.bfloat16, torch.float32):
        x = scores.to(dtype)
        assert torch.equal(two_stage_argmax(x), x.argmax(-1)), dtype
    assert two_stage_argmax(scores).tolist()[1:3] == [0, vocab // 2]
    strided = scores.float().t().contiguous().t()  # the same rows, the vocabulary axis strided
    assert torch.equal(two_stage_argmax(strided), strided.argmax(-1))


def test_argmax_rows_times_each_cuda_shape_once_and_takes_the_faster(monkeypatch):
    """The choice is made per (vocabulary, dtype, device) at the first call outside a capture, whatever the rows,
    then remembered; the CPU and a first call during a capture take torch.argmax. CUDA is faked on CPU tensors."""
    import sparsedecoding.engine.generate as generate

    class Cuda(torch.Tensor):  # is_cuda for the dispatcher; everything else a CPU tensor
        is_cuda = True

    timed, used = [], []
    monkeypatch.setattr(generate, "_TWO_STAGE_FASTER", {})
    monkeypatch.setattr(generate, "_time_argmax", lambda rows, vocab, dtype, device: timed.append(vocab) or
                        vocab == 128256)
    monkeypatch.setattr(generate, "two_stage_argmax", lambda scores: used.append(scores.shape[1]) or
                        scores.argmax(-1))
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    llama, qwen = torch.randn(1, 128256).as_subclass(Cuda), torch.randn(1, 151936).as_subclass(Cuda)
    capturing[0] = True
    assert torch.equal(generate.argmax_rows(llama), llama.argmax(-1)) and timed == [] and used == []
    capturing[0] = False
    for rows in (1, 3):  # another row count: the same choice, not timed again
        llama, qwen = torch.randn(rows, 128256).as_subclass(Cuda), torch.randn(rows, 151936).as_subclass(Cuda)
        assert torch.equal(generate.argmax_rows(llama), llama.argmax(-1))
        assert torch.equal(generate.argmax_rows(qwen), qwen.argmax(-1))
    assert timed == [128256, 151936] and used == [128256, 128256]  # timed once each; two stages only where faster
    cpu = torch.randn(2, 128256)
    assert torch.equal(generate.argmax_rows(cpu), cpu.argmax(-1)) and used == [128256, 128256]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("vocab", [128256, 151936])
def test_argmax_rows_on_the_gpu_gives_torchs_index_whichever_it_picks(vocab):
    from sparsedecoding.engine.generate import _TWO_STAGE_FASTER, argmax_rows

    scores = torch.randn(4, vocab, device="cuda").bfloat16()
    scores[1, vocab // 2] = scores[1, vocab - 1] = 99.0
    assert torch.equal(argmax_rows(scores), scores.argmax(-1))
    assert (vocab, torch.bfloat16, scores.device) in _TWO_STAGE_FASTER


@pytest.mark.parametrize("combo,pdl,options", [("0", "0", None), ("1", "0", {"combo_kernels": True}),
                                               ("0", "1", {"triton.enable_pdl": True}),
                                               ("1", "1", {"combo_kernels": True, "triton.enable_pdl": True})])
def test_inductor_settings_reach_the_compiled_regions(combo, pdl, options, monkeypatch):
    compiled = []
    monkeypatch.setenv("SPARSEDECODING_COMBO_KERNELS", combo)
    monkeypatch.setenv("SPARSEDECODING_INDUCTOR_PDL", pdl)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled.append(kwargs) or fn)
    model = build_model(TINY, random_state(TINY, None, torch.float32, "cpu"))
    model.compile_regions()
    assert [kwargs["options"] for kwargs in compiled] == [options, options]


def test_compiled_regions_past_dynamos_recompile_limit(monkeypatch):
    """Ten compilations of the regions, each at its own batch (a recompile under static shapes), all run: each
    compile_regions call gets code objects of its own. On one shared code object the ninth failed under fullgraph
    (Dynamo's limit of 8 a code object), as a GPU test run after thirteen compiled engines did. Dynamo's eager
    backend stands in for Inductor so that this stays fast on a CPU."""
    import torch._dynamo

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: real_compile(fn, fullgraph=True, dynamic=False,
                                                                            backend="eager"))
    torch._dynamo.reset()
    model = build_model(TINY, random_state(TINY, None, torch.float32, "cpu"))
    prompt = torch.randint(TINY.vocab_size, (10, 3), generator=torch.Generator().manual_seed(0))
    with torch._dynamo.config.patch(recompile_limit=8):  # Dynamo's own patch: a monkeypatch's undo deletes it
        for batch in range(1, 11):
            model.setup_caches(batch, 16)
            model.compile_regions()
            compiled = model(prompt[:batch], torch.arange(3), compiled=True)
            torch.testing.assert_close(compiled, model(prompt[:batch], torch.arange(3)), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("has_pdl", [True, False])
def test_the_inductor_defaults_are_combo_kernels_and_programmatic_launches_where_inductor_has_them(has_pdl,
                                                                                                   monkeypatch):
    import torch._inductor.config as inductor

    from sparsedecoding.kernels import op

    for name in ("SPARSEDECODING_COMBO_KERNELS", "SPARSEDECODING_INDUCTOR_PDL", "SPARSEDECODING_INDUCTOR_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    if not has_pdl:  # an older PyTorch (the real config module is left alone: it does not take deletions back)
        monkeypatch.setattr(op, "_inductor_has_pdl", lambda: False)
        assert op.compile_options() == {"combo_kernels": True}
        monkeypatch.setenv("SPARSEDECODING_INDUCTOR_PDL", "1")  # asked for explicitly: one clear error
        with pytest.raises(op.KernelChoiceError, match="no programmatic launches"):
            op.compile_options()
        return
    assert hasattr(inductor.triton, "enable_pdl"), "this PyTorch's Inductor lacks the option: test the other case"
    assert op.compile_options() == {"combo_kernels": True, "triton.enable_pdl": True}
    assert op.settings()["SPARSEDECODING_INDUCTOR_ATTENTION"] == "auto"


def test_reduction_decode_attention_equals_sdpa():
    from sparsedecoding.engine.model import decode_attention

    generator = torch.Generator().manual_seed(3)
    batch, kv_heads, group, length, dim = 2, 3, 4, 37, 16
    q = torch.randn(batch, kv_heads, group, dim, generator=generator)
    k, v = (torch.randn(batch, kv_heads, length, dim, generator=generator) for _ in range(2))
    allowed = torch.arange(length) <= 20
    mask = torch.zeros(group, length).masked_fill(~allowed, float("-inf"))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(decode_attention(q, k, v, mask), expected, rtol=1e-5, atol=1e-6)
    bf16 = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask.bfloat16())
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), expected, rtol=2e-2, atol=2e-2)


def test_engine_decodes_the_same_tokens_with_reduction_attention(monkeypatch):
    state = random_state(TINY, None, torch.float32, "cpu")
    prompt = torch.randint(0, TINY.vocab_size, (2, 5), generator=torch.Generator().manual_seed(4))
    tokens = {}
    for value in ("0", "1", "auto"):
        monkeypatch.setenv("SPARSEDECODING_INDUCTOR_ATTENTION", value)
        model = build_model(TINY, {name: tensor.clone() for name, tensor in state.items()})
        assert all(block.attention.reduction_decode == value for block in model.layers)
        tokens[value] = Engine(model, 2, 24, compile=False).generate(prompt, 12).tokens
    assert torch.equal(tokens["0"], tokens["1"]) and torch.equal(tokens["0"], tokens["auto"])


@pytest.mark.parametrize("value,batch,device,cache,reductions", [
    ("auto", 1, "cuda", 8, True), ("auto", 1, "cuda", 1024, True), ("auto", 1, "cuda", 1040, False),
    ("auto", 2, "cuda", 8, False), ("auto", 1, "cpu", 8, False), ("1", 4, "cpu", 1040, True),
    ("0", 1, "cuda", 8, False)])
def test_the_attention_setting_picks_reductions_by_batch_device_and_cache(value, batch, device, cache, reductions,
                                                                         monkeypatch):
    """"auto" (the default) takes the reductions at batch 1 on CUDA with a cache of at most 1024 positions only:
    measured faster there (272 and 1024 positions), slower with 4096 and at batch 4 and 8. The device is faked on CPU
    tensors (only the branch is under test)."""
    import sparsedecoding.engine.model as engine_model

    monkeypatch.setenv("SPARSEDECODING_INDUCTOR_ATTENTION", value)
    model = build_model(TINY, random_state(TINY, None, torch.float32, "cpu"))
    attention = model.layers[0].attention
    attention.k_cache = torch.zeros(batch, TINY.n_kv_heads, cache, TINY.head_dim)
    attention.v_cache = torch.zeros_like(attention.k_cache)
    called = []
    monkeypatch.setattr(engine_model, "decode_attention", lambda *args: called.append(1) or
                        torch.nn.functional.scaled_dot_product_attention(*args[:3], attn_mask=args[3]))

    class Qkv(torch.Tensor):  # is_cuda as the parametrization says, everything else a CPU tensor
        is_cuda = device == "cuda"

    qkv = torch.randn(batch, 1, attention.qkv.out_features).as_subclass(Qkv)
    group = TINY.n_heads // TINY.n_kv_heads
    cos, sin = torch.ones(1, TINY.head_dim), torch.zeros(1, TINY.head_dim)
    attention.attend(qkv, cos, sin, torch.zeros(group, cache), torch.tensor([0]))
    assert bool(called) == reductions


def test_a_packed_folder_without_its_manifest_says_so(tmp_path):
    from sparsedecoding.packed import PACKED_MANIFEST

    model = random_hf_model("llama")
    prune_in_place(model, "2:4")
    pack_checkpoint(saved(model, tmp_path / "pruned"), tmp_path / "packed")
    (tmp_path / "packed" / PACKED_MANIFEST).unlink()
    with pytest.raises(EngineError, match=f"packed but has no {PACKED_MANIFEST}"):
        load_model(tmp_path / "packed", dtype=torch.float32, device="cpu")
