"""The refit (`refit_steps`, `solvers.refit`): the kept weights re-solved for the mask a solver chose, by conjugate
gradients toward the least damped layer loss the mask allows."""

import pytest
import torch

from sparsedecoding import solvers
from sparsedecoding.errors import SolverSettingsError, SparseDecodingError
from sparsedecoding.settings import PruneConfig, check
from test_solvers import random_problem


def layer_loss(W, new, H):
    delta = (W - new).double()
    return float(((delta @ H.double()) * delta).sum())


def exact_refit(W, kept, H, percdamp=0.01):
    """Each row's kept entries solved exactly in float64: (H + λI)_KK·x_K = (w·(H + λI))_K, λ as the solver's."""
    Hn = solvers.normalized_hessian(H, torch.float64)
    A = Hn + percdamp * Hn.diagonal().mean() * torch.eye(Hn.shape[0], dtype=torch.float64)
    X = torch.zeros(W.shape, dtype=torch.float64)
    target = W.double() @ A
    for row in range(W.shape[0]):
        K = kept[row].nonzero().flatten()
        X[row, K] = torch.linalg.solve(A[K][:, K], target[row, K])
    return X


@pytest.mark.parametrize("pattern", ["2:4", "16:32", "50%"])
def test_enough_steps_reach_the_exact_per_row_solution(pattern):
    """Conjugate gradients end at the exact solution once the steps reach the kept count of a row (here 40 of 64
    columns at most); in float64 equal to 1e-9 of the largest weight."""
    W, H = random_problem(rows=12, cols=64, seed=2)
    ours = solvers.sparsegpt(W, H, pattern, refit_steps=200)
    mask = solvers.sparsegpt(W, H, pattern) != 0
    assert torch.equal(ours != 0, mask)
    expected = exact_refit(W, mask, H)
    assert float((ours - expected).abs().max()) < 1e-9 * float(expected.abs().max())


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "16:32", "50%", "16:32+2"])
def test_the_refit_keeps_the_mask_and_lowers_the_loss(pattern):
    """Same mask as SparseGPT's (bit for bit), and a lower loss on every problem: 0.55-0.85x on these."""
    for seed in range(4):
        W, H = random_problem(rows=32, cols=128, seed=seed)
        plain = solvers.sparsegpt(W, H, pattern)
        refit = solvers.sparsegpt(W, H, pattern, refit_steps=40)
        assert torch.equal(refit != 0, plain != 0)
        assert layer_loss(W, refit, H) < 0.95 * layer_loss(W, plain, H), seed


def test_the_loss_falls_with_every_step():
    """Conjugate gradients lower the damped objective at every step; the plain loss follows it (within rounding)."""
    W, H = random_problem(rows=16, cols=96, seed=5)
    losses = [layer_loss(W, solvers.sparsegpt(W, H, "2:4", refit_steps=steps), H) for steps in (0, 1, 2, 3, 5, 10, 40)]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0]


