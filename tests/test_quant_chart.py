"""benchmarks/quant_chart.py on synthetic summaries and speed reports, and on the committed 8B speed report: the
speeds it reads, the points it leaves out as not measured, the issue 13 target line, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def chart(monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import quant_chart

    return quant_chart


def row(name: str, pattern: str, quantize: str | None, mean: float) -> dict:
    values = {"name": name, "pattern": pattern, "pass@1_fenced": mean + 0.01, "pass@1_plain": mean - 0.01,
              "pass@1_mean": mean, "kl": 0.01}
    return values if quantize is None else {**values, "quantize": quantize}  # the first round's rows have none


def chart_text(chart, tmp_path, rows: list[dict]) -> str:
    """The markdown the chart writes for held-out `rows` against the committed 8B speed report."""
    summary, out = tmp_path / "summary.json", tmp_path / "q.png"
    summary.write_text(json.dumps({"final": rows}))
    chart.main(["--summary", str(summary), "--speed", f"8B={BENCHMARKS / 'results' / 'quant_e2e_h200.md'}",
                "--out", str(out)])
    return out.with_suffix(".md").read_text()


SPEED_TABLE = """Copy bandwidth (device-to-device, read + write): 4.22 TB/s

| model | weights | batch | ms/step | tok/s per seq | tok/s total | vs dense | weight GB/step | achieved TB/s | % of copy | weights held GB | compile+capture s |
|---|---|---|---|---|---|---|---|---|---|---|---|
| qwen2.5-coder-1.5b | dense | 1 | 2.000 | 500.0 | 500.0 | 1.000x | 3.1 | 1.5 | 36% | 3.5 | 2.0 |
| qwen2.5-coder-1.5b | dense | 2 | 2.100 | 476.2 | 952.4 | 1.000x | 3.1 | 1.5 | 36% | 3.5 | 2.0 |
| qwen2.5-coder-1.5b | 16:32 | 1 | 1.600 | 625.0 | 625.0 | 1.250x | 1.9 | 1.2 | 28% | 2.3 | 1.0 |
| qwen2.5-coder-1.5b | 16:32 int8 | 1 | | not run: needs 99 GB | | | | | | | |
| qwen2.5-coder-1.5b | dense int4 g128 | 1 | 1.250 | 800.0 | 800.0 | 1.600x | 0.9 | 0.7 | 17% | 1.3 | 1.0 |
"""


def test_the_committed_8b_report_gives_its_batch_1_speeds(chart):
    speeds = chart.parse_speed_table(BENCHMARKS / "results" / "quant_e2e_h200.md")
    retired = speeds.pop("dense int8")  # that report's dense int8 ran PyTorch's kernel, which the code no longer runs
    assert retired[0] != retired[0] and "no longer runs" in retired[1]
    assert {label: value for label, (value, _) in speeds.items()} == {
        "dense": 204.7, "2:4": 264.1, "2:4 int8": 250.0, "dense int4 g128": 302.6, "2:4 int4 g128": 253.5}
    assert {model for _, model in speeds.values()} == {"llama-3.1-8b"}


def test_a_dense_int8_row_of_our_kernel_is_read(chart, tmp_path):
    report = tmp_path / "r.md"
    report.write_text("Dense int8 runs our `triton_w8` kernel (reports before 2026-12-01 ran PyTorch's "
                      "`_weight_int8pack_mm`), dense int4 PyTorch's.\n\n" + SPEED_TABLE.replace(
                          "| qwen2.5-coder-1.5b | 16:32 int8 | 1 | | not run: needs 99 GB | | | | | | | |",
                          "| qwen2.5-coder-1.5b | dense int8 | 1 | 1.5 | 666.0 | 666.0 | 1.3x | 1 | 1 | 1% | 1 | 1 |"))
    assert chart.parse_speed_table(report)["dense int8"] == (666.0, "qwen2.5-coder-1.5b")


def test_labels_are_the_bench_reports_weights_column(chart):
    from sparsedecoding.engine.bench import run_label
    from sparsedecoding.patterns import SparsityPattern

    for config in chart.CONFIGS:
        pattern = None if config.pattern == "dense" else SparsityPattern.parse(config.pattern)
        quantize = None if config.quantize == "none" else config.quantize
        head = None if config.head == "none" else config.head
        assert config.weights == run_label(pattern, quantize=quantize, group_size=chart.GROUP_SIZE, head=head)


def test_the_chart_draws_what_was_measured_and_lists_the_rest(chart, tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"final": [
        row("dense", "dense", None, 0.67), row("nm50-p16-fit", "16:32", None, 0.44),
        row("nm16-bf16-fit", "16:32", "none", 0.45), row("nm16-int8-fit", "16:32", "int8", 0.43),
        row("gptq-int4-fit", "dense", "int4", 0.60), row("gptq-int4-text", "dense", "int4", 0.55)]}))
    report = tmp_path / "qwen.md"
    report.write_text(SPEED_TABLE)
    extra = tmp_path / "more.json"
    # dense: the report's value wins the dense row, but 16:32 int8's ratio is against its own file's dense (one run)
    extra.write_text(json.dumps({"16:32 int8": 700.0, "dense": 350.0}))
    out = tmp_path / "chart" / "q.png"
    assert chart.main(["--summary", str(summary), "--speed", f"Qwen={report},{extra}", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = out.with_suffix(".md").read_text()
    assert "| 16:32 bf16 | decode | nm16-bf16-fit | 0.460 | 0.440 | 0.450 | 0.0100 | 625.0 (1.25x) |" in text
    assert "| 16:32 int8 | decode | nm16-int8-fit | 0.440 | 0.420 | 0.430 | 0.0100 | 700.0 (2.00x) |" in text
    assert "| dense int4 | text | gptq-int4-text | 0.560 | 0.540 | 0.550 | 0.0100 | 800.0 (1.60x) |" in text
    assert "| dense int8 | decode | - | - | - | - | - | not measured |" in text
    assert "- dense int8, decode: no held-out result (items gptq-int8-fit)" in text
    assert "- dense bf16 in Qwen" not in text and "- 16:32 int8, decode in Qwen" not in text
    assert "- 16:32 int4, decode: no held-out result" in text
    assert "- Qwen: qwen.md: qwen2.5-coder-1.5b" in text and "- Qwen: more.json: more.json" in text
    assert "nm16-int8-fit 0.430 vs nm16-bf16-fit 0.450: 0.020 below (met)" in text


def test_a_missing_speed_is_listed_never_filled_in(chart, tmp_path):
    text = chart_text(chart, tmp_path, [row("nm50-p16-fit", "16:32", None, 0.44),
                                        row("nm16-int8-fit", "16:32", "int8", 0.40)])
    assert "| 16:32 bf16 | decode | nm50-p16-fit | 0.450 | 0.430 | 0.440 | 0.0100 | not measured |" in text
    assert "- 16:32 int8, decode in 8B: no batch-1 speed for weights `16:32 int8`" in text
    assert "nm16-int8-fit 0.400 vs nm50-p16-fit 0.440: 0.040 below (missed by 0.010)" in text


@pytest.mark.parametrize("argv,expected", [
    (["--summary", "missing.json"], "quality summary missing.json does not exist"),
    (["--speed", "no-title"], "is not TITLE=FILE"),
    (["--speed", "8B=missing.md"], "speed report missing.md does not exist"),
])
def test_bad_inputs_are_one_error_line(chart, tmp_path, argv, expected):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"final": []}))
    base = ["--summary", str(summary)] if "--summary" not in argv else []
    with pytest.raises(SystemExit, match=expected):
        chart.main(base + argv + ["--out", str(tmp_path / "q.png")])


def test_a_row_of_another_configuration_is_refused(chart, tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"final": [row("nm16-int8-fit", "16:32", "int4", 0.4)]}))
    with pytest.raises(SystemExit, match="nm16-int8-fit is 16:32 int4, not 16:32 int8, decode"):
        chart.main(["--summary", str(summary), "--out", str(tmp_path / "q.png")])


def test_it_runs_on_the_committed_files_alone(chart, tmp_path):
    out = tmp_path / "q.png"
    assert chart.main(["--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert "| dense bf16 | none | dense | 0.659 | 0.683 | 0.671 |" in text  # the first round's held-out dense row
    # the held-out 16:32 + int8 row of the committed quality rounds and its target line
    assert "| 16:32 int8 | decode | nm16-int8-fit | 0.463 | 0.354 | 0.409 |" in text
    assert "- 16:32: nm16-int8-fit 0.409 vs nm16-bf16-fit 0.409: equal (met)" in text


def test_repaired_pairs_get_their_own_target_line_and_old_rows_without_quantize_count_as_bf16(chart, tmp_path):
    old_row = {**row("2of4-p2-broad-seq-repair-lr1e5", "2:4", None, 0.28), "quantize": None}  # before issue 13
    text = chart_text(chart, tmp_path, [old_row, row("p2r-int8", "2:4", "int8", 0.24),
                                        row("check-p16-fit-repair-lr1e5", "16:32", None, 0.48)])
    assert "- 2:4, repaired: p2r-int8 0.240 vs 2of4-p2-broad-seq-repair-lr1e5 0.280: 0.040 below (missed by 0.010)" \
        in text
    assert "- 16:32, repaired: not measured" in text
    assert "| 2:4 int8 | decode + repair | p2r-int8 | 0.250 | 0.230 | 0.240 | 0.0100 | 250.0 (1.22x) |" in text


def test_a_head_point_is_paired_with_its_own_rounds_control_and_leaves_the_plain_pair_alone(chart, tmp_path):
    text = chart_text(chart, tmp_path, [row("p2r-bf16", "2:4", None, 0.30), row("p2r-int8", "2:4", "int8", 0.29),
                                        row("q4-p2r-bf16", "2:4", None, 0.36),
                                        row("q4-p2r-int8-h4", "2:4", "int8", 0.32)])
    assert "- 2:4, repaired: p2r-int8 0.290 vs p2r-bf16 0.300: 0.010 below (met)" in text
    assert "- 2:4, repaired, int4 head: q4-p2r-int8-h4 0.320 vs q4-p2r-bf16 0.360: 0.040 below (missed by 0.010)" \
        in text


def test_a_panel_of_runs_with_different_dense_speeds_is_flagged_and_one_of_close_runs_is_not(chart, tmp_path):
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text(SPEED_TABLE)
    dense_row = next(line for line in SPEED_TABLE.splitlines() if line.startswith("| qwen2.5-coder-1.5b | dense | 1 |"))
    cells = dense_row.split("|")
    faster = float(cells[5]) * 1.2
    only_dense = "\n".join(line for line in SPEED_TABLE.splitlines() if "16:32" not in line)  # 16:32 from a.md
    second.write_text(only_dense.replace(dense_row, "|".join(cells[:5] + [f" {faster:.1f} "] + cells[6:])))
    warning = chart.mixed_runs([("P", chart.read_panel([second, first]))])
    assert len(warning) == 2 and "the P panel mixes runs" in warning[1] and "a.md 500.0" in warning[1]
    assert chart.mixed_runs([("P", chart.read_panel([first, second]))]) == []  # every row from a.md


def test_a_retired_row_gives_way_to_a_later_files_measured_row_and_nothing_else_does(chart, tmp_path):
    """A dense int8 row that ran PyTorch's retired kernel (NaN) is replaced by a later report's row of our kernel;
    a measured row of an earlier file is never replaced."""
    retired = tmp_path / "old.md"
    retired.write_text("Dense int8 runs PyTorch's `_weight_int8pack_mm`.\n\n" + SPEED_TABLE.replace(
        "| qwen2.5-coder-1.5b | 16:32 int8 | 1 | | not run: needs 99 GB | | | | | | | |",
        "| qwen2.5-coder-1.5b | dense int8 | 1 | 9.0 | 111.0 | 111.0 | 0.2x | 1 | 1 | 1% | 1 | 1 |"))
    later = tmp_path / "new.md"
    later.write_text("Dense int8 runs our `triton_w8` kernel.\n\n" + SPEED_TABLE.replace(
        "| qwen2.5-coder-1.5b | 16:32 int8 | 1 | | not run: needs 99 GB | | | | | | | |",
        "| qwen2.5-coder-1.5b | dense int8 | 1 | 1.5 | 666.0 | 666.0 | 1.3x | 1 | 1 | 1% | 1 | 1 |").replace(
        "| 16:32 | 1 | 1.600 | 625.0 | 625.0 |", "| 16:32 | 1 | 1.500 | 700.0 | 700.0 |"))
    panel = chart.read_panel([retired, later])
    assert panel["dense int8"][:2] == (666.0, "new.md: qwen2.5-coder-1.5b")
    assert panel["16:32"][:2] == (625.0, "old.md: qwen2.5-coder-1.5b")
