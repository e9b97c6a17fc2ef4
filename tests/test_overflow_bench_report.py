"""benchmarks/overflow_bench.py's tables on synthetic measurements (no GPU: they only read Row times): each column
is the geomean over the shapes of cuBLAS time over the column's time, the loop orders side by side."""

from __future__ import annotations

import pytest

from helpers import benchmark_module


@pytest.fixture
def bench(monkeypatch):
    return benchmark_module(monkeypatch, "overflow_bench")


def row(bench, shape: str, batch: int, dense: float, fused_rows: float, fused_slots: float):
    r = bench.Row("llama-3.1-8b", shape, 4096, 4096, batch)
    r.times = {"dense": dense, "op16": 2 * dense, "sp24": dense / 2, "slots": dense, "both": 1.5 * dense,
               "fused:rows": fused_rows, "fused:slots": fused_slots, "fused": fused_rows, "split": dense / 4,
               "split_kernels": dense / 8}
    return r


def test_summary_columns_are_geomeans_over_shapes(bench):
    rows = [row(bench, "o", 1, 8.0, 4.0, 4.0), row(bench, "qkv", 1, 8.0, 16.0, 4.0)]
    lines = bench.summary(rows).splitlines()
    # fused: geomean(2, 0.5) = 1, min 0.5; two launches 1/1.5; the 16:32 op 0.5; sp24 2; fused vs op:
    # geomean(16/4, 16/16) = 2; fused over sp24: geomean(4/4, 16/4) = 2
    # the split: 4x cuBLAS (min 4x), 8x without the transpose
    assert lines[2] == "| 1 | 1.00x (0.50x) | 0.67x | 0.50x | 2.00x | 2.00x | 2.00x | 4.00x (4.00x) | 8.00x |"
    loops = bench.loop_summary(rows, ["rows", "slots"]).splitlines()
    assert loops[0] == "| batch | fused, rows | fused, slots |"
    assert loops[2] == "| 1 | 1.00x | 2.00x |"


def test_baseline_table_compares_each_batch_with_its_baseline_launch(bench):
    rows = [row(bench, "o", 1, 8.0, 4.0, 4.0), row(bench, "qkv", 1, 8.0, 2.0, 4.0)]
    rows[0].times["fused:baseline"], rows[1].times["fused:baseline"] = 8.0, 2.0
    lines = bench.baseline_summary(rows, {"SPARSEDECODING_SP24_EARLY_TRIGGER": "0"}).strip().splitlines()
    assert lines[0] == "## The fused kernel against the baseline settings (SPARSEDECODING_SP24_EARLY_TRIGGER=0)"
    # now: 2x and 4x cuBLAS (geomean 2.83x, min 2x); baseline 1x and 4x (2x, min 1x); time ratios 2 and 1
    assert lines[4] == "| 1 | 2.83x (2.00x) | 2.00x (1.00x) | 1.414x |"


