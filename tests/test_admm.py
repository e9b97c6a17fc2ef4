"""ADMM pruning (`--solver admm`, `solvers.admm`): the mask and its weights from ADMM on the whole damped layer
loss, every group's mask revisited, instead of SparseGPT's single pass over the columns."""

import json

import pytest
import torch

from sparsedecoding import pipeline, solvers
from sparsedecoding.errors import SolverSettingsError, SparseDecodingError
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import prune
from sparsedecoding.settings import PruneConfig, check
import test_pipeline
from test_pipeline import config, weights
from test_refit import exact_refit, layer_loss
from test_solvers import random_problem


# the pipeline tests' tiny model and prompts
tiny_folder, prompts_file = test_pipeline.tiny_folder, test_pipeline.prompts_file


def reference_admm(W, H, pattern, iterations, percdamp=0.01):
    """ADMM written out in float64 with a direct solve at every step (no eigendecomposition): the free copy
    X = (w·A + ρ(D − V))·(A + ρI)⁻¹, D the pattern's largest magnitudes of X + V, V += X − D, A = H + λI on the
    normalized H, ρ from 0.1 to 1000 times mean(eig A) = mean(diag A) geometrically."""
    pattern = SparsityPattern.parse(pattern)
    Hn = solvers.normalized_hessian(H, torch.float64)
    A = Hn + percdamp * Hn.diagonal().mean() * torch.eye(Hn.shape[0], dtype=torch.float64)
    W = W.double()
    D = W * solvers.keep_mask(W.abs(), pattern)
    V = torch.zeros_like(W)
    rho = 0.1 * float(A.diagonal().mean())
    for _ in range(iterations):
        right = W @ A + rho * (D - V)
        X = torch.linalg.solve(A + rho * torch.eye(A.shape[0], dtype=torch.float64), right.T).T
        Z = X + V
        D = Z * solvers.keep_mask(Z.abs(), pattern)
        V = Z - D
        rho *= 10_000 ** (1 / (iterations - 1))
    return D


@pytest.mark.parametrize("pattern", ["2:4", "16:32", "50%"])
def test_admm_equals_the_written_out_algorithm(pattern):
    W, H = random_problem(rows=8, cols=64, seed=3)
    ours = solvers.admm(W, H, pattern, iterations=30)
    expected = reference_admm(W, H, pattern, 30)
    assert torch.equal(ours != 0, expected != 0)
    assert float((ours - expected).abs().max()) < 1e-9 * float(expected.abs().max())


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "16:32", "50%", "16:32+2", "16:32+4q", "16:32+2l"])
def test_the_mask_is_the_patterns(pattern):
    """Every pattern the solvers take, the capped and placed ones included (their projection is `keep_mask`'s)."""
    W, H = random_problem(rows=32, cols=128, seed=1)
    ours = solvers.admm(W, H, pattern, iterations=40)
    parsed = SparsityPattern.parse(pattern)
    if parsed.is_nm:
        solvers.check_kept_zeros(ours, parsed)  # raises where a group keeps too much or breaks the placement
        assert int((ours != 0).sum()) == 32 * 128 * parsed.n // parsed.m
    else:
        assert torch.equal((ours == 0).sum(1), torch.full((32,), 64))
    assert ours.dtype == W.dtype and bool(torch.isfinite(ours).all())


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "16:32", "50%", "16:32+2"])
def test_admm_lowers_the_loss_well_below_sparsegpts(pattern):
    """On these problems ADMM ends at 0.40-0.60x SparseGPT's layer loss (SparseGPT's mask refit exactly: 0.50-0.64x);
    over four problems together below 0.6x."""
    totals = [0.0, 0.0]
    for seed in range(4):
        W, H = random_problem(rows=32, cols=128, seed=seed)
        totals[0] += layer_loss(W, solvers.admm(W, H, pattern), H)
        totals[1] += layer_loss(W, solvers.sparsegpt(W, H, pattern), H)
    assert totals[0] < 0.6 * totals[1], totals


