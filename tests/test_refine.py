import json

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.hessian import prunable_linears
from sparsedecoding.models import load_model
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import PruneConfig, first_layer_inputs, prune, run_layer
from sparsedecoding.refine import refine_layer
from sparsedecoding.solvers import magnitude
from tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("refine") / "model", num_hidden_layers=2)


def layer_problem(folder, keep_every=2):
    """Layer 0 of the tiny model, magnitude-pruned to 2:4, its replay batches (every `keep_every`-th position kept)
    and the dense layer's outputs on them."""
    model, _, _ = load_model(folder, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (8, 24), generator=generator)
    keep = torch.zeros(8, 24, dtype=torch.bool)
    keep[:, ::keep_every] = True
    calib = CalibrationSet(ids, torch.ones_like(ids), keep, source="test")
    with torch.no_grad():
        batches = first_layer_inputs(model, calib, 2, torch.device("cpu"))
        layer = model.model.layers[0]
        targets = run_layer(layer, batches)
        linears = prunable_linears(layer)
        for linear in linears.values():
            linear.weight.copy_(magnitude(linear.weight, None, SparsityPattern.parse("2:4")))
    return layer, linears, batches, targets


def snapshot(linears):
    return {name: linear.weight.detach().clone() for name, linear in linears.items()}


def test_refinement_lowers_the_held_out_error_and_keeps_every_zero(tiny_folder):
    layer, linears, batches, targets = layer_problem(tiny_folder)
    solver = snapshot(linears)
    stats = refine_layer(layer, linears, batches, targets, steps=60, lr=3e-3)
    assert stats["kept"] and stats["held_out_error_after"] < 0.9 * stats["held_out_error_before"]
    assert all(p.grad is None and p.requires_grad for p in layer.parameters())  # no side effect on the model
    for name, linear in linears.items():
        assert torch.all(linear.weight[solver[name] == 0] == 0), name  # the mask is unchanged
        assert not torch.equal(linear.weight, solver[name]), name  # the kept weights moved
        counts = (linear.weight != 0).reshape(linear.weight.shape[0], -1, 4).sum(-1)
        assert torch.all(counts <= 2), name


def test_a_refinement_that_does_worse_on_the_held_out_batch_is_discarded(tiny_folder):
    layer, linears, batches, targets = layer_problem(tiny_folder)
    solver = snapshot(linears)
    stats = refine_layer(layer, linears, batches, targets, steps=5, lr=10.0)  # far too large: it diverges
    assert not stats["kept"] and stats["held_out_error_after"] > stats["held_out_error_before"]
    assert all(torch.equal(linear.weight, solver[name]) for name, linear in linears.items())


def test_positions_that_are_not_kept_never_count(tiny_folder):
    layer, linears, batches, targets = layer_problem(tiny_folder)
    solver = snapshot(linears)
    refine_layer(layer, linears, batches, targets, steps=10, lr=1e-3)
    first = snapshot(linears)
    for name, linear in linears.items():
        linear.weight.data.copy_(solver[name])
    noisy = [torch.where(kept[..., None], target, torch.randn_like(target) * 100)
             for target, (_, _, kept) in zip(targets, batches)]
    refine_layer(layer, linears, batches, noisy, steps=10, lr=1e-3)
    assert all(torch.equal(linear.weight, first[name]) for name, linear in linears.items())


def test_the_positions_given_are_the_ones_fitted(tiny_folder):
    layer, linears, batches, targets = layer_problem(tiny_folder)
    solver = snapshot(linears)
    everywhere = [torch.ones_like(kept) for _, _, kept in batches]
    refine_layer(layer, linears, batches, targets, steps=10, lr=1e-3, positions=everywhere)
    first = snapshot(linears)
    for name, linear in linears.items():
        linear.weight.data.copy_(solver[name])
    noisy = [torch.where(kept[..., None], target, target + 1.0) for target, (_, _, kept) in zip(targets, batches)]
    refine_layer(layer, linears, batches, noisy, steps=10, lr=1e-3, positions=everywhere)
    assert any(not torch.equal(linear.weight, first[name]) for name, linear in linears.items())


def test_refinement_input_errors(tiny_folder):
    layer, linears, batches, targets = layer_problem(tiny_folder)
    with pytest.raises(SparseDecodingError, match="at least two"):
        refine_layer(layer, linears, batches[:1], targets[:1], steps=5, lr=1e-3)
    with pytest.raises(SparseDecodingError, match="positive"):
        refine_layer(layer, linears, batches, targets, steps=0, lr=1e-3)
    with pytest.raises(SparseDecodingError, match="refine-steps"):
        PruneConfig(model="m", out="x", refine_steps=-1).validate()


def test_prune_with_refinement_fits_real_tokens_records_it_and_keeps_the_masks(tiny_folder, tmp_path, monkeypatch):
    from sparsedecoding import pipeline

    fitted = []

    def spy(layer, linears, batches, targets, steps, lr, seed=0, positions=None):
        fitted.append((sum(int(kept.sum()) for _, _, kept in batches), sum(int(p.sum()) for p in positions)))
        return refine_layer(layer, linears, batches, targets, steps, lr, seed, positions)

    monkeypatch.setattr(pipeline, "refine_layer", spy)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\nsort a list\nhello world\nprint numbers\nx = 1\nloop\n")
    out = prune(PruneConfig(model=str(tiny_folder), out=str(tmp_path / "out"), prompts=str(prompts), tokens=36,
                            max_new_tokens=16, batch_size=2, gen_batch_size=4, refine_steps=20, refine_lr=1e-3),
                progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert sorted(manifest["refinement"]) == ["0", "1"]
    # every real token is fitted (prompt positions too), not only the kept decode positions
    assert len(fitted) == 2 and all(real > kept for kept, real in fitted)
    assert manifest["solver_options"]["refine_steps"] == 20
    assert all({"held_out_error_before", "held_out_error_after", "kept"} <= stats.keys()
               for stats in manifest["refinement"].values())
    for name, tensor in load_file(str(out / "model.safetensors")).items():
        if name.endswith(("q_proj.weight", "down_proj.weight")):
            counts = (tensor != 0).reshape(tensor.shape[0], -1, 4).sum(-1)
            assert torch.all(counts <= 2) and (counts == 2).float().mean() > 0.99, name
