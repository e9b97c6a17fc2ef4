"""Dense-target reconstruction: paired statistics of the dense and pruned streams, and the closed-form target."""

import torch
from torch import nn

from sparsedecoding import solvers
from sparsedecoding.hessian import KeepMask, accumulate_paired_inputs, dense_target, paired_by_module


def test_dense_target_is_the_least_squares_map_from_pruned_inputs_to_dense_outputs():
    torch.manual_seed(0)
    n, d_in, d_out = 400, 24, 10
    X_d = torch.randn(n, d_in, dtype=torch.float64)
    X_p = X_d + 0.3 * torch.randn(n, d_in, dtype=torch.float64)
    W = torch.randn(d_out, d_in, dtype=torch.float64)
    H = 2 * X_p.T @ X_p / n
    C = 2 * X_d.T @ X_p / n
    target = dense_target(W, C, H, percdamp=0.0)
    expected = torch.linalg.lstsq(X_p, X_d @ W.T).solution.T  # argmin ‖X_p·Ŵᵀ − X_d·Wᵀ‖
    torch.testing.assert_close(target, expected, rtol=1e-9, atol=1e-9)
    # Pruning the target with the pruned inputs' Hessian fits the dense outputs better than pruning W itself.
    fitted = solvers.sparsegpt(target, H, "2:4", blocksize=8, percdamp=0.01)
    plain = solvers.sparsegpt(W, H, "2:4", blocksize=8, percdamp=0.01)
    error = lambda Wh: float((X_p @ Wh.T - X_d @ W.T).square().sum())  # noqa: E731
    assert error(fitted) < error(plain)


def test_identical_streams_give_the_weight_itself():
    torch.manual_seed(1)
    X = torch.randn(300, 16, dtype=torch.float64)
    W = torch.randn(5, 16, dtype=torch.float64)
    H = 2 * X.T @ X / 300
    for percdamp in (0.0, 0.01, 0.5):  # the damping pulls towards W, so equal streams give W at any damping
        torch.testing.assert_close(dense_target(W, H, H, percdamp=percdamp), W, rtol=1e-9, atol=1e-9)


def test_paired_hooks_accumulate_h_and_c_over_kept_rows_only():
    torch.manual_seed(2)
    layer = nn.ModuleDict({"q_proj": nn.Linear(8, 4, bias=False), "k_proj": nn.Linear(8, 4, bias=False),
                           "o_proj": nn.Linear(8, 8, bias=False)}).double()
    modules = {f"attn.{name}": module for name, module in layer.items()}
    keep = KeepMask()
    x_d, x_p = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    kept = torch.rand(2, 5) > 0.4
    with accumulate_paired_inputs(modules, keep, torch.float64) as state:
        keep.set(kept)
        for x in (x_d, x_p):
            layer["q_proj"](x), layer["k_proj"](x), layer["o_proj"](x)
            state.mode = "pruned"
    hessians, crosses = paired_by_module(state, list(modules))
    rows_d, rows_p = x_d[kept], x_p[kept]
    count = int(kept.sum())
    torch.testing.assert_close(hessians["attn.q_proj"], 2 * rows_p.T @ rows_p / count)
    torch.testing.assert_close(crosses["attn.o_proj"], 2 * rows_d.T @ rows_p / count)
    assert hessians["attn.q_proj"] is hessians["attn.k_proj"]  # q/k share one input and one accumulator