def test_admm_weights_are_close_to_the_best_for_their_mask():
    """ADMM's D is feasible at every step and the penalty ends large, so its kept weights end near the exact refit of
    its own mask (within 5% of the loss here); `refit_steps` closes most of the rest and keeps the mask."""
    W, H = random_problem(rows=32, cols=128, seed=2)
    ours = solvers.admm(W, H, "2:4")
    best = layer_loss(W, exact_refit(W, ours != 0, H), H)
    assert best <= layer_loss(W, ours, H) < 1.05 * best
    refit = solvers.admm(W, H, "2:4", refit_steps=200)
    assert torch.equal(refit != 0, ours != 0)
    assert layer_loss(W, refit, H) < 1.001 * best


def test_more_iterations_search_further():
    W, H = random_problem(rows=32, cols=128, seed=0)
    losses = [layer_loss(W, solvers.admm(W, H, "2:4", iterations=n), H) for n in (1, 10, 100)]
    assert losses[2] < losses[1] < losses[0], losses


def test_stacked_weights_get_what_they_get_alone():
    W, H = random_problem(rows=40, cols=64, seed=7)
    together = torch.cat(solvers.admm_shared([W[:16], W[16:]], H, "2:4", iterations=50))
    alone = torch.cat([solvers.admm(W[:16], H, "2:4", iterations=50), solvers.admm(W[16:], H, "2:4", iterations=50)])
    assert torch.equal(together != 0, alone != 0)
    assert torch.allclose(together, alone, rtol=0, atol=1e-12)


def test_float32_and_bfloat16_weights():
    """Computed in float32 for anything but float64 weights; the result has the weight's dtype and mask."""
    W, H = random_problem(rows=16, cols=64, seed=5)
    wide = solvers.admm(W, H, "2:4", iterations=50)
    single = solvers.admm(W.float(), H.float(), "2:4", iterations=50)
    assert single.dtype == torch.float32
    assert float((single.double() != 0).ne(wide != 0).float().mean()) < 0.02  # float32 may flip a near tie
    half = solvers.admm(W.to(torch.bfloat16), H, "2:4", iterations=50)
    assert half.dtype == torch.bfloat16
    assert int((half != 0).view(16, -1, 4).sum(-1).max()) <= 2


def test_dead_inputs_are_pruned_and_nothing_is_nan():
    W, H = random_problem(rows=8, cols=64, seed=4)
    H[:, 5] = H[5, :] = 0
    ours = solvers.admm(W, H, "2:4")
    assert bool(torch.isfinite(ours).all()) and float(ours[:, 5].abs().max()) == 0


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("order", ["columns", "hessian"])
def test_quantized_admm_rounds_with_the_admm_mask_fixed(quantize, order):
    """With quantize the loop rounds ADMM's weights with its mask fixed: every value on the grid, nothing kept outside
    the unquantized mask, the N:M pattern kept in W's own columns, the loss lower than the joint SparseGPT's."""
    totals = [0.0, 0.0]
    for seed in range(3):
        W, H = random_problem(rows=32, cols=128, seed=seed)
        ours = solvers.admm(W, H, "2:4", quantize=quantize, group_size=32, order=order)
        unquantized = solvers.admm(W, H, "2:4")
        assert not bool((ours != 0)[unquantized == 0].any())
        assert torch.equal(solvers.quantization_codes(ours, quantize, 32).dequantize(torch.float64), ours)
        assert int((ours != 0).view(32, -1, 4).sum(-1).max()) <= 2
        totals[0] += layer_loss(W, ours, H)
        totals[1] += layer_loss(W, solvers.sparsegpt(W, H, "2:4", quantize=quantize, group_size=32, order=order), H)
    assert totals[0] < 0.8 * totals[1], totals


@pytest.mark.parametrize("iterations", [0, -1, 1.5, True, "100", 10_001])
def test_bad_iteration_counts_are_refused(iterations):
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SolverSettingsError, match="admm_iterations"):
        solvers.admm(W, H, "2:4", iterations=iterations)


def test_admm_needs_a_pattern_and_a_mask_to_choose():
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SolverSettingsError, match="needs a sparsity pattern and a mask not kept"):
        solvers._solve([W], H, None, "int8", 128, 128, 0.01, False, admm_iterations=10)
    pruned = solvers.sparsegpt(W, H, "2:4")
    with pytest.raises(SolverSettingsError, match="needs a sparsity pattern and a mask not kept"):
        solvers._solve([pruned], H, SparsityPattern.parse("2:4"), None, 128, 128, 0.01, False, keep_zeros=True,
                       admm_iterations=10)


