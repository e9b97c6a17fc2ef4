"""`order="hessian"`: SparseGPT and GPTQ visiting whole N:M groups (GPTQ: columns) heaviest diag(H) first, int4
scales fixed before the loop."""

import pytest
import torch

from sparsedecoding import SparsityPattern, solvers
from sparsedecoding.errors import SolverSettingsError
from sparsedecoding.settings import SOLVER_ORDERS, PruneConfig
from test_solvers import random_problem


def layer_loss(W, pruned, H):
    delta = (W - pruned).double()
    return float(((delta @ H.double()) * delta).sum())


def shuffled_scales_problem(rows=32, cols=256, seed=0):
    """Correlated inputs whose scales are log-normal (a spread of about e^±2) in random column order, as real
    activations' are."""
    generator = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    X = torch.randn(1024, cols, generator=generator, dtype=torch.float64)
    X = X @ (torch.eye(cols, dtype=torch.float64) + torch.randn(cols, cols, generator=generator,
                                                                 dtype=torch.float64) / cols ** 0.5)
    X = X * torch.randn(cols, generator=generator, dtype=torch.float64).exp()
    return W, 2 * X.T @ X / X.shape[0]


def test_hessian_order_keeps_units_whole_and_puts_the_heaviest_first():
    H = torch.diag(torch.tensor([1.0, 1, 5, 5, 2, 2, 9, 0, 3, 3, 3, 3]))
    # unit sums: columns 0-3: 12, 4-7: 13, 8-11: 12; a tie keeps column order
    assert solvers.hessian_order(H, 4).tolist() == [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11]
    assert solvers.hessian_order(H, 1).tolist()[:3] == [6, 2, 3]
    assert solvers.hessian_order(H, 12).tolist() == list(range(12))


@pytest.mark.parametrize("pattern, unit", [("2:4", 4), ("16:32", 32), ("16:32+2", 32), ("16:32+4q", 32), ("50%", 1),
                                           (None, 1)])
def test_order_unit(pattern, unit):
    assert solvers.order_unit(None if pattern is None else SparsityPattern.parse(pattern)) == unit


@pytest.mark.parametrize("pattern", ["2:4", "16:32", "16:32+2", "50%"])
@pytest.mark.parametrize("quantize", [None, "int8"])
def test_hessian_order_is_the_column_solve_of_the_permuted_problem(pattern, quantize):
    """Bit for bit: permute W and H by the order, solve left to right, put the columns back (int8's one scale a
    row is the same either way; int4's fixed scales have their own tests below)."""
    W, H = random_problem(rows=16, cols=128, seed=4)
    parsed = SparsityPattern.parse(pattern)
    unit = solvers.order_unit(parsed)
    Hn = solvers.normalized_hessian(H, torch.float64)
    visit = solvers.hessian_order(Hn, unit)
    ours = solvers.sparsegpt(W, H, pattern, quantize=quantize, group_size=32, blocksize=64, order="hessian")
    permuted = solvers.sparsegpt(W[:, visit], H[visit][:, visit], pattern, quantize=quantize, group_size=32,
                                 blocksize=64)
    expected = torch.empty_like(permuted)
    expected[:, visit] = permuted
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_gptq_hessian_order_is_the_column_solve_of_the_permuted_problem(quantize):
    """One column at a time. With one int4 group a row, the left-to-right solve also sets its one scale from W
    before any column moves, so the fixed scales give the same bits."""
    W, H = random_problem(rows=16, cols=128, seed=5)
    visit = solvers.hessian_order(solvers.normalized_hessian(H, torch.float64), 1)
    assert visit.tolist() != list(range(128))
    ours = solvers.gptq(W, H, quantize, group_size=128, order="hessian")
    permuted = solvers.gptq(W[:, visit], H[visit][:, visit], quantize, group_size=128)
    expected = torch.empty_like(permuted)
    expected[:, visit] = permuted
    assert torch.equal(ours, expected)


def test_a_hessian_already_in_falling_order_solves_as_columns():
    W, H = random_problem(rows=16, cols=128, seed=2)
    unit_sums = H.diagonal().reshape(-1, 4).sum(1)
    visit = (torch.argsort(unit_sums, descending=True)[:, None] * 4 + torch.arange(4)).reshape(-1)
    W, H = W[:, visit], H[visit][:, visit]
    for pattern in ("2:4", "16:32"):
        assert torch.equal(solvers.sparsegpt(W, H, pattern, order="hessian"), solvers.sparsegpt(W, H, pattern))


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "16:32", "16:32+2", "16:32+2l", "16:32+4q"])
def test_the_mask_stays_in_the_weights_own_groups(pattern):
    W, H = shuffled_scales_problem(rows=32, cols=128, seed=1)
    W = W.float()
    parsed = SparsityPattern.parse(pattern)
    ours = solvers.sparsegpt(W, H, pattern, order="hessian")
    kept = ours != 0
    assert torch.all(kept.reshape(32, -1, parsed.m).sum(-1) == parsed.n)
    assert solvers.placement_breaks(kept, parsed) == 0


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_values_stay_on_their_own_scale_groups_grid(quantize):
    W, H = shuffled_scales_problem(rows=16, cols=256, seed=3)
    ours = solvers.sparsegpt(W.float(), H, "2:4", quantize=quantize, group_size=64, order="hessian")
    assert torch.all((ours != 0).reshape(16, -1, 4).sum(-1) <= 2)
    codes = solvers.quantization_codes(ours, quantize, 64)
    assert torch.equal(codes.dequantize(torch.float64), ours.double())
    dense = solvers.gptq(W.float(), H, quantize, group_size=64, order="hessian")
    codes = solvers.quantization_codes(dense, quantize, 64)
    assert torch.equal(codes.dequantize(torch.float64), dense.double())


