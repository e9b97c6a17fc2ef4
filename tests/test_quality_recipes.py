"""benchmarks/quality_recipes.py without a model: the workers' order, claims, the selection rule and the report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"

PLAN = {
    "recipes": [
        {"name": "fit", "pattern": "16:32", "data": "humaneval:fit"},
        {"name": "broad-a", "pattern": "16:32", "data": "broad"},
        {"name": "broad-b", "pattern": "2:4", "data": "broad"},
        {"name": "sweep", "pattern": "4:8", "data": "broad", "late": True},
    ],
    "families": {"nm50": ["fit", "broad-a"], "2of4": ["broad-b"]},
    "baselines": [{"name": "paper", "pattern": "16:32", "data": "humaneval:calib"},
                  {"name": "text", "pattern": "16:32", "data": "text", "late": True}],
}


@pytest.fixture
def recipes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import quality_recipes

    return quality_recipes


def run_for(recipes, out: Path, worker: int):
    """A Run with only what the scheduling needs (no model is loaded)."""
    run = object.__new__(recipes.Run)
    run.plan, run.out, run.mine = PLAN, out, set()
    run.args = SimpleNamespace(worker=worker, deadline=float("inf"), plan="plan.json")
    run.started = 0.0
    (out / "claims").mkdir(parents=True, exist_ok=True)
    for stage in ("dev", "final"):
        (out / stage).mkdir(exist_ok=True)
    return run


def names(items):
    return [f"{stage}:{recipe['name']}" for stage, recipe, _ in items]


def test_workers_start_apart_and_leave_late_items_for_after_the_picks(recipes, tmp_path):
    first, late = run_for(recipes, tmp_path, 0).queue({"dev", "final"})
    assert names(first) == ["dev:dense", "dev:broad-a", "dev:broad-b", "dev:fit", "final:dense", "final:paper"]
    assert names(late) == ["dev:sweep", "final:text"]
    first, _ = run_for(recipes, tmp_path, 1).queue({"dev", "final"})
    assert names(first) == ["dev:dense", "dev:fit", "final:dense", "final:paper", "dev:broad-a", "dev:broad-b"]


def test_a_claimed_item_belongs_to_one_worker(recipes, tmp_path):
    zero, one = run_for(recipes, tmp_path, 0), run_for(recipes, tmp_path, 1)
    assert zero.claim("dev-fit") and zero.claim("dev-fit")  # its own claim stays its own
    assert not one.claim("dev-fit")
    assert not one.families_settled()  # claimed, no result yet
    (tmp_path / "dev" / "fit.failed").write_text("{}")
    assert one.families_settled()  # a failed item is settled; unclaimed ones will not run


def result(name: str, recipe: dict, passed: list[tuple[bool, bool]], kl: float, ppl: float) -> dict:
    fenced, plain = (sum(row[i] for row in passed) for i in (0, 1))
    count = len(passed)
    from sparsedecoding.evaluation.suite import HARNESS_VERSION

    return {"name": name, "recipe": recipe, "pruning": None, "seconds": 1.0, "harness": HARNESS_VERSION,
            "environment": {"date": "2026-11-30", "device": "cpu", "versions": {}}, "command": ["python", "x"],
            "metrics": {"pass@1_fenced": fenced / count, "pass@1_plain": plain / count,
                        "pass@1_mean": (fenced + plain) / (2 * count), "passed_fenced": fenced,
                        "passed_plain": plain, "problems": count, "kl": kl, "ppl": ppl}}


def write(out: Path, stage: str, name: str, recipe: dict, passed, kl=0.0, ppl=10.0) -> None:
    (out / stage / f"{name}.json").write_text(json.dumps(result(name, recipe, passed, kl, ppl)))
    rows = [{"task_id": f"HumanEval/{task}", "wording": wording, "passed": row[i]}
            for i, wording in enumerate(("fenced", "plain")) for task, row in enumerate(passed)]
    (out / stage / f"{name}.records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_rule_picks_the_best_dev_mean_and_the_report_counts_the_pairs(recipes, tmp_path):
    run = run_for(recipes, tmp_path, 0)
    by_name = {recipe["name"]: recipe for recipe in PLAN["recipes"]}
    write(tmp_path, "dev", "dense", {"name": "dense", "dense": True}, [(True, True)] * 4)
    write(tmp_path, "dev", "fit", by_name["fit"], [(True, False), (False, False)] * 2, kl=0.02)
    write(tmp_path, "dev", "broad-a", by_name["broad-a"], [(True, True), (False, False)] * 2, kl=0.03)
    (tmp_path / "dev" / "broad-b.failed").write_text(json.dumps({"name": "broad-b", "error": "RuntimeError: x"}))
    (tmp_path / "claims" / "dev-broad-b").mkdir()
    with pytest.raises(SystemExit, match="2of4"):
        run.picks()  # a family none of whose recipes produced a result cannot be picked
    run.args.only = ["fit", "broad-a"]  # a plan run in parts: a family left out by --only is left out of the picks
    assert set(run.picks()) == {"nm50"}
    run.args.only = ["fit", "broad-b"]  # but not one --only asked for
    with pytest.raises(SystemExit, match="2of4"):
        run.picks()
    del run.args.only
    write(tmp_path, "dev", "broad-b", by_name["broad-b"], [(False, False)] * 4, kl=0.1)
    picks = run.picks()
    assert picks["nm50"]["model"] == "broad-a" and picks["nm50"]["name"] == "nm50-broad-a"
    (tmp_path / "final" / "picks.json").write_text(json.dumps(picks))
    write(tmp_path, "final", "dense", {"name": "dense", "dense": True}, [(True, True)] * 4, ppl=10.0)
    write(tmp_path, "final", "nm50-broad-a", picks["nm50"], [(True, True), (True, False), (False, False),
                                                             (False, True)], kl=0.03, ppl=25.0)
    write(tmp_path, "final", "paper", PLAN["baselines"][0], [(False, True), (False, False), (True, False),
                                                             (False, True)])
    recipes.Report(tmp_path, PLAN, "plan.json").write()
    report = (tmp_path / "report.md").read_text()
    assert "- nm50: broad-a (members: fit, broad-a)" in report
    assert "- nm50-broad-a vs paper (fenced): 2 vs 1" in report  # problems 1 and 2 vs problem 3
    assert "- nm50-broad-a vs paper (plain): 0 vs 0" in report  # both solve problems 1 and 4
    assert "nm50 pass@1 0.500 vs >= 0.850" in report and "missed by 0.350" in report
    assert "Lee ppl 25.0 vs <= 20.0: missed" in report
    assert "broad-b: RuntimeError: x" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {row["name"] for row in summary["final"]} == {"dense", "nm50-broad-a", "paper"}
    assert [row["pass_vs_dense"] for row in summary["final"] if row["name"] == "nm50-broad-a"] == [0.5]


def test_a_later_round_takes_the_earlier_results_but_not_its_failures_or_picks(recipes, tmp_path):
    earlier, out = tmp_path / "earlier", tmp_path / "out"
    for folder in (earlier, out):
        (folder / "dev").mkdir(parents=True)
        (folder / "final").mkdir()
    by_name = {recipe["name"]: recipe for recipe in PLAN["recipes"]}
    write(earlier, "dev", "fit", by_name["fit"], [(True, True)] * 2)
    write(earlier, "final", "paper", PLAN["baselines"][0], [(True, False)] * 2)
    (earlier / "dev" / "broad-b.failed").write_text("{}")
    (earlier / "final" / "picks.json").write_text("{}")
    write(out, "dev", "broad-a", by_name["broad-a"], [(False, False)] * 2)
    write(earlier, "dev", "broad-a", by_name["broad-a"], [(True, True)] * 2)  # this round's own result wins
    recipes.seed_from_earlier(earlier, out)
    assert sorted(path.name for path in (out / "dev").iterdir()) == [
        "broad-a.json", "broad-a.records.jsonl", "fit.json", "fit.records.jsonl"]
    assert sorted(path.name for path in (out / "final").iterdir()) == ["paper.json", "paper.records.jsonl"]
    assert json.loads((out / "dev" / "broad-a.json").read_text())["metrics"]["passed_fenced"] == 0
    with pytest.raises(SystemExit, match="not a folder"):
        recipes.seed_from_earlier(tmp_path / "missing", out)


def test_a_plan_may_name_several_earlier_rounds_and_the_first_to_give_a_result_wins(recipes, tmp_path):
    """plan-permute2.json pairs with two rounds (the 16:32+2 row of one, the dense held-out row of the other)."""
    first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "out"
    for folder in (first, second, out):
        (folder / "dev").mkdir(parents=True)
        (folder / "final").mkdir()
    by_name = {recipe["name"]: recipe for recipe in PLAN["recipes"]}
    write(first, "dev", "fit", by_name["fit"], [(True, True)] * 2)
    write(second, "dev", "fit", by_name["fit"], [(False, False)] * 2)
    write(second, "final", "dense", {"name": "dense", "dense": True}, [(True, True)] * 2)
    assert recipes.earlier_rounds({"earlier": "a"}) == [Path("a")] and recipes.earlier_rounds({}) == []
    rounds = recipes.earlier_rounds({"earlier": [str(first), str(second)]})
    assert rounds == [first, second]
    for earlier in rounds:
        recipes.seed_from_earlier(earlier, out)
    assert json.loads((out / "dev" / "fit.json").read_text())["metrics"]["passed_fenced"] == 2
    assert (out / "final" / "dense.json").exists()


def test_an_earlier_result_of_an_older_harness_is_checked_again_from_its_answers(recipes, tmp_path):
    """Harness 4 reads a block closed by a fence short of a backtick: the earlier round's answer that version 3
    failed passes once copied, its counts are redone, KL stays, and the report names what was checked again."""
    from sparsedecoding.evaluation.sandbox import SandboxLimits

    problems = {f"HumanEval/{task}": {"task_id": f"HumanEval/{task}", "prompt": 'def f(x):\n    """A stub."""\n',
                                      "entry_point": "f",
                                      "test": f"def check(candidate):\n    assert candidate(1) == {task + 2}\n"}
                for task in range(2)}
    right = ["```python\ndef f(x):\n    return x + 1\n```", "```python\ndef f(x):\n    return x + 2\n``"]
    wrong = "```python\ndef f(x):\n    return 0\n``"
    earlier, out = tmp_path / "earlier", tmp_path / "out"
    for folder in (earlier, out):
        (folder / "dev").mkdir(parents=True)
        (folder / "final").mkdir()
    old = result("fit", PLAN["recipes"][0], [(True, False), (False, False)], kl=0.02, ppl=9.0)
    del old["harness"]  # results before version 3 carry no field
    (earlier / "dev" / "fit.json").write_text(json.dumps(old))
    answers = {("fenced", 0): right[0], ("fenced", 1): wrong, ("plain", 0): wrong, ("plain", 1): right[1]}
    rows = [{"task_id": f"HumanEval/{task}", "wording": wording, "passed": (wording, task) == ("fenced", 0),
             "outcome": "x", "error": None, "message": "", "completion": answers[wording, task], "new_tokens": 9}
            for wording in ("fenced", "plain") for task in range(2)]
    (earlier / "dev" / "fit.records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipes.seed_from_earlier(earlier, out, SandboxLimits(timeout_s=5.0, memory_mb=256), problems)
    copied = json.loads((out / "dev" / "fit.json").read_text())
    metrics = copied["metrics"]
    assert (metrics["passed_fenced"], metrics["passed_plain"], metrics["pass@1_mean"]) == (1, 1, 0.5)
    assert (metrics["kl"], metrics["ppl"]) == (0.02, 9.0)
    assert copied["rescored"] == {"from_harness": 0, "passed_fenced": 1, "passed_plain": 0}
    records = [json.loads(line) for line in (out / "dev" / "fit.records.jsonl").read_text().splitlines()]
    assert [row["passed"] for row in records] == [True, False, False, True]
    assert [row["completion"] for row in records] == [row["completion"] for row in rows]
    recipes.Report(out, PLAN, "plan.json").write()
    assert "- dev fit: from a harness version not recorded (before 4), 1 / 0" in (out / "report.md").read_text()

    (earlier / "dev" / "fit.records.jsonl").write_text(json.dumps({k: v for k, v in rows[0].items()
                                                                   if k != "completion"}) + "\n")
    (out / "dev" / "fit.json").unlink()
    with pytest.raises(SystemExit, match="cannot be checked again under version"):
        recipes.seed_from_earlier(earlier, out, problems=problems)


def test_a_held_out_check_is_paired_in_the_report_but_never_picked(recipes, tmp_path):
    plan = {**PLAN, "held_out_checks": [{"recipe": "broad-a", "against": ["nm50-fit", "paper"]}]}
    run = run_for(recipes, tmp_path, 0)
    run.plan = plan
    by_name = {recipe["name"]: recipe for recipe in PLAN["recipes"]}
    write(tmp_path, "dev", "fit", by_name["fit"], [(True, True)] * 4)
    write(tmp_path, "dev", "broad-a", by_name["broad-a"], [(True, False)] * 4)
    write(tmp_path, "dev", "broad-b", by_name["broad-b"], [(False, False)] * 4)
    picks = run.picks()
    assert picks["nm50"]["model"] == "fit"
    (tmp_path / "final" / "picks.json").write_text(json.dumps(picks))
    write(tmp_path, "final", "nm50-fit", picks["nm50"], [(True, True), (False, False)])
    write(tmp_path, "final", "check-broad-a", {**by_name["broad-a"], "model": "broad-a"},
          [(True, True), (True, False)])
    write(tmp_path, "final", "paper", PLAN["baselines"][0], [(False, False)] * 2)
    recipes.Report(tmp_path, plan, "plan.json").write()
    report = (tmp_path / "report.md").read_text()
    assert "- check-broad-a vs nm50-fit (fenced): 1 vs 0" in report
    assert "- check-broad-a vs paper (plain): 1 vs 0" in report


def test_one_worker_samples_each_calibration_set_and_the_others_wait_for_it(recipes, tmp_path, monkeypatch):
    import torch

    from sparsedecoding.calibration import CalibrationSet

    built = []

    def build(config, model, tokenizer):
        built.append(config.prompts)
        ids = torch.full((2, 4), len(built))
        return CalibrationSet(ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool), "decode"), {"n": 1}

    monkeypatch.setattr(recipes, "build_calibration", build)
    zero, one = run_for(recipes, tmp_path, 0), run_for(recipes, tmp_path, 1)
    (tmp_path / "data").mkdir()
    for run in (zero, one):
        run.folder, run.dense, run.tokenizer = tmp_path, None, None
        run.args.pick_grace = 0.0
    recipe = {"name": "q", "pattern": "dense", "quantize": "int8", "data": "humaneval:fit", "tokens": 8}
    assert zero.claim("data-humaneval:fit-8-1")  # worker 0 is sampling them; worker 1 waits until they are there
    monkeypatch.setattr(recipes.time, "sleep", lambda seconds: zero.calibration(recipe))
    calib, stats = one.calibration(recipe)
    assert built == ["humaneval:fit"] and int(calib.input_ids[0, 0]) == 1 and stats == {"n": 1}
    other = {**recipe, "tokens": 16}
    assert zero.claim("data-humaneval:fit-16-1")
    one.args.deadline = 0.0  # past the deadline nobody waits: the set is sampled again (same seed, same data)
    one.calibration(other)
    assert built == ["humaneval:fit"] * 2


def test_quantized_baselines_show_their_values_and_their_own_pairs(recipes, tmp_path):
    baselines = [{"name": "gptq-int8", "pattern": "dense", "quantize": "int8", "data": "humaneval:fit",
                  "against": ["dense"]},
                 {"name": "nm-int4", "pattern": "16:32", "quantize": "int4", "group_size": 128, "data": "text"}]
    plan = {**PLAN, "title": "Issue 13 quality", "baselines": baselines}
    run_for(recipes, tmp_path, 0)
    write(tmp_path, "final", "dense", {"name": "dense", "dense": True}, [(True, True), (True, False)])
    write(tmp_path, "final", "gptq-int8", baselines[0], [(True, False), (False, False)])
    write(tmp_path, "final", "nm-int4", baselines[1], [(False, False)] * 2)
    recipes.Report(tmp_path, plan, "plan.json").write()
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Issue 13 quality (")
    assert "| gptq-int8 | dense int8 | humaneval:fit" in report and "| nm-int4 | 16:32 int4 g128 | text" in report
    assert "- gptq-int8 vs dense (fenced): 0 vs 1" in report and "- gptq-int8 vs dense (plain): 0 vs 1" in report
    rows = {row["name"]: row for row in json.loads((tmp_path / "summary.json").read_text())["final"]}
    assert (rows["gptq-int8"]["quantize"], rows["nm-int4"]["group_size"], rows["dense"]["quantize"]) == \
        ("int8", 128, "none")


@pytest.mark.parametrize("plan_file", sorted((BENCHMARKS / "recipes").glob("*.json")), ids=lambda path: path.name)
def test_every_committed_plan_names_only_recipes_it_can_run(recipes, plan_file):
    """A typo in a plan would surface only on the GPU: every family member and held-out check is a recipe of the plan
    or a dev result of its earlier round, every recipe and baseline is a valid prune configuration, and every repair
    setting is one that repair or the script takes."""
    from dataclasses import fields

    from sparsedecoding.repair import RepairConfig

    plan = json.loads(plan_file.read_text())
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    run.plan = plan
    for recipe in plan["recipes"] + plan["baselines"]:
        if recipe.get("as_is"):  # scores its start's model: it prunes nothing itself
            assert "start" in recipe and "quantize" not in recipe, recipe["name"]
            continue
        run.prune_config(recipe).check_values()
    run.check_dense_linears({"num_hidden_layers": 28})  # every committed plan prunes Qwen2.5-Coder-1.5B (28 layers)
    for path in plan.get("calibration_files", {}).values():  # committed sets the plan prunes from
        assert (BENCHMARKS.parent / path).is_file(), path
    known = {recipe["name"] for recipe in plan["recipes"]}
    for earlier in recipes.earlier_rounds(plan):
        assert (BENCHMARKS.parent / earlier).is_dir(), earlier
        known |= {path.stem for path in (BENCHMARKS.parent / earlier / "dev").glob("*.json")}
    for family, members in plan["families"].items():
        assert set(members) <= known, family
    for check in plan.get("held_out_checks", []):
        assert check["recipe"] in {recipe["name"] for recipe in plan["recipes"]}
    run.plan = plan
    for item in plan["recipes"] + plan["baselines"]:
        if "start" in item:
            assert run.recipe_named(item["start"])["name"] == item["start"]
    repair_keys = {field.name for field in fields(RepairConfig)} | set(recipes.REPAIR_DATA_KEYS)
    assert set(plan.get("repair", {})) <= repair_keys
    if "repair" in plan:
        settings = {key: value for key, value in plan["repair"].items() if key not in recipes.REPAIR_DATA_KEYS}
        RepairConfig(**settings).validate()
    assert recipes.repair_problem(plan) is None
    assert recipes.calibration_problem(plan) is None  # each committed set's tensors and statistics are there


def test_a_start_names_a_recipe_or_baseline_of_the_plan(recipes):
    run = object.__new__(recipes.Run)
    run.plan = PLAN
    assert run.recipe_named("paper")["data"] == "humaneval:calib" and run.recipe_named("fit")["pattern"] == "16:32"
    with pytest.raises(SystemExit, match="neither a recipe nor a baseline"):
        run.recipe_named("missing")


def test_an_as_is_item_scores_its_start_model_without_pruning_again(recipes, tmp_path, monkeypatch):
    """`as_is` returns the start's model and record (marked), and neither calibrates nor saves a model of its own."""
    plan = {**PLAN, "baselines": [*PLAN["baselines"], {"name": "fit-again", "start": "fit", "as_is": True}]}
    run = run_for(recipes, tmp_path, 0)
    run.plan, run.dense = plan, object()
    (tmp_path / "models").mkdir()
    started = object()
    calls = []

    def pruned_start(recipe):
        calls.append(recipe["name"])
        return started, {"repair": {"best_step": 7}}

    original = recipes.Run.pruned
    monkeypatch.setattr(run, "calibration", lambda recipe: pytest.fail("an as_is item calibrated"))
    monkeypatch.setattr(recipes.copy, "deepcopy", lambda model: model)
    monkeypatch.setattr(run, "pruned", lambda recipe: pruned_start(recipe) if recipe["name"] == "fit"
                        else original(run, recipe))
    model, record = run.pruned(run.recipe_named("fit-again"))
    assert model is started and calls == ["fit"]
    assert record == {"repair": {"best_step": 7}, "as_is": "fit"}
    assert not list((tmp_path / "models").iterdir())