def test_the_settings():
    assert PruneConfig(model="m", out="o").admm_iterations == 100
    assert PruneConfig(model="m", out="o").solver == "admm"  # the default since plan-admm.json's rule passed
    assert PruneConfig(model="m", out="o", solver="admm").solver == "admm"
    with pytest.raises(SparseDecodingError, match="--admm-iterations"):
        check(PruneConfig(model="m", out="o", admm_iterations=0))
    PruneConfig(model="m", out="o", solver="admm", quantize="int4").check_values()  # ADMM's mask, then the rounding
    with pytest.raises(SparseDecodingError, match="--solver sparsegpt or admm"):
        PruneConfig(model="m", out="o", solver="wanda", quantize="int4").check_values()


def test_prune_with_admm_reaches_every_solve_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch,
                                                             caplog):
    """--solver admm: every input group goes through solvers.admm_shared with the iterations, the manifest records
    them, every layer's loss is below SparseGPT's on the same calibration, and the weights keep the pattern.
    SparseGPT runs are warned that they do not read --admm-iterations."""
    calls = []
    admm_shared = pipeline.solvers.admm_shared
    monkeypatch.setattr(pipeline.solvers, "admm_shared",
                        lambda *a, **k: calls.append((len(a[0]), k["iterations"])) or admm_shared(*a, **k))
    with caplog.at_level("INFO", logger="sparsedecoding.pipeline"):
        out = prune(config(tiny_folder, tmp_path / "admm", prompts_file, solver="admm", admm_iterations=60),
                    progress=False)
    assert "--solver admm (the default) on a CPU: 60 iterations a layer" in caplog.text  # the hint to CPU users
    caplog.clear()
    assert calls == [(3, 60), (1, 60), (2, 60), (1, 60)] * 3  # qkv, o, gate_up, down of three layers
    record = json.loads((out / "sparsedecoding.json").read_text())
    assert record["solver"] == "admm" and record["solver_options"]["admm_iterations"] == 60
    plain = json.loads((prune(config(tiny_folder, tmp_path / "sg", prompts_file, solver="sparsegpt"), progress=False)
                        / "sparsedecoding.json").read_text())
    assert plain["solver_options"]["admm_iterations"] is None
    for name, item in record["layers"].items():
        assert item["relative_error"] < plain["layers"][name]["relative_error"], name
    pattern = SparsityPattern.parse(record["pattern"])
    for key, tensor in weights(out).items():
        if key.endswith("proj.weight"):
            solvers.check_kept_zeros(tensor.float(), pattern)
    with caplog.at_level("WARNING"):
        pipeline.warn_ignored_options(config(tiny_folder, tmp_path / "x", prompts_file, solver="sparsegpt",
                                             admm_iterations=50))
    assert "--admm-iterations" in caplog.text


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_device_and_a_layer_sized_problem(device):
    """On the device of the weight (the GPU's eigendecomposition and products), a bfloat16 weight of a real layer's
    width: the pattern kept, the dtype and device kept, the loss below SparseGPT's on the same device."""
    rows, cols = (256, 1024) if device == "cuda" else (64, 256)  # the CPU's: fast enough for CI
    W, H = random_problem(rows=rows, cols=cols, samples=2 * cols, dtype=torch.float32, seed=6)
    W, H = W.bfloat16().to(device), H.to(device)
    ours = solvers.admm(W, H, "2:4")
    assert ours.dtype == torch.bfloat16 and ours.device == W.device
    assert int((ours != 0).view(rows, -1, 4).sum(-1).max()) <= 2
    assert layer_loss(W.cpu(), ours.cpu(), H.cpu()) < 0.8 * layer_loss(W.cpu(), solvers.sparsegpt(W, H, "2:4").cpu(),
                                                                       H.cpu())


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest():
    one_ulp = 2.0 ** -10  # TF32's spacing at 1
    x = torch.tensor([1.0, 1 + one_ulp, 1 + 0.49 * one_ulp, 1 + 0.5 * one_ulp, 1 + 0.51 * one_ulp, -(1 + 0.6 * one_ulp),
                      3.0e-5 * (1 + 0.3 * one_ulp), 0.0], dtype=torch.float32)
    expected = [1.0, 1 + one_ulp, 1.0, 1 + one_ulp, 1 + one_ulp, -(1 + one_ulp), None, 0.0]
    rounded = solvers.tf32_round(x)
    for value, want in zip(rounded.tolist(), expected):
        if want is not None:
            assert value == want
    bits = rounded.view(torch.int32)
    assert torch.equal(bits & 0x1FFF, torch.zeros_like(bits))  # the 13 low mantissa bits are gone
    assert float(((rounded - x).abs() / x.abs().clamp_min(1e-30)).max()) <= 2.0 ** -11


