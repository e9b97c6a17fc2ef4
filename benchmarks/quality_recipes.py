"""Issue 11's recipe search: rank pruning recipes on the dev split, then score the chosen ones once on the held-out half.

    python benchmarks/quality_recipes.py --model qwen2.5-coder-1.5b --plan benchmarks/recipes/plan.json \
        --out OUT --stage dev [--deadline 540]
    python benchmarks/quality_recipes.py ... --stage final

The plan (a committed JSON file, fixed before any held-out run) lists the recipes, the calibration data sources, the
selection rule's families and the final stage's baselines.

- Stage `dev`: each recipe prunes an in-memory copy of the dense model (`pipeline.prune_layers`; optional repair after
  the solver), then is scored on HumanEval's dev quarter (index % 4 == 2, never used for calibration) under both
  instruction wordings in one batched greedy generation, with on-policy KL(dense‖pruned) over its own answers to the
  dev prompts and perplexity on the held-out Lee corpus. Results: OUT/dev/NAME.json; the pruned weights are kept in
  OUT/models/NAME.safetensors for the final stage.
- Stage `final`: the selection rule picks, for each family of the plan, the recipe with the highest mean dev pass@1
  over the two wordings (ties: lower dev KL). Each pick, the baselines and the dense model are scored once on the
  held-out odd half under both wordings; OUT/final/NAME.json, per-problem records beside them, and OUT/report.md with
  counts and exact McNemar tests of each pick against each baseline of its pattern.

A later round (a second plan file) may name the committed folder of an `earlier` round (or a list of them): its dev
and held-out results are copied into OUT first (never its failures or picks; the first folder to give a result wins),
so the selection rule ranks old and new recipes together without running the old ones again. `held_out_checks`
names recipes whose held-out score is reported whether or not they are picked (a repaired model, say), each with the
items it is paired against; a check never feeds the selection.
A baseline may name items it is paired against (`against`) as well. A recipe or baseline takes any PruneConfig field
by name: `quantize` and `group_size` give N:M + int8/int4 values, and `"pattern": "dense"` with `quantize` dense GPTQ.
A recipe without `solver` runs the plan's top-level `solver`, else sparsegpt (the default when the committed plans
were fixed; the CLI's default is admm since the fifty-eighth session).
`"start": NAME` begins from another recipe's or baseline's model of the same run (pruned and repaired first if its
weights are not in OUT/models yet) instead of the dense one; with `"keep_mask": true` and `quantize` this quantizes a
repaired N:M model without moving its mask, and with `"as_is": true` the start's model is scored as it is (a
recreated model's own bf16 control, since a repair stopped by its time budget is not reproduced step for step).
`--only NAME,...` runs only the named items (plan recipes, baselines or `dense`; results already there still count).
GPU sampling does not reproduce a calibration draw bit for bit across runs (the refit and ADMM rounds' controls, one
recipe and seed, drew 31,851 and 31,498 tokens and scored 0.439 and 0.396 held-out), so a plan may name committed
sets by data key, `"calibration_files": {"humaneval:fit-32768-4": PATH}` with PATH a round's
`benchmarks/results/ROUND/data/humaneval_fit-32768-4.safetensors`, and its items then prune from those very tokens
(`h200.sh recipes` brings each round's sets back).

Every finished item is skipped when the script runs again, so a run can be split over several device calls;
`--deadline` stops starting new items after that many seconds. Several GPUs share one OUT: start one process per GPU
with `--worker K --workers N` (stage `all`); each claims an item before it starts it (a folder under OUT/claims), so
no item runs twice, and one worker builds each calibration set while the others wait for it. The held-out scores of
the dense model and of the baselines do not depend on the dev stage, so a second worker scores them while the first
builds the self-written data; the picks are scored once every dev item has finished. Stage `report` only rewrites
OUT/report.md from the results there.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from paired_test import mcnemar  # benchmarks/ is on sys.path when this script runs
from sparsedecoding import repair, selfdata
from sparsedecoding.calibration import CalibrationSet, describe
from sparsedecoding.data import chat_format, humaneval_problems, humaneval_prompts, lee_text, shares_problems
from sparsedecoding.evaluation.humaneval import check_completions
from sparsedecoding.evaluation.metrics import on_policy_scores, perplexity, repetition_summary
from sparsedecoding.evaluation.sandbox import SandboxLimits
from sparsedecoding.evaluation.suite import HARNESS_VERSION, harness_version
from sparsedecoding.batchgen import generate_many
from sparsedecoding.generation import tokenize_prompts
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.models import load_model, read_config, resolve_model
from sparsedecoding.pipeline import PruneConfig, build_calibration, check_dense_linears, prune_layers
from sparsedecoding.runenv import environment, pick_device, write_json

log = logging.getLogger("quality_recipes")
WORDINGS = ("fenced", "plain")
REPAIR_DATA_KEYS = ("tokens", "dev_tokens", "samples_per_prompt")  # a plan's repair settings that choose its data


class Run:
    def __init__(self, args):
        self.args = args
        self.plan = json.loads(Path(args.plan).read_text())
        self.out = Path(args.out)
        for sub in ("dev", "final", "models", "data", "claims"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.device = pick_device(args.device)
        self.folder = resolve_model(args.model)
        self.check_dense_linears(read_config(self.folder))
        self.dense, self.tokenizer, _ = load_model(self.folder, self.device)
        self.limits = SandboxLimits(args.timeout, 1024)
        self.mine: set[str] = set()
        self.lee_ids = self.tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"]
        self._selfdata = None
        for earlier in earlier_rounds(self.plan):
            seed_from_earlier(earlier, self.out, self.limits)

    def time_left(self, needed: float) -> bool:
        return time.perf_counter() - self.started + needed < self.args.deadline

    def claim(self, key: str) -> bool:
        """True if this process may work on `key`: it created the claim now or earlier; False if another did."""
        if key in self.mine:
            return True
        try:
            os.mkdir(self.out / "claims" / key)
        except FileExistsError:
            return False
        self.mine.add(key)
        return True

    def wait_for(self, done, what: str, grace: float = 0.0) -> bool:
        """Poll until `done()` (another worker is finishing `what`); False if the deadline (plus `grace` seconds)
        comes first."""
        while not done():
            if not self.time_left(-grace):
                return False
            log.info("waiting for another worker: %s", what)
            time.sleep(15)
        return True

    # data --------------------------------------------------------------------------------------------------------
    def calibration(self, recipe: dict) -> tuple[CalibrationSet, dict]:
        source = recipe["data"]
        key = f"{source}-{recipe['tokens']}-{recipe.get('samples_per_prompt', 1)}"
        file, stats_file = self.out / "data" / f"{key}.safetensors", self.out / "data" / f"{key}.json"
        if stats_file.exists():
            return CalibrationSet.load(file), json.loads(stats_file.read_text())
        committed = self.plan.get("calibration_files", {}).get(key)
        if committed is not None:  # an earlier round's set, committed: its very tokens, not a new draw of them
            calib, stats = committed_calibration(REPO / committed)
            stats = {**stats, "from_file": committed}
            calib.save(file)
            write_json(stats_file, stats)
            return calib, stats
        # items on the same data must calibrate on the same tokens: one worker samples them, the others wait (past
        # the deadline, or if that worker died, they sample them themselves, with the same seed)
        if not self.claim(f"data-{key}") and self.wait_for(stats_file.exists, f"calibration data {key}",
                                                          self.args.pick_grace):
            return CalibrationSet.load(file), json.loads(stats_file.read_text())
        if source == "broad":
            data = self.selfdata()
            calib, _ = selfdata.calibration_sets(data, self.tokenizer.pad_token_id, recipe["tokens"])
            stats = {**describe(calib), "selfdata": data.stats}
        else:
            calib, stats = build_calibration(self.prune_config(recipe), self.dense, self.tokenizer)
        temporary = file.with_name(f"{file.stem}.{os.getpid()}.tmp")
        calib.save(temporary)
        os.replace(temporary, file)
        write_json(stats_file, stats)
        return calib, stats

    def selfdata(self) -> selfdata.SelfData:
        """The dense model's self-written prompts and its answers (built once, resumable, in OUT/data/selfdata)."""
        if self._selfdata is None:
            marker = self.out / "data" / "selfdata.done"
            if not self.claim("selfdata") and not self.wait_for(marker.exists, "self-written data"):
                raise SystemExit("deadline reached while another worker builds the self-written data")
            config = selfdata.SelfDataConfig(**self.plan["broad"], seed=self.args.seed)
            self._selfdata = selfdata.build(self.dense, self.tokenizer, self.out / "data" / "selfdata", config,
                                            progress=False)
            marker.touch()
        return self._selfdata

    def repair(self, model, settings: dict, work: Path) -> dict:
        """Fixed-mask distillation of `model` towards the dense model on the pruned model's own samples of the
        self-written train prompts, early-stopped on its samples of the dev prompts."""
        data = self.selfdata()
        settings = dict(settings)
        tokens = settings.pop("tokens")
        dev_tokens = settings.pop("dev_tokens")
        # several samples of each train prompt (each its own draw) when the prompts alone give too few tokens
        copies = settings.pop("samples_per_prompt", 1)
        started = time.perf_counter()
        train = repair.student_samples(model, self.tokenizer, [gen.prompt_ids for gen in data.train] * copies,
                                       token_budget=tokens, seed=self.args.seed, progress=False)
        dev = repair.student_samples(model, self.tokenizer, [gen.prompt_ids for gen in data.dev],
                                     token_budget=dev_tokens, seed=self.args.seed + 1, progress=False)
        sampling = round(time.perf_counter() - started, 1)
        report = repair.repair(self.dense, model, train, dev, work, repair.RepairConfig(**settings, seed=self.args.seed))
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        return {**report, "sampling_seconds": sampling, "train_tokens": train.tokens, "dev_tokens": dev.tokens}

    def check_dense_linears(self, model_config: dict) -> None:
        """SystemExit before the model loads if an item's dense_linears names no linear of this model (prune_layers
        alone would then prune every linear, silently) or every one of them."""
        for recipe in self.plan["recipes"] + self.plan.get("baselines", []):
            if recipe.get("dense_linears"):
                try:
                    check_dense_linears(PruneConfig(model="", out="", dense_linears=recipe["dense_linears"]),
                                        model_config)
                except SparseDecodingError as exc:
                    raise SystemExit(f"error: {recipe['name']}: {exc}") from exc

    def prune_config(self, recipe: dict) -> PruneConfig:
        known = {f.name for f in fields(PruneConfig)}
        values = {key: value for key, value in recipe.items() if key in known}
        # Every plan before plan-admm.json was fixed while SparseGPT was the default solver: a recipe without
        # "solver" takes the plan's own "solver", else sparsegpt, so committed plans rerun as they were run.
        values.setdefault("solver", self.plan.get("solver", "sparsegpt"))
        # Plans before plan-permute4.json reordered channels across the whole layer, int4 values or not
        values.setdefault("permute_scope", self.plan.get("permute_scope", "layer"))
        calibration = "text" if recipe["data"] == "text" else "decode"
        prompts = recipe["data"] if recipe["data"].startswith("humaneval:") else "humaneval:fit"
        if shares_problems(prompts, "eval"):
            raise SystemExit(f"error: {recipe['name']} calibrates on {prompts}, which holds the held-out half "
                             f"(humaneval:eval) that every plan is scored on; calibrate on humaneval:fit or calib")
        ranked = recipe["name"] in {item["name"] for item in self.plan["recipes"]}  # scored on dev to be chosen
        if ranked and shares_problems(prompts, "dev"):
            raise SystemExit(f"error: {recipe['name']} calibrates on {prompts}, which holds the dev quarter "
                             f"(humaneval:dev) its dev row ranks it on; calibrate on humaneval:fit")
        return PruneConfig(model=str(self.folder), out="", calibration=calibration, prompts=prompts,
                           do_sample=recipe.get("samples_per_prompt", 1) > 1, **values)

    # pruning -----------------------------------------------------------------------------------------------------
    def pruned(self, recipe: dict) -> tuple[torch.nn.Module, dict | None]:
        """The recipe's model: dense, loaded from OUT/models, or pruned (and repaired) now."""
        if recipe.get("dense"):
            return self.dense, None
        file = self.out / "models" / f"{recipe.get('model', recipe['name'])}.safetensors"
        record_file = file.with_suffix(".json")
        model = copy.deepcopy(self.dense)
        if record_file.exists():
            saved = load_file(str(file), device=str(self.device))
            if "lm_head.weight" in saved:  # a quantized head (quantize_head): a weight of its own, never tied
                model.lm_head.weight = torch.nn.Parameter(saved.pop("lm_head.weight"), requires_grad=False)
                model.config.tie_word_embeddings = False
            model.load_state_dict(saved, strict=False)
            return model, json.loads(record_file.read_text())
        start = None
        if "start" in recipe:  # quantize (keep_mask) another item's model of this run, which is made first if needed
            model, start = self.pruned(self.recipe_named(recipe["start"]))
            if recipe.get("as_is"):  # that model itself, scored as it is (the control of a recreated start)
                return model, {**start, "as_is": recipe["start"]}
        calib, stats = self.calibration(recipe)
        config = self.prune_config(recipe)
        started = time.perf_counter()
        outcome = prune_layers(model, calib, config)
        record = {"calibration": stats, "solver_seconds": outcome["solver_seconds"],
                  "prune_seconds": round(time.perf_counter() - started, 1), "config": asdict(config)}
        if start is not None:
            record["start"] = {"recipe": recipe["start"], "record": start}
        if "repair" in recipe:
            record["repair"] = self.repair(model, {**self.plan.get("repair", {}), **recipe["repair"]},
                                           self.out / "data" / f"repair-{recipe['name']}")
        keep_head = head_quantized(record)  # this item's or its start's quantize_head
        trained = {name: tensor for name, tensor in model.state_dict().items()
                   if "layers." in name or name == "lm_head.weight" and keep_head}
        temporary = file.with_name(f"{file.stem}.{os.getpid()}.tmp")
        save_file({name: tensor.contiguous() for name, tensor in trained.items()}, str(temporary))
        os.replace(temporary, file)
        write_json(record_file, record)
        return model, record

    def recipe_named(self, name: str) -> dict:
        """The plan's recipe or baseline called `name` (a `start`)."""
        for recipe in [*self.plan["recipes"], *self.plan["baselines"]]:
            if recipe["name"] == name:
                return recipe
        raise SystemExit(f"error: the plan names start {name!r}, which is neither a recipe nor a baseline of it")

    # scoring -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, model, split: str) -> tuple[dict, list[dict]]:
        """pass@1 under both wordings (one batched greedy generation), KL and repetition on the fenced answers,
        Lee perplexity."""
        limit = self.args.limit
        problems = humaneval_problems(split)[:limit]
        prompts = [prompt for wording in WORDINGS for prompt in humaneval_prompts(split, wording)[:limit]]
        started = time.perf_counter()
        prompt_ids = tokenize_prompts(self.tokenizer, chat_format(self.tokenizer, prompts))
        generations = generate_many(model, self.tokenizer, prompt_ids, self.args.max_new_tokens,
                                    batch_size=len(prompt_ids), progress=False)
        seconds = {"generation": round(time.perf_counter() - started, 1)}
        metrics: dict = {"split": split, "problems": len(problems), "wordings": list(WORDINGS)}
        records = []
        for index, wording in enumerate(WORDINGS):
            part = generations[index * len(problems):(index + 1) * len(problems)]
            completions = [self.tokenizer.decode(gen.new_ids, skip_special_tokens=True) for gen in part]
            checked = check_completions(problems, completions, self.limits)
            metrics[f"pass@1_{wording}"] = sum(item.passed for item in checked) / len(checked)
            metrics[f"passed_{wording}"] = sum(item.passed for item in checked)
            records += [{"wording": wording, **asdict(item), "new_tokens": len(gen.new_ids)}
                        for item, gen in zip(checked, part)]
        metrics["pass@1_mean"] = sum(metrics[f"pass@1_{w}"] for w in WORDINGS) / len(WORDINGS)
        fenced = generations[:len(problems)]
        if model is not self.dense:
            scores = on_policy_scores(self.dense, model, fenced, self.tokenizer.pad_token_id, 16)
            tokens = sum(score.tokens for score in scores)
            metrics["kl"] = sum(score.kl for score in scores) / tokens
            metrics["dense_nll"] = sum(score.dense_nll for score in scores) / tokens
        else:
            metrics["kl"] = 0.0
        metrics.update(repetition_summary([gen.new_ids for gen in fenced]))
        metrics["ppl"], _ = perplexity(model, self.lee_ids, 512, 16)
        seconds["total"] = round(time.perf_counter() - started, 1)
        metrics["seconds"] = seconds
        return metrics, records

    def item(self, stage: str, recipe: dict, split: str, estimate: float, grace: float = 0.0) -> dict | None:
        result_file = self.out / stage / f"{recipe['name']}.json"
        if result_file.exists():
            return json.loads(result_file.read_text())
        if self.args.only and recipe.get("model", recipe["name"]) not in self.args.only:
            return None  # a held-out pick or check answers to the name of the recipe it scores
        if not self.time_left(estimate - grace):
            log.info("deadline: %s/%s left for the next call", stage, recipe["name"])
            return None
        if not self.claim(f"{stage}-{recipe['name']}"):
            return None
        log.info("%s: %s", stage, recipe["name"])
        started = time.perf_counter()
        try:
            model, record = self.pruned(recipe)
            metrics, records = self.score(model, split)
        except Exception as error:  # one broken recipe must not stop the search: it is reported as failed
            log.exception("%s %s failed", stage, recipe["name"])
            write_json(self.out / stage / f"{recipe['name']}.failed", {"name": recipe["name"], "recipe": recipe,
                                                                       "error": f"{type(error).__name__}: {error}"})
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
            return None
        result = {"name": recipe["name"], "recipe": recipe, "pruning": record, "metrics": metrics,
                  "seconds": round(time.perf_counter() - started, 1), "environment": environment(),
                  "command": ["python", *sys.argv], "harness": HARNESS_VERSION}
        (self.out / stage / f"{recipe['name']}.records.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in records))
        write_json(result_file, result)
        log.info("%s %s: %s", stage, recipe["name"], {k: v for k, v in metrics.items() if k != "seconds"})
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return result

    # stages ------------------------------------------------------------------------------------------------------
    def queue(self, stages: set[str]) -> tuple[list[tuple[str, dict, str]], list[tuple[str, dict, str]]]:
        """This worker's order over the items that do not depend on the dev results, as (before the picks, after
        them): items the plan marks `late` (the pattern sweep, the text baseline) run after the picks' held-out
        scores. Even workers start with the dense model and the recipes on the self-written data (they build it);
        odd workers start with what needs no self-written data (recipes on HumanEval's fit quarter, then the
        held-out scores of the dense model and the baselines) and then join the self-written recipes in plan order.
        Claims keep workers off each other's items."""
        dev = [("dev", recipe, "dev") for recipe in [{"name": "dense", "dense": True}, *self.plan["recipes"]]]
        fixed = [("final", recipe, "eval") for recipe in [{"name": "dense", "dense": True}, *self.plan["baselines"]]]
        dev = dev if "dev" in stages else []
        fixed = fixed if "final" in stages else []
        late = [item for item in dev + fixed if item[1].get("late")]
        dev, fixed = [item for item in dev if item not in late], [item for item in fixed if item not in late]
        broad = [item for item in dev if item[1].get("data") == "broad"]
        rest = [item for item in dev if item not in broad]
        if self.args.worker % 2 == 0:
            return rest[:1] + broad + rest[1:] + fixed, late
        return rest + fixed + broad, late

    def families_settled(self) -> bool:
        """Every recipe of a family has its dev result or nobody claimed it (no worker had time to start it)."""
        names = {name for members in self.plan["families"].values() for name in members}
        return all(self.settled("dev", name) or not (self.out / "claims" / f"dev-{name}").exists() for name in names)

    def settled(self, stage: str, name: str) -> bool:
        return (self.out / stage / f"{name}.json").exists() or (self.out / stage / f"{name}.failed").exists()

    def finals_settled(self) -> bool:
        claimed = [path.name[len("final-"):] for path in (self.out / "claims").glob("final-*")]
        return all(self.settled("final", name) for name in claimed)

    def picks(self) -> dict[str, dict]:
        """The selection rule: per family, the highest mean dev pass@1 over both wordings, ties by lower dev KL,
        among the family's recipes that ran (the ones that did not are listed in the pick's `not_run`). A family
        without any dev result stops the run, unless `--only` leaves out every one of its recipes: then it is left
        out of the picks (a plan run in parts)."""
        chosen = {}
        for family, names in self.plan["families"].items():
            results = [json.loads((self.out / "dev" / f"{name}.json").read_text()) for name in names
                       if (self.out / "dev" / f"{name}.json").exists()]
            if not results and not set(names) & set(getattr(self.args, "only", None) or names):
                log.warning("family %s: none of its recipes is in --only and none has a dev result; not scored", family)
                continue
            if not results:
                raise SystemExit(f"family {family}: no dev result; run --stage dev first")
            best = max(results, key=lambda r: (r["metrics"]["pass@1_mean"], -r["metrics"]["kl"]))
            chosen[family] = {**best["recipe"], "name": f"{family}-{best['recipe']['name']}",
                              "model": best["recipe"]["name"],
                              "not_run": [name for name in names if name not in {r["name"] for r in results}]}
        return chosen

    def run(self, stage: str) -> None:
        stages = {"dev", "final"} if stage == "all" else {stage}
        first, late = self.queue(stages)
        for stage_name, recipe, split in first:
            self.item(stage_name, recipe, split, recipe.get("estimate_s", 120))
        if "final" not in stages:
            for stage_name, recipe, split in late:
                self.item(stage_name, recipe, split, recipe.get("estimate_s", 120))
            return
        if not self.wait_for(self.families_settled, "dev items of the families still running", self.args.pick_grace):
            return
        chosen = self.picks()
        write_json(self.out / "final" / "picks.json", chosen)
        for recipe in chosen.values():
            self.item("final", recipe, "eval", self.args.pick_estimate, self.args.pick_grace)
        picked = {recipe["model"] for recipe in chosen.values()}
        for check in self.plan.get("held_out_checks", []):
            name = check["recipe"]
            if name in picked or not (self.out / "dev" / f"{name}.json").exists():
                continue  # scored as a pick, or it did not run (its dev failure is reported)
            recipe = next(recipe for recipe in self.plan["recipes"] if recipe["name"] == name)
            self.item("final", {**recipe, "name": f"check-{name}", "model": name}, "eval", self.args.pick_estimate,
                      self.args.pick_grace)
        self.report()
        for stage_name, recipe, split in late:
            self.item(stage_name, recipe, split, recipe.get("estimate_s", 120))
        self.wait_for(self.finals_settled, "items of other workers still running", self.args.pick_grace + 400)
        self.report()

    def report(self) -> None:
        Report(self.out, self.plan, self.args.plan).write()


def head_quantized(record: dict | None) -> bool:
    """Whether a pruning record's model has a quantized lm_head: its own `quantize_head` or that of its start."""
    if not record:
        return False
    return (record.get("config") or {}).get("quantize_head", "none") != "none" or \
        head_quantized((record.get("start") or {}).get("record"))


def repair_problem(plan: dict) -> str | None:
    """What is wrong with the first item whose repair settings (the plan's, overridden by the item's) repair does not
    take, else None. Read before the model loads: otherwise only after that item's prune (a CPU rehearsal in the
    seventy-ninth session stopped so after 6.5 minutes of pruning)."""
    for recipe in plan.get("recipes", []) + plan.get("baselines", []):
        if "repair" not in recipe:
            continue
        merged = {**plan.get("repair", {}), **recipe["repair"]}
        missing = [key for key in ("tokens", "dev_tokens") if key not in merged]
        if missing:
            return f"{recipe['name']}: repair settings: no {' or '.join(missing)} (the plan's repair or the item's)"
        if "broad" not in plan:
            return f"{recipe['name']}: repair trains on the self-written prompts, which the plan's \"broad\" sets"
        try:
            repair.RepairConfig(**{key: value for key, value in merged.items()
                                   if key not in REPAIR_DATA_KEYS}).validate()
            selfdata.SelfDataConfig(**plan["broad"]).validate()
        except (TypeError, SparseDecodingError) as exc:
            return f"{recipe['name']}: repair settings: {exc}"
    return None


def earlier_rounds(plan: dict) -> list[Path]:
    """The plan's `earlier` rounds: one committed folder, or a list of them, seeded in that order (a result the first
    gives is not replaced by a later one's)."""
    earlier = plan.get("earlier", [])
    return [Path(folder) for folder in ([earlier] if isinstance(earlier, str) else earlier)]


def harness_name(version: int) -> str:
    """How a report names the harness an earlier result was scored by (0: made before results recorded it)."""
    return f"harness version {version}" if version else "a harness version not recorded (before 4)"


def seed_from_earlier(earlier: Path, out: Path, limits: SandboxLimits = SandboxLimits(),
                      problems: dict[str, dict] | None = None) -> None:
    """Copy an earlier round's dev and held-out results (and their per-problem records) into OUT, leaving out its
    failures and picks, and never over a result this round already has. A result made by an older harness than
    today's (`HARNESS_VERSION`; results without the field are older) is checked again from its records' answers
    (`rescored`), so that no pair or pick mixes harness versions; `problems` (task_id -> problem) defaults to
    HumanEval's."""
    if not earlier.is_dir():
        raise SystemExit(f"the plan's earlier round {earlier} is not a folder")
    for stage in ("dev", "final"):
        for path in sorted((earlier / stage).glob("*.json")):
            if path.stem == "picks":
                continue
            target, records_path = out / stage / path.name, path.with_suffix(".records.jsonl")
            if target.exists():
                continue
            result = json.loads(path.read_text())
            records = ([json.loads(line) for line in records_path.read_text().splitlines()]
                       if records_path.exists() else None)
            if harness_version(result) < HARNESS_VERSION:
                if records is None or any("completion" not in record for record in records):
                    raise SystemExit(f"error: {path} was scored by harness version {harness_version(result)} and "
                                     f"its answers are not in {records_path.name}, so it cannot be checked again "
                                     f"under version {HARNESS_VERSION}; score it again in this round instead")
                if problems is None:
                    problems = {problem["task_id"]: problem for problem in humaneval_problems("all")}
                result, records = rescored(result, records, problems, limits)
            if records is not None:
                (out / stage / records_path.name).write_text("".join(json.dumps(row) + "\n" for row in records))
            write_json(target, result)


def rescored(result: dict, records: list[dict], problems: dict[str, dict],
             limits: SandboxLimits) -> tuple[dict, list[dict]]:
    """A result and its records with every answer checked again under today's harness: outcomes and pass counts
    anew, the rest (KL, perplexity, repetition: none of them reads the harness) as they were. The result keeps the
    counts it had (`rescored`)."""
    checked = check_completions([problems[record["task_id"]] for record in records],
                                [record["completion"] for record in records], limits)
    records = [{**record, **{key: value for key, value in asdict(item).items() if key not in ("task_id", "completion")}}
               for record, item in zip(records, checked)]
    metrics = dict(result["metrics"])
    wordings = metrics.get("wordings", list(WORDINGS))
    for wording in wordings:
        rows = [record for record in records if record["wording"] == wording]
        metrics[f"passed_{wording}"] = sum(record["passed"] for record in rows)
        metrics[f"pass@1_{wording}"] = metrics[f"passed_{wording}"] / len(rows)
    metrics["pass@1_mean"] = sum(metrics[f"pass@1_{wording}"] for wording in wordings) / len(wordings)
    before = {key: result["metrics"][key] for key in (f"passed_{wording}" for wording in wordings)}
    return {**result, "metrics": metrics, "harness": HARNESS_VERSION,
            "rescored": {"from_harness": harness_version(result), **before}}, records


TARGETS = {"nm50": 0.85, "2of4": 0.60}  # issue 11: share of dense held-out pass@1 (KL <= 0.020, ppl <= 2x for nm50)


class Report:
    """OUT/report.md and OUT/summary.json (one row per scored item, to reload and plot) from the result files."""

    def __init__(self, out: Path, plan: dict, plan_path: str):
        self.out, self.plan, self.plan_path = out, plan, plan_path

    def results(self, stage: str) -> dict[str, dict]:
        return {path.stem: json.loads(path.read_text()) for path in sorted((self.out / stage).glob("*.json"))
                if path.stem != "picks"}

    def solved(self, name: str) -> dict[str, dict[str, bool]]:
        """wording -> task_id -> passed, from the item's held-out records."""
        rows = [json.loads(line) for line in (self.out / "final" / f"{name}.records.jsonl").read_text().splitlines()]
        return {wording: {row["task_id"]: row["passed"] for row in rows if row["wording"] == wording}
                for wording in WORDINGS}

    @staticmethod
    def row(name: str, result: dict, dense: dict | None) -> dict:
        recipe, metrics, pruning = result["recipe"], result["metrics"], result.get("pruning") or {}
        repair = pruning.get("repair") or {}
        config = (pruning.get("config") or {}) if recipe.get("as_is") else {}  # an as_is item shows its start's
        row = {"name": name, "pattern": recipe.get("pattern", "dense"), "quantize": recipe.get("quantize", "none"),
               "group_size": recipe.get("group_size", 128) if recipe.get("quantize") == "int4" else None,
               "data": recipe.get("data", f"as {recipe['start']}" if recipe.get("as_is") else "-"),
               "tokens": (pruning.get("calibration") or {}).get("tokens"),
               "propagation": recipe.get("propagation", config.get("propagation", "-")),
               "target": recipe.get("target", config.get("target", "-")),
               "repair_steps": repair.get("best_step"), "repair_tokens": repair.get("tokens"),
               "repair_seconds": repair.get("seconds"), "initial_dev_kl": repair.get("initial_dev_kl"),
               "best_dev_kl": repair.get("best_dev_kl"),
               **{key: metrics[key] for key in ("pass@1_fenced", "pass@1_plain", "pass@1_mean", "passed_fenced",
                                                  "passed_plain", "problems", "kl", "ppl")},
               "seconds": result["seconds"], "prune_seconds": pruning.get("prune_seconds")}
        if dense and dense["metrics"]["pass@1_mean"] > 0:
            row["pass_vs_dense"] = row["pass@1_mean"] / dense["metrics"]["pass@1_mean"]
        if dense:
            row["ppl_vs_dense"] = row["ppl"] / dense["metrics"]["ppl"]
        return row

    def table(self, rows: list[dict]) -> list[str]:
        lines = ["| name | pattern | data (tokens) | propagation, target | repair (best step, tokens, s) | "
                 "pass@1 fenced | pass@1 plain | mean (x dense) | KL(dense‖model) | Lee ppl (x dense) | s |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            repair = (f"{r['repair_steps']}, {r['repair_tokens']}, {r['repair_seconds']:.0f}; dev KL "
                      f"{r['initial_dev_kl']:.4f}->{r['best_dev_kl']:.4f}" if r["repair_tokens"] else "-")
            versus = lambda key: f" ({r[key]:.2f}x)" if key in r else ""  # noqa: E731
            values = "" if r.get("quantize", "none") == "none" else \
                f" {r['quantize']}" + (f" g{r['group_size']}" if r["group_size"] else "")
            lines.append(f"| {r['name']} | {r['pattern']}{values} | {r['data']} ({r['tokens'] or '-'}) | "
                         f"{r['propagation']}, {r['target']} | {repair} | {r['pass@1_fenced']:.3f} "
                         f"({r['passed_fenced']}/{r['problems']}) "
                         f"| {r['pass@1_plain']:.3f} ({r['passed_plain']}/{r['problems']}) | {r['pass@1_mean']:.3f}"
                         f"{versus('pass_vs_dense')} | {r['kl']:.4f} | {r['ppl']:.1f}{versus('ppl_vs_dense')} | "
                         f"{r['seconds']:.0f} |")
        return lines

    def write(self) -> None:
        dev, final = self.results("dev"), self.results("final")
        dev_rows = [self.row(name, result, dev.get("dense")) for name, result in dev.items()]
        final_rows = [self.row(name, result, final.get("dense")) for name, result in final.items()]
        lines = [f"# {self.plan.get('title', 'Issue 11 recipe search')} (Qwen2.5-Coder-1.5B-Instruct)", "",
                 f"Plan: `{self.plan_path}`, fixed before any held-out run. "
                 "Greedy pass@1 under two instruction wordings (fenced, plain) in one sandboxed run; KL(dense‖model) "
                 "on the model's own fenced answers; Lee perplexity on the held-out Lee corpus.", "",
                 "## Dev quarter (HumanEval index % 4 == 2): every configuration tried", ""]
        lines += self.table(dev_rows) if dev_rows else ["(no dev results)"]
        failed = [json.loads(path.read_text()) for stage in ("dev", "final")
                  for path in sorted((self.out / stage).glob("*.failed"))]
        if failed:
            lines += ["", "Failed (not scored):", *[f"- {item['name']}: {item['error']}" for item in failed]]
        picks_file = self.out / "final" / "picks.json"
        picks = json.loads(picks_file.read_text()) if picks_file.exists() else {}
        lines += ["", "## Picks (per family: highest mean dev pass@1, ties by lower dev KL)", ""]
        for family, pick in picks.items():
            missing = f"; not run: {', '.join(pick['not_run'])}" if pick.get("not_run") else ""
            lines.append(f"- {family}: {pick['model']} (members: {', '.join(self.plan['families'][family])}{missing})")
        lines += ["", "## Held-out odd half of HumanEval, each item scored once", ""]
        lines += self.table(final_rows) if final_rows else ["(no held-out results)"]
        lines += self.targets(picks, final) + self.tests(picks, final)
        environments = [result["environment"] for result in [*dev.values(), *final.values()]]
        commands = sorted({" ".join(result["command"]) for result in [*dev.values(), *final.values()]})
        if environments:
            runs = sorted({f"{env['date']}, {env['device']}, {json.dumps(env['versions'])}" for env in environments})
            lines += ["", "Runs (an earlier round's results keep their own):", *[f"- {run}" for run in runs], "",
                      "Commands:", *[f"- `{command}`" for command in commands]]
        again = [(stage, name, result["rescored"]) for stage, results in (("dev", dev), ("held-out", final))
                 for name, result in results.items() if "rescored" in result]
        if again:
            lines += ["", f"Checked again under harness version {HARNESS_VERSION} from their answers (an earlier "
                      "round's, scored by an older harness; passed fenced / plain before):",
                      *[f"- {stage} {name}: from {harness_name(info['from_harness'])}, "
                        f"{' / '.join(str(info[f'passed_{w}']) for w in WORDINGS if f'passed_{w}' in info)}"
                        for stage, name, info in again]]
        (self.out / "report.md").write_text("\n".join(lines) + "\n")
        write_json(self.out / "summary.json", {"dev": dev_rows, "final": final_rows, "picks": picks})

    def targets(self, picks: dict, final: dict) -> list[str]:
        if "dense" not in final:
            return []
        dense = final["dense"]["metrics"]
        lines = []
        for family, pick in picks.items():
            if pick["name"] not in final:
                lines.append(f"- {family}: pick {pick['model']} not scored on the held-out half")
                continue
            if family not in TARGETS:  # a family of its own question (a pattern's share, say): no issue 11 target
                continue
            m = final[pick["name"]]["metrics"]
            need = TARGETS[family] * dense["pass@1_mean"]
            verdict = "met" if m["pass@1_mean"] >= need else f"missed by {need - m['pass@1_mean']:.3f}"
            lines.append(f"- {family} pass@1 {m['pass@1_mean']:.3f} vs >= {need:.3f} ({TARGETS[family]:.0%} of dense "
                         f"{dense['pass@1_mean']:.3f}): {verdict}")
            if family == "nm50":
                lines.append(f"- {family} KL {m['kl']:.4f} vs <= 0.020: "
                             f"{'met' if m['kl'] <= 0.020 else 'missed'}; Lee ppl {m['ppl']:.1f} vs <= "
                             f"{2 * dense['ppl']:.1f}: {'met' if m['ppl'] <= 2 * dense['ppl'] else 'missed'}")
        return ["", "## Targets (issue 11)", "", *lines] if lines else []

    def tests(self, picks: dict, final: dict) -> list[str]:
        lines = ["", "## Paired exact McNemar tests (problems solved only by the first / only by the second)", ""]
        pairs = [(pick["name"], base["name"]) for pick in picks.values() for base in self.plan["baselines"]
                 if base.get("pattern") == pick.get("pattern")] + [(pick["name"], "dense") for pick in picks.values()]
        pairs += [(f"check-{check['recipe']}", other) for check in self.plan.get("held_out_checks", [])
                  for other in check.get("against", [])]
        pairs += [(base["name"], other) for base in self.plan["baselines"] for other in base.get("against", [])]
        listed: set[frozenset] = set()
        for first, second in pairs:
            if first not in final or second not in final or frozenset((first, second)) in listed:
                continue  # not scored, or the same pair the other way round (a pick's baseline naming the pick)
            listed.add(frozenset((first, second)))
            a, b = self.solved(first), self.solved(second)
            for wording in WORDINGS:
                if a[wording].keys() != b[wording].keys():  # pairs by problem, never by position
                    raise SystemExit(f"error: {first} and {second} hold different problems ({wording} wording); "
                                     f"score both on the same split and --limit")
                only_a = sum(a[wording][task] and not b[wording][task] for task in a[wording])
                only_b = sum(b[wording][task] and not a[wording][task] for task in a[wording])
                lines.append(f"- {first} vs {second} ({wording}): {only_a} vs {only_b}, p = {mcnemar(only_a, only_b):.3g}")
        return lines


REPO = Path(__file__).resolve().parents[1]


def missing_calibration_file(path: Path) -> str | None:
    """What is wrong with a committed calibration set's files (`committed_calibration`), or None."""
    for needed in (path, path.with_suffix(".json")):
        if not needed.is_file():
            return (f"the plan's calibration file {needed} does not exist (calibration_files names a set an earlier "
                    f"round brought back, relative to the repository root)")
    return None


def calibration_problem(plan: dict) -> str | None:
    """The first of the plan's calibration_files whose tensors or statistics are missing, checked before the model
    loads (the eightieth session's lease found one missing only when its item began)."""
    for committed in plan.get("calibration_files", {}).values():
        problem = missing_calibration_file(REPO / committed)
        if problem:
            return problem
    return None


def committed_calibration(path: Path) -> tuple[CalibrationSet, dict]:
    """A calibration set a round brought back (`h200.sh recipes` copies OUT/data/KEY.safetensors and its .json into
    the report folder's data/, ':' written '_'), loaded with its statistics; a missing file is one error line."""
    problem = missing_calibration_file(path)
    if problem:
        raise SystemExit(f"error: {problem}")
    return CalibrationSet.load(path), json.loads(path.with_suffix(".json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--plan", default="benchmarks/recipes/plan.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage", choices=["dev", "final", "all", "report"], default="all")
    parser.add_argument("--worker", type=int, default=0, help="this process's index when several share OUT")
    parser.add_argument("--pick-estimate", type=float, default=90.0,
                        help="seconds a pick's held-out scoring needs (its model is already pruned)")
    parser.add_argument("--pick-grace", type=float, default=240.0,
                        help="the picks' held-out scores may start this many seconds past --deadline")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no item starts")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=6.0, help="sandbox seconds per problem")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of a split (smoke runs)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=lambda text: [name for name in text.split(",") if name], default=[],
                        help="comma-separated item names: run only these (recipes, baselines or dense)")
    args = parser.parse_args()
    plan = json.loads(Path(args.plan).read_text())
    missing = [str(folder) for folder in earlier_rounds(plan) if not folder.is_dir()]
    if missing and args.stage != "report":  # found only after the model has loaded otherwise
        parser.exit(2, f"error: the plan's earlier round {', '.join(missing)} is not a folder\n")
    problem = repair_problem(plan) or calibration_problem(plan)
    if problem and args.stage != "report":
        parser.exit(2, f"error: {problem}\n")
    if args.only:  # a typo would otherwise run nothing after the model has loaded
        known = {"dense", *(item["name"] for item in plan["recipes"] + plan["baselines"])}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.exit(2, f"error: --only names {', '.join(unknown)}, not an item of {args.plan}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.stage == "report":
        if not Path(args.out).is_dir():  # the report reads OUT's results; a traceback otherwise
            parser.exit(2, f"error: --stage report reads the results under --out, and {args.out} is not a folder\n")
        Report(Path(args.out), plan, args.plan).write()
        return
    Run(args).run(args.stage)


if __name__ == "__main__":
    main()