def main_refused(recipes, tmp_path, monkeypatch, plan_fields: dict, *arguments) -> None:
    """Run main on a plan of PLAN with `plan_fields` and OUT tmp_path/o: it must exit 2 and leave no OUT."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**PLAN, **plan_fields}))
    monkeypatch.setattr("sys.argv", ["quality_recipes.py", "--plan", str(plan), "--out", str(tmp_path / "o"),
                                     *arguments])
    with pytest.raises(SystemExit) as exit_info:
        recipes.main()
    assert exit_info.value.code == 2 and not (tmp_path / "o").exists()


def test_only_runs_the_named_items_and_rejects_a_name_the_plan_lacks(recipes, tmp_path, monkeypatch):
    run = run_for(recipes, tmp_path, 0)
    run.args.only = ["paper"]
    assert run.item("dev", {"name": "fit"}, "dev", 1.0) is None  # not named: skipped before any claim
    assert not (tmp_path / "claims" / "dev-fit").exists()
    main_refused(recipes, tmp_path, monkeypatch, {}, "--only", "paper,nope")


def test_an_earlier_round_that_is_not_there_is_one_error_before_any_model_loads(recipes, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setattr(recipes, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    main_refused(recipes, tmp_path, monkeypatch, {"earlier": [str(tmp_path), str(tmp_path / "gone")]})
    assert capsys.readouterr().err.strip().splitlines() == [f"error: the plan's earlier round {tmp_path / 'gone'} "
                                                           "is not a folder"]


def test_a_calibration_set_without_its_statistics_is_one_error_before_any_model_loads(recipes, tmp_path,
                                                                                      monkeypatch, capsys):
    """The eightieth session's lease: the set's tensors were there, its SET.json was not, and the run found out only
    when its item began, after the model's pieces and load."""
    monkeypatch.setattr(recipes, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    monkeypatch.setattr(recipes, "REPO", tmp_path)
    data = tmp_path / "benchmarks" / "results" / "round" / "data"
    data.mkdir(parents=True)
    (data / "set.safetensors").write_bytes(b"")
    main_refused(recipes, tmp_path, monkeypatch,
                 {"calibration_files": {"humaneval:fit-64-4": "benchmarks/results/round/data/set.safetensors"}})
    assert capsys.readouterr().err.strip().splitlines() == [f"error: the plan's calibration file {data / 'set.json'} "
                                                           "does not exist (calibration_files names a set an earlier "
                                                           "round brought back, relative to the repository root)"]
    assert recipes.calibration_problem({"calibration_files": {}}) is None


@pytest.mark.parametrize("stage", ["dev", "final", "all"])
def test_repair_settings_repair_refuses_are_one_error_before_any_model_loads(recipes, tmp_path, monkeypatch, capsys,
                                                                             stage):
    monkeypatch.setattr(recipes, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    broad = json.loads((BENCHMARKS / "recipes" / "plan-grouped-repair.json").read_text())["broad"]
    repaired = {**PLAN["recipes"][0], "name": "fit-r", "repair": {"max_steps": 6}}
    data = {"tokens": 1000, "dev_tokens": 100}

    def refused(plan_fields: dict) -> str:
        main_refused(recipes, tmp_path, monkeypatch, {"recipes": PLAN["recipes"] + [repaired], **plan_fields},
                     "--stage", stage)
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1
        return lines[0]

    assert refused({"repair": {**data, "lr": 1e-5}, "broad": broad}) == \
        "error: fit-r: repair settings: repair warmup_steps must be in [0, max_steps), got 20"
    repaired["repair"] = {"warmup": 2}
    assert refused({"repair": data, "broad": broad}).startswith("error: fit-r: repair settings: ")
    assert "warmup" in refused({"repair": data, "broad": broad})
    repaired["repair"] = {}
    assert refused({"repair": {"tokens": 1000}, "broad": broad}) == \
        "error: fit-r: repair settings: no dev_tokens (the plan's repair or the item's)"
    assert refused({"repair": data}) == \
        "error: fit-r: repair trains on the self-written prompts, which the plan's \"broad\" sets"
    assert "fit-r: repair settings: " in refused({"repair": data, "broad": {**broad, "n_meta": -1}})
    # and with all of them right the plan passes
    assert recipes.repair_problem({"recipes": [repaired], "repair": data, "broad": broad}) is None


def test_a_report_of_an_out_that_is_not_there_is_one_error(recipes, tmp_path, monkeypatch, capsys):
    main_refused(recipes, tmp_path, monkeypatch, {}, "--stage", "report")
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --stage report reads the results under --out, and {tmp_path / 'o'} is not a folder"]


def test_an_as_is_row_shows_its_start_and_the_start_recipes_settings(recipes):
    item = {"name": "fit-again", "start": "fit", "as_is": True, "pattern": "16:32"}
    scored = result("fit-again", item, [(True, False)], 0.01, 12.0)
    scored["pruning"] = {"config": {"propagation": "sequential", "target": "self"}, "as_is": "fit",
                         "calibration": {"tokens": 64}}
    row = recipes.Report.row("fit-again", scored, None)
    assert (row["data"], row["propagation"], row["target"], row["tokens"]) == ("as fit", "sequential", "self", 64)
    plain = result("paper", PLAN["baselines"][0], [(True, False)], 0.01, 12.0)
    plain["pruning"] = {"config": {"propagation": "sequential"}}  # not as_is: only the recipe's own fields show
    assert recipes.Report.row("paper", plain, None)["propagation"] == "-"


def test_a_saved_model_with_a_quantized_head_reloads_untied_and_records_say_which_have_one(recipes, tmp_path):
    import torch
    from safetensors.torch import save_file

    from helpers import random_hf_model

    assert recipes.head_quantized({"config": {"quantize_head": "int8"}})
    assert recipes.head_quantized({"config": {"quantize_head": "none"},
                                   "start": {"record": {"config": {"quantize_head": "int4"}}}})
    assert not recipes.head_quantized({"config": {"quantize_head": "none"}}) and not recipes.head_quantized(None)
    run = run_for(recipes, tmp_path, 0)
    run.dense, run.device = random_hf_model("qwen2", tie_word_embeddings=True), torch.device("cpu")
    assert run.dense.lm_head.weight is run.dense.model.embed_tokens.weight
    (tmp_path / "models").mkdir()
    head = torch.randn_like(run.dense.lm_head.weight)
    layer = torch.randn_like(run.dense.model.layers[0].mlp.down_proj.weight)
    save_file({"lm_head.weight": head, "model.layers.0.mlp.down_proj.weight": layer},
              str(tmp_path / "models" / "x.safetensors"))
    (tmp_path / "models" / "x.json").write_text(json.dumps({"config": {"quantize_head": "int8"}}))
    model, record = run.pruned({"name": "x"})
    assert torch.equal(model.lm_head.weight, head) and torch.equal(model.model.layers[0].mlp.down_proj.weight, layer)
    assert torch.equal(model.model.embed_tokens.weight, run.dense.model.embed_tokens.weight)
    assert not model.config.tie_word_embeddings and record["config"]["quantize_head"] == "int8"
    assert run.dense.lm_head.weight is run.dense.model.embed_tokens.weight  # the dense model is untouched


def test_paired_tests_pair_problems_by_task_not_by_position(recipes, tmp_path):
    (tmp_path / "final").mkdir()

    def records(name, passed):  # passed: task -> bool, written in the given order, under both wordings
        lines = [json.dumps({"task_id": task, "wording": wording, "passed": ok})
                 for wording in recipes.WORDINGS for task, ok in passed.items()]
        (tmp_path / "final" / f"{name}.records.jsonl").write_text("\n".join(lines) + "\n")

    records("a", {"T/1": True, "T/2": False, "T/3": True})
    records("b", {"T/3": True, "T/2": False, "T/1": False})  # the same problems in another order
    report = recipes.Report(tmp_path, {"baselines": [{"name": "a", "against": ["b"]}]}, "plan.json")
    lines = report.tests({}, {"a": {}, "b": {}})
    assert [line for line in lines if line.startswith("- a vs b")][0].startswith("- a vs b (fenced): 1 vs 0")
    records("b", {"T/1": False, "T/2": False})
    with pytest.raises(SystemExit, match="hold different problems"):
        report.tests({}, {"a": {}, "b": {}})


def test_a_recipe_without_a_solver_runs_sparsegpt_unless_its_plan_names_one(recipes):
    """Every committed plan before plan-admm.json was fixed while SparseGPT was the default: they rerun with it, not
    with the CLI's default (admm); a plan's top-level `solver` and a recipe's own win in that order."""
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    recipe = {"name": "r", "pattern": "16:32", "data": "humaneval:fit", "tokens": 1024}
    run.plan = {"recipes": [recipe]}
    assert run.prune_config(recipe).solver == "sparsegpt"
    run.plan = {"recipes": [recipe], "solver": "admm"}
    assert run.prune_config(recipe).solver == "admm"
    assert run.prune_config({**recipe, "solver": "wanda"}).solver == "wanda"


def test_a_recipe_ranked_on_dev_may_not_calibrate_on_the_dev_quarter(recipes):
    """Recipes are chosen by their dev rows (humaneval:dev, a quarter of calib): one calibrated on calib or dev would
    be ranked on problems it saw; a baseline, scored on the held-out half only, may take calib."""
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    baseline = {"name": "b", "pattern": "2:4", "data": "humaneval:calib", "tokens": 1024}
    for data in ("humaneval:calib", "humaneval:dev"):
        recipe = {"name": "r", "pattern": "2:4", "data": data, "tokens": 1024}
        run.plan = {"recipes": [recipe], "baselines": [baseline]}
        with pytest.raises(SystemExit, match="holds the dev quarter"):
            run.prune_config(recipe)
    run.plan = {"recipes": [{**recipe, "data": "humaneval:fit"}], "baselines": [baseline]}
    assert run.prune_config(baseline).prompts == "humaneval:calib"
    assert run.prune_config(run.plan["recipes"][0]).prompts == "humaneval:fit"


def test_a_recipe_without_a_permute_scope_reorders_across_the_layer_as_plans_before_it_did(recipes):
    """plan-permute3.json and earlier reordered channels across the whole layer, int4 values or not."""
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    recipe = {"name": "r", "pattern": "2:4", "data": "humaneval:fit", "tokens": 1024, "quantize": "int4",
              "permute_channels": "mlp+attention"}
    run.plan = {"recipes": [recipe]}
    assert run.prune_config(recipe).permute_scope == "layer"
    assert run.prune_config({**recipe, "permute_scope": "group"}).permute_scope == "group"
    plan = json.loads((BENCHMARKS / "recipes" / "plan-permute4.json").read_text())
    run.plan = plan
    assert run.prune_config(plan["recipes"][0]).permute_scope == "group"


def test_a_family_without_an_issue_11_target_is_reported_without_one(recipes, tmp_path):
    """plan-admm2.json's `o2` family (16:32+2's own question) has no target in TARGETS: the report still writes."""
    report = o2_report(recipes, tmp_path, {**PLAN["families"], "o2": ["broad-a"]}, ("fit", "broad-a", "broad-b"))
    assert "- o2: broad-a (members: broad-a)" in report and "o2 pass@1" not in report


def o2_report(recipes, out, families: dict, dev_names: tuple) -> str:
    """The report of a plan with these families, after dev rows for `dev_names` and held-out rows for dense and the
    `o2` family's pick (broad-a)."""
    plan = {**PLAN, "families": families, "baselines": []}
    run = run_for(recipes, out, 0)
    run.plan = plan
    by_name = {recipe["name"]: recipe for recipe in PLAN["recipes"]}
    for name in dev_names:
        write(out, "dev", name, by_name[name], [(True, False)] * 4)
    picks = run.picks()
    assert picks["o2"]["name"] == "o2-broad-a"
    (out / "final" / "picks.json").write_text(json.dumps(picks))
    write(out, "final", "dense", {"name": "dense", "dense": True}, [(True, True)] * 2)
    write(out, "final", "o2-broad-a", picks["o2"], [(True, False)] * 2)
    recipes.Report(out, plan, "plan.json").write()
    return (out / "report.md").read_text()


def test_a_plan_whose_families_have_no_target_writes_no_targets_heading(recipes, tmp_path):
    """plan-permute.json asks its own questions only: its report has no empty issue 11 targets section."""
    report = o2_report(recipes, tmp_path, {"o2": ["broad-a"]}, ("broad-a",))
    assert "- o2: broad-a (members: broad-a)" in report and "## Targets" not in report


def test_a_plan_can_prune_from_an_earlier_rounds_committed_calibration_set(recipes, tmp_path, monkeypatch):
    """calibration_files: the items of that data key load the committed set and its statistics (never a new draw),
    and OUT/data keeps a copy for the later items; a file that is not there is one error line."""
    import torch

    from sparsedecoding.calibration import CalibrationSet

    monkeypatch.setattr(recipes, "REPO", tmp_path)
    committed = tmp_path / "benchmarks" / "results" / "round" / "data"
    committed.mkdir(parents=True)
    ids = torch.arange(12).view(2, 6)
    original = CalibrationSet(ids, torch.ones_like(ids), ids % 2 == 0, "decode")
    original.save(committed / "humaneval_fit-64-4.safetensors")
    (committed / "humaneval_fit-64-4.json").write_text(json.dumps({"tokens": 6, "prompts_hash": "abc"}))
    out = tmp_path / "out"
    run = run_for(recipes, out, 0)
    (out / "data").mkdir()
    run.plan = {**PLAN, "calibration_files": {
        "humaneval:fit-64-4": "benchmarks/results/round/data/humaneval_fit-64-4.safetensors"}}
    run.claim = lambda key: pytest.fail("a committed set is never sampled")
    recipe = {"name": "r", "pattern": "16:32", "data": "humaneval:fit", "tokens": 64, "samples_per_prompt": 4}
    calib, stats = run.calibration(recipe)
    assert torch.equal(calib.input_ids, ids) and torch.equal(calib.keep, original.keep) and calib.source == "decode"
    assert stats == {"tokens": 6, "prompts_hash": "abc",
                     "from_file": "benchmarks/results/round/data/humaneval_fit-64-4.safetensors"}
    again, _ = run.calibration(recipe)  # now from OUT/data
    assert torch.equal(again.input_ids, ids)
    (out / "data" / "humaneval:fit-64-4.json").unlink()  # as in a fresh OUT
    run.plan = {**PLAN, "calibration_files": {"humaneval:fit-64-4": "benchmarks/results/none.safetensors"}}
    with pytest.raises(SystemExit, match="calibration file .*none.safetensors does not exist"):
        run.calibration(recipe)


def test_only_names_the_recipe_a_held_out_pick_or_check_scores(recipes, tmp_path):
    run = run_for(recipes, tmp_path, 0)
    run.args.only = ["fit"]
    scored = []
    run.pruned = lambda recipe: (object(), None)
    run.score = lambda model, split: (scored.append(split) or {"pass@1_mean": 0.5}, [])
    recipe = next(recipe for recipe in PLAN["recipes"] if recipe["name"] == "fit")
    assert run.item("final", {**recipe, "name": "nm50-fit", "model": "fit"}, "eval", 1.0) is not None
    assert run.item("final", {**recipe, "name": "check-broad-a", "model": "broad-a"}, "eval", 1.0) is None
    assert run.item("dev", {"name": "dense", "dense": True}, "dev", 1.0) is None
    assert scored == ["eval"] and (tmp_path / "final" / "nm50-fit.json").exists()


def test_an_items_dense_linears_must_name_linears_of_the_model_before_it_loads(recipes):
    """prune_layers leaves dense only what matches: a typo in a plan would prune everything, silently, on the GPU."""
    run = object.__new__(recipes.Run)
    qwen = {"num_hidden_layers": 28}
    run.plan = {"recipes": [{"name": "l0", "pattern": "2:4", "data": "humaneval:fit",
                             "dense_linears": "model.layers.0.*"}], "baselines": []}
    run.check_dense_linears(qwen)
    run.plan["recipes"][0]["dense_linears"] = "model.layers.28.*"
    with pytest.raises(SystemExit, match="l0: --dense-linears pattern 'model.layers.28.*' matches no linear"):
        run.check_dense_linears(qwen)


def test_plan_rounding_passes_its_rounding_options_to_the_prune(recipes):
    """plan-rounding.json differs from q2-i4 only in the rounding: scale_search and 3 rounding sweeps reach the
    prune's settings (a recipe's keys are PruneConfig fields)."""
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    run.plan = json.loads((BENCHMARKS / "recipes" / "plan-rounding.json").read_text())
    config = run.prune_config(run.plan["recipes"][0])
    assert (config.scale_search, config.rounding_sweeps, config.quantize, config.solver) == (True, 3, "int4", "admm")
    assert run.prune_config({**run.plan["recipes"][0], "scale_search": False}).scale_search is False


def test_plan_first_items_are_their_controls_with_first_positions(recipes):
    """plan-first.json: each item is its control (plan-admm2's q16 and q2, plan-permute3's q2-i4, plan-rounding's
    q2-i4-sc) with first_positions 1 and nothing else changed, and the option reaches the prune's settings."""
    run = object.__new__(recipes.Run)
    run.folder = Path("not-loaded")
    plans = {name: json.loads((BENCHMARKS / "recipes" / f"plan-{name}.json").read_text())
             for name in ("first", "admm2", "permute3", "rounding")}
    run.plan = plans["first"]
    controls = {recipe["name"]: recipe for plan in ("admm2", "permute3", "rounding") for recipe in plans[plan]["recipes"]}
    for recipe in plans["first"]["recipes"]:
        control = controls[recipe["name"].removesuffix("-f")]
        drop = {"name", "estimate_s", "first_positions"}
        assert {k: v for k, v in recipe.items() if k not in drop} == {k: v for k, v in control.items() if k not in drop}
        config, before = run.prune_config(recipe), run.prune_config(control)
        assert (config.first_positions, before.first_positions) == (1, 0)
        assert {**asdict(config), "first_positions": 0} == asdict(before)
    assert plans["first"]["calibration_files"] == plans["rounding"]["calibration_files"]  # plan-admm2's own tokens