@pytest.mark.parametrize("pattern", ["2:4", "16:32"])
def test_tf32_products_cost_almost_nothing_in_layer_loss(pattern):
    """TF32 operands (emulated on the CPU) perturb each iteration's solve by about 2^-11 relative. Float32 keeps
    float64's mask exactly on this problem; TF32 flips about 2.5% of the decisions (near-ties) and lands within 1%
    of the loss (on real layers 0.2-1.4% above it: benchmarks/results/admm_tf32_smollm2_cpu.md)."""
    W, H = random_problem(rows=64, cols=256, samples=512, dtype=torch.float32, seed=8)
    exact = solvers.admm(W, H, pattern, iterations=60)
    fast = solvers.admm(W, H, pattern, iterations=60, products="tf32")
    assert not torch.equal(exact, fast)
    assert abs(layer_loss(W, fast, H) / layer_loss(W, exact, H) - 1) < 0.02
    assert float(((exact != 0) == (fast != 0)).float().mean()) > 0.95
    solvers.check_kept_zeros(fast, SparsityPattern.parse(pattern))


def test_tf32_leaves_float64_problems_and_the_global_setting_alone():
    W, H = random_problem(rows=8, cols=64, seed=3)
    W = W.double()
    assert torch.equal(solvers.admm(W, H, "2:4", iterations=20, products="tf32"), solvers.admm(W, H, "2:4", iterations=20))
    with pytest.raises(SolverSettingsError, match="admm products = 'bf16'"):
        solvers.admm(W, H, "2:4", iterations=20, products="bf16")


def test_tf32_products_reach_the_solver_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch):
    seen = []
    admm_shared = pipeline.solvers.admm_shared
    monkeypatch.setattr(pipeline.solvers, "admm_shared",
                        lambda *a, **k: seen.append(k["products"]) or admm_shared(*a, **k))
    out = prune(config(tiny_folder, tmp_path / "tf32", prompts_file, admm_iterations=20, admm_products="tf32"),
                progress=False)
    assert seen == ["tf32"] * 12
    assert json.loads((out / "sparsedecoding.json").read_text())["solver_options"]["admm_products"] == "tf32"
    assert "admm_products" in pipeline.unread_options(config(tiny_folder, tmp_path / "x", prompts_file,
                                                             solver="sparsegpt", admm_products="tf32"))
    with pytest.raises(SparseDecodingError, match="--admm-products"):
        check(PruneConfig(model="m", out="o", admm_products="fp8"))


@pytest.mark.gpu
def test_tf32_on_the_gpu_matches_the_emulation_closely_and_restores_the_setting():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    W, H = random_problem(rows=256, cols=1024, samples=2048, dtype=torch.float32, seed=9)
    before = torch.backends.cuda.matmul.allow_tf32
    gpu = solvers.admm(W.cuda(), H.cuda(), "2:4", products="tf32").cpu()
    assert torch.backends.cuda.matmul.allow_tf32 == before
    exact = solvers.admm(W.cuda(), H.cuda(), "2:4").cpu()
    assert abs(layer_loss(W, gpu, H) / layer_loss(W, exact, H) - 1) < 0.02
    # 93.8% on an H100 (benchmarks/results/solver_admm_tf32_gpu_h100_llama-3.1-8b.md's note); 92-99% on SmolLM2's
    # layers under the CPU emulation (admm_tf32_smollm2_cpu.md)
    assert float(((gpu != 0) == (exact != 0)).float().mean()) > 0.90


