"""benchmarks/hf_generate_bench.py's choices before any GPU work: --tile and --sides, and the random-weights note
that a folder written by random_hf_model.py carries into the report."""

import json

import pytest

from helpers import benchmark_module


def test_tile_is_sides_tiled_and_conflicts_are_refused(monkeypatch, capsys):
    bench = benchmark_module(monkeypatch, "hf_generate_bench")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["/nonexistent", "--tile", "--sides", "packed"])
    assert exit_info.value.code == 2 and "--tile is --sides tiled" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["/nonexistent", "--sides", "tiled", "sideways"])
    assert exit_info.value.code == 2 and "invalid choice: 'sideways'" in capsys.readouterr().err
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)  # valid choices reach the GPU check
    for argv in (["--tile"], ["--tile", "--sides", "tiled"], ["--sides", "packed", "tiled"], []):
        assert bench.main(["/nonexistent", *argv]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_random_note_names_a_random_hf_model_folder(monkeypatch, tmp_path):
    bench = benchmark_module(monkeypatch, "hf_generate_bench")
    assert bench.random_note(tmp_path) == ""
    (tmp_path / bench.RANDOM_RECORD).write_text(json.dumps({"preset": "qwen2.5-coder-1.5b", "prune": "2:4",
                                                            "seed": 0}), encoding="utf-8")
    note = bench.random_note(tmp_path)
    assert "**random weights**" in note and "qwen2.5-coder-1.5b" in note and "magnitude-pruned 2:4" in note