def group_scales(weight, group):
    return solvers.grid_scale(weight.abs().reshape(weight.shape[0], -1, group).amax(2), "int4")


@pytest.mark.parametrize("pattern", ["2:4", "16:32", None])
def test_int4_scales_in_the_hessian_order_come_from_the_unquantized_solve(pattern):
    """Every value is an in-range integer multiple of its own column group's scale, and that scale is the grid
    scale of the same problem solved without rounding (W itself for GPTQ), in W's own column groups."""
    W, H = shuffled_scales_problem(rows=16, cols=256, seed=6)
    W = W.float()
    if pattern is None:
        ours, unrounded = solvers.gptq(W, H, "int4", group_size=64, order="hessian"), W
    else:
        ours = solvers.sparsegpt(W, H, pattern, quantize="int4", group_size=64, order="hessian")
        unrounded = solvers.sparsegpt(W, H, pattern, order="hessian")
    scales = group_scales(unrounded, 64).repeat_interleave(64, dim=1)
    codes = ours / scales
    assert torch.equal(codes, codes.round())
    assert int(codes.min()) >= -8 and int(codes.max()) <= 7
    assert not torch.equal(scales, group_scales(ours, 64).repeat_interleave(64, dim=1))  # not the result's own


def test_int4_columns_order_keeps_the_running_scales():
    """Left to right keeps GPTQ's scales set as each group's block starts: bit for bit the earlier results, so the
    fixed scales belong to the hessian order alone."""
    W, H = random_problem(rows=16, cols=128, seed=7)
    ours = solvers.sparsegpt(W, H, "2:4", quantize="int4", group_size=32, blocksize=32)
    original, running = W.clone(), W.clone()
    U = solvers.damped_inverse_cholesky(solvers.normalized_hessian(H, torch.float64), 0.01)
    solvers._column_loop(running, U, SparsityPattern.parse("2:4"), (16,), "int4", 32, 32, False)
    assert torch.equal(ours, running)
    assert not torch.equal(original, running)


@pytest.mark.parametrize("pattern, bound", [("2:4", 0.95), (None, 0.9)])
def test_int4_in_the_hessian_order_lowers_the_loss_when_input_scales_are_spread(pattern, bound):
    """With scales fixed up front the order moves single groups (GPTQ: columns) and keeps its gain under int4."""
    for seed in range(3):
        W, H = shuffled_scales_problem(cols=256, seed=seed)
        if pattern is None:
            columns = layer_loss(W, solvers.gptq(W, H, "int4", group_size=64), H)
            hessian = layer_loss(W, solvers.gptq(W, H, "int4", group_size=64, order="hessian"), H)
        else:
            columns = layer_loss(W, solvers.sparsegpt(W, H, pattern, quantize="int4", group_size=64), H)
            hessian = layer_loss(W, solvers.sparsegpt(W, H, pattern, quantize="int4", group_size=64,
                                                     order="hessian"), H)
        assert hessian < bound * columns, (seed, hessian / columns)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_keep_zeros_keeps_the_mask_under_either_order(quantize):
    W, H = shuffled_scales_problem(rows=16, cols=128, seed=4)
    pruned = solvers.sparsegpt(W, H, "2:4")
    again = solvers.sparsegpt(pruned, H, "2:4", quantize=quantize, group_size=32, keep_zeros=True, order="hessian")
    assert not bool(((again != 0) & (pruned == 0)).any())  # nothing pruned comes back
    # a kept weight may round to 0: rarely on int8's grid, on int4's (a step of about absmax/7.5) for a few percent
    assert int(((again == 0) & (pruned != 0)).sum()) < {"int8": 8, "int4": 52}[quantize]  # of 1024 kept


@pytest.mark.parametrize("pattern, cols, bound", [("2:4", 256, 0.95), ("16:32", 512, 1.0)])
def test_heaviest_first_lowers_the_loss_when_input_scales_are_spread(pattern, cols, bound):
    """The reason for the option: on each of these problems the group order leaves less reconstruction loss than
    left to right, clearly at 2:4 and less so at 16:32, whose 16 groups a row leave less to reorder."""
    for seed in range(4):
        W, H = shuffled_scales_problem(cols=cols, seed=seed)
        columns = layer_loss(W, solvers.sparsegpt(W, H, pattern), H)
        hessian = layer_loss(W, solvers.sparsegpt(W, H, pattern, order="hessian"), H)
        assert hessian < bound * columns, (seed, hessian / columns)


def test_unknown_order_is_one_settings_error():
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SolverSettingsError, match="order = 'act'"):
        solvers.sparsegpt(W, H, "2:4", order="act")
    with pytest.raises(SolverSettingsError, match="order"):
        solvers.gptq(W, H, "int8", order=None)


def test_the_setting_is_a_prune_field_with_the_solvers_choices():
    assert SOLVER_ORDERS == solvers.ORDERS
    assert PruneConfig(model="m", out="o").solver_order == "columns"
    assert PruneConfig(model="m", out="o", solver_order="hessian").solver_order == "hessian"


def test_an_unknown_setting_is_refused_by_the_settings_check():
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.settings import check
    with pytest.raises(SparseDecodingError, match="--solver-order 'act' is not one of columns, hessian"):
        check(PruneConfig(model="m", out="o", solver_order="act"))
