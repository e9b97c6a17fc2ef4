"""`keep_zeros`: SparseGPT with the mask a weight already has (quantizing or re-fitting a pruned, possibly repaired
model): the mask is kept exactly, the kept values land on the grid, the result equals a float64 column-by-column
reference, and the layer loss is no worse than rounding the kept values to the nearest grid point; weights that are
not N:M sparse are refused in one line; and `prune --keep-mask` on a pruned checkpoint keeps its masks."""

from __future__ import annotations

import json

import pytest
import torch

from sparsedecoding import SparsityPatternError, solvers

from test_solvers import layer_loss, random_problem, round_to_nearest


def pruned_problem(pattern="2:4", rows=16, cols=96, seed=11):
    """A weight pruned by SparseGPT (so its kept values carry a solver's compensation) and its Hessian."""
    W, H = random_problem(rows=rows, cols=cols, seed=seed)
    return solvers.sparsegpt(W, H, pattern, blocksize=32), H


def reference_fixed_mask(W, H, quantize, group_size, percdamp=0.01):
    """OBS with a fixed mask, column by column in float64, no lazy blocks: column i's kept entries rounded to the grid
    (scales from the kept weights' group, taken when the group's first column is reached; int8 one scale a row from
    an unquantized fixed-mask pass first), its zeros kept at 0, the error spread to the columns right of it."""
    W, H = W.clone().double(), H.clone().double()
    pruned = W == 0
    rows, cols = W.shape
    U = solvers.damped_inverse_cholesky(H, percdamp)

    def column_pass(W, scales):
        for i in range(cols):
            w = W[:, i]
            if scales is None:
                q = w.masked_fill(pruned[:, i], 0)
            else:
                q = solvers.round_to_grid(w, scales[:, i], quantize).masked_fill(pruned[:, i], 0)
            err = (w - q) / U[i, i]
            W[:, i:] -= err[:, None] * U[i, i:][None, :]
            W[:, i] = q
        return W

    if quantize == "int8":
        first = column_pass(W.clone(), None)
        scales = solvers.grid_scale(first.abs().amax(1), quantize)[:, None].expand(rows, cols)
    else:
        scales = torch.empty(rows, cols, dtype=W.dtype)
        out = W.clone()
        for g in range(0, cols, group_size):  # each group's scale from its weights when the group starts
            scales[:, g:g + group_size] = solvers.grid_scale(out[:, g:g + group_size].abs().amax(1),
                                                             quantize)[:, None]
            for i in range(g, g + group_size):
                w = out[:, i]
                q = solvers.round_to_grid(w, scales[:, i], quantize).masked_fill(pruned[:, i], 0)
                err = (w - q) / U[i, i]
                out[:, i:] -= err[:, None] * U[i, i:][None, :]
                out[:, i] = q
        return out
    return column_pass(W, scales)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("pattern", ["2:4", "16:32"])
def test_mask_kept_grid_exact_and_equal_to_the_reference(pattern, quantize):
    W, H = pruned_problem(pattern)
    ours = solvers.sparsegpt(W, H, pattern, quantize=quantize, group_size=32, blocksize=32, keep_zeros=True)
    assert bool((ours[W == 0] == 0).all())  # every pruned entry stays pruned (a kept one may round to code 0)
    assert float((ours != 0).float().mean()) > 0.45
    grid = solvers.quantization_codes(ours, quantize, 32)
    assert torch.equal(grid.dequantize(ours.dtype), ours)  # on the grid exactly
    reference = reference_fixed_mask(W, H, quantize, 32)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_loss_no_worse_than_rounding_the_kept_values(quantize):
    W, H = pruned_problem("2:4", rows=32, cols=128, seed=12)
    ours = solvers.sparsegpt(W, H, "2:4", quantize=quantize, group_size=32, keep_zeros=True)
    rounded = round_to_nearest(W, quantize, 32)  # prune-then-round: the same mask, kept values to the nearest point
    assert bool((rounded[W == 0] == 0).all()) and bool((ours[W == 0] == 0).all())
    assert layer_loss(W, ours, H) <= layer_loss(W, rounded, H)


def test_without_quantization_it_changes_nothing():
    """With the mask fixed and no rounding, each column's error is zero (its pruned entries are zero already), so the
    weight comes back unchanged on any Hessian: the weight is its own target (why the CLI asks for --quantize)."""
    W, H = pruned_problem("2:4")
    _, other = random_problem(rows=16, cols=96, seed=13)
    for hessian in (H, other):
        torch.testing.assert_close(solvers.sparsegpt(W, hessian, "2:4", keep_zeros=True), W, rtol=0, atol=1e-12)