def test_stacked_weights_refit_as_they_would_alone():
    W, H = random_problem(rows=40, cols=64, seed=7)
    together = torch.cat(solvers.sparsegpt_shared([W[:16], W[16:]], H, "2:4", refit_steps=30))
    alone = torch.cat([solvers.sparsegpt(W[:16], H, "2:4", refit_steps=30),
                       solvers.sparsegpt(W[16:], H, "2:4", refit_steps=30)])
    assert torch.equal(together != 0, alone != 0)
    assert torch.allclose(together, alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("order", ["columns", "hessian"])
def test_quantized_refit_is_on_the_grid_with_the_unquantized_mask(quantize, order):
    """With quantize the mask is the unquantized solve's, the refit weights are rounded with it fixed: every value
    on the grid, the N:M pattern kept, the total loss lower than the joint solve's without the refit."""
    totals = [0.0, 0.0]
    for seed in range(4):
        W, H = random_problem(rows=32, cols=128, seed=seed)
        ours = solvers.sparsegpt(W, H, "2:4", quantize=quantize, group_size=32, order=order, refit_steps=40)
        unquantized = solvers.sparsegpt(W, H, "2:4", order=order, refit_steps=40)
        assert not bool((ours != 0)[unquantized == 0].any())  # nothing kept outside the mask (rounding may zero)
        assert torch.equal(solvers.quantization_codes(ours, quantize, 32).dequantize(torch.float64), ours)
        assert int((ours != 0).view(32, -1, 4).sum(-1).max()) <= 2
        totals[0] += layer_loss(W, ours, H)
        totals[1] += layer_loss(W, solvers.sparsegpt(W, H, "2:4", quantize=quantize, group_size=32, order=order), H)
    assert totals[0] < 0.95 * totals[1], totals


def test_hessian_order_refit_keeps_the_pattern_in_the_weights_own_columns():
    W, H = random_problem(rows=16, cols=128, seed=3)
    ours = solvers.sparsegpt(W, H, "16:32", order="hessian", refit_steps=40)
    assert torch.equal((ours != 0).view(16, -1, 32).sum(-1), torch.full((16, 4), 16))
    assert layer_loss(W, ours, H) < layer_loss(W, solvers.sparsegpt(W, H, "16:32", order="hessian"), H)


@pytest.mark.parametrize("solver", [solvers.wanda, solvers.magnitude])
def test_public_refit_of_another_solvers_mask(solver):
    """`solvers.refit` on Wanda's or magnitude's mask: same mask, much lower loss (their kept weights are W's own
    values, never compensated); 0 steps changes nothing; the dtype is the pruned weight's."""
    W, H = random_problem(rows=24, cols=64, seed=1)
    pruned = solver(W, H, "2:4")
    refit = solvers.refit(W, pruned, H, steps=40)
    assert torch.equal(refit != 0, pruned != 0)
    assert layer_loss(W, refit, H) < 0.7 * layer_loss(W, pruned, H)
    assert torch.equal(solvers.refit(W, pruned, H, steps=0), pruned)
    half = solvers.refit(W.float(), pruned.to(torch.bfloat16), H, steps=10)
    assert half.dtype == torch.bfloat16 and torch.equal(half != 0, pruned != 0)


def test_a_shared_refit_is_each_weights_own():
    W, H = random_problem(rows=40, cols=64, seed=8)
    parts = [solvers.wanda(W[:16], H, "2:4"), solvers.wanda(W[16:], H, "2:4")]
    together = solvers.refit_shared([W[:16], W[16:]], parts, H, steps=15)
    for new, weight, part in zip(together, (W[:16], W[16:]), parts):
        assert torch.allclose(new, solvers.refit(weight, part, H, steps=15), rtol=0, atol=1e-12)
    with pytest.raises(SolverSettingsError, match="one pruned weight for each weight, got 1 for 2"):
        solvers.refit_shared([W[:16], W[16:]], parts[:1], H)


def test_the_public_refit_is_the_solvers_own():
    W, H = random_problem(rows=16, cols=64, seed=4)
    inside = solvers.sparsegpt(W, H, "2:4", refit_steps=25)
    after = solvers.refit(W, solvers.sparsegpt(W, H, "2:4"), H, steps=25)
    assert torch.allclose(inside, after, rtol=0, atol=1e-12)


@pytest.mark.parametrize("steps", [-1, 1.5, True, "40", 10_001])
def test_bad_step_counts_are_refused(steps):
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SolverSettingsError, match="refit_steps"):
        solvers.sparsegpt(W, H, "2:4", refit_steps=steps)
    with pytest.raises(SolverSettingsError, match="refit_steps"):
        solvers.refit(W, W, H, steps=steps)


def test_the_public_refit_checks_its_inputs():
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SolverSettingsError, match="pruned must have the weight's shape"):
        solvers.refit(W, W[:4], H)
    with pytest.raises(SolverSettingsError, match="hessian must be"):
        solvers.refit(W, W, H[:16, :16])


def test_the_setting_is_a_prune_field():
    assert PruneConfig(model="m", out="o").refit_steps == 0
    assert PruneConfig(model="m", out="o", refit_steps=40).refit_steps == 40
    with pytest.raises(SparseDecodingError, match="--refit-steps"):
        check(PruneConfig(model="m", out="o", refit_steps=-1))


def test_gptq_alone_does_not_read_it():
    """With nothing pruned there is no mask to refit for: GPTQ's result is unchanged by the setting."""
    W, H = random_problem(rows=8, cols=64)
    assert torch.equal(solvers.gptq(W, H, "int8"), solvers._solve([W], H, None, "int8", 128, 128, 0.01, False,
                                                                   refit_steps=40)[0])
