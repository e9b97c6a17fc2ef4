"""The rounding options of the quantizing solvers: `scale_search` (each scale clipped for the least loss the loop
charges) and `rounding_sweeps` (coordinate descent over the kept weights after the loop, mask and scales held)."""

import pytest
import torch

from sparsedecoding import SparsityPattern, solvers
from sparsedecoding.errors import SolverSettingsError
from sparsedecoding.pipeline import rounding_options, unread_options
from sparsedecoding.settings import PruneConfig
from test_solver_order import layer_loss, shuffled_scales_problem


def damped(H: torch.Tensor, percdamp: float = 0.01) -> torch.Tensor:
    """The normalized, damped Hessian the solvers minimise against."""
    Hn = solvers.normalized_hessian(H, torch.float64)
    _, damping = solvers.damped_factor(Hn, percdamp)
    return Hn + damping * torch.eye(Hn.shape[0], dtype=torch.float64)


def test_searched_scale_is_the_best_candidate_by_brute_force():
    generator = torch.Generator().manual_seed(1)
    W = torch.randn(6, 32, generator=generator, dtype=torch.float64) * torch.rand(6, 1, generator=generator,
                                                                               dtype=torch.float64)
    W[0, 3] = 9.0  # an outlier: clipping it pays
    d = torch.rand(32, generator=generator, dtype=torch.float64) + 0.5
    kept = torch.rand(6, 32, generator=generator) < 0.6
    ours = solvers.searched_scale(W, d, kept, "int4")
    for row in range(6):
        absmax = float((W[row] * kept[row]).abs().max())
        errors = []
        for shrink in solvers.SCALE_SHRINKS:
            scale = solvers.grid_scale(torch.tensor(absmax * shrink, dtype=torch.float64), "int4")
            q = solvers.round_to_grid(W[row], scale, "int4")
            errors.append((float((((W[row] - q) / d) ** 2 * kept[row]).sum()), float(scale)))
        best = min(errors, key=lambda pair: pair[0])  # min keeps the first of equals, as the search does
        assert float(ours[row]) == best[1]
        assert best[0] <= errors[0][0]
    assert float(ours[0]) < float(solvers.grid_scale(torch.tensor(9.0, dtype=torch.float64), "int4"))


def coordinate_optimal(W, T, A, kept, column_scale):
    """No kept weight can move one grid step either way (within the code range) and lower the loss."""
    base = float(((W - T) @ A * (W - T)).sum())
    for r, c in kept.nonzero().tolist():
        for step in (-1, 1):
            moved = W.clone()
            moved[r, c] += step * column_scale[r, c]
            if not -8 <= round(float(moved[r, c] / column_scale[r, c])) <= 7:
                continue
            if float(((moved - T) @ A * (moved - T)).sum()) < base - 1e-9 * abs(base):
                return False
    return True


def test_rounding_sweeps_lower_the_loss_stay_on_the_grid_and_end_coordinate_optimal():
    W, H = shuffled_scales_problem(rows=4, cols=64, seed=3)
    A = damped(H)
    pattern = SparsityPattern.parse("2:4")
    kept = solvers.keep_mask(W.abs(), pattern)
    scales = solvers.grid_scale(W.abs().view(4, -1, 32).amax(2), "int4")
    column_scale = scales.repeat_interleave(32, dim=1)
    start = solvers.round_to_grid(W, column_scale, "int4") * kept
    losses = [layer_loss(W, start, A)]
    current = start.clone()
    for _ in range(6):
        current = solvers.rounding_sweeps(current, W, A, kept, column_scale, "int4", 1, block=16)
        losses.append(layer_loss(W, current, A))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(losses, losses[1:]))
    assert losses[-1] < 0.9 * losses[0]
    codes = current / column_scale
    assert torch.equal(codes, codes.round()) and codes.min() >= -8 and codes.max() <= 7
    assert not bool(current[~kept].any())
    # blocks change only when the gradient is refreshed: one sweep in blocks of 16 is one sweep column by column
    once = solvers.rounding_sweeps(start.clone(), W, A, kept, column_scale, "int4", 1, block=16)
    single = solvers.rounding_sweeps(start.clone(), W, A, kept, column_scale, "int4", 1, block=1)
    assert torch.allclose(once, single, rtol=0, atol=1e-12)
    converged = solvers.rounding_sweeps(current.clone(), W, A, kept, column_scale, "int4", 30)
    assert coordinate_optimal(converged, W, A, kept, column_scale)


