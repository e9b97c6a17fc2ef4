import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding import pipeline
from sparsedecoding.errors import OutputNotWritableError
from sparsedecoding.hessian import collect_hessians
from sparsedecoding.models import load_model
from sparsedecoding.patterns import PRUNABLE_LINEARS as PRUNABLE
from sparsedecoding.pipeline import PruneConfig, prune
from helpers import make_tiny_model



@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("pipeline") / "model", num_hidden_layers=3)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": text}) for text in
                              ["def f(x):", "sort a list", "hello world", "print numbers", "x = 1", "loop"]))
    return path


def config(folder, out, prompts, **overrides):
    values = dict(model=str(folder), out=str(out), prompts=str(prompts), pattern="2:4", tokens=36, max_new_tokens=16,
                  batch_size=2, gen_batch_size=4, do_sample=True, seed=0)
    values.update(overrides)
    return PruneConfig(**values)


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("pattern,calibration,solver,propagation", [
    ("2:4", "decode", "sparsegpt", "dense"),
    ("4:8", "text", "wanda", "sequential"),
    ("16:32", "mix", "sparsegpt", "sequential"),
    ("50%", "decode", "magnitude", "dense"),
])
def test_prune_writes_a_valid_sparse_checkpoint(tiny_folder, prompts_file, tmp_path, pattern, calibration, solver,
                                               propagation):
    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, pattern=pattern, calibration=calibration,
                       solver=solver, propagation=propagation, text_seq_len=16), progress=False)
    dense, pruned = weights(tiny_folder), weights(out)
    assert dense.keys() == pruned.keys()
    for name, tensor in pruned.items():
        if name.endswith(tuple(f"{leaf}.weight" for leaf in PRUNABLE)):
            if ":" in pattern:
                n, m = map(int, pattern.split(":"))
                counts = (tensor != 0).reshape(tensor.shape[0], -1, m).sum(-1)
                assert torch.all(counts == n), name
            else:
                assert (tensor == 0).float().mean() == pytest.approx(0.5, abs=0.01), name
        else:  # embeddings, lm_head, norms, biases: untouched
            assert torch.equal(tensor, dense[name]), name
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["pattern"] == pattern and manifest["solver"] == solver
    assert manifest["propagation"] == propagation
    assert manifest["calibration"]["tokens"] == 36
    assert sum(manifest["calibration"]["tokens_by_source"].values()) == 36
    assert len(manifest["layers"]) == 3 * 7
    assert not (tmp_path / "out.partial").exists()
    model, _, _ = load_model(out)  # loads with transformers
    assert model.config.num_hidden_layers == 3


def spy_calibration_and_hessians(monkeypatch) -> dict:
    """Record, as prune runs, its calibration set (key "calib") and every solve's Hessians (key "hessians")."""
    captured = {"hessians": []}
    build, solve = pipeline.build_calibration, pipeline.solve_layer

    def spy_build(cfg, model, tokenizer, store, *rest):
        captured["calib"], stats = build(cfg, model, tokenizer, store, *rest)
        return captured["calib"], stats

    def spy_solve(cfg, pattern, linears, hessians, crosses=None):
        captured["hessians"].append({name: hessian.clone() for name, hessian in hessians.items()})
        return solve(cfg, pattern, linears, hessians, crosses)

    monkeypatch.setattr(pipeline, "build_calibration", spy_build)
    monkeypatch.setattr(pipeline, "solve_layer", spy_solve)
    return captured


@pytest.mark.slow
def test_dense_propagation_uses_dense_model_hessians(tiny_folder, prompts_file, tmp_path, monkeypatch):
    """With dense propagation every layer's Hessians equal those of one pass of the dense model; with sequential
    propagation the later layers' differ (their inputs come from pruned layers)."""
    captured = spy_calibration_and_hessians(monkeypatch)
    dense_model, _, _ = load_model(tiny_folder)
    for propagation in ("dense", "sequential"):
        captured["hessians"].clear()
        prune(config(tiny_folder, tmp_path / propagation, prompts_file, propagation=propagation), progress=False)
        expected = collect_hessians(dense_model, captured["calib"], batch_size=2, progress=False)
        differences = []
        for index, layer_hessians in enumerate(captured["hessians"]):
            for name, hessian in layer_hessians.items():
                reference = expected[f"model.layers.{index}.{name}"]
                differences.append((index, float((hessian - reference).abs().max() / reference.abs().max())))
        if propagation == "dense":
            assert max(diff for _, diff in differences) < 1e-5
        else:
            assert max(diff for index, diff in differences if index == 0) < 1e-5
            assert min(diff for index, diff in differences if index > 0) > 1e-4