def test_a_weight_that_is_not_pruned_is_refused_in_one_line():
    W, H = random_problem(rows=8, cols=32)
    with pytest.raises(SparsityPatternError, match="groups of 4 columns have fewer than 2 zeros") as caught:
        solvers.sparsegpt(W, H, "2:4", keep_zeros=True)
    assert "\n" not in str(caught.value)
    pruned, _ = pruned_problem("16:32", rows=8, cols=64)
    with pytest.raises(SparsityPatternError, match="N:M pattern"):
        solvers.sparsegpt(pruned, torch.eye(64, dtype=pruned.dtype), "50%", keep_zeros=True)


def test_shared_solve_equals_separate_solves():
    W, H = pruned_problem("2:4", rows=12, cols=64, seed=14)
    W2 = solvers.sparsegpt(random_problem(rows=8, cols=64, seed=15)[0], H, "2:4")
    a, b = solvers.sparsegpt_shared([W, W2], H, "2:4", quantize="int4", group_size=32, keep_zeros=True)
    assert torch.equal(a, solvers.sparsegpt(W, H, "2:4", quantize="int4", group_size=32, keep_zeros=True))
    assert bool((b[W2 == 0] == 0).all())


def test_prune_keep_mask_quantizes_a_pruned_checkpoint_without_moving_its_masks(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from sparsedecoding.packed import load_packed_checkpoint, pack_checkpoint
    from sparsedecoding.pipeline import PruneConfig, prune

    from helpers import make_tiny_model

    source = make_tiny_model(tmp_path / "bf16")
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(torch.bfloat16).save_pretrained(source)
    common = dict(calibration="text", tokens=32, text_seq_len=16, batch_size=2, device="cpu")
    pruned_dir = prune(PruneConfig(model=str(source), out=str(tmp_path / "pruned"), pattern="2:4", **common),
                       progress=False)
    out = prune(PruneConfig(model=str(pruned_dir), out=str(tmp_path / "int8"), pattern="2:4", quantize="int8",
                            keep_mask=True, **common), progress=False)
    record = json.loads((out / "sparsedecoding.json").read_text())
    # the default solver is admm, but with the mask kept only SparseGPT's loop runs: the record says so
    assert record["solver"] == "sparsegpt" and record["solver_options"]["admm_iterations"] is None
    before = load_file(str(pruned_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    checked = 0
    for name, weight in before.items():
        if (weight == 0).float().mean() > 0.45 and weight.dim() == 2 and "embed" not in name:
            assert bool((after[name][weight == 0] == 0).all()), name  # every pruned weight stays pruned
            assert not torch.equal(after[name], weight), name  # and the kept ones moved onto the grid
            checked += 1
    assert checked == 2 * 7  # every linear of the two layers
    manifest = pack_checkpoint(out, tmp_path / "packed", pattern="2:4", quantize="int8")
    state, _ = load_packed_checkpoint(tmp_path / "packed")
    for name, info in manifest["tensors"].items():
        if "pattern" in info:
            assert torch.equal(state[name].to_dense(torch.bfloat16), after[name])


@pytest.mark.parametrize("settings, message", [
    (dict(pattern="2:4", keep_mask=True), "needs the model's N:M --pattern"),
    (dict(pattern="50%", keep_mask=True, quantize="int8"), "--keep-mask"),
    (dict(pattern="dense", keep_mask=True, quantize="int8"), "--keep-mask"),
])
def test_keep_mask_settings_fail_in_one_line(tmp_path, settings, message):
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.pipeline import PruneConfig

    with pytest.raises(SparseDecodingError, match=message) as caught:
        PruneConfig(model="m", out=str(tmp_path / "o"), calibration="text", tokens=32, **settings).validate()
    assert "\n" not in str(caught.value)


def test_keep_mask_on_an_unpruned_model_fails_before_calibration_and_leaves_nothing(tmp_path, monkeypatch):
    from sparsedecoding import pipeline
    from sparsedecoding.pipeline import PruneConfig, prune

    from helpers import make_tiny_model

    source = make_tiny_model(tmp_path / "dense")

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibration started before the mask was checked")

    monkeypatch.setattr(pipeline, "build_calibration", no_calibration)
    out = tmp_path / "out"
    with pytest.raises(SparsityPatternError, match="fewer than 2 zeros") as caught:
        prune(PruneConfig(model=str(source), out=str(out), pattern="2:4", quantize="int8", keep_mask=True,
                          calibration="text", tokens=32, text_seq_len=16, device="cpu"), progress=False)
    assert "\n" not in str(caught.value)
    assert not out.exists() and not (tmp_path / "out.partial").exists()
