"""benchmarks/int4_rounding_linears_cpu.py without the real model: the Hessians its hooks sum per kind of position,
the sequences it cuts from a calibration set, and its two tables."""

from __future__ import annotations

import pytest
import torch

from helpers import benchmark_module


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.down_proj = torch.nn.Linear(3, 2, bias=False)


class Tiny(torch.nn.Module):
    """Embeds ids as 3-vectors and feeds them to the one block's down_proj (the only input hooked here)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 3)
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([Block()])

    def forward(self, input_ids):
        return self.model.layers[0].mlp.down_proj(self.embed(input_ids))


def test_hessians_sum_each_kind_of_position_apart(monkeypatch):
    script = benchmark_module(monkeypatch, "int4_rounding_linears_cpu")
    monkeypatch.setattr(script, "INPUTS", ["mlp.down_proj"])
    from sparsedecoding.calibration import CalibrationSet

    torch.manual_seed(0)
    model = Tiny()
    ids = torch.tensor([[0, 5, 1, 2, 3], [4, 6, 2, 2, 1]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    keep = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    sequences = script.calibration_sequences(CalibrationSet(ids, mask, keep, "test"), 0, 2, prompts=True)
    assert [len(found) for found, _ in sequences] == [4, 5]  # the left padding cut off
    sums = script.input_hessians(model, sequences, [0])
    x = model.embed.weight.detach().double()
    first = torch.tensor([[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)  # after the padding
    for kind, chosen in (("decode", keep), ("first", first), ("prompt", mask.bool() & ~keep & ~first)):
        rows = x[ids[chosen]]
        torch.testing.assert_close(sums[0, "mlp.down_proj", kind], rows.T @ rows)
    without_prompts = script.calibration_sequences(CalibrationSet(ids, mask, keep, "test"), 1, 2, prompts=False)
    assert len(without_prompts) == 1 and set(without_prompts[0][1]) == {"decode"}
    assert not model.model.layers[0].mlp.down_proj._forward_pre_hooks  # removed at the end


def test_tables_compare_each_rounding_with_the_loop(monkeypatch):
    script = benchmark_module(monkeypatch, "int4_rounding_linears_cpu")
    results = []
    for linear, factor in (("q", 0.5), ("down", 2.0)):
        for rounding in script.ROUNDINGS:
            ratio = 1.0 if rounding == "loop" else factor
            results.append({"layer": 3, "linear": linear, "rows": 4, "columns": 8, "rounding": rounding,
                            "fitted": 0.1 * ratio, "decode": 0.2 * ratio, "first": 0.5 * ratio, "prompt": 0.3,
                            "lee": 0.4 / ratio, "seconds": 1.0})
    summary = script.summary_table(results).splitlines()
    assert len(summary) == 2 + len(script.ROUNDINGS) - 1
    # geomean of 0.5 and 2.0 is 1; one of two linears lowered on fitted, decode and lee; none on prompt
    assert summary[2] == ("| scale search | 1.000, 1 of 2 | 1.000, 1 of 2 | 1.000, 1 of 2 | 1.000, 0 of 2 | "
                          "1.000, 1 of 2 |")
    each = script.report_table(results).splitlines()
    assert len(each) == 2 + len(results)
    assert ("| 3 | down | 4 x 8 | both | 0.2 | 2.000 | 0.4 | 2.000 | 1 | 2.000 | 0.3 | 1.000 | 0.2 | 0.500 | 1 |"
            in each)
    with pytest.raises(KeyError):  # a rounding without its loop row cannot be compared
        script.report_table([dict(results[1])])


def test_first_position_tables_compare_each_solve_with_the_chosen_control(monkeypatch):
    """int4_rounding_first_cpu.py: a summary row per (rounding, fit) other than the control, each score's geomean
    against the control's and how many linears it lowered."""
    script = benchmark_module(monkeypatch, "int4_rounding_first_cpu")
    results = []
    for linear, factor in (("q", 0.5), ("down", 4.0)):
        for rounding in script.ROUNDINGS:
            for fit in script.FITS:
                ratio = factor if fit != "decode" else 1.0
                results.append({"layer": 1, "linear": linear, "rounding": rounding, "fit": fit, "seconds": 2.0,
                                **{kind: (0.1 if rounding == "loop" else 0.05) * ratio for kind in script.SCORED}})
    summary = script.summary_table(results, ("loop", "decode")).splitlines()
    assert len(summary) == 2 + 3
    assert summary[2].startswith("| loop | decode + first | 1.414, 1 of 2 |")  # geomean of 0.5 and 4
    assert summary[3].startswith("| both | decode | 0.500, 2 of 2 |")
    against_first = script.summary_table(results, ("loop", "decode + first")).splitlines()
    assert against_first[2].startswith("| loop | decode | 0.707, 1 of 2 |")
    assert len(script.report_table(results).splitlines()) == 2 + len(results)


def test_fitted_sequences_are_whole_sequences_until_the_token_count(monkeypatch):
    script = benchmark_module(monkeypatch, "int4_rounding_linears_cpu")
    from sparsedecoding.calibration import CalibrationSet

    keep = torch.zeros(3, 6, dtype=torch.bool)
    for row, count in enumerate((3, 4, 5)):  # 3, 7 and 12 decode positions by the end of each sequence
        keep[row, :count] = True
    calibration = CalibrationSet(torch.zeros(3, 6, dtype=torch.long), torch.ones(3, 6, dtype=torch.long), keep, "t")
    assert [script.fitted_sequences(calibration, tokens) for tokens in (1, 3, 4, 7, 8, 100)] == [1, 1, 2, 2, 3, 3]