def test_a_bad_baseline_setting_is_one_error_line_before_any_gpu_work(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--baseline", "SPARSEDECODING_SP24_EARLY_TRIGGER=2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: --baseline: SPARSEDECODING_SP24_EARLY_TRIGGER='2'; use 1" in err[-1]


def test_baseline_table_takes_the_alternated_times_and_the_details_name_the_baseline_launch(bench):
    """With --baseline cuBLAS, the fused kernel and its baseline launch are timed alternately: the baseline table
    compares those medians (not the single timings), and each shape's row names the baseline's launch and time."""
    rows = [row(bench, "o", 1, 8.0, 4.0, 4.0)]
    rows[0].times.update({"fused:baseline": 4.0, "fused:paired": 2.0, "dense:paired": 8.0, "slots_cuda": 1.0})
    rows[0].fused_launch = {"rows": "1/4s+e", "baseline": "2"}
    rows[0].sp24_launch, rows[0].slot_config = "1/4s", "N32xW16 w4"
    rows[0].checks = {"fused": 0.5, "both": 0.5, "op16": 0.5, "split": 0.5}
    rows[0].bytes = {"fused": 1e6}
    lines = bench.baseline_summary(rows, {"SPARSEDECODING_SP24_EARLY_TRIGGER": "auto"}).strip().splitlines()
    assert lines[4] == "| 1 | 4.00x (4.00x) | 2.00x (2.00x) | 2.000x |"
    rows[0].times["dense:paired"] = 4.0  # cuBLAS's median, not its single timing (8), in both columns
    lines = bench.baseline_summary(rows, {"SPARSEDECODING_SP24_EARLY_TRIGGER": "auto"}).strip().splitlines()
    assert lines[4] == "| 1 | 2.00x (2.00x) | 1.00x (1.00x) | 2.000x |"
    detail = bench.details(rows, 1e12, ["rows"]).splitlines()[2]
    assert "| 8000000.0 | 16000000.0 | 4000000.0 (1/4s) |" in detail
    assert "| 4000000.0 (1/4s+e; 0%; baseline 2 4000000.0) | 2.00x |" in detail


def test_ablate_probe_slot_summary_reads_against_cublas(monkeypatch):
    """ablate_probe --kinds slots: each build's geomean and least speed against the cuBLAS of the same rounds, and
    the 16:32 target of the batch (none at batch 3); --models takes every decoder shape of both presets."""
    probe = benchmark_module(monkeypatch, "ablate_probe")
    lines = probe.slot_summary({"full step": [2.0, 0.5], "no slot MMAs or gathers": [1.25, 1.25]}, 16)
    assert "issue 12's 16:32 target at batch 16: 1.10x." in lines[0]
    assert lines[4] == "| full step | 1.000x | 0.500x | 1 of 2 |"
    assert lines[5] == "| no slot MMAs or gathers | 1.250x | 1.250x | 0 of 2 |"
    assert "target at batch 3: none." in probe.slot_summary({"full step": [1.0]}, 3)[0]
    shapes = probe.slot_shapes(["llama-3.1-8b", "qwen3-14b"])
    assert [s[:3] for s in shapes[::4]] == [("8B qkv", 6144, 4096), ("14B qkv", 7168, 5120)]
    assert ("14B gate_up", 34816, 5120) in [s[:3] for s in shapes]


def test_ablate_probe_builds_summary_reads_against_the_kinds_target(monkeypatch):
    """ablate_probe --kinds int4 with --models: each build's geomean and least speed against cuBLAS, and its distance
    from issue 13's batch-1 target (none at batch 2; bf16 takes issue 12's)."""
    probe = benchmark_module(monkeypatch, "ablate_probe")
    lines = probe.builds_summary({"default": [4.0, 3.0], "early, 3 CTAs": [4.0, 4.0]}, "int4", 1, True)
    assert "target: 3.80x." in lines[0] and "fastest of the splits/slices" in lines[0]
    assert lines[4] == "| default | 3.464x | 3.000x | -8.8% |"
    assert lines[5] == "| early, 3 CTAs | 4.000x | 4.000x | meets |"
    assert "target: none." in probe.builds_summary({"default": [1.0]}, "int4", 2, False)[0]
    assert "target: 1.30x." in probe.builds_summary({"default": [1.0]}, "bf16", 8, False)[0]


def test_ablate_probe_refuses_splits_without_slices(monkeypatch, capsys):
    """--splits pairs with --slices: alone it is refused before any GPU work, with one line and exit 2."""
    import sys

    probe = benchmark_module(monkeypatch, "ablate_probe")
    monkeypatch.setattr(sys, "argv", ["ablate_probe.py", "--kinds", "int4", "--splits", "2"])
    with pytest.raises(SystemExit) as exit_info:
        probe.main()
    assert exit_info.value.code == 2
    assert "--splits pairs with --slices" in capsys.readouterr().err


def test_shape_probe_takes_out_x_in_shapes_and_refuses_the_kernel_cannot_tile(monkeypatch, capsys):
    """shape_probe.py --shapes: OUTxIN with rows a multiple of 16 and in-features a multiple of 512; anything else, and
    --reps below 1, ends with one argparse error line (exit 2) before any GPU work."""
    probe = benchmark_module(monkeypatch, "shape_probe")
    args = probe.parse_args(["--shapes", "28672x4096", "34816x5120", "--kinds", "int4", "bf16"])
    assert args.shapes == [(28672, 4096), (34816, 5120)] and args.kinds == ["int4", "bf16"] and args.batch == 1
    for bad in (["--shapes", "100x4096"], ["--shapes", "4096x100"], ["--shapes", "4096"], ["--shapes", "64x512",
                                                                                          "--reps", "0"]):
        with pytest.raises(SystemExit) as exc:
            probe.parse_args(bad)
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err
