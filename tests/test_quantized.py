"""Quantized N:M packing and its kernels: the packed weight dequantizes exactly to the solver's weight; the Triton
kernel (under the Triton interpreter on CPU, TRITON_INTERPRET=1 set before the kernel module is imported) and the
dense int8 / int4 baseline agree with a float64 product of that weight."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding import solvers  # noqa: E402
from sparsedecoding.errors import KernelInputError, PackingError, QuantizationError  # noqa: E402
from sparsedecoding.kernels.format import PackedNM, pack_nm  # noqa: E402
from sparsedecoding.packed import PACKED_MANIFEST, load_packed_checkpoint, pack_checkpoint  # noqa: E402
from sparsedecoding.kernels.quantized import (DenseQuantized, PackedNMQ, nmq_spmv, nmq_spmv_reference,  # noqa: E402
                                              pack_int4, pack_nm_quantized, unpack_int4)

from helpers import random_nm_weight  # noqa: E402

PATTERNS = [(2, 4), (4, 8), (8, 16), (16, 32), (1, 4)]


def grid_weight(out, in_features, n, m, quantize, group_size=64, dtype=torch.bfloat16, seed=0):
    """An N:M weight on a `quantize` grid: random codes (some groups short, some kept codes 0) times random scales
    with the solver's few significant bits, so that code·scale is exact in bfloat16 and `dtype`."""
    g = torch.Generator().manual_seed(seed)
    low, high = solvers.CODE_RANGES[quantize]
    group = in_features if quantize == "int8" else group_size
    codes = torch.randint(low, high + 1, (out, in_features), generator=g).float()
    codes *= random_nm_weight(out, in_features, n, m, torch.float32, seed) != 0
    absmax = torch.rand(out, in_features // group, generator=g) * 4 + 1e-2
    scales = solvers.grid_scale(absmax, quantize)
    return (codes * scales.repeat_interleave(group, dim=1)).to(dtype)


def max_error(y, x, packed):
    """Largest |y − x·Wᵀ| over the autotuner's float64 bound (output rounding + worst-case fp32 sums); ≤ 1 passes."""
    from sparsedecoding.kernels.autotune import output_error

    return output_error(y.cpu(), x.cpu(), packed.kept_values().cpu(), packed.bitmask.cpu())


def test_int4_nibbles_round_trip():
    codes = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 16)
    assert int(packed[0, 0]) == (-8 & 0xF) | ((-7 & 0xF) << 4)  # earlier value in the low nibble
    assert torch.equal(unpack_int4(packed), codes)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("n,m", PATTERNS)
