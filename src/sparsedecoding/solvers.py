"""One-shot pruning solvers. Each takes a weight W [out, in], the layer Hessian H [in, in] of the reconstruction loss
‖W·X − Ŵ·X‖² (H = 2·X·Xᵀ/N) and a sparsity pattern, and returns the pruned weight in W's dtype. A solver never knows
where H came from."""

from __future__ import annotations

import logging

import torch

from .errors import CalibrationError, SparsityPatternError
from .patterns import SparsityPattern

log = logging.getLogger(__name__)

MAX_DAMPING = 1.0  # relative to the mean diagonal; beyond this H is too far from PD to trust the result


def check_pattern(weight: torch.Tensor, pattern: SparsityPattern) -> None:
    if pattern.is_nm and weight.shape[1] % pattern.m != 0:
        raise SparsityPatternError(f"{pattern} needs in_features divisible by {pattern.m}, got {weight.shape[1]}")


def keep_mask(score: torch.Tensor, pattern: SparsityPattern) -> torch.Tensor:
    """Boolean mask of kept entries: the N largest scores in each group of M consecutive columns of a row, or the
    (1 − sparsity) largest of each row for unstructured patterns."""
    rows, cols = score.shape
    if pattern.is_nm:
        groups = score.reshape(rows, cols // pattern.m, pattern.m)
        kept = torch.zeros_like(groups, dtype=torch.bool)
        kept.scatter_(2, groups.topk(pattern.n, dim=2).indices, True)
        return kept.reshape(rows, cols)
    n_pruned = int(cols * pattern.sparsity)
    kept = torch.ones_like(score, dtype=torch.bool)
    if n_pruned:
        kept.scatter_(1, score.topk(n_pruned, dim=1, largest=False).indices, False)
    return kept


def magnitude(weight: torch.Tensor, hessian: torch.Tensor | None, pattern: SparsityPattern | str) -> torch.Tensor:
    """Keep the largest |W| per row (or per N:M group); H is ignored."""
    pattern = SparsityPattern.parse(pattern)
    check_pattern(weight, pattern)
    return weight * keep_mask(weight.abs().float(), pattern)


def wanda(weight: torch.Tensor, hessian: torch.Tensor, pattern: SparsityPattern | str) -> torch.Tensor:
    """Wanda: score |W_ij|·‖X_j‖ = |W_ij|·sqrt(H_jj/2·N) (the constant does not change the order), compared within
    each output row (or each N:M group of a row)."""
    pattern = SparsityPattern.parse(pattern)
    check_pattern(weight, pattern)
    score = weight.abs().float() * hessian.diagonal().float().clamp(min=0).sqrt().to(weight.device)
    return weight * keep_mask(score, pattern)


def damped_inverse_cholesky(hessian: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor U of (H + λI)⁻¹ (so (H + λI)⁻¹ = Uᵀ·U), λ = percdamp · mean(diag H).

    If a factorisation fails, λ grows tenfold with a warning, up to MAX_DAMPING; past that it raises."""
    identity = torch.eye(hessian.shape[0], dtype=hessian.dtype, device=hessian.device)
    mean_diag = hessian.diagonal().mean()
    damping = percdamp
    while True:
        lower, info = torch.linalg.cholesky_ex(hessian + damping * mean_diag * identity)
        if info == 0:
            inverse = torch.cholesky_inverse(lower)
            upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
            if info == 0:
                return upper
        if damping * 10 > MAX_DAMPING:
            raise CalibrationError(f"the Hessian is not positive definite even with damping {damping:g}·mean(diag H); "
                                   f"calibrate on more tokens")
        log.warning("Cholesky failed with damping %g·mean(diag H); retrying with %g", damping, damping * 10)
        damping *= 10


def prune_block(WT: torch.Tensor, U1: torch.Tensor, d: torch.Tensor, pattern: SparsityPattern,
                segments: tuple[int, ...], pruned1: torch.Tensor, ErrT: torch.Tensor) -> None:
    """SparseGPT's in-block column loop, in place on the transposed block WT [B, rows] (column i is the row WT[i]).

    Fills `pruned1` [B, rows] (True = pruned) and `ErrT` [B, rows] (the scaled errors spread to later blocks) and leaves
    the updated weights in WT. `segments` are the row counts of weights stacked on one Hessian: the unstructured
    threshold is taken per segment so stacking never changes a weight's result."""
    pruned1.zero_()
    if not pattern.is_nm:
        score = WT.square() / d.square().unsqueeze(1)
        start = 0
        for rows in segments:
            block = score[:, start:start + rows]
            lowest = block.flatten().topk(int(block.numel() * pattern.sparsity), largest=False).indices
            chosen = torch.zeros(block.numel(), dtype=torch.bool, device=block.device)
            chosen.scatter_(0, lowest, torch.ones_like(lowest, dtype=torch.bool))  # no host scalar: graph-safe
            pruned1[:, start:start + rows] = chosen.view(block.shape)
            start += rows
    scale = pruned1.to(WT.dtype) / d.unsqueeze(1)  # 1/[U]_ii where pruned, 0 where kept
    for i in range(WT.shape[0]):
        if pattern.is_nm and i % pattern.m == 0:
            group = slice(i, i + pattern.m)
            score = WT[group].square() / d[group].square().unsqueeze(1)
            pruned1[group] = ~keep_mask(score.T, pattern).T
            scale[group] = pruned1[group].to(WT.dtype) / d[group].unsqueeze(1)
        torch.mul(WT[i], scale[i], out=ErrT[i])
        WT[i:].addr_(U1[i, i:], ErrT[i], alpha=-1)


class CapturedBlock:
    """`prune_block` for one shape captured as a CUDA graph: the loop issues a few hundred tiny kernels per block, and
    replaying them from a graph removes the per-launch host overhead that otherwise dominates the solver's time."""

    def __init__(self, rows: int, blocksize: int, pattern: SparsityPattern, segments: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device):
        self.WT = torch.zeros(blocksize, rows, dtype=dtype, device=device)
        self.U1 = torch.eye(blocksize, dtype=dtype, device=device)
        self.d = torch.ones(blocksize, dtype=dtype, device=device)
        self.pruned1 = torch.zeros(blocksize, rows, dtype=torch.bool, device=device)
        self.ErrT = torch.zeros(blocksize, rows, dtype=dtype, device=device)
        args = (self.WT, self.U1, self.d, pattern, segments, self.pruned1, self.ErrT)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside capture, as CUDA graphs require
            prune_block(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            prune_block(*args)

    def __call__(self, WT: torch.Tensor, U1: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.WT.copy_(WT)
        self.U1.copy_(U1)
        self.d.copy_(d)
        self.graph.replay()
        return self.WT, self.pruned1, self.ErrT


_captured: dict[tuple, CapturedBlock] = {}


@torch.no_grad()
def sparsegpt_shared(weights: list[torch.Tensor], hessian: torch.Tensor, pattern: SparsityPattern | str, *,
                     blocksize: int = 128, percdamp: float = 0.01, cuda_graph: bool | None = None
                     ) -> list[torch.Tensor]:
    """`sparsegpt` for several weights that read the same input (q/k/v, gate/up): their rows are stacked and solved
    against one Hessian factorisation, which gives exactly the per-weight results at a fraction of the launches.
    `cuda_graph` (default: on for CUDA tensors) replays the in-block loop from a captured graph; same arithmetic."""
    pattern = SparsityPattern.parse(pattern)
    for weight in weights:
        check_pattern(weight, pattern)
    if pattern.is_nm and blocksize % pattern.m != 0:
        raise SparsityPatternError(f"blocksize {blocksize} must be a multiple of M={pattern.m}")
    compute = torch.float64 if weights[0].dtype == torch.float64 else torch.float32
    W = torch.cat([weight.to(compute) for weight in weights])
    segments = tuple(weight.shape[0] for weight in weights)
    H = hessian.to(device=W.device, dtype=compute).clone()
    rows, cols = W.shape
    use_graph = W.is_cuda if cuda_graph is None else cuda_graph

    dead = H.diagonal() == 0  # inputs that were always zero: any weight there is free to prune
    H[dead, dead] = 1
    W[:, dead] = 0
    U = damped_inverse_cholesky(H, percdamp)
    U_diag = U.diagonal()

    pruned = torch.zeros(rows, cols, dtype=torch.bool, device=W.device)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        WT, U1, d = W[:, i1:i2].T.contiguous(), U[i1:i2, i1:i2], U_diag[i1:i2]
        if use_graph:
            key = (rows, i2 - i1, pattern, segments, compute, W.device)
            if key not in _captured:
                _captured[key] = CapturedBlock(rows, i2 - i1, pattern, segments, compute, W.device)
            WT, pruned1, ErrT = _captured[key](WT, U1, d)
        else:
            pruned1, ErrT = torch.empty_like(WT, dtype=torch.bool), torch.empty_like(WT)
            prune_block(WT, U1, d, pattern, segments, pruned1, ErrT)
        W[:, i1:i2] = WT.T
        pruned[:, i1:i2] = pruned1.T
        W[:, i2:].addmm_(ErrT.T, U[i1:i2, i2:], alpha=-1)
    W[pruned] = 0  # the in-block update leaves rounding-level residue on pruned entries
    return [part.to(weight.dtype) for part, weight in zip(W.split(segments), weights)]


def sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, pattern: SparsityPattern | str, *,
              blocksize: int = 128, percdamp: float = 0.01) -> torch.Tensor:
    """SparseGPT (OBS with lazy block updates). Columns are visited left to right; column i's pruned entries are set
    to zero and the error err = (w_i − q_i)/[U]_ii is spread over the columns j > i by w_j −= err·U_ij, where U is the
    upper Cholesky factor of (H + λI)⁻¹ (inside the block at once, to later blocks in one product per block).
    The mask is chosen from the current (already updated) weights with score w²/[U]_ii²: for unstructured patterns the
    lowest-scoring `sparsity` share of each block of `blocksize` columns (one threshold over the block, all rows), for
    N:M the M − N lowest of each row's group of M columns, chosen when the loop reaches the group.

    Computes in float64 if W is float64, else float32; H may be any float dtype; returns W's dtype."""
    return sparsegpt_shared([weight], hessian, pattern, blocksize=blocksize, percdamp=percdamp)[0]
