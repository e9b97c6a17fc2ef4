import logging

import pytest
import torch

from sparsedecoding import SparsityPattern, SparsityPatternError, solvers
from sparsedecoding.errors import CalibrationError


def random_problem(rows=24, cols=64, samples=256, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, cols, generator=generator, dtype=dtype)
    # Correlated inputs with uneven scales, like real activations.
    X = torch.randn(samples, cols, generator=generator, dtype=dtype) @ torch.randn(cols, cols, generator=generator,
                                                                                dtype=dtype)
    X = X * torch.rand(cols, generator=generator, dtype=dtype).mul(3).add(0.1)
    return W, 2 * X.T @ X / samples


def reference_sparsegpt(W, H, pattern, blocksize, percdamp):
    """The SparseGPT algorithm written out column by column in float64, straight from the paper's pseudocode."""
    pattern = SparsityPattern.parse(pattern)
    W, H = W.clone().double(), H.clone().double()
    cols = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(cols, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        mask1 = torch.zeros_like(W1, dtype=torch.bool)
        if not pattern.is_nm:
            tmp = W1 ** 2 / torch.diag(Hinv1).reshape(1, -1) ** 2
            order = torch.argsort(tmp.flatten(), stable=True)
            mask1.view(-1)[order[:int(tmp.numel() * pattern.sparsity)]] = True
        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]
            if pattern.is_nm and i % pattern.m == 0:
                tmp = W1[:, i:i + pattern.m] ** 2 / torch.diag(Hinv1)[i:i + pattern.m].reshape(1, -1) ** 2
                smallest = torch.argsort(tmp, dim=1, stable=True)[:, :pattern.m - pattern.n]
                mask1.scatter_(1, i + smallest, True)
            q = w.clone()
            q[mask1[:, i]] = 0
            Q1[:, i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err1
        W[:, i1:i2] = Q1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return W


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "8:16", "16:32", "1:4", "50%", "70%"])
@pytest.mark.parametrize("blocksize", [32, 64])
def test_sparsegpt_matches_float64_reference(pattern, blocksize):
    W, H = random_problem(cols=96)  # 96 is not a multiple of 64: the last block is short
    ours = solvers.sparsegpt(W, H, pattern, blocksize=blocksize)
    reference = reference_sparsegpt(W, H, pattern, blocksize, 0.01)
    assert torch.equal(ours == 0, reference == 0)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "8:16", "16:32"])
@pytest.mark.parametrize("solver", ["sparsegpt", "wanda", "magnitude"])
def test_every_group_keeps_exactly_n(pattern, solver):
    W, H = random_problem(rows=16, cols=128, dtype=torch.float32, seed=1)
    parsed = SparsityPattern.parse(pattern)
    pruned = getattr(solvers, solver)(W, H, pattern)
    nonzero = (pruned != 0).reshape(16, 128 // parsed.m, parsed.m).sum(-1)
    assert torch.all(nonzero == parsed.n)


def test_unstructured_counts():
    W, H = random_problem(rows=16, cols=256, dtype=torch.float32, seed=2)
    pruned = solvers.sparsegpt(W, H, "50%", blocksize=128)
    for start in (0, 128):  # exactly half of each block, over all rows together
        assert int((pruned[:, start:start + 128] == 0).sum()) == 16 * 128 // 2
    for solver in (solvers.wanda, solvers.magnitude):  # exactly half of every row
        assert torch.all((solver(W, H, "50%") == 0).sum(1) == 128)


def test_sparsegpt_beats_magnitude_and_wanda_on_its_objective():
    W, H = random_problem(rows=32, cols=128, dtype=torch.float32, seed=3)

    def loss(pruned):
        delta = (W - pruned).double()
        return float(((delta @ H.double()) * delta).sum())

    for pattern in ("2:4", "50%"):
        ours = loss(solvers.sparsegpt(W, H, pattern))
        assert ours < loss(solvers.wanda(W, H, pattern)) < loss(solvers.magnitude(W, H, pattern))


def test_wanda_score_uses_input_norms():
    W = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    H = torch.diag(torch.tensor([100.0, 1.0, 1.0, 0.01]))
    # scores |W|·sqrt(diag H) = 10, 2, 3, 0.4: keep columns 0 and 2
    assert torch.equal(solvers.wanda(W, H, "2:4"), torch.tensor([[1.0, 0.0, 3.0, 0.0]]))
    assert torch.equal(solvers.magnitude(W, H, "2:4"), torch.tensor([[0.0, 0.0, 3.0, 4.0]]))


def test_dtype_and_device_preserved():
    W, H = random_problem(dtype=torch.float32)
    for solver in (solvers.sparsegpt, solvers.wanda, solvers.magnitude):
        out = solver(W.bfloat16(), H, "2:4")
        assert out.dtype == torch.bfloat16 and out.shape == W.shape


def test_dead_inputs_are_pruned_first():
    W, H = random_problem(rows=8, cols=32)
    H[5, :] = 0
    H[:, 5] = 0
    assert torch.all(solvers.sparsegpt(W, H, "2:4")[:, 5] == 0)


def test_cholesky_failure_raises_damping_with_warning(caplog):
    W, H = random_problem(rows=8, cols=32)
    eigenvalues, vectors = torch.linalg.eigh(H)
    # Push one eigenvalue below zero by a bit more than the default damping can fix, but less than 10x damping.
    shift = eigenvalues.min() + 0.05 * H.diagonal().mean()
    indefinite = H - shift * vectors[:, :1] @ vectors[:, :1].T
    with caplog.at_level(logging.WARNING, logger="sparsedecoding.solvers"):
        pruned = solvers.sparsegpt(W, indefinite, "2:4")
    assert "retrying with 0.1" in caplog.text
    assert torch.isfinite(pruned).all()


def test_hopeless_hessian_raises():
    W, _ = random_problem(rows=8, cols=32)
    with pytest.raises(CalibrationError, match="not positive definite"):
        solvers.sparsegpt(W, -torch.eye(32, dtype=torch.float64), "2:4")


def test_pattern_must_divide_columns():
    W, H = random_problem(rows=4, cols=30)
    with pytest.raises(SparsityPatternError, match="divisible by 4"):
        solvers.sparsegpt(W, H, "2:4")
    with pytest.raises(SparsityPatternError):
        solvers.wanda(W, H, "3:2")


@pytest.mark.parametrize("pattern", ["2:4", "16:32", "50%"])
def test_shared_hessian_solve_equals_separate_solves(pattern):
    W, H = random_problem(rows=40, cols=64, seed=4)
    q, k, v = W[:24], W[24:32], W[32:]
    together = solvers.sparsegpt_shared([q, k, v], H, pattern, blocksize=32)
    for alone, stacked in zip((q, k, v), together):
        torch.testing.assert_close(stacked, solvers.sparsegpt(alone, H, pattern, blocksize=32), rtol=1e-10,
                                   atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["2:4", "50%"])
def test_cuda_graph_block_loop_equals_eager(pattern):
    W, H = random_problem(rows=64, cols=256, dtype=torch.float32, seed=5)
    W, H = W.cuda(), H.cuda()
    graph = solvers.sparsegpt_shared([W[:40], W[40:]], H, pattern, cuda_graph=True)
    eager = solvers.sparsegpt_shared([W[:40], W[40:]], H, pattern, cuda_graph=False)
    for first, second in zip(graph, eager):
        assert torch.equal(first == 0, second == 0)
        torch.testing.assert_close(first, second, rtol=1e-5, atol=1e-5)