def test_packed_weight_dequantizes_exactly(n, m, quantize):
    weight = grid_weight(24, 128, n, m, quantize, seed=n + m)
    packed = pack_nm_quantized(weight, n, m, quantize, group_size=64)
    assert torch.equal(packed.to_dense(torch.bfloat16), weight)
    assert torch.equal(packed.bitmask, pack_nm(weight, n, m).bitmask)  # the same kept columns as bf16 packing
    assert torch.equal(packed.kept_values().bfloat16(), pack_nm(weight, n, m).values)  # in the same order
    expected_codes = (24, 128 * n // m) if quantize == "int8" else (24, 64 * n // m)
    assert tuple(packed.codes.shape) == expected_codes
    assert tuple(packed.scales.shape) == ((24, 1) if quantize == "int8" else (24, 2))
    restored = PackedNMQ.from_state_dict(packed.state_dict("w"), "w", n, m, packed.shape, quantize,
                                         packed.group_size)
    assert torch.equal(restored.to_dense(), packed.to_dense())


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_solver_output_packs_exactly(quantize):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(16, 128, generator=g)
    X = torch.randn(256, 128, generator=g)
    pruned = solvers.sparsegpt(W.bfloat16(), 2 * X.T @ X / 256, "2:4", quantize=quantize, group_size=64)
    packed = pack_nm_quantized(pruned, 2, 4, quantize, group_size=64)
    assert torch.equal(packed.to_dense(torch.bfloat16), pruned)


def test_packing_errors():
    weight = grid_weight(8, 128, 2, 4, "int4", group_size=64)
    with pytest.raises(PackingError, match="multiple of 32"):
        pack_nm_quantized(weight, 2, 4, "int4", group_size=16)
    with pytest.raises(PackingError, match="int8 or int4"):
        pack_nm_quantized(weight, 2, 4, "int2")
    off_grid = weight.clone()
    off_grid[0, off_grid[0].nonzero()[0]] *= 1.01
    with pytest.raises(QuantizationError, match="not on an int4 grid"):
        pack_nm_quantized(off_grid, 2, 4, "int4", group_size=64)
    with pytest.raises(PackingError, match="not 2:4 sparse"):
        pack_nm_quantized(grid_weight(8, 128, 3, 4, "int4", group_size=64), 2, 4, "int4", group_size=64)
    packed = pack_nm_quantized(weight, 2, 4, "int4", group_size=64)
    with pytest.raises(PackingError, match="scales"):
        PackedNMQ(packed.codes, packed.scales.float(), packed.bitmask, 2, 4, packed.shape, "int4", 64)


def write_quantized_model(folder, quantize, off_grid: str | None = None):
    """One decoder layer whose linears are 2:4 on a `quantize` grid (int4 groups of 32), except `off_grid`."""
    folder.mkdir()
    tensors = {"model.layers.0.input_layernorm.weight": torch.ones(64).bfloat16()}
    for i, linear in enumerate(["self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"]):
        weight = grid_weight(32, 64, 2, 4, quantize, group_size=32, seed=i)
        if linear == off_grid:
            weight = random_nm_weight(32, 64, 2, 4, seed=i)
        tensors[f"model.layers.0.{linear}.weight"] = weight
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return tensors


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_checkpoint_round_trips_and_old_manifests_load(tmp_path, quantize):
    tensors = write_quantized_model(tmp_path / "hf", quantize)
    manifest = pack_checkpoint(tmp_path / "hf", tmp_path / "packed", quantize=quantize, group_size=32)
    assert manifest["version"] == 2 and manifest["quantize"] == quantize
    state, _ = load_packed_checkpoint(tmp_path / "packed")
    for name, original in tensors.items():
        if name.endswith("_proj.weight"):
            assert isinstance(state[name], PackedNMQ) and state[name].quantize == quantize
            assert torch.equal(state[name].to_dense(torch.bfloat16), original)
        else:
            assert torch.equal(state[name], original)
    pack_checkpoint(tmp_path / "hf", tmp_path / "plain")  # bf16 values, then made to look like a version-1 folder
    manifest_path = tmp_path / "plain" / PACKED_MANIFEST
    old = json.loads(manifest_path.read_text())
    del old["version"], old["quantize"]
    manifest_path.write_text(json.dumps(old))
    up = "model.layers.0.mlp.up_proj.weight"
    state, _ = load_packed_checkpoint(tmp_path / "plain")
    assert isinstance(state[up], PackedNM) and torch.equal(state[up].to_dense(), tensors[up])
    manifest_path.write_text(json.dumps(old | {"version": 3}))
    with pytest.raises(PackingError, match="manifest version 3; this sparsedecoding reads versions 1 to 2"):
        load_packed_checkpoint(tmp_path / "plain")


def test_quantized_packing_names_an_off_grid_weight(tmp_path):
    write_quantized_model(tmp_path / "hf", "int4", off_grid="mlp.up_proj")
    with pytest.raises(QuantizationError, match="model.layers.0.mlp.up_proj.weight: row 0, .* not on an int4 grid"):
        pack_checkpoint(tmp_path / "hf", tmp_path / "packed", quantize="int4", group_size=32)
    assert not (tmp_path / "packed").exists()


# (out, in, batch, pattern, quantize, group, config): one row of x; ragged rows and a partial last step; batches
# 3, 5 and 16 (padded and not); split-K with an uneven last split; int4 groups of 32 (one word) and 128; every
# code load width (16, 8 and 4 bytes a word, and the 24-code words of 3:4).
KERNEL_CASES = [
    (16, 128, 1, (2, 4), "int8", 128, dict(block_rows=8, block_words=2)),
    (20, 160, 3, (4, 8), "int4", 32, dict(block_rows=8, block_words=2)),
    (24, 256, 16, (8, 16), "int8", 256, dict(block_rows=4, block_words=4, split_k=2)),
    (12, 384, 5, (16, 32), "int4", 128, dict(block_rows=4, block_words=4, split_k=3)),
    (8, 96, 2, (1, 4), "int4", 32, dict(block_rows=8, block_words=2)),
    (9, 64, 1, (2, 4), "int4", 64, dict(block_rows=4, block_words=1)),
    (16, 128, 2, (3, 4), "int8", 128, dict(block_rows=8, block_words=2)),  # 24 codes a word: 6 int32 loads
    (12, 128, 1, (3, 4), "int4", 32, dict(block_rows=4, block_words=4, split_k=2)),  # 3 int32 loads
    (8, 64, 4, (1, 4), "int8", 64, dict(block_rows=8, block_words=1)),  # 8 codes: one 8-byte load
    # rows not a multiple of the tile, several full steps and a partial one, 16:32, int4 groups of 64
    (13, 320, 1, (2, 4), "int4", 64, dict(block_rows=4, block_words=4)),
    (10, 256, 1, (16, 32), "int4", 128, dict(block_rows=8, block_words=2, split_k=2)),
    (7, 192, 2, (4, 8), "int8", 192, dict(block_rows=4, block_words=4)),
]


@pytest.mark.parametrize("design", ["scan", "tile"])
@pytest.mark.parametrize("out,in_features,batch,pattern,quantize,group,config", KERNEL_CASES)
def test_triton_kernel_matches_float64(out, in_features, batch, pattern, quantize, group, config, design):
    from sparsedecoding.kernels.triton_nmq import NmqConfig, nmq_spmv_triton

    n, m = pattern
    weight = grid_weight(out, in_features, n, m, quantize, group_size=group, seed=out)
    packed = pack_nm_quantized(weight, n, m, quantize, group_size=group).to(DEVICE)
    x = torch.randn(batch, in_features, generator=torch.Generator().manual_seed(batch)).bfloat16().to(DEVICE)
    y = nmq_spmv_triton(x, packed, NmqConfig(**config, design=design))
    assert y.shape == (batch, out) and y.dtype == torch.bfloat16
    assert max_error(y, x, packed) <= 1
    assert max_error(nmq_spmv_reference(x, packed), x, packed) <= 1


@pytest.mark.parametrize("design", ["scan", "tile"])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_every_code_comes_out_exact(quantize, design):
    """One-hot rows of x read single weights back through the kernel's code-to-float path: every code of the format
    (the extremes included) comes out exactly. 16:32, the first 16 columns of each word kept, unit scales; kept
    column k of row r holds code (16k + r) mod 2^BITS, so the 16 columns read cover every code."""
    from sparsedecoding.kernels.quantized import SCALE_DTYPE
    from sparsedecoding.kernels.triton_nmq import NmqConfig, nmq_spmv_triton
    from sparsedecoding.kernels.triton_spmv import split_counters

    low, high = solvers.CODE_RANGES[quantize]
    out, in_features, group = 16, 256, 256 if quantize == "int8" else 128
    kept = torch.arange(in_features // 2)
    codes = ((16 * kept[None, :] + torch.arange(out)[:, None]) % (high - low + 1) + low).to(torch.int8)
    packed = PackedNMQ(codes if quantize == "int8" else pack_int4(codes), torch.ones(out, in_features // group,
                       dtype=SCALE_DTYPE), torch.full((out, in_features // 32), 0xFFFF, dtype=torch.int32), 16, 32,
                       (out, in_features), quantize, group).to(DEVICE)
    x = torch.eye(16, in_features).bfloat16().to(DEVICE)  # row b: kept column b (k = b)
    y = nmq_spmv_triton(x, packed, NmqConfig(4, 4, split_k=2, design=design))
    assert torch.equal(y.cpu(), codes[:, :16].T.bfloat16())
    assert set(codes[:, :16].flatten().tolist()) == set(range(low, high + 1))
    assert not split_counters(x.device, 4).any()  # the last split of each row block reset its counter


@pytest.mark.parametrize("batch", [2, 16])
def test_tuner_times_both_designs_from_batch_2(batch):
    from sparsedecoding.kernels.triton_nmq import NmqConfig, candidate_configs

    assert {config.design for config in candidate_configs(4096, 128, 1)} == {"scan"}
    candidates = candidate_configs(4096, 128, batch)
    assert {config.design for config in candidates} == {"scan", "tile"}
    assert candidates[0].design == "scan"  # the interpreter's pick
    assert str(NmqConfig(16, 8, design="tile")) == "tile R16xW8 split1 w4"
    with pytest.raises(KernelInputError, match="design"):
        NmqConfig(design="gather")


def test_tuner_rejects_a_wrong_candidate_and_picks_the_fastest_correct(monkeypatch):
    """The tuner's choice with its graph timing stubbed: a candidate whose output is wrong is never chosen, even
    when it would be the fastest, and is listed with the reason; each correct one is timed on weight copies that
    hold the packed weight's own tensors first; the choice is kept."""
    from sparsedecoding.kernels import autotune, triton_nmq
    from sparsedecoding.kernels.triton_nmq import NmqConfig

    packed = pack_nm_quantized(grid_weight(8, 128, 2, 4, "int4", group_size=32), 2, 4, "int4", 32).to(DEVICE)
    x = torch.randn(1, 128).bfloat16().to(DEVICE)  # the real kernel on a GPU (without one, the interpreter)
    wrong, slow, fast = NmqConfig(4, 2), NmqConfig(8, 2), NmqConfig(8, 2, design="tile")
    times, launched = {wrong: 1.0, slow: 3.0, fast: 2.0}, []
    launch = triton_nmq.launch_nmq

    def stub_launch(x, packed, config):
        launched.append(config)
        return launch(x, packed, config) * (2 if config == wrong else 1)

    monkeypatch.setattr(triton_nmq, "launch_nmq", stub_launch)
    rounds = []

    def stub_replay(call, weights):  # one launch on the last copy stands for the graph's replays
        rounds.append(weights)
        call(weights[-1])
        return times[launched[-1]]

    monkeypatch.setattr(autotune, "weight_copies", lambda tensors, most: [tensors, tuple(t.clone() for t in tensors)])
    monkeypatch.setattr(autotune, "replay_ms", stub_replay)
    monkeypatch.setattr(autotune, "interpreted", lambda: False)  # the choice itself, as on a GPU
    monkeypatch.setattr(triton_nmq, "_tuner", autotune.Tuner("nmq_spmv"))
    monkeypatch.setattr(triton_nmq, "candidate_configs", lambda *shape: [wrong, slow, fast])
    assert triton_nmq.tuned_config(x, packed) == fast
    assert len(launched) == 5  # three checked against float64, the two correct ones timed
    assert len(rounds) == 2 and rounds[0] is rounds[1]  # one set of copies for the problem
    assert all(a is b for a, b in zip(rounds[0][0], (packed.codes, packed.scales, packed.bitmask)))
    key = triton_nmq.tuner_key(x, packed)
    assert list(triton_nmq.rejected_candidates()[key]) == [wrong]
    assert "float64 bound" in triton_nmq.rejected_candidates()[key][wrong]
    assert triton_nmq.tuned_config(x, packed) == fast and len(launched) == 5  # kept: no second tuning


def test_vector_input_and_entry_checks():
    packed = pack_nm_quantized(grid_weight(8, 64, 2, 4, "int8"), 2, 4, "int8").to(DEVICE)
    x = torch.randn(64).bfloat16().to(DEVICE)
    assert nmq_spmv(x, packed).shape == (8,)
    for bad, message in ((x.float(), "bfloat16 or float16"), (x[:32], "expected"),
                         (torch.zeros(17, 64, dtype=torch.bfloat16, device=DEVICE), "batch 1..16")):
        with pytest.raises(KernelInputError, match=message):
            nmq_spmv(bad, packed)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_dense_quantized_baseline_matches_float64(quantize):
    if DEVICE == "cpu" and quantize == "int4" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("this torch has no CPU int4 matmul")
    weight = grid_weight(64, 256, 2, 4, quantize, group_size=64).to(DEVICE)
    grid = solvers.quantization_codes(weight, quantize, 64)
    dense = DenseQuantized.from_codes(grid, inner_k_tiles=2)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1)).bfloat16().to(DEVICE)
    assert max_error(dense(x), x, pack_nm_quantized(weight.cpu(), 2, 4, quantize, group_size=64)) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("batch", [1, 2, 8, 16])
def test_tuned_kernel_on_gpu_matches_float64(quantize, batch):
    weight = grid_weight(1024, 4096, 2, 4, quantize, group_size=128, seed=batch)
    packed = pack_nm_quantized(weight, 2, 4, quantize, group_size=128).to("cuda")
    x = torch.randn(batch, 4096, device="cuda").bfloat16()
    assert max_error(nmq_spmv(x, packed), x, packed) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("quantize,kernel", [("int8", "triton"), ("int8", "sp24"), ("int4", "triton"),
                                             ("int4", "tinygemm"), ("int4", "sp24")])
def test_dense_quantized_baseline_on_gpu_matches_float64(quantize, kernel, monkeypatch):
    """int8 through our triton_w8 kernel or the sparse tensor-core kernel's dense mode; int4 through our triton_w4
    kernel, PyTorch's tinygemm with our layout for it (tinygemm's nibble order and scale-and-zero tensor) or that
    dense mode; above 16 rows the dequantized weight."""
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8" if quantize == "int8" else "SPARSEDECODING_DENSE_INT4", kernel)
    weight = grid_weight(512, 4096, 1, 2, quantize, group_size=128).cuda()
    dense = DenseQuantized.from_codes(solvers.quantization_codes(weight, quantize, 128))
    layout = {"w4": "w4", "sp24": "sp24"}.get("w4" if quantize == "int4" and kernel == "triton" else kernel, "torch")
    assert dense.layout == layout
    for batch in (1, 8, 16, 20):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        assert max_error(dense(x), x, pack_nm_quantized(weight.cpu(), 1, 2, quantize, group_size=128)) <= 1


def test_dense_int4_in_the_w4_layout_runs_on_cpu_through_the_dequantized_weight():
    """A DenseQuantized in triton_w4's layout (built on the GPU by default) multiplies anywhere: on CPU through the
    dequantized weight."""
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear
    from sparsedecoding.kernels.triton_w4 import pack_w4

    weight = grid_weight(32, 256, 1, 2, "int4", group_size=64)
    grid = solvers.quantization_codes(weight, "int4", 64)
    codes, scales = pack_w4(grid.codes, grid.scales, torch.bfloat16)
    dense = DenseQuantized(codes, scales, "int4", 64, (32, 256))
    assert dense.layout == "w4"
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).bfloat16()
    expected = pack_nm_quantized(weight, 1, 2, "int4", group_size=64)
    assert max_error(dense(x), x, expected) <= 1
    assert max_error(DenseQuantizedLinear(dense)(x[None])[0], x, expected) <= 1


@pytest.mark.parametrize("value", ["cublas", "1"])
def test_a_bad_dense_int4_setting_is_one_error(value, monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, settings

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", value)
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_DENSE_INT4"):
        settings()


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_prune_quantize_writes_a_checkpoint_that_packs_exactly(tmp_path, quantize):
    from transformers import AutoModelForCausalLM

    from sparsedecoding.pipeline import PruneConfig, prune

    from helpers import make_tiny_model

    source = make_tiny_model(tmp_path / "bf16")
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(torch.bfloat16).save_pretrained(source)
    out = prune(PruneConfig(model=str(source), out=str(tmp_path / "out"), pattern="2:4", calibration="text", tokens=32,
                            text_seq_len=16, batch_size=2, device="cpu", quantize=quantize, group_size=32),
                progress=False)
    manifest = pack_checkpoint(out, tmp_path / "packed", pattern="2:4", quantize=quantize, group_size=32)
    state, _ = load_packed_checkpoint(tmp_path / "packed")
    pruned = load_file_tensors(out)
    for name, info in manifest["tensors"].items():
        if "pattern" in info:
            assert info["quantize"] == quantize
            assert torch.equal(state[name].to_dense(torch.bfloat16), pruned[name])
    assert sum("quantize" in info for info in manifest["tensors"].values()) == 2 * 7


def load_file_tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("settings, message", [
    (dict(quantize="int4", solver="wanda"), "--quantize int4 runs inside SparseGPT"),
    (dict(quantize="int8", repair_steps=10), "--repair-steps 0"),
    (dict(quantize="int3"), "int3"),
    (dict(quantize="int4", group_size=0), "group"),
])
def test_prune_quantize_settings_fail_in_one_line(tmp_path, settings, message):
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.pipeline import PruneConfig

    with pytest.raises(SparseDecodingError, match=message) as caught:
        PruneConfig(model="x", out=str(tmp_path / "out"), **settings).check_values()
    assert "\n" not in str(caught.value)


def test_prune_refuses_a_group_size_that_does_not_divide_the_rows_before_model_work(tmp_path):
    from sparsedecoding.pipeline import PruneConfig, prune

    from helpers import make_tiny_model

    source = make_tiny_model(tmp_path / "model")
    with pytest.raises(QuantizationError, match="group_size 48 does not divide the row length 64"):
        prune(PruneConfig(model=str(source), out=str(tmp_path / "out"), pattern="2:4", calibration="text", tokens=32,
                          device="cpu", quantize="int4", group_size=48), progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
