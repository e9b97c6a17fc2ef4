"""benchmarks/scatter_bench.py before any GPU work: the split candidates it times and its refusals."""

import pytest

from helpers import benchmark_module


def test_split_candidates_respect_the_x_copy_and_keep_steps(monkeypatch):
    bench = benchmark_module(monkeypatch, "scatter_bench")
    assert bench.split_candidates(128, 64, 2) == [2, 4]  # 8B qkv / gate_up: 4096 columns
    assert bench.split_candidates(448, 64, 8) == [7, 8, 14, 16]  # 8B down: 14336 columns, at least 7
    assert bench.split_candidates(3, 64, 1) == [1]  # never more splits than steps of 4 words allow
    assert all(s >= 7 for s in bench.split_candidates(448, 64, 1))


def test_refusals_before_the_gpu(monkeypatch, capsys, tmp_path):
    bench = benchmark_module(monkeypatch, "scatter_bench")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--warps", "5"])
    assert exit_info.value.code == 2 and "invalid choice: 5" in capsys.readouterr().err
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path / "r.md")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