def test_a_failed_eigendecomposition_is_retried_once_in_float64(monkeypatch, caplog):
    W, H = random_problem(rows=16, cols=64, samples=256, dtype=torch.float32, seed=2)
    expected = solvers.admm(W, H, "2:4", iterations=30)
    eigh, calls = torch.linalg.eigh, []

    def flaky(A):
        calls.append(A.dtype)
        if A.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigh(A)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    with caplog.at_level("WARNING", logger="sparsedecoding.solvers"):
        retried = solvers.admm(W, H, "2:4", iterations=30)
    assert calls == [torch.float32, torch.float64] and "retrying in float64" in caplog.text
    assert retried.dtype == torch.float32 and torch.equal(retried != 0, expected != 0)
    assert float((retried - expected).abs().max()) < 1e-4 * float(expected.abs().max())
    monkeypatch.setattr(torch.linalg, "eigh", lambda A: (_ for _ in ()).throw(torch.linalg.LinAlgError("no")))
    with pytest.raises(torch.linalg.LinAlgError):
        solvers.admm(W.double(), H, "2:4", iterations=30)  # float64 has nothing to fall back to


@pytest.mark.parametrize("overrides", [
    dict(propagation="sequential", target="dense"),  # ADMM on W·C·H⁻¹, the dense model's output as the target
    dict(quantize="int4", group_size=32),  # ADMM's mask, then SparseGPT's loop rounding with it fixed
    dict(pattern="16:32+2"),  # the capped projection
])
def test_the_default_solver_runs_with_the_other_prune_options(tiny_folder, prompts_file, tmp_path, overrides):
    """admm is the default: the options that used to meet only SparseGPT run with it, the pattern kept."""
    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, admm_iterations=20, **overrides), progress=False)
    record = json.loads((out / "sparsedecoding.json").read_text())
    assert record["solver"] == "admm"
    pattern = SparsityPattern.parse(record["pattern"])
    for key, tensor in weights(out).items():
        if key.endswith("proj.weight"):
            solvers.check_kept_zeros(tensor.float(), pattern)  # 16:32+2: the cap on weights beyond two too


def test_zero_iterations_is_refused_not_run_as_sparsegpt():
    W, H = random_problem(rows=8, cols=64, seed=3)
    for iterations in (0, True, 10_001):
        with pytest.raises(SolverSettingsError, match="admm_iterations"):
            solvers.admm(W, H, "2:4", iterations=iterations)


def test_settle_stops_once_the_mask_holds_and_refits_its_weights():
    """`settle=K` runs until the projection has returned one mask K times in a row, then moves the kept weights by
    `ADMM_SETTLED_REFIT` conjugate-gradient steps: the mask is the one the loop reached at that iteration, the
    weights never worse on the loss than the loop's own, and near the full run's loss."""
    W, H = random_problem(rows=32, cols=128, seed=5)
    pattern = SparsityPattern.parse("2:4")
    Hn = solvers.normalized_hessian(H, torch.float64)
    _, damping = solvers.damped_factor(Hn, 0.01, inverse=False)
    full, full_kept, ran = solvers.admm_prune(W.double(), Hn, damping, pattern, 100)
    assert ran == 100
    settled, kept, stopped = solvers.admm_prune(W.double(), Hn, damping, pattern, 100, settle=5)
    assert 5 < stopped < 100
    loop = reference_stop(W, Hn, damping, pattern, 100, stopped)  # the same iterations, no refit after them
    assert torch.equal(kept, loop != 0) and torch.equal(settled != 0, kept)
    assert layer_loss(W, settled, H) < layer_loss(W, loop, H)  # the refit ran, and lowered the loss
    assert layer_loss(W, settled, H) < 1.02 * layer_loss(W, full, H)


def reference_stop(W, Hn, damping, pattern, iterations, stop):
    """`admm_prune`'s iterations written out in float64 with a direct solve, the schedule of `iterations`, stopped
    after `stop` of them; returns D."""
    A = Hn + damping * torch.eye(Hn.shape[0], dtype=torch.float64)
    W = W.double()
    D = W * solvers.keep_mask(W.abs(), pattern)
    V = torch.zeros_like(W)
    rho = 0.1 * float(torch.linalg.eigvalsh(A).clamp_min(damping).mean())
    for _ in range(stop):
        X = torch.linalg.solve(A + rho * torch.eye(A.shape[0], dtype=torch.float64), (W @ A + rho * (D - V)).T).T
        Z = X + V
        D = Z * solvers.keep_mask(Z.abs(), pattern)
        V = Z - D
        rho *= 10_000 ** (1 / (iterations - 1))
    return D