@pytest.mark.parametrize("propagation,target", [("dense", "self"), ("sequential", "self"), ("sequential", "dense")])
@pytest.mark.slow
def test_resume_after_interruption_gives_the_same_weights(tiny_folder, prompts_file, tmp_path, monkeypatch,
                                                          propagation, target):
    straight = prune(config(tiny_folder, tmp_path / f"straight-{propagation}", prompts_file,
                            propagation=propagation, target=target), progress=False)
    out = tmp_path / f"resumed-{propagation}"
    solve, calls = pipeline.solve_layer, []
    calls_per_layer = 4 if target == "dense" else 1  # dense target solves q/k/v, o, gate/up and down in turn

    def interrupt_at_second_layer(*args):
        calls.append(1)
        if len(calls) == calls_per_layer + 1:
            raise KeyboardInterrupt
        return solve(*args)

    monkeypatch.setattr(pipeline, "solve_layer", interrupt_at_second_layer)
    with pytest.raises(KeyboardInterrupt):
        prune(config(tiny_folder, out, prompts_file, propagation=propagation, target=target), progress=False)
    assert not out.exists() and (tmp_path / f"resumed-{propagation}.partial" / "layers" / "000.safetensors").exists()
    monkeypatch.setattr(pipeline, "solve_layer", solve)
    prune(config(tiny_folder, out, prompts_file, propagation=propagation, target=target), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["timing"]["resumed_from_layer"] == 1
    first, second = weights(straight), weights(out)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_a_bf16_model_pruned_on_the_cpu_is_written_in_bf16(tmp_path, prompts_file):
    source = make_tiny_model(tmp_path / "bf16")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(torch.bfloat16).save_pretrained(source)
    out = prune(config(source, tmp_path / "out", prompts_file, device="cpu"), progress=False)
    pruned = weights(out)
    assert {tensor.dtype for tensor in pruned.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    q = pruned["model.layers.0.self_attn.q_proj.weight"].float().reshape(-1, 4)
    assert int((q != 0).sum(-1).max()) <= 2  # still 2:4 after the cast


def test_the_source_dtype_comes_from_the_config_or_else_the_weights(tmp_path):
    from sparsedecoding.models import source_dtype

    folder = make_tiny_model(tmp_path / "model")
    assert source_dtype(folder) == torch.float32
    config_file = folder / "config.json"
    settings = json.loads(config_file.read_text())
    settings["dtype"] = "float16"
    config_file.write_text(json.dumps(settings))
    assert source_dtype(folder) == torch.float16
    del settings["dtype"]
    config_file.write_text(json.dumps(settings))
    from safetensors.torch import save_file

    save_file({name: tensor.to(torch.bfloat16) for name, tensor in weights(folder).items()},
              str(folder / "model.safetensors"))
    assert source_dtype(folder) == torch.bfloat16


@pytest.mark.slow
def test_dense_target_matches_self_target_where_the_streams_agree_and_differs_after(tiny_folder, prompts_file,
                                                                                   tmp_path):
    """Layer 0's q/k/v read the same inputs in both streams (nothing is pruned before them), so fitting the dense
    outputs gives their own-output solution; every later linear reads inputs that pruning has moved (o_proj already
    sees the pruned q/k/v), so the dense target changes its weights."""
    results = {target: weights(prune(config(tiny_folder, tmp_path / target, prompts_file, propagation="sequential",
                                            target=target, pattern="2:4"), progress=False))
               for target in ("self", "dense")}
    for name, tensor in results["dense"].items():
        if not name.endswith(tuple(f"{leaf}.weight" for leaf in PRUNABLE)):
            continue
        counts = (tensor != 0).reshape(tensor.shape[0], -1, 4).sum(-1)
        assert torch.all(counts == 2), name
        other = results["self"][name]
        if name.startswith(tuple(f"model.layers.0.self_attn.{leaf}" for leaf in ("q_proj", "k_proj", "v_proj"))):
            torch.testing.assert_close(tensor, other, rtol=1e-4, atol=1e-5)
        else:
            assert (tensor - other).abs().max() > 1e-3, name


def test_dense_target_needs_sequential_propagation(tiny_folder, prompts_file, tmp_path):
    from sparsedecoding.errors import SparseDecodingError

    with pytest.raises(SparseDecodingError, match="sequential"):
        prune(config(tiny_folder, tmp_path / "out", prompts_file, target="dense"), progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.slow
def test_an_interrupted_prune_resumes_at_its_generation_batch_and_then_its_layer(tiny_folder, prompts_file, tmp_path,
                                                                                 monkeypatch, caplog):
    """Generation is cut at its third batch, then solving at the second layer; each rerun reuses what was kept."""
    from sparsedecoding import generation

    calls, stop = {"generate": 0, "solve": 0}, {"generate": None, "solve": None}

    def counted(kind, original):
        def call(*args):
            calls[kind] += 1
            if calls[kind] == stop[kind]:
                raise KeyboardInterrupt
            return original(*args)
        return call

    monkeypatch.setattr(generation, "_generate_batch", counted("generate", generation._generate_batch))
    monkeypatch.setattr(pipeline, "solve_layer", counted("solve", pipeline.solve_layer))

    def run(out, kind=None, at=None):
        calls.update(generate=0, solve=0)
        stop.update(generate=None, solve=None)
        stop[kind] = at
        caplog.clear()
        with caplog.at_level("INFO"):
            # one prompt per batch, so the 36-token budget takes several batches
            return prune(config(tiny_folder, out, prompts_file, gen_batch_size=1), progress=False)

    straight = run(tmp_path / "straight")
    batches = calls["generate"]
    assert batches >= 3
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run(out, "generate", 3)
    assert sorted(path.name for path in (tmp_path / "resumed.partial" / "generation").iterdir()) == \
        ["batch-00000.json", "batch-00001.json"]
    with pytest.raises(KeyboardInterrupt):
        run(out, "solve", 2)
    assert "resuming generation at batch 3 of 6" in caplog.text and calls["generate"] == batches - 2
    run(out)
    assert "resuming from layer 1 of 3" in caplog.text and calls["generate"] == 0
    first, second = weights(straight), weights(out)
    assert first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_pattern_dense_runs_gptq_on_the_same_hessians(tiny_folder, prompts_file, tmp_path, monkeypatch, quantize):
    """`--pattern dense --quantize`: every prunable weight lands on its grid (int8: one scale a row, int4: one per 32
    columns) with nothing pruned, each layer's error on its own Hessian is no worse than rounding to nearest, and
    the checkpoint records GPTQ with the quantization that `pack` reads."""
    from sparsedecoding import solvers
    from sparsedecoding.packed import recorded_quantization

    seen = {}
    solve = pipeline.solve_layer

    def spy_solve(cfg, pattern, linears, hessians, crosses=None):
        assert pattern is None
        index = len(seen) // len(linears)
        for name, linear in linears.items():
            seen[f"model.layers.{index}.{name}.weight"] = (linear.weight.detach().clone(), hessians[name].clone())
        return solve(cfg, pattern, linears, hessians, crosses)

    monkeypatch.setattr(pipeline, "solve_layer", spy_solve)
    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, pattern="dense", quantize=quantize,
                       group_size=32), progress=False)
    dense, quantized = weights(tiny_folder), weights(out)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["pattern"] == "dense" and manifest["solver"] == "gptq"
    assert recorded_quantization(out) == (quantize, 32)
    assert len(seen) == 3 * len(PRUNABLE)
    for name, tensor in quantized.items():
        if name not in seen:
            assert torch.equal(tensor, dense[name]), name  # embeddings, lm_head, norms: untouched
            continue
        codes = solvers.quantization_codes(tensor, quantize, 32)
        assert torch.equal(codes.dequantize(torch.float64), tensor.double()), name
        assert codes.scales.shape == (tensor.shape[0], 1 if quantize == "int8" else tensor.shape[1] // 32)
        weight, hessian = seen[name]
        rows, cols = weight.shape
        group = cols if quantize == "int8" else 32
        blocks = weight.double().reshape(rows, cols // group, group)
        scale = solvers.grid_scale(blocks.abs().amax(-1), quantize)[..., None]
        nearest = solvers.round_to_grid(blocks, scale, quantize).reshape(rows, cols)
        # nothing is pruned: zeros are code 0 of the rounding, about as many as rounding to nearest gives
        zeros, nearest_zeros = float((tensor == 0).float().mean()), float((nearest == 0).float().mean())
        assert zeros < 0.25 and zeros <= nearest_zeros + 0.05, (name, zeros, nearest_zeros)
        error = pipeline.relative_error(weight.double(), tensor.double(), hessian.double())
        assert error <= pipeline.relative_error(weight.double(), nearest, hessian.double()) * (1 + 1e-6), name
        assert manifest["layers"][name.removesuffix(".weight")]["relative_error"] == pytest.approx(error, rel=1e-3)


@pytest.mark.parametrize("overrides,expected", [
    ({}, "--pattern dense prunes nothing and, without --quantize, changes nothing"),
    ({"quantize": "int8", "solver": "wanda"}, "--quantize int8 runs inside SparseGPT"),
    ({"quantize": "int4", "repair_steps": 5}, "--quantize int4 runs inside SparseGPT"),
])
def test_pattern_dense_refuses_what_it_cannot_do_in_one_line(tiny_folder, prompts_file, tmp_path, capsys, overrides,
                                                             expected):
    from sparsedecoding.cli import main

    argv = ["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "out"), "--pattern", "dense"]
    for key, value in overrides.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.parametrize("quantize_head,tied", [("int8", False), ("int4", True)])
def test_quantize_head_rounds_lm_head_by_gptq_on_the_final_hidden_states(prompts_file, tmp_path, monkeypatch,
                                                                          quantize_head, tied):
    """`--quantize-head`: lm_head lands on its grid, its error on the Hessian of the final normed hidden states (at
    the kept positions) is no worse than rounding to nearest, a tied head is untied with the embedding unchanged, and
    the manifest records it; the block linears are pruned as without it."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding import solvers

    folder = make_tiny_model(tmp_path / f"model-{tied}", tie_word_embeddings=tied)
    seen = {}
    original = pipeline.quantize_head

    def spy(model, batches, cfg, dtype):
        head, norm = model.get_output_embeddings(), model.model.norm
        rows = torch.cat([norm(hidden).reshape(-1, hidden.shape[-1])[kept.reshape(-1)] for hidden, _, kept in batches])
        seen["weight"], seen["hessian"] = head.weight.detach().clone(), 2 * rows.T.double() @ rows.double() / len(rows)
        return original(model, batches, cfg, dtype)

    monkeypatch.setattr(pipeline, "quantize_head", spy)
    out = prune(config(folder, tmp_path / "out", prompts_file, quantize_head=quantize_head, group_size=32),
                progress=False)
    plain = prune(config(folder, tmp_path / "plain", prompts_file, group_size=32), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["solver_options"]["quantize_head"] == quantize_head
    assert manifest["layers"]["lm_head"]["quantize"] == quantize_head
    saved, before = weights(out), weights(folder)
    head = saved["lm_head.weight"]  # saved on its own even when the source tied it
    codes = solvers.quantization_codes(head, quantize_head, 32)
    assert torch.equal(codes.dequantize(torch.float64), head.double())
    assert torch.equal(saved["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(loaded.lm_head.weight, head) and not loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    weight, hessian = seen["weight"].double(), seen["hessian"]
    group = weight.shape[1] if quantize_head == "int8" else 32
    blocks = weight.reshape(weight.shape[0], -1, group)
    nearest = solvers.round_to_grid(blocks, solvers.grid_scale(blocks.abs().amax(-1), quantize_head)[..., None],
                                    quantize_head).reshape(weight.shape)
    error = pipeline.relative_error(weight, head.double(), hessian)
    assert error <= pipeline.relative_error(weight, nearest, hessian) * (1 + 1e-6)
    # the same GPTQ on the Hessian built here from the final normed hidden states: the same grid values (up to a
    # rare rounding tie that the two summation orders break differently)
    expected = solvers.gptq(seen["weight"], hessian.float(), quantize_head, group_size=32)
    assert (expected.to(head.dtype) == head).float().mean() > 0.99
    assert manifest["layers"]["lm_head"]["relative_error"] == pytest.approx(error, rel=1e-3)
    others = weights(plain)
    for name, tensor in saved.items():
        if name != "lm_head.weight":
            assert torch.equal(tensor, others[name]), name  # the blocks are pruned exactly as without it


@pytest.mark.parametrize("quantize_head", ["int8", "int4"])
def test_the_engine_runs_a_quantized_head_as_recorded_and_pack_keeps_the_record(prompts_file, tmp_path,
                                                                                quantize_head):
    """A checkpoint of `--quantize-head` loads into the engine with lm_head as a dense int8 / int4 weight (its
    codes read back exactly) unless --sparse none; its packed checkpoint too. The logits match the checkpoint's
    bf16 grid values."""
    from sparsedecoding.engine import load_model as load_engine
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear
    from sparsedecoding.packed import pack_checkpoint, recorded_head_quantization

    folder = make_tiny_model(tmp_path / "model", tie_word_embeddings=True)
    out = prune(config(folder, tmp_path / "out", prompts_file, quantize_head=quantize_head, group_size=32),
                progress=False)
    packed = tmp_path / "packed"
    pack_checkpoint(out, packed)
    hidden = torch.randn(3, 64).bfloat16()
    for source in (out, packed):
        assert recorded_head_quantization(source) == (quantize_head, 32)
        engine = load_engine(source, sparse="auto", device="cpu")
        assert isinstance(engine.output, DenseQuantizedLinear) and engine.output.quantize == quantize_head
        dense = load_engine(source, sparse="none", device="cpu")
        assert type(dense.output) is torch.nn.Linear
        torch.testing.assert_close(engine.logits(hidden).float(), dense.logits(hidden).float(), rtol=2e-2, atol=2e-2)
    assert recorded_head_quantization(folder) == (None, 128)


@pytest.mark.parametrize("overrides,expected", [
    ({"quantize-head": "int4", "group-size": "48"}, "group_size 48 does not divide the row length 64"),
    ({"quantize-head": "int4", "group-size": "16"}, "the dense int4 kernel takes 32, 64, 128, 256"),
    ({"pattern": "dense", "quantize": "int4", "group-size": "16"}, "the dense int4 kernel takes 32, 64, 128, 256"),
])
def test_a_dense_int4_group_the_engine_cannot_run_is_refused_before_any_work(tiny_folder, prompts_file, tmp_path,
                                                                           capsys, overrides, expected):
    from sparsedecoding.cli import main

    argv = ["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "out"), "--prompts", str(prompts_file)]
    for key, value in overrides.items():
        argv += [f"--{key}", value]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], errors
    assert not list(tmp_path.glob("out*"))  # neither the output nor its work folder


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_transformers_loads_a_quantized_checkpoint_with_codes_and_a_quantized_head(prompts_file, tmp_path, quantize):
    """`load_packed` of a packed `prune --quantize Q --quantize-head int8` checkpoint, and `sparsify(model,
    quantize=Q, head="int8")` of the pruned folder loaded by transformers, give the same transformers model: every
    pruned linear a QuantizedPackedLinear holding codes that dequantize to exactly the checkpoint's weights, lm_head
    a DenseQuantizedLinear, untied; logits equal to each other and, within bf16 rounding, to the bf16 grid model's.
    A head of another format than its grid, or values off their grid, are refused with nothing swapped."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding import load_packed, sparsify
    from sparsedecoding.errors import PackingError, QuantizationError
    from sparsedecoding.kernels import PackedLinear
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
    from sparsedecoding.packed import pack_checkpoint

    folder = make_tiny_model(tmp_path / "model", tie_word_embeddings=True)
    out = prune(config(folder, tmp_path / "out", prompts_file, quantize=quantize, group_size=32,
                       quantize_head="int8"), progress=False)
    pack_checkpoint(out, tmp_path / "packed32", quantize=quantize, group_size=32)
    with pytest.raises(PackingError, match="float32 tensors.*bfloat16"):  # the tiny model is float32
        load_packed(tmp_path / "packed32")
    grid = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()  # the grid is exact in bf16
    grid.save_pretrained(tmp_path / "bf16")
    shutil.copy(out / "sparsedecoding.json", tmp_path / "bf16")
    pack_checkpoint(tmp_path / "bf16", tmp_path / "packed", quantize=quantize, group_size=32)
    loaded = load_packed(tmp_path / "packed")
    model, summary = sparsify(copy.deepcopy(grid), quantize=quantize, group_size=32, head="int8")
    assert (summary.quantize, summary.head) == (quantize, "int8") and "lm_head" not in summary.kept_dense
    # the default ("auto") reads the same settings from the pruning record of the folder the model came from
    auto, auto_summary = sparsify(copy.deepcopy(grid))
    assert (auto_summary.quantize, auto_summary.head) == (quantize, "int8")
    plain, plain_summary = sparsify(copy.deepcopy(grid), quantize=None, head=None)
    assert (plain_summary.quantize, plain_summary.head) == (None, None) and "lm_head" in plain_summary.kept_dense
    assert sum(isinstance(m, PackedLinear) for m in plain.modules()) == 2 * 7
    assert f"{quantize} values" in str(summary) and "lm_head dense int8" in str(summary)
    tokens = torch.tensor([[5, 17, 42, 9, 77, 23], [8, 30, 101, 2, 55, 19]])
    with torch.no_grad():
        reference = grid(tokens).logits.float()
        for candidate in (loaded, model):
            swapped = {name: module for name, module in candidate.named_modules()
                       if isinstance(module, QuantizedPackedLinear)}
            assert len(swapped) == 2 * 7 and not any(isinstance(m, PackedLinear) for m in candidate.modules())
            for name, module in swapped.items():
                assert torch.equal(module.packed.to_dense(torch.bfloat16), grid.get_submodule(name).weight), name
            assert isinstance(candidate.lm_head, DenseQuantizedLinear) and candidate.lm_head.quantize == "int8"
            assert not candidate.config.tie_word_embeddings
            assert torch.equal(candidate.model.embed_tokens.weight, grid.model.embed_tokens.weight)
            torch.testing.assert_close(candidate(tokens).logits.float(), reference, rtol=3e-2, atol=3e-2)
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
        assert torch.equal(auto(tokens).logits, model(tokens).logits)
    before = copy.deepcopy(grid)
    with pytest.raises(QuantizationError, match="lm_head: .*--quantize-head int4"):
        sparsify(grid, quantize=quantize, group_size=32, head="int4")  # the head's int8 values: not on that grid
    with torch.no_grad():  # one kept value a third of a grid step off
        row = grid.model.layers[0].mlp.up_proj.weight[0]
        kept = int(row.nonzero()[0])
        row[kept] += row[:32].abs().max() / (127 if quantize == "int8" else 7) / 3
    with pytest.raises(QuantizationError, match=f"model.layers.0.mlp.up_proj: .*--quantize {quantize}"):
        sparsify(grid, quantize=quantize, group_size=32)
    assert not any(isinstance(m, QuantizedPackedLinear | DenseQuantizedLinear) for m in grid.modules())
    assert before.config.tie_word_embeddings == grid.config.tie_word_embeddings


def test_a_run_stopped_in_generation_is_not_resumed_by_other_settings_or_edited_prompts(tiny_folder, prompts_file,
                                                                                       tmp_path, monkeypatch, caplog):
    """The work folder records its fingerprint before any work, and the fingerprint covers the prompt file's
    contents: a rerun with other settings, or after the prompts were edited, starts over."""
    from sparsedecoding import generation

    def stop_at_second_batch(original):
        calls = []

        def call(*args):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return original(*args)
        return call

    out = tmp_path / "out"
    for change in ("settings", "prompts"):
        monkeypatch.setattr(generation, "_generate_batch", stop_at_second_batch(generation._generate_batch))
        with pytest.raises(KeyboardInterrupt):
            prune(config(tiny_folder, out, prompts_file, gen_batch_size=1), progress=False)
        assert json.loads((tmp_path / "out.partial" / "state.json").read_text())["fingerprint"]
        monkeypatch.undo()
        if change == "prompts":
            prompts_file.write_text(prompts_file.read_text().replace("sort a list", "reverse a string"))
        caplog.clear()
        with caplog.at_level("INFO"):
            prune(config(tiny_folder, out, prompts_file, gen_batch_size=1,
                         seed=1 if change == "settings" else 0), progress=False)
        assert "from a run with other settings" in caplog.text and "resuming generation" not in caplog.text
        shutil.rmtree(out)


def test_the_same_run_spelled_otherwise_resumes_and_an_edited_chat_template_starts_over(tiny_folder, prompts_file,
                                                                                         tmp_path, monkeypatch,
                                                                                         caplog):
    """The fingerprint takes the model and files as resolved paths and the device as picked, so a trailing slash or
    an absolute path resumes the stopped run; the digest reads the tokenizer and generation config, so an edited
    chat template (which changes the calibration tokens) starts over."""
    from sparsedecoding import generation

    model = shutil.copytree(tiny_folder, tmp_path / "model")
    out = tmp_path / "out"
    for respelled, edited in ((str(model) + "/", False), (str(model.resolve()), False), (str(model), True)):
        batches = []

        def stop_at_second_batch(*args, original=generation._generate_batch):
            batches.append(1)
            if len(batches) == 2:
                raise KeyboardInterrupt
            return original(*args)

        monkeypatch.setattr(generation, "_generate_batch", stop_at_second_batch)
        with pytest.raises(KeyboardInterrupt):
            prune(config(model, out, prompts_file, gen_batch_size=1, device="auto"), progress=False)
        monkeypatch.undo()
        if edited:
            template = model / "tokenizer_config.json"
            record = json.loads(template.read_text())
            record["chat_template"] = (record.get("chat_template") or "") + " "
            template.write_text(json.dumps(record))
        caplog.clear()
        with caplog.at_level("INFO"):
            prune(config(respelled, out, prompts_file, gen_batch_size=1, device="cpu"), progress=False)
        if edited:
            assert "from a run with other settings" in caplog.text and "resuming generation" not in caplog.text
        else:
            assert "from a run with other settings" not in caplog.text and "resuming generation" in caplog.text
        shutil.rmtree(out)


def test_overwrite_never_deletes_a_self_sources_prompt_file_kept_in_out(tiny_folder, prompts_file, tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    mine = out / "mine.txt"
    mine.write_text("".join(f"write function {index}\n" for index in range(20)))
    with pytest.raises(OutputNotWritableError, match="would overwrite the input"):
        prune(config(tiny_folder, out, prompts_file, calibration="self", self_sources=f"self=0.5,{mine}=0.5",
                     overwrite=True, gen_backend="hf"), progress=False)
    assert mine.exists()


def test_repair_split_of_too_few_sequences_is_refused_before_any_layer_is_solved(tiny_folder, prompts_file, tmp_path,
                                                                                monkeypatch):
    from sparsedecoding.errors import RepairError

    monkeypatch.setattr(pipeline, "solve_layer", lambda *args: pytest.fail("a layer was solved"))
    with pytest.raises(RepairError, match="train/dev split empty"):
        prune(config(tiny_folder, tmp_path / "out", prompts_file, tokens=10, n_prompts=1, repair_steps=2,
                     repair_on_policy=False), progress=False)


def test_options_a_run_does_not_read_are_named_in_one_warning(tiny_folder, prompts_file, tmp_path, caplog):
    with caplog.at_level("WARNING"):
        pipeline.warn_ignored_options(config(tiny_folder, tmp_path / "out", prompts_file, do_sample=False,
                                             temperature=0.3, solver="wanda", percdamp=0.5))
    assert "does not read --temperature, --percdamp" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        pipeline.warn_ignored_options(config(tiny_folder, tmp_path / "out", prompts_file, recipe="recommended"))
    assert caplog.text == ""


def test_int4_groups_of_16_are_refused_for_n_m_patterns_only(tiny_folder, prompts_file, tmp_path):
    """The packed format needs groups of a multiple of 32; an unstructured 50% model is never packed."""
    from sparsedecoding.errors import PackingError

    with pytest.raises(PackingError, match="multiple of 32"):
        prune(config(tiny_folder, tmp_path / "nm", prompts_file, quantize="int4", group_size=16), progress=False)
    out = prune(config(tiny_folder, tmp_path / "unstructured", prompts_file, pattern="50%", quantize="int4",
                       group_size=16), progress=False)
    assert (out / "sparsedecoding.json").is_file()


def test_prune_runs_without_autograd(tiny_folder, prompts_file, tmp_path, monkeypatch):
    """Calibration and everything around the solver run with gradients off (repair turns them on for itself):
    an autograd graph kept over calibration would cost memory the size of the activations."""
    seen = []
    real = pipeline.build_calibration

    def recording(*args, **kwargs):
        seen.append(torch.is_grad_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "build_calibration", recording)
    prune(config(tiny_folder, tmp_path / "out", prompts_file), progress=False)
    assert seen == [False]


def test_calibrating_on_the_held_out_half_is_warned_about(tiny_folder, tmp_path, monkeypatch, caplog):
    class Stop(Exception):
        pass

    monkeypatch.setattr(pipeline, "read_prompts", lambda source: ["def f():"])
    monkeypatch.setattr(pipeline, "WorkDir", lambda *args: (_ for _ in ()).throw(Stop()))
    for prompts, warned in (("humaneval:eval", True), ("humaneval:all", True), ("humaneval:calib", False)):
        caplog.clear()
        with caplog.at_level("WARNING"), pytest.raises(Stop):
            prune(PruneConfig(model=str(tiny_folder), out=str(tmp_path / "out"), prompts=prompts), progress=False)
        assert ("holds HumanEval's held-out half" in caplog.text) == warned, prompts


def test_the_recommended_recipe_calibrates_on_the_fit_quarter_it_was_evaluated_with():
    assert PruneConfig(model="m", out="o", recipe="recommended").prompts == "humaneval:fit"
    assert PruneConfig(model="m", out="o", recipe="recommended", prompts="p.txt").prompts == "p.txt"


def test_mix_keeps_its_ratio_when_decode_falls_short(tiny_folder, prompts_file, tmp_path, caplog):
    """Six prompts of at most 4 new tokens cannot give 500 decode tokens: text gets the matching share, not the
    rest of --tokens (which turned a 50% mix into a few percent of decode tokens)."""
    with caplog.at_level("WARNING"):
        calib, stats = pipeline.build_calibration(
            config(tiny_folder, tmp_path / "out", prompts_file, calibration="mix", tokens=1000, mix_ratio=0.5,
                   max_new_tokens=4, text_seq_len=16), *load_model(tiny_folder)[:2], progress=False)
    decode, text = stats["tokens_by_source"]["decode"], stats["tokens_by_source"]["text"]
    assert 0 < decode < 500 and text == decode and calib.tokens == 2 * decode
    assert "mix: decode gave" in caplog.text and "to keep --mix-ratio 0.5" in caplog.text


def test_the_refit_reaches_every_solve_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch, caplog):
    """--refit-steps: every SparseGPT solve gets it (Wanda's masks go through solvers.refit), the manifest records
    it, the mask is the one without it and every layer's loss is lower; GPTQ alone is warned it does not read it."""
    seen = []
    sparsegpt_shared = pipeline.solvers.sparsegpt_shared

    def spy(*args, **kwargs):
        seen.append(kwargs["refit_steps"])
        return sparsegpt_shared(*args, **kwargs)

    monkeypatch.setattr(pipeline.solvers, "sparsegpt_shared", spy)
    manifests, results = {}, {}
    for steps in (0, 30):
        seen.clear()
        out = prune(config(tiny_folder, tmp_path / f"s{steps}", prompts_file, solver="sparsegpt", refit_steps=steps),
                    progress=False)
        assert seen == [steps] * (3 * 4)
        manifests[steps] = json.loads((out / "sparsedecoding.json").read_text())
        assert manifests[steps]["solver_options"]["refit_steps"] == steps
        results[steps] = weights(out)
    for key in results[0]:
        if key.endswith("proj.weight"):
            assert torch.equal(results[0][key] != 0, results[30][key] != 0), key
    assert len(manifests[30]["layers"]) == 7 * 3
    for name, item in manifests[30]["layers"].items():
        assert item["relative_error"] < manifests[0]["layers"][name]["relative_error"], name
    calls = []
    refit_shared = pipeline.solvers.refit_shared
    monkeypatch.setattr(pipeline.solvers, "refit_shared",
                        lambda *a, **k: calls.append((len(a[0]), k["steps"])) or refit_shared(*a, **k))
    prune(config(tiny_folder, tmp_path / "wanda", prompts_file, solver="wanda", refit_steps=20), progress=False)
    assert calls == [(3, 20), (1, 20), (2, 20), (1, 20)] * 3  # qkv, o, gate_up, down of three layers
    with caplog.at_level("WARNING"):
        pipeline.warn_ignored_options(config(tiny_folder, tmp_path / "out", prompts_file, pattern="dense",
                                             quantize="int8", refit_steps=40))
    assert "--refit-steps" in caplog.text


def test_the_solver_order_reaches_every_solve_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch, caplog):
    """--solver-order: every SparseGPT solve (and the head's GPTQ) gets it, the manifest records it, and the two
    orders give different weights; Wanda, which has no column loop, is warned that it does not read it."""
    orders = []
    sparsegpt_shared, gptq_shared = pipeline.solvers.sparsegpt_shared, pipeline.solvers.gptq_shared

    def spy_sparsegpt(*args, **kwargs):
        orders.append(kwargs["order"])
        return sparsegpt_shared(*args, **kwargs)

    def spy_gptq(*args, **kwargs):
        orders.append(kwargs["order"])
        return gptq_shared(*args, **kwargs)

    monkeypatch.setattr(pipeline.solvers, "sparsegpt_shared", spy_sparsegpt)
    monkeypatch.setattr(pipeline.solvers, "gptq_shared", spy_gptq)
    results = {}
    for order in ("columns", "hessian"):
        orders.clear()
        out = prune(config(tiny_folder, tmp_path / order, prompts_file, solver="sparsegpt", solver_order=order,
                           quantize_head="int8"), progress=False)
        assert orders and set(orders) == {order}
        assert len(orders) == 3 * 4 + 1  # qkv, o, gate_up, down of three layers, then the head
        manifest = json.loads((out / "sparsedecoding.json").read_text())
        assert manifest["solver_options"]["solver_order"] == order
        results[order] = weights(out)
    assert any(not torch.equal(results["columns"][key], results["hessian"][key]) for key in results["columns"]
               if key.endswith("down_proj.weight"))
    with caplog.at_level("WARNING"):
        pipeline.warn_ignored_options(config(tiny_folder, tmp_path / "out", prompts_file, solver="wanda",
                                             solver_order="hessian"))
    assert "--solver-order" in caplog.text


def test_first_positions_enter_the_hessians_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch):
    """--first-positions 1: every layer's Hessians are those of the calibration set with each sequence's first
    position kept as well (dense propagation: one pass of the dense model over that set)."""
    captured = spy_calibration_and_hessians(monkeypatch)
    out = prune(config(tiny_folder, tmp_path / "first", prompts_file, first_positions=1), progress=False)
    dense_model, _, _ = load_model(tiny_folder)
    calib = captured["calib"]
    with_first = collect_hessians(dense_model, calib.with_first(1), batch_size=2, progress=False)
    without = collect_hessians(dense_model, calib, batch_size=2, progress=False)
    for index, layer_hessians in enumerate(captured["hessians"]):
        for name, hessian in layer_hessians.items():
            key = f"model.layers.{index}.{name}"
            assert torch.allclose(hessian, with_first[key], rtol=1e-4, atol=1e-5 * float(hessian.abs().max())), key
            assert not torch.allclose(hessian, without[key], rtol=1e-3), key
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["config"]["first_positions"] == 1


def test_prune_to_16_32g8_writes_masks_with_a_split_every_8_rows(tiny_folder, prompts_file, tmp_path):
    """`--pattern 16:32g8` through the pipeline (ADMM, the default solver): every prunable weight keeps 16 of each 32
    columns in a split shared by each 8 rows (`solvers.placement_breaks`), and the manifest records the pattern."""
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.solvers import placement_breaks

    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, pattern="16:32g8", solver="admm",
                       admm_iterations=10), progress=False)
    pattern = SparsityPattern.parse("16:32g8")
    for name, tensor in weights(out).items():
        if name.endswith(tuple(f"{leaf}.weight" for leaf in PRUNABLE)):
            assert bool(((tensor != 0).reshape(tensor.shape[0], -1, 32).sum(-1) == 16).all()), name
            assert placement_breaks(tensor != 0, pattern) == 0, name
    assert json.loads((out / "sparsedecoding.json").read_text())["pattern"] == "16:32g8"
