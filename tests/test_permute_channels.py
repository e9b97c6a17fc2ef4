"""`prune --permute-channels`: the column order it chooses drops less saliency than the weight's own, the layer it
reorders computes what it computed, the Hessians follow the weights, and a run interrupted after a reordered layer
resumes to the same weights (biases included)."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding import pipeline, solvers
from sparsedecoding.errors import SparseDecodingError, SparsityPatternError
from sparsedecoding.hessian import prunable_linears
from sparsedecoding.kernels.overflow import words_over_cap
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import prune
import test_pipeline
from helpers import char_tokenizer, random_hf_model, straight_and_resumed

prompts_file = test_pipeline.prompts_file  # the same fixture


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    """Qwen2, 3 layers, every parameter random: v's bias is nonzero, so a reordering that left it behind v's rows
    would show."""
    folder = tmp_path_factory.mktemp("permute") / "model"
    model = random_hf_model("qwen2", num_hidden_layers=3)
    assert model.model.layers[0].self_attn.v_proj.bias.abs().min() > 0
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = [1, 3], 0
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def config(folder, out, prompts, **overrides):
    return test_pipeline.config(folder, out, prompts, **{"permute_channels": "mlp+attention", **overrides})


def dropped(S, order, width=4, drop=2):
    return float(solvers.dropped_saliency(S[:, order], width, drop).sum())


def test_the_order_is_a_permutation_that_drops_less_than_clustered_columns():
    g = torch.Generator().manual_seed(0)
    S = torch.rand(64, 128, generator=g)
    S[:, :32] *= 50  # the strong columns sit together: 2:4 must drop half of them
    order = solvers.balanced_column_order(S, "2:4")
    assert sorted(order.tolist()) == list(range(128))
    identity = torch.arange(128)
    assert dropped(S, order) < 0.5 * dropped(S, identity)
    # 16:32 groups are 32 wide; 16:32+2 is balanced on its groups of four
    assert solvers.permutation_groups(SparsityPattern.parse("16:32")) == (32, 16)
    assert solvers.permutation_groups(SparsityPattern.parse("16:32+2")) == (4, 2)
    wide = solvers.balanced_column_order(S, "16:32")
    assert dropped(S, wide, 32, 16) <= dropped(S, identity, 32, 16)


@pytest.mark.parametrize("width,drop", [(4, 2), (4, 1), (4, 3), (8, 4), (32, 16)])
def test_a_swap_costs_what_sorting_the_new_group_says(width, drop):
    """without_each's closed form (the search's cost of a swap) against sorting every group with each column
    replaced, ties included (values drawn from a few levels)."""
    torch.manual_seed(width + drop)
    groups = torch.randint(0, 5, (3, 7, width)).float()
    incoming = torch.randint(0, 5, (3, 7)).float()
    kept, edge = solvers.without_each(groups, drop)
    for column in range(width):
        swapped = groups.clone()
        swapped[..., column] = incoming
        expected = swapped.sort(-1).values[..., :drop].sum(-1)
        assert torch.equal(kept[..., column] + torch.minimum(incoming, edge[..., column]), expected)


def test_an_order_that_cannot_help_leaves_the_columns_as_they_are():
    S = torch.ones(8, 16)  # every order drops the same
    assert torch.equal(solvers.balanced_column_order(S, "2:4"), torch.arange(16))
    with pytest.raises(SparsityPatternError, match="N:M patterns"):
        solvers.balanced_column_order(S, "50%")
    with pytest.raises(SparsityPatternError, match="groups of 4"):
        solvers.balanced_column_order(torch.ones(8, 18), "2:4")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_reordered_layer_computes_what_it_did_and_its_hessians_follow(arch):
    model = random_hf_model(arch)
    layer = model.model.layers[0]
    before = copy.deepcopy(layer)
    linears = prunable_linears(layer)
    g = torch.Generator().manual_seed(1)
    hessians = {}
    for name, linear in linears.items():
        X = torch.randn(256, linear.in_features, generator=g) * torch.rand(linear.in_features, generator=g) * 3
        hessians[name] = X.T @ X
    originals = {name: linear.weight.detach().clone() for name, linear in linears.items()}
    down_h, o_h = hessians["mlp.down_proj"].clone(), hessians["self_attn.o_proj"].clone()
    cfg = test_pipeline.config("m", "o", "p", permute_channels="mlp+attention")
    ratios = pipeline.permute_layer(cfg, SparsityPattern.parse("2:4"), layer, linears, hessians)
    assert set(ratios) == {"mlp.down_proj", "self_attn.o_proj"} and all(0 < r <= 1 for r in ratios.values())
    assert not torch.equal(linears["mlp.down_proj"].weight, originals["mlp.down_proj"])
    for name in ("self_attn.q_proj", "self_attn.k_proj"):  # not reordered
        assert torch.equal(linears[name].weight, originals[name])
    # the same layer output on any input
    hidden = torch.randn(2, 7, model.config.hidden_size, generator=g)
    position_ids = torch.arange(7)[None].expand(2, -1)
    rotary = model.model.rotary_emb(hidden, position_ids)
    expected = before(hidden, position_embeddings=rotary, position_ids=position_ids)
    got = layer(hidden, position_embeddings=rotary, position_ids=position_ids)
    expected, got = (x[0] if isinstance(x, tuple) else x for x in (expected, got))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # each reordered weight's loss form is the old one's: W H Wᵀ is unchanged when W's columns and H move together
    for name, old_h in (("mlp.down_proj", down_h), ("self_attn.o_proj", o_h)):
        W, old = linears[name].weight.double(), originals[name].double()
        torch.testing.assert_close(W @ hessians[name].double() @ W.T, old @ old_h.double() @ old.T)


def test_a_pruned_run_records_the_ratios_and_keeps_n_of_m(qwen_folder, prompts_file, tmp_path):
    out = prune(config(qwen_folder, tmp_path / "out", prompts_file), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["solver_options"]["permute_channels"] == "mlp+attention"
    ratios = [item["permuted_dropped_saliency"] for name, item in manifest["layers"].items()
              if name.endswith(("mlp.down_proj", "self_attn.o_proj"))]
    assert len(ratios) == 6 and all(0 < r <= 1 for r in ratios)
    for name, tensor in load_file(str(out / "model.safetensors")).items():
        if name.endswith("_proj.weight") and ".layers." in name:  # random weights: no zero of their own
            assert torch.all((tensor != 0).reshape(tensor.shape[0], -1, 4).sum(-1) == 2), name


def test_admm_16of32p2_permuted_keeps_its_pattern(qwen_folder, prompts_file, tmp_path):
    """plan-permute2.json's item: ADMM at 16:32+2 with the channels reordered against its 2:4 part's groups."""
    out = prune(config(qwen_folder, tmp_path / "out", prompts_file, pattern="16:32+2", solver="admm",
                       admm_iterations=10), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["solver_options"]["permute_channels"] == "mlp+attention"
    for name, tensor in load_file(str(out / "model.safetensors")).items():
        if name.endswith("_proj.weight") and ".layers." in name:  # random weights: no zero of their own
            assert torch.all((tensor != 0).reshape(tensor.shape[0], -1, 32).sum(-1) == 16), name
            assert words_over_cap(tensor, slots=2) == 0, name


def test_admm_2of4_with_int4_values_permuted_keeps_its_pattern_and_grid(qwen_folder, prompts_file, tmp_path):
    """plan-permute3.json's item: the channels reordered, ADMM's 2:4 mask, then int4 values rounded on the new order."""
    out = prune(config(qwen_folder, tmp_path / "out", prompts_file, solver="admm", admm_iterations=10,
                       quantize="int4", group_size=32), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["solver_options"]["permute_channels"] == "mlp+attention"
    weight = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"].float()
    kept = (weight != 0).reshape(weight.shape[0], -1, 4).sum(-1)  # a kept weight may round to a zero code
    assert torch.all(kept <= 2) and (kept == 2).float().mean() > 0.9
    groups = weight.reshape(weight.shape[0], -1, 32)  # at most 16 levels a group of 32 columns: int4 codes
    assert all(len(torch.unique(row)) <= 16 for row in groups.reshape(-1, 32))


def test_a_layer_left_dense_is_not_reordered(qwen_folder, prompts_file, tmp_path):
    out = prune(config(qwen_folder, tmp_path / "out", prompts_file, dense_linears="model.layers.1.mlp.down_proj"),
                progress=False)
    source, pruned = load_file(str(qwen_folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"  # left dense: as it was, so its MLP keeps its channel order
    assert torch.all(pruned[name] != 0)
    # as it was up to the rounding of the dtype the run loads in (bf16 on a GPU): reordered columns would differ
    torch.testing.assert_close(pruned[name].float(), source[name].float(), rtol=1e-2, atol=1e-3)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert "permuted_dropped_saliency" not in manifest["layers"]["model.layers.1.mlp.up_proj"]
    assert "permuted_dropped_saliency" in manifest["layers"]["model.layers.1.self_attn.o_proj"]


def test_an_interrupted_run_resumes_to_the_same_weights_and_biases(qwen_folder, prompts_file, tmp_path, monkeypatch):
    straight, resumed, record = straight_and_resumed(
        monkeypatch, lambda out: prune(config(qwen_folder, out, prompts_file, propagation="sequential"),
                                       progress=False), tmp_path, interrupt_on_call=2)
    assert record["timing"]["resumed_from_layer"] == 1
    bias = "model.layers.0.self_attn.v_proj.bias"  # reordered with v's rows in layer 0, restored on resumption
    source = load_file(str(qwen_folder / "model.safetensors"))[bias]
    assert not torch.equal(resumed[bias], source.to(resumed[bias].dtype))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_a_head_narrower_than_the_groups_keeps_its_value_order_and_says_so(caplog):
    model = random_hf_model("qwen2")  # head_dim 16: 16:32's groups of 32 span two heads
    layer = model.model.layers[0]
    linears = prunable_linears(layer)
    hessians = {name: torch.eye(linear.in_features) for name, linear in linears.items()}
    value = linears["self_attn.v_proj"].weight.detach().clone()
    cfg = test_pipeline.config("m", "o", "p", permute_channels="mlp+attention", pattern="16:32")
    with caplog.at_level("WARNING"):
        ratios = pipeline.permute_layer(cfg, SparsityPattern.parse("16:32"), layer, linears, hessians)
    assert set(ratios) == {"mlp.down_proj"} and torch.equal(linears["self_attn.v_proj"].weight, value)
    assert "head_dim 16 is not a multiple of 16:32's groups of 32" in caplog.text


@pytest.mark.parametrize("overrides", [dict(pattern="50%"), dict(pattern="dense", quantize="int8"),
                                       dict(target="dense", propagation="sequential")])
def test_settings_it_cannot_serve_are_one_error(overrides, tmp_path):
    cfg = test_pipeline.config("m", str(tmp_path / "o"), "p", permute_channels="mlp", **overrides)
    with pytest.raises(SparseDecodingError, match="--permute-channels mlp reorders channels for an N:M pattern"):
        cfg.check_values()


def test_a_grouped_order_keeps_every_column_in_its_run_and_drops_less_there():
    g = torch.Generator().manual_seed(2)
    S = torch.rand(32, 256, generator=g)
    S[:, :16] *= 50  # strong columns together in the first run of 64
    order = solvers.grouped_column_order(S, "2:4", 64)
    assert sorted(order.tolist()) == list(range(256))
    runs = order.view(4, 64) // 64
    assert torch.equal(runs, torch.arange(4)[:, None].expand(4, 64))
    assert dropped(S[:, :64], order[:64]) < 0.8 * dropped(S[:, :64], torch.arange(64))
    for start in (64, 128, 192):  # each run no worse than its own order
        part = order[start:start + 64] - start
        assert dropped(S[:, start:start + 64], part) <= dropped(S[:, start:start + 64], torch.arange(64))
    for block in (0, 30, 96):  # not groups of four, or not splitting 256 columns
        with pytest.raises(SparsityPatternError, match="runs of"):
            solvers.grouped_column_order(S, "2:4", block)


@pytest.mark.parametrize("pattern,block", [("2:4", 64), ("2:4", 128), ("16:32+2", 128), ("4:8", 256)])
def test_runs_searched_together_get_the_orders_their_own_searches_give(pattern, block):
    """grouped_column_order searches every run at once; each run must get exactly what balanced_column_order gives
    it alone (the same draws, disjoint pairs), including a run that keeps its own order and a chunk smaller than a
    round's pairs."""
    g = torch.Generator().manual_seed(block)
    S = torch.rand(24, 4 * block, generator=g) ** 3
    S[:, :block // 4] *= 30
    S[:, 2 * block:3 * block] = 1.0  # every order drops the same here: the run keeps its own
    for search in ({}, {"chunk": 3, "rounds": 7, "options": 5, "seed": 4}):
        alone = torch.cat([start + solvers.balanced_column_order(S[:, start:start + block], pattern, **search)
                           for start in range(0, S.shape[1], block)])
        assert torch.equal(solvers.grouped_column_order(S, pattern, block, **search), alone)
    assert torch.equal(alone[2 * block:3 * block], torch.arange(2 * block, 3 * block))


def column_moves(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """For each column of `after`, the index of the equal column of `before` (random weights: all columns differ)."""
    return torch.cdist(after.T.double(), before.T.double()).argmin(1)


@pytest.mark.parametrize("scope,quantize,moved_out", [("group", "int4", False), ("layer", "int4", True),
                                                      ("group", "none", True)])
def test_the_scope_keeps_columns_in_their_int4_groups(scope, quantize, moved_out):
    model = random_hf_model("qwen2")
    layer = model.model.layers[0]
    linears = prunable_linears(layer)
    g = torch.Generator().manual_seed(3)
    hessians = {}
    for name, linear in linears.items():
        scale = torch.rand(linear.in_features, generator=g) * 10  # columns of very different strength
        hessians[name] = torch.diag(scale ** 2)
    down = linears["mlp.down_proj"].weight.detach().clone()
    cfg = test_pipeline.config("m", "o", "p", permute_channels="mlp", permute_scope=scope, quantize=quantize,
                               group_size=16)
    pipeline.permute_layer(cfg, SparsityPattern.parse("2:4"), layer, linears, hessians)
    moves = column_moves(down, linears["mlp.down_proj"].weight.detach())
    own = torch.arange(down.shape[1])
    assert sorted(moves.tolist()) == own.tolist() and not torch.equal(moves, own)
    left = bool((moves // 16 != own // 16).any())
    assert left == moved_out


def test_scope_blocks():
    cfg = test_pipeline.config("m", "o", "p", permute_channels="mlp", quantize="int4", group_size=128)
    assert pipeline.scope_block(cfg, 8960, 8960) == 128  # down: its scale groups
    assert pipeline.scope_block(cfg, 1536, 128) is None  # o: a head's 128 columns are one scale group already
    assert pipeline.scope_block(cfg, 2048, 256) == 128  # a head wider than a group: one run a group
    small = test_pipeline.config("m", "o", "p", permute_channels="mlp", quantize="int4", group_size=64)
    assert pipeline.scope_block(small, 1536, 128) == 64
    for quantize, scope in (("int8", "group"), ("none", "group"), ("int4", "layer")):
        other = test_pipeline.config("m", "o", "p", permute_channels="mlp", quantize=quantize, permute_scope=scope)
        assert pipeline.scope_block(other, 8960, 8960) is None
