import contextlib
import logging
import math
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding import SparsityPattern, SparsityPatternError, solvers
from sparsedecoding.errors import CalibrationError, QuantizationError, SolverSettingsError


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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_dtype_and_device_preserved(device):
    W, H = random_problem(dtype=torch.float32)
    W, H = W.bfloat16().to(device), H.to(device)
    for solver in (solvers.sparsegpt, solvers.wanda, solvers.magnitude):
        out = solver(W, H, "2:4")
        assert out.dtype == torch.bfloat16 and out.shape == W.shape and out.device == W.device, solver.__name__


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


@contextlib.contextmanager
def time_limit(seconds):
    """Fail instead of hanging if the body loops forever (the damping escalation once did for percdamp = 0)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_hopeless_hessian_raises_after_one_warning_per_step(caplog):
    W, _ = random_problem(rows=8, cols=32)
    with caplog.at_level(logging.WARNING, logger="sparsedecoding.solvers"), time_limit(20), \
            pytest.raises(CalibrationError, match="singular.*not positive definite.*calibrate on more tokens"):
        solvers.sparsegpt(W, -torch.eye(32, dtype=torch.float64), "2:4")
    assert [r.getMessage() for r in caplog.records] == [  # 0.01 -> 0.1 -> 1, and 10 would pass MAX_DAMPING
        "Cholesky failed with damping 0.01·mean(diag H); retrying with 0.1",
        "Cholesky failed with damping 0.1·mean(diag H); retrying with 1"]


@pytest.mark.parametrize("percdamp", [0, 0.0, -0.01, math.nan, math.inf])
def test_bad_damping_raises_at_once(percdamp):
    W, H = random_problem(rows=8, cols=32)
    singular = H.clone()
    singular[:, 3] = singular[3, :] = 0
    singular[3, 3] = -1  # indefinite and with a zero row: no damping of 0 could ever factorise it
    with time_limit(20):
        for solve in (lambda: solvers.sparsegpt(W, singular, "2:4", percdamp=percdamp),
                      lambda: solvers.gptq(W, singular, "int8", percdamp=percdamp)):
            with pytest.raises(SolverSettingsError, match="percdamp .* must be a positive finite number"):
                solve()


def test_non_finite_hessian_raises():
    W, H = random_problem(rows=8, cols=32)
    H[2, 5] = math.nan
    with pytest.raises(CalibrationError, match="NaN or inf"):
        solvers.sparsegpt(W, H, "2:4")


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


# ---- quantization: the joint SparseGPT mode and GPTQ ----

def reference_joint(W, H, pattern, quantize, group_size, blocksize, percdamp=0.01):
    """The joint loop written out column by column in float64 (pattern None: GPTQ). int4: a group's scale comes
    from W as it stands when the group's block starts (GPTQ's order); int8 with a pattern: the scale per row from
    the plain SparseGPT result (reference_sparsegpt)."""
    W, H = W.clone().double(), H.clone().double()
    rows, cols = W.shape
    low, high = solvers.CODE_RANGES[quantize]
    group = cols if quantize == "int8" else group_size
    row_scale = None
    if pattern is not None:
        pattern = SparsityPattern.parse(pattern)
        if quantize == "int8":
            row_scale = solvers.grid_scale(reference_sparsegpt(W, H, pattern, blocksize, percdamp).abs().amax(1),
                                           quantize)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(cols, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    scale = torch.zeros(rows, cols, dtype=W.dtype)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        for c in range(i1, i2):
            if c % group == 0:
                scale[:, c:c + group] = (row_scale if row_scale is not None else
                                         solvers.grid_scale(W[:, c:c + group].abs().amax(1), quantize))[:, None]
        W1, Err1, Hinv1 = W[:, i1:i2].clone(), torch.zeros(rows, i2 - i1, dtype=W.dtype), Hinv[i1:i2, i1:i2]
        mask1 = torch.zeros_like(W1, dtype=torch.bool)
        if pattern is not None and not pattern.is_nm:
            tmp = W1 ** 2 / torch.diag(Hinv1).reshape(1, -1) ** 2
            order = torch.argsort(tmp.flatten(), stable=True)
            mask1.view(-1)[order[:int(tmp.numel() * pattern.sparsity)]] = True
        for i in range(i2 - i1):
            w, d = W1[:, i], Hinv1[i, i]
            if pattern is not None and pattern.is_nm and i % pattern.m == 0:
                tmp = W1[:, i:i + pattern.m] ** 2 / torch.diag(Hinv1)[i:i + pattern.m].reshape(1, -1) ** 2
                smallest = torch.argsort(tmp, dim=1, stable=True)[:, :pattern.m - pattern.n]
                mask1.scatter_(1, i + smallest, True)
            s = scale[:, i1 + i]
            q = torch.clamp(torch.round(w / s), low, high) * s
            q[mask1[:, i]] = 0
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            W1[:, i] = q
            Err1[:, i] = err1
        W[:, i1:i2] = W1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return W


def layer_loss(W, new, H):
    delta = (W - new).double()
    return float(((delta @ H.double()) * delta).sum())


def round_to_nearest(W, quantize, group_size):
    """Each row group rounded to the nearest point of its own grid (scale from its largest magnitude)."""
    rows, cols = W.shape
    group = cols if quantize == "int8" else group_size
    blocks = W.float().reshape(rows, cols // group, group)
    scale = solvers.grid_scale(blocks.abs().amax(-1), quantize)
    return solvers.round_to_grid(blocks, scale[..., None], quantize).reshape(rows, cols).to(W.dtype)


@pytest.mark.parametrize("pattern", ["2:4", "4:8", "50%", None])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_joint_solver_matches_float64_reference(pattern, quantize):
    W, H = random_problem(rows=16, cols=96, seed=6)
    if pattern is None:
        ours = solvers.gptq(W, H, quantize, group_size=32, blocksize=64)
    else:
        ours = solvers.sparsegpt(W, H, pattern, quantize=quantize, group_size=32, blocksize=64)
    reference = reference_joint(W, H, pattern, quantize, 32, 64)
    assert torch.equal(ours == 0, reference == 0)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("pattern", ["2:4", "8:16", "50%"])
def test_joint_mask_is_exact_and_kept_values_on_the_grid(pattern, quantize, dtype):
    W, H = random_problem(rows=16, cols=128, dtype=torch.float32, seed=7)
    parsed = SparsityPattern.parse(pattern)
    ours = solvers.sparsegpt(W.to(dtype), H, pattern, quantize=quantize, group_size=32, blocksize=64)
    assert ours.dtype == dtype and ours.shape == W.shape
    kept = ours != 0
    if parsed.is_nm:
        assert torch.all(kept.reshape(16, -1, parsed.m).sum(-1) <= parsed.n)  # a kept weight may round to 0
    else:
        assert int((~kept).sum()) >= W.numel() // 2
    plain = solvers.sparsegpt(W.to(dtype), H, pattern, blocksize=64)
    assert int((~kept).sum()) - int((plain == 0).sum()) < W.numel() // 20  # zeros beyond the mask are rare
    codes = solvers.quantization_codes(ours, quantize, 32)
    assert torch.equal(codes.dequantize(torch.float64).to(dtype), ours)  # codes·scales is the weight exactly
    assert torch.equal(codes.dequantize(torch.float64), ours.double())  # and exact before the cast too
    low, high = solvers.CODE_RANGES[quantize]
    assert codes.codes.min() >= low and codes.codes.max() <= high
    assert torch.equal(codes.scales.bfloat16().float(), codes.scales)
    assert codes.scales.shape == (16, 1 if quantize == "int8" else 4)


@pytest.mark.parametrize("pattern", ["2:4", "50%"])
def test_joint_loss_no_worse_than_prune_then_round(pattern):
    """int4: better on every problem (by 8-23% on these). int8 rounding adds only ~0.1-0.6% to the pruning loss, less
    than the noise its compensation adds to SparseGPT's greedy mask choices, so the joint pass is better on most
    problems and in total, and never worse by more than that noise."""
    totals = {"int8": [0.0, 0.0], "int4": [0.0, 0.0]}
    for seed in range(6):
        W, H = random_problem(rows=32, cols=256, dtype=torch.float32, seed=seed)
        pruned = solvers.sparsegpt(W, H, pattern)
        for quantize, total in totals.items():
            joint = layer_loss(W, solvers.sparsegpt(W, H, pattern, quantize=quantize, group_size=64), H)
            prune_then_round = layer_loss(W, round_to_nearest(pruned, quantize, 64), H)
            assert joint <= prune_then_round * (1.006 if quantize == "int8" else 1.0), (quantize, seed)
            total[0] += joint
            total[1] += prune_then_round
    for quantize, (joint, prune_then_round) in totals.items():
        assert joint <= prune_then_round, quantize


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_gptq_beats_round_to_nearest(quantize):
    W, H = random_problem(rows=32, cols=256, dtype=torch.float32, seed=3)
    ours = solvers.gptq(W, H, quantize, group_size=64)
    assert (ours != 0).float().mean() > 0.8  # dense: nothing is pruned; some small values round to 0
    assert layer_loss(W, ours, H) < 0.8 * layer_loss(W, round_to_nearest(W, quantize, 64), H)
    assert torch.equal(solvers.quantization_codes(ours, quantize, 64).dequantize(), ours)


def test_unquantized_results_unchanged_from_before_quantization():
    """Outputs of the solver as it was before the joint mode (commit c399d08) on fixed problems: the same mask, and
    values equal to rounding. Bit for bit on the CPU that wrote the file; on another (MKL picks other kernels per
    instruction set) float32 values moved by up to 7e-6 and float64 by 6e-15, while any change to the algorithm
    moves them by far more than the tolerance (one mask flip moves several values by O(1))."""
    before = load_file(str(Path(__file__).parent / "data" / "sparsegpt_before_quantization.safetensors"))

    def same(new, old, dtype):
        assert torch.equal(new == 0, old == 0)
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        assert float((new - old).abs().max()) <= tolerance * float(old.abs().max())

    for dtype in (torch.float32, torch.float64):
        name = str(dtype).removeprefix("torch.")
        W, H = random_problem(rows=16, cols=96, dtype=dtype, seed=11)
        for pattern in ("2:4", "4:8", "50%"):
            for blocksize in (32, 128):
                same(solvers.sparsegpt(W, H, pattern, quantize=None, blocksize=blocksize),
                     before[f"{name}/{pattern}/{blocksize}"], dtype)
        same(torch.cat(solvers.sparsegpt_shared([W[:6], W[6:]], H, "2:4", blocksize=32)), before[f"{name}/shared"],
             dtype)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("pattern", ["2:4", "50%"])
def test_quantized_shared_solve_equals_separate_solves(pattern, quantize):
    W, H = random_problem(rows=40, cols=64, seed=4)
    q, k, v = W[:24], W[24:32], W[32:]
    together = solvers.sparsegpt_shared([q, k, v], H, pattern, quantize=quantize, group_size=32, blocksize=32)
    for alone, stacked in zip((q, k, v), together):
        separate = solvers.sparsegpt(alone, H, pattern, quantize=quantize, group_size=32, blocksize=32)
        torch.testing.assert_close(stacked, separate, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_gptq_shared_solve_equals_separate_solves(quantize):
    W, H = random_problem(rows=40, cols=64, seed=5)
    q, k, v = W[:24], W[24:32], W[32:]
    together = solvers.gptq_shared([q, k, v], H, quantize, group_size=32, blocksize=32)
    for alone, stacked in zip((q, k, v), together):
        torch.testing.assert_close(stacked, solvers.gptq(alone, H, quantize, group_size=32, blocksize=32),
                                   rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("call, message", [
    (lambda W, H: solvers.sparsegpt(W, H, "2:4", quantize="int4", group_size=48), "group_size 48 does not divide"),
    (lambda W, H: solvers.sparsegpt(W, H, "2:4", quantize="int3"), "'int3' is not supported"),
    (lambda W, H: solvers.gptq(W, H, "int2"), "int8 or int4"),
    (lambda W, H: solvers.sparsegpt(W, H, "2:4", quantize="int4", group_size=0),
     "group_size = 0 must be a positive integer"),
    (lambda W, H: solvers.gptq(W, H, "int8", group_size=-128), "group_size = -128 must be a positive integer"),
    (lambda W, H: solvers.quantization_codes(W, "int4", 32), "not on an int4 grid"),
])
def test_bad_quantization_settings_raise_one_line(call, message):
    W, H = random_problem(rows=8, cols=64)
    with pytest.raises(QuantizationError, match=message) as caught:
        call(W, H)
    assert "\n" not in str(caught.value)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_cuda_graph_joint_loop_equals_eager(quantize):
    W, H = random_problem(rows=64, cols=256, dtype=torch.float32, seed=5)
    W, H = W.cuda(), H.cuda()
    graph = solvers.sparsegpt_shared([W[:40], W[40:]], H, "2:4", quantize=quantize, cuda_graph=True)
    eager = solvers.sparsegpt_shared([W[:40], W[40:]], H, "2:4", quantize=quantize, cuda_graph=False)
    for first, second in zip(graph, eager):
        assert torch.equal(first == 0, second == 0)
        torch.testing.assert_close(first, second, rtol=1e-5, atol=1e-5)


def test_capped_mask_spans_2of4_to_16of32_and_is_the_best_allowed_mask():
    """N:M+K: K = 0 is the 2:4 mask, K = M / 4 the plain N:M one; in between every group of M keeps N with at most K
    beyond 2 in its groups of 4, and (brute force on 8:16+1) no allowed mask has a larger total score."""
    import itertools

    from sparsedecoding.solvers import keep_mask

    score = torch.rand(32, 64, generator=torch.Generator().manual_seed(0))
    def mask(text: str) -> torch.Tensor:
        return keep_mask(score, SparsityPattern.parse(text))

    assert torch.equal(mask("16:32+0"), mask("2:4")) and torch.equal(mask("16:32+8"), mask("16:32"))
    kept = mask("16:32+3")
    per_four = kept.view(32, 2, 8, 4).sum(-1)
    assert kept.view(32, 2, 32).sum(-1).eq(16).all() and (per_four - 2).clamp_min(0).sum(-1).le(3).all()
    assert (per_four - 2).clamp_min(0).sum(-1).eq(3).any()  # the limit is used, not just respected
    small = torch.rand(12, 16, generator=torch.Generator().manual_seed(1))
    kept = keep_mask(small, SparsityPattern.parse("8:16+1"))
    for row in range(12):
        best = max(float(small[row, list(c)].sum()) for c in itertools.combinations(range(16), 8)
                   if sum(max(0, sum(i // 4 == g for i in c) - 2) for g in range(4)) <= 1)
        assert abs(float(small[row][kept[row]].sum()) - best) < 1e-5


def test_keeping_the_mask_of_a_capped_pattern_checks_the_cap():
    """`keep_zeros` with 16:32+K: a 16:32 weight with more than K kept beyond two in its groups of four is refused
    in one line; one within the cap passes."""
    from sparsedecoding.solvers import check_kept_zeros

    weight = torch.zeros(1, 32)
    weight[0, :16] = 1.0  # groups of four keep 4, 4, 4, 4: eight beyond two
    check_kept_zeros(weight, SparsityPattern.parse("16:32+8"))
    with pytest.raises(SparsityPatternError) as info:
        check_kept_zeros(weight, SparsityPattern.parse("16:32+2"))
    assert "more than 2 weights beyond two" in str(info.value) and "\n" not in str(info.value)
    within = torch.zeros(1, 32)
    within[0, [0, 1, 2, 4, 5, 6, 8, 9, 12, 13, 16, 17, 20, 21, 24, 28]] = 1.0  # 3, 3, 2, 2, 2, 2, 1, 1
    check_kept_zeros(within, SparsityPattern.parse("16:32+2"))



def _bad_weight_inputs():
    W, H = random_problem(rows=8, cols=64, dtype=torch.float32)[:2]
    nan_weight = W.clone()
    nan_weight[0, 0] = math.nan
    nan_hessian = H.clone()
    nan_hessian[3, 3] = math.nan
    return [
        ("1-D weight", W[0], H, SolverSettingsError, "2-D floating-point"),
        ("integer weight", torch.randint(-5, 6, (8, 64)), H, SolverSettingsError, "2-D floating-point"),
        ("meta weight", W.to("meta"), H, SolverSettingsError, "meta device"),
        ("no columns", W[:, :0], H[:0, :0], SolverSettingsError, "no input columns"),
        ("NaN weight", nan_weight, H, SolverSettingsError, "NaN or inf"),
        ("Hessian of other size", W, H[:32, :32], SolverSettingsError, r"\[64, 64\]"),
        ("1-D Hessian", W, H[0], SolverSettingsError, r"\[64, 64\]"),
        ("NaN on the Hessian's diagonal", W, nan_hessian, CalibrationError, "NaN or inf"),
    ]


@pytest.mark.parametrize("solver", ["sparsegpt", "gptq", "wanda"])
@pytest.mark.parametrize("case", _bad_weight_inputs(), ids=lambda case: case[0])
def test_bad_weights_and_hessians_are_named_before_solving(solver, case):
    _, weight, hessian, error, match = case
    call = {"sparsegpt": lambda: solvers.sparsegpt(weight, hessian, "2:4"),
            "gptq": lambda: solvers.gptq(weight, hessian, "int8"),
            "wanda": lambda: solvers.wanda(weight, hessian, "2:4")}[solver]
    with pytest.raises(error, match=match):
        call()


def test_magnitude_checks_the_weight_and_ignores_the_hessian():
    W = random_problem(rows=8, cols=64, dtype=torch.float32)[0]
    assert solvers.magnitude(W, torch.zeros(3), "2:4").shape == W.shape
    with pytest.raises(SolverSettingsError, match="NaN or inf"):
        solvers.magnitude(torch.full((4, 8), math.inf), None, "2:4")


def test_an_unstructured_share_prunes_the_columns_it_names():
    """100 · 0.29 is 28.999… in floating point: 29% of 100 columns is still 29 of them."""
    W, H = random_problem(rows=4, cols=100, dtype=torch.float64)[:2]
    for solver in (solvers.magnitude, solvers.wanda):
        assert int((solver(W, H, "29%") == 0).sum(1).min()) == 29


def test_quantization_codes_refuse_a_weight_with_nan():
    weight = torch.zeros(2, 32)
    weight[0, :4] = torch.tensor([1.0, 2.0, math.nan, 3.0])
    with pytest.raises(QuantizationError, match="NaN or inf"):
        solvers.quantization_codes(weight, "int8")


# --- Hessians at the edges: scale, dead inputs, asymmetry; float16 grids -------------------------------------------

def output_error(W, W_hat, H):
    """‖(W - Ŵ)X‖_F² through H = X·Xᵀ (up to H's constant factor)."""
    D = (W - W_hat).to(torch.float64)
    return float(torch.einsum("ij,jk,ik->", D, H.to(torch.float64), D))


@pytest.mark.parametrize("solve", ["sparsegpt", "gptq"])
def test_the_result_does_not_depend_on_the_hessians_scale_even_with_dead_inputs(solve):
    """A dead input (diag 0) gets a placeholder on the live inputs' scale: at activation scale 1e-3 it once set
    the damping a million times too high and the solve fell back to magnitude pruning / round-to-nearest."""
    W, H = random_problem(rows=16, cols=64, seed=3)
    H[5, :] = H[:, 5] = 0  # an input that was always zero
    run = (lambda h: solvers.sparsegpt(W, h, "2:4")) if solve == "sparsegpt" else \
        (lambda h: solvers.gptq(W, h, "int4", group_size=32))
    live = torch.ones(64, dtype=torch.bool)
    live[5] = False
    errors = [output_error(W[:, live], run(H * scale)[:, live], H[live][:, live]) for scale in (1.0, 1e-6, 1e-40)]
    assert errors[1] == pytest.approx(errors[0], rel=1e-3) and errors[2] == pytest.approx(errors[0], rel=1e-3)


def test_a_float64_hessian_far_outside_float32s_range_still_prunes():
    W, H = random_problem(rows=8, cols=32, seed=2)
    expected = solvers.sparsegpt(W.float(), H, "2:4")
    for scale in (1e-50, 1e39):
        torch.testing.assert_close(solvers.sparsegpt(W.float(), H * scale, "2:4"), expected)


def test_a_zero_or_asymmetric_hessian_is_refused_by_name():
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(CalibrationError, match="the Hessian is zero: no calibration input reached this layer"):
        solvers.gptq(W, torch.zeros(32, 32, dtype=torch.float64), "int8")
    lopsided = H.clone()
    lopsided[0, 5] += 50 * float(H.diagonal().mean())
    for solve in (lambda: solvers.sparsegpt(W, lopsided, "2:4"), lambda: solvers.gptq(W, lopsided.T, "int8")):
        with pytest.raises(CalibrationError, match="not symmetric"):
            solve()


@pytest.mark.parametrize("solve", ["gptq", "sparsegpt"])
@pytest.mark.parametrize("quantize", ["int4", "int8"])
def test_float16_results_stay_on_their_grid_for_tiny_weights(solve, quantize):
    """float16's smallest step is 2⁻²⁴: scales of groups with |w| near 1e-6 are rounded up to a multiple of it."""
    W, H = random_problem(rows=16, cols=64, seed=6, dtype=torch.float32)
    W = (W * 3e-6).half()
    out = solvers.gptq(W, H, quantize, group_size=32) if solve == "gptq" else \
        solvers.sparsegpt(W, H, "2:4", quantize=quantize, group_size=32)
    assert out.dtype == torch.float16
    codes = solvers.quantization_codes(out, quantize, group_size=32)
    assert torch.equal(codes.dequantize(torch.float16), out)


def test_codes_pushed_to_the_ends_of_the_range_are_warned_about(caplog):
    """Outlier inputs with a tiny damping: GPTQ's compensation outgrows the scales and half the int4 codes clip;
    at the default damping the same problem stays quiet."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(256, 64, generator=g) @ torch.randn(64, 1024, generator=g) / 8 \
        + 0.1 * torch.randn(256, 1024, generator=g)
    X[[44, 175, 201, 242]] *= 1e4
    W, H = torch.randn(128, 256, generator=g), 2 * X @ X.T / 1024
    with caplog.at_level("WARNING", logger="sparsedecoding.solvers"):
        solvers.gptq(W, H, "int4")
        assert "codes sit at the ends of the range" not in caplog.text
        solvers.gptq(W, H, "int4", percdamp=1e-6)
    assert "int4 codes sit at the ends of the range" in caplog.text and "a larger --percdamp" in caplog.text


def test_the_saturation_count_takes_each_visited_columns_own_scale_under_the_hessian_order(caplog):
    """order="hessian" runs the loop on permuted columns: each column's code is its value over its own group's
    scale, not the scale of the group its position falls in. Two groups of weights 10^4 apart, the small one's
    inputs heavier (so visited first): their codes stay in range in either order, and neither order warns."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(16, 256, generator=g)
    W[:, :128] *= 100.0
    W[:, 128:] *= 0.01
    X = torch.randn(256, 4096, generator=g)
    X[128:] *= 10.0
    H = 2 * X @ X.T / X.shape[1]
    assert solvers.hessian_order(solvers.normalized_hessian(H, torch.float32), 1)[0] >= 128  # permuted
    for order in ("columns", "hessian"):
        with caplog.at_level("WARNING", logger="sparsedecoding.solvers"):
            out = solvers.gptq(W, H, "int4", group_size=128, order=order)
        codes = solvers.quantization_codes(out, "int4", 128).codes.float()
        assert float(((codes <= -8) | (codes >= 7)).float().mean()) < solvers.SATURATED_SHARE
        assert "codes sit at the ends of the range" not in caplog.text, order


def test_a_cuda_graph_asked_for_cpu_weights_is_one_settings_error():
    W, H = random_problem(rows=8, cols=64, seed=2, dtype=torch.float32)
    for solve in (lambda: solvers.sparsegpt_shared([W], H, "2:4", cuda_graph=True),
                  lambda: solvers.gptq_shared([W], H, "int8", cuda_graph=True),
                  lambda: solvers.admm_shared([W], H, "2:4", iterations=2, cuda_graph=True)):
        with pytest.raises(SolverSettingsError, match="must be on a CUDA device"):
            solve()