def test_settle_zero_or_never_reached_is_the_full_run_and_bad_values_are_refused():
    W, H = random_problem(rows=16, cols=64, seed=4)
    full = solvers.admm(W, H, "16:32", iterations=40)
    assert torch.equal(solvers.admm(W, H, "16:32", iterations=40, settle=0), full)
    assert torch.equal(solvers.admm(W, H, "16:32", iterations=40, settle=40), full)  # a stop at the end: no refit
    for settle in (-1, True, 2.5, 10_001):
        with pytest.raises(SolverSettingsError, match="settle"):
            solvers.admm(W, H, "2:4", iterations=30, settle=settle)
    with pytest.raises(SparseDecodingError, match="--admm-settle"):
        check(PruneConfig(model="m", out="o", admm_settle=-1))


def test_settle_reaches_the_solver_and_the_record(tiny_folder, prompts_file, tmp_path, monkeypatch):
    seen = []
    admm_shared = pipeline.solvers.admm_shared
    monkeypatch.setattr(pipeline.solvers, "admm_shared",
                        lambda *a, **k: seen.append(k["settle"]) or admm_shared(*a, **k))
    out = prune(config(tiny_folder, tmp_path / "settle", prompts_file, admm_iterations=30, admm_settle=3),
                progress=False)
    assert seen == [3] * 12
    assert json.loads((out / "sparsedecoding.json").read_text())["solver_options"]["admm_settle"] == 3
    assert "admm_settle" in pipeline.unread_options(config(tiny_folder, tmp_path / "x", prompts_file,
                                                           solver="sparsegpt", admm_settle=3))


def test_split_reaches_the_solver_and_the_record_and_is_read_only_for_grouped_patterns(tiny_folder, prompts_file,
                                                                                        tmp_path, monkeypatch):
    seen = []
    admm_shared = pipeline.solvers.admm_shared
    monkeypatch.setattr(pipeline.solvers, "admm_shared",
                        lambda *a, **k: seen.append(k["split"]) or admm_shared(*a, **k))
    out = prune(config(tiny_folder, tmp_path / "split", prompts_file, pattern="16:32g", admm_iterations=5,
                       admm_split="magnitude"), progress=False)
    assert seen == ["magnitude"] * 12
    assert json.loads((out / "sparsedecoding.json").read_text())["solver_options"]["admm_split"] == "magnitude"
    for pattern, read in (("16:32g", True), ("16:32g8", True), ("2:4", False), ("16:32", False)):
        unread = pipeline.unread_options(config(tiny_folder, tmp_path / "x", prompts_file, pattern=pattern,
                                                admm_split="magnitude"))
        assert ("admm_split" not in unread) == read
    with pytest.raises(SparseDecodingError, match="--admm-split"):
        check(PruneConfig(model="m", out="o", admm_split="cubed"))


def test_a_grid_from_the_last_iteration_rounds_admms_result_in_place():
    """`admm_prune(grid=...)` (benchmarks/admm_grid_layer_cpu.py): from iteration K on the projection also rounds
    each group of columns to its int4 grid; the result keeps the pattern and at most 16 levels a group, and with
    K = the last iteration it is exactly the unrounded result put on its grid."""
    W, H = random_problem(rows=8, cols=256, seed=4)
    pattern = SparsityPattern.parse("2:4")
    Hn = solvers.normalized_hessian(H, W.dtype)
    _, damping = solvers.damped_factor(Hn, 0.01, inverse=False)
    grid = solvers.group_grid("int4", 128)
    plain, kept, _ = solvers.admm_prune(W, Hn, damping, pattern, 20)
    last, last_kept, _ = solvers.admm_prune(W, Hn, damping, pattern, 20, grid=grid, grid_from=20)
    assert torch.equal(last_kept, kept) and torch.equal(last, grid(plain, kept))
    early, early_kept, _ = solvers.admm_prune(W, Hn, damping, pattern, 20, grid=grid, grid_from=10)
    solvers.check_kept_zeros(early, pattern)
    assert all(len(torch.unique(group)) <= 16 for group in early.reshape(-1, 128))
    assert bool((early[~early_kept] == 0).all())
