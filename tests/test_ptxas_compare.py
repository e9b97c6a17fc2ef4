"""benchmarks/ptxas_compare.py: ptxas -v reports read per kernel, only differing kernels tabulated, bad input refused."""

from __future__ import annotations

import pytest

from helpers import benchmark_module

_SYMBOL = "_ZN39_GLOBAL__N__85dbbebc_7_sp24_cu_{h}11sp24_kernelI13__nv_bfloat16Li1ELi4ELi4ELb0ELi0ELb0ELb{s}EEEvPKT_"


def _report(spills_plain: int, regs_stream: int, hash_: str) -> str:
    entry = ("ptxas info    : Function properties for {sym}\n    {st} bytes stack frame, {ss} bytes spill stores, "
             "{sl} bytes spill loads\nptxas info    : Used {r} registers, used 1 barriers\n")
    return (entry.format(sym=_SYMBOL.format(h=hash_, s=0), st=8 if spills_plain else 0, ss=spills_plain,
                         sl=spills_plain, r=128)
            + entry.format(sym=_SYMBOL.format(h=hash_, s=1), st=0, ss=0, sl=0, r=regs_stream))


def test_only_kernels_whose_counts_differ_are_tabulated(tmp_path, monkeypatch):
    ptxas = benchmark_module(monkeypatch, "ptxas_compare")
    before, after = tmp_path / "a.txt", tmp_path / "b.txt"
    before.write_text(_report(0, 124, "e6a6da5d"))
    after.write_text(_report(88, 124, "0badf00d"))  # another source's namespace hash: the same kernels
    assert ptxas.counts(after.read_text()) == {
        "bf16 NT=1 CODE=4 SPS=4 NORM=0 OVER=0 DENSE=0 STREAM=0": (8, 88, 88, 128),
        "bf16 NT=1 CODE=4 SPS=4 NORM=0 OVER=0 DENSE=0 STREAM=1": (0, 0, 0, 124)}
    out = tmp_path / "t.md"
    assert ptxas.main(["--logs", f"old=WAIT=0={before}", f"new={after}", "--command", "nvcc -Xptxas -v",
                       "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| bf16")]
    assert rows == ["| bf16 NT=1 CODE=4 SPS=4 NORM=0 OVER=0 DENSE=0 STREAM=0 | 0 / 0 / 0 / 128 | 8 / 88 / 88 / 128 |"]
    assert "| kernel | old=WAIT=0 | new |" in out.read_text()


def test_refuses_a_missing_or_empty_report(tmp_path, capsys, monkeypatch):
    ptxas = benchmark_module(monkeypatch, "ptxas_compare")
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing here\n")
    for item in (f"x={tmp_path / 'none.txt'}", f"x={empty}", "no-equals"):
        with pytest.raises(SystemExit) as stop:
            ptxas.main(["--logs", item, "--command", "c", "--out", str(tmp_path / "o.md")])
        assert stop.value.code == 2
        assert "--logs" in capsys.readouterr().err
    assert not (tmp_path / "o.md").exists()
