"""benchmarks/thin_tree.py: thinning deletes only committed results not kept, and restoring brings exactly them back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import thin_tree  # noqa: E402


def run_git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("needs git")
    run_git(tmp_path, "init", "-q")
    files = {"src/a.py": "a", "benchmarks/results/round1/report.md": "r1",
             "benchmarks/results/round1/dev/x.json": "{}", "benchmarks/results/round2/data/set.safetensors": "s",
             "benchmarks/results/round2/notes.md": "n", "benchmarks/results/SUMMARY.md": "summary"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    run_git(tmp_path, "add", ".")
    run_git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return tmp_path, files


def present(root, files):
    return {name for name in files if (root / name).exists()}


def test_thinning_keeps_the_named_paths_and_everything_outside_results_and_restore_brings_the_rest_back(repo):
    root, files = repo
    keep = ["benchmarks/results/round1", "benchmarks/results/round2/data/set.safetensors"]
    assert thin_tree.thin(root, keep) == 2
    assert present(root, files) == {"src/a.py", "benchmarks/results/round1/report.md",
                                    "benchmarks/results/round1/dev/x.json",
                                    "benchmarks/results/round2/data/set.safetensors"}
    assert thin_tree.restore(root) == 2
    assert present(root, files) == set(files)
    assert (root / "benchmarks/results/SUMMARY.md").read_text() == "summary"


def test_restore_leaves_an_edit_made_while_thin_and_a_new_report_alone(repo):
    root, files = repo
    thin_tree.thin(root, ["benchmarks/results/round1"])
    (root / "benchmarks/results/round1/report.md").write_text("edited")
    (root / "benchmarks/results/new.md").write_text("new report")
    assert thin_tree.restore(root) == 3
    assert (root / "benchmarks/results/round1/report.md").read_text() == "edited"
    assert (root / "benchmarks/results/new.md").read_text() == "new report"
    assert present(root, files) == set(files)


@pytest.mark.parametrize("dirty", ["modified", "untracked", "deleted"])
def test_thinning_refuses_a_results_folder_with_work_in_it_and_deletes_nothing(repo, dirty, capsys):
    root, files = repo
    if dirty == "modified":
        (root / "benchmarks/results/round2/notes.md").write_text("changed")
    elif dirty == "untracked":
        (root / "benchmarks/results/round2/new.md").write_text("not committed")
    else:
        (root / "benchmarks/results/SUMMARY.md").unlink()
    with pytest.raises(SystemExit) as exit_info:
        thin_tree.thin(root, ["benchmarks/results/round1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: 1 file(s) under benchmarks/results")
    expected = set(files) - ({"benchmarks/results/SUMMARY.md"} if dirty == "deleted" else set())
    assert present(root, files) == expected


def test_a_kept_path_that_does_not_exist_is_refused_before_anything_goes(repo, capsys):
    root, files = repo
    with pytest.raises(SystemExit) as exit_info:
        thin_tree.thin(root, ["benchmarks/results/round3"])
    assert exit_info.value.code == 2
    assert "round3 is named to keep but does not exist" in capsys.readouterr().err
    assert present(root, files) == set(files)


def test_a_plan_keeps_its_earlier_rounds_and_calibration_files(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"earlier": "benchmarks/results/a",
                                "calibration_files": {"humaneval:fit-1-1": "benchmarks/results/b/data/x.safetensors"}}))
    assert thin_tree.plan_paths(plan) == ["benchmarks/results/a", "benchmarks/results/b/data/x.safetensors",
                                          "benchmarks/results/b/data/x.json"]
    plan.write_text(json.dumps({"earlier": ["benchmarks/results/a", "benchmarks/results/c"]}))
    assert thin_tree.plan_paths(plan) == ["benchmarks/results/a", "benchmarks/results/c"]



def test_a_plan_that_is_not_json_is_one_error(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    monkeypatch.setattr("sys.argv", ["thin_tree.py", "--plan", str(plan)])
    monkeypatch.setattr(thin_tree, "thin", lambda *args: pytest.fail("thinned"))
    with pytest.raises(SystemExit) as exit_info:
        thin_tree.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: a plan is not a recipes plan's JSON")


def test_a_thinned_tree_still_holds_what_the_plans_run_reads_of_its_calibration_set(repo, tmp_path):
    """The eightieth session's lease: thinned for its plan, the tree lacked the calibration set's statistics, and
    quality_recipes.py stopped before its one item. Thinned now, the set loads as the run loads it."""
    import torch

    import quality_recipes
    from sparsedecoding.calibration import CalibrationSet

    root, _ = repo
    data = root / "benchmarks/results/round2/data"
    CalibrationSet(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long), torch.tensor([[False, True, True]]),
                   "test").save(data / "set.safetensors")
    (data / "set.json").write_text(json.dumps({"tokens": 2}))
    run_git(root, "add", ".")
    run_git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "set")
    plan = tmp_path / "plan.json"
    tensors = "benchmarks/results/round2/data/set.safetensors"
    plan.write_text(json.dumps({"calibration_files": {"humaneval:fit-2-1": tensors}}))
    thin_tree.thin(root, thin_tree.plan_paths(plan))
    assert not (root / "benchmarks/results/round2/notes.md").exists()
    calibration, stats = quality_recipes.committed_calibration(data / "set.safetensors")
    assert stats == {"tokens": 2} and calibration.keep.sum() == 2
