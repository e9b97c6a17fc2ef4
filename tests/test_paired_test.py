"""benchmarks/paired_test.py: paired counts of two record files, one instruction wording at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import benchmark_module


@pytest.fixture
def paired(monkeypatch):
    return benchmark_module(monkeypatch, "paired_test")


def write(path: Path, rows: list[tuple[str, str, bool]]) -> Path:
    path.write_text("".join(json.dumps({"task_id": t, "wording": w, "passed": p}) + "\n" for t, w, p in rows))
    return path


def test_each_wording_is_paired_on_its_own(paired, tmp_path, capsys):
    a = write(tmp_path / "a.records.jsonl", [("t1", "fenced", True), ("t2", "fenced", True), ("t1", "plain", False),
                                              ("t2", "plain", True)])
    b = write(tmp_path / "b.records.jsonl", [("t1", "fenced", False), ("t2", "fenced", True), ("t1", "plain", True),
                                              ("t2", "plain", True)])
    paired.main(["--wording", "fenced", str(a), str(b)])
    assert capsys.readouterr().out.splitlines()[-1].endswith("| 2 | 1 | 1 | 0 | 1 |")
    paired.main(["--wording", "plain", str(a), str(b)])
    assert capsys.readouterr().out.splitlines()[-1].endswith("| 1 | 2 | 0 | 1 | 1 |")
    with pytest.raises(SystemExit, match="no records of wording 'other'"):
        paired.main(["--wording", "other", str(a), str(b)])
    with pytest.raises(SystemExit, match="several records of one problem .* --wording"):  # both wordings at once
        paired.main([str(a), str(b)])


def test_mcnemar_exact_p(paired):
    from math import isclose

    assert paired.mcnemar(0, 0) == 1.0 and isclose(paired.mcnemar(2, 0), 0.5)
    assert isclose(paired.mcnemar(6, 0), 2 / 64) and isclose(paired.mcnemar(3, 3), 1.0)


def test_recheck_checks_the_answers_again_under_todays_harness(paired, tmp_path, capsys, monkeypatch):
    """A recorded failure whose block ends in a fence short of a backtick passes under harness 4's reading; a record
    without its answer cannot be checked again."""
    import sparsedecoding.data

    problem = {"task_id": "t1", "prompt": 'def f(x):\n    """A stub."""\n', "entry_point": "f",
               "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    monkeypatch.setattr(sparsedecoding.data, "humaneval_problems", lambda split: [problem])
    right = "```python\ndef f(x):\n    return x + 1\n``"
    a = tmp_path / "a.records.jsonl"
    a.write_text(json.dumps({"task_id": "t1", "wording": "plain", "passed": False, "completion": right}) + "\n")
    b = write(tmp_path / "b.records.jsonl", [("t1", "plain", False)])
    paired.main([str(a), str(a)])
    assert capsys.readouterr().out.splitlines()[-1].endswith("| 0 | 0 | 0 | 0 | 1 |")  # as recorded
    paired.main(["--recheck", str(a), str(a)])
    out = capsys.readouterr().out
    assert "answers checked again under harness version" in out
    assert out.splitlines()[-1].endswith("| 1 | 1 | 0 | 0 | 1 |")
    with pytest.raises(SystemExit, match="without their answers"):
        paired.main(["--recheck", str(a), str(b)])