@pytest.mark.parametrize("solve", ["sparsegpt", "admm", "gptq", "sparsegpt-hessian", "keep-zeros"])
@pytest.mark.parametrize("quantize", ["int4", "int8"])
def test_each_solver_with_both_options_lowers_the_loss_and_stays_on_its_grid(solve, quantize):
    W, H = shuffled_scales_problem(rows=16, cols=128, seed=5)
    group = 32
    if solve == "keep-zeros":
        W = W * solvers.keep_mask(W.abs(), SparsityPattern.parse("2:4"))

    def run(**options):
        common = {"quantize": quantize, "group_size": group, "blocksize": 64, **options}
        if solve == "gptq":
            return solvers.gptq(W, H, quantize, group_size=group, blocksize=64, **options)
        if solve == "admm":
            return solvers.admm(W, H, "2:4", iterations=20, **common)
        return solvers.sparsegpt(W, H, "2:4", keep_zeros=solve == "keep-zeros",
                                 order="hessian" if solve == "sparsegpt-hessian" else "columns", **common)

    plain, searched = run(), run(scale_search=True)
    swept, both = run(rounding_sweeps=3), run(scale_search=True, rounding_sweeps=3)
    A = damped(H)
    for result in (searched, swept, both):
        codes = solvers.quantization_codes(result, quantize, group if quantize == "int4" else W.shape[1])
        assert torch.equal(codes.dequantize(torch.float64), result)
        if solve != "gptq":
            assert bool(((result != 0).view(16, -1, 4).sum(-1) <= 2).all())
    assert layer_loss(W, swept, A) <= layer_loss(W, plain, A)
    assert layer_loss(W, both, A) <= layer_loss(W, searched, A)
    if solve == "keep-zeros":
        assert not bool(both[W == 0].any())


def test_options_without_a_quantization_are_refused():
    W, H = shuffled_scales_problem(rows=4, cols=64)
    with pytest.raises(SolverSettingsError, match="need quantize"):
        solvers.sparsegpt(W, H, "2:4", scale_search=True)
    with pytest.raises(SolverSettingsError, match="need quantize"):
        solvers.admm(W, H, "2:4", iterations=5, rounding_sweeps=2)
    for bad in (-1, 1.5, True, solvers.MAX_ROUNDING_SWEEPS + 1):
        with pytest.raises(SolverSettingsError, match="rounding_sweeps"):
            solvers.sparsegpt(W, H, "2:4", quantize="int4", group_size=32, rounding_sweeps=bad)


def test_pipeline_passes_them_only_to_quantizing_solves_and_names_them_unread_otherwise():
    config = PruneConfig(model="m", out="o", pattern="2:4", quantize="int4", scale_search=True, rounding_sweeps=3)
    assert rounding_options(config, config.quantize) == {"scale_search": True, "rounding_sweeps": 3}
    assert rounding_options(config, "none") == {}
    assert "rounding_sweeps" not in unread_options(config)
    bf16 = PruneConfig(model="m", out="o", pattern="2:4", scale_search=True, rounding_sweeps=3)
    assert {"scale_search", "rounding_sweeps"} <= set(unread_options(bf16))
    head = PruneConfig(model="m", out="o", pattern="2:4", quantize_head="int8", rounding_sweeps=3)
    assert "rounding_sweeps" not in unread_options(head)
