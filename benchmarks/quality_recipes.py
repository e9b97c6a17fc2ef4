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

Every finished item is skipped when the script runs again, so a run can be split over several device calls;
`--deadline` stops starting new items after that many seconds.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from paired_test import mcnemar  # benchmarks/ is on sys.path when this script runs
from sparsedecoding import repair, selfdata
from sparsedecoding.calibration import CalibrationSet, describe
from sparsedecoding.data import chat_format, humaneval_problems, humaneval_prompts, lee_text
from sparsedecoding.evaluation.humaneval import check_completions
from sparsedecoding.evaluation.metrics import on_policy_scores, perplexity, repetition_summary
from sparsedecoding.evaluation.sandbox import SandboxLimits
from sparsedecoding.batchgen import generate_many
from sparsedecoding.generation import tokenize_prompts
from sparsedecoding.models import load_model, resolve_model
from sparsedecoding.pipeline import PruneConfig, build_calibration, prune_layers
from sparsedecoding.runenv import environment, pick_device, write_json

log = logging.getLogger("quality_recipes")
WORDINGS = ("fenced", "plain")


class Run:
    def __init__(self, args):
        self.args = args
        self.plan = json.loads(Path(args.plan).read_text())
        self.out = Path(args.out)
        for sub in ("dev", "final", "models", "data"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.device = pick_device(args.device)
        self.folder = resolve_model(args.model)
        self.dense, self.tokenizer, _ = load_model(self.folder, self.device)
        self.limits = SandboxLimits(args.timeout, 1024)
        self.lee_ids = self.tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"]
        self._selfdata = None

    def time_left(self, needed: float) -> bool:
        return time.perf_counter() - self.started + needed < self.args.deadline

    # data --------------------------------------------------------------------------------------------------------
    def calibration(self, recipe: dict) -> tuple[CalibrationSet, dict]:
        source = recipe["data"]
        key = f"{source}-{recipe['tokens']}-{recipe.get('samples_per_prompt', 1)}"
        file, stats_file = self.out / "data" / f"{key}.safetensors", self.out / "data" / f"{key}.json"
        if stats_file.exists():
            return CalibrationSet.load(file), json.loads(stats_file.read_text())
        if source == "broad":
            data = self.selfdata()
            calib, _ = selfdata.calibration_sets(data, self.tokenizer.pad_token_id, recipe["tokens"])
            stats = {**describe(calib), "selfdata": data.stats}
        else:
            calib, stats = build_calibration(self.prune_config(recipe), self.dense, self.tokenizer)
        calib.save(file)
        write_json(stats_file, stats)
        return calib, stats

    def selfdata(self) -> selfdata.SelfData:
        """The dense model's self-written prompts and its answers (built once, resumable, in OUT/data/selfdata)."""
        if self._selfdata is None:
            config = selfdata.SelfDataConfig(**self.plan["broad"], seed=self.args.seed)
            self._selfdata = selfdata.build(self.dense, self.tokenizer, self.out / "data" / "selfdata", config)
        return self._selfdata

    def repair(self, model, settings: dict, work: Path) -> dict:
        """Fixed-mask distillation of `model` towards the dense model on the pruned model's own samples of the
        self-written train prompts, early-stopped on its samples of the dev prompts."""
        data = self.selfdata()
        settings = dict(settings)
        tokens = settings.pop("tokens")
        dev_tokens = settings.pop("dev_tokens")
        started = time.perf_counter()
        train = repair.student_samples(model, self.tokenizer, [gen.prompt_ids for gen in data.train],
                                       token_budget=tokens, seed=self.args.seed, progress=False)
        dev = repair.student_samples(model, self.tokenizer, [gen.prompt_ids for gen in data.dev],
                                     token_budget=dev_tokens, seed=self.args.seed + 1, progress=False)
        sampling = round(time.perf_counter() - started, 1)
        report = repair.repair(self.dense, model, train, dev, work, repair.RepairConfig(**settings, seed=self.args.seed))
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        return {**report, "sampling_seconds": sampling, "train_tokens": train.tokens, "dev_tokens": dev.tokens}

    def prune_config(self, recipe: dict) -> PruneConfig:
        known = {f.name for f in fields(PruneConfig)}
        values = {key: value for key, value in recipe.items() if key in known}
        calibration = "text" if recipe["data"] == "text" else "decode"
        prompts = recipe["data"] if recipe["data"].startswith("humaneval:") else "humaneval:fit"
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
            model.load_state_dict(load_file(str(file), device=str(self.device)), strict=False)
            return model, json.loads(record_file.read_text())
        calib, stats = self.calibration(recipe)
        config = self.prune_config(recipe)
        started = time.perf_counter()
        outcome = prune_layers(model, calib, config)
        record = {"calibration": stats, "solver_seconds": outcome["solver_seconds"],
                  "prune_seconds": round(time.perf_counter() - started, 1), "config": asdict(config)}
        if recipe.get("repair"):
            record["repair"] = self.repair(model, {**self.plan["repair"], **recipe["repair"]},
                                           self.out / "data" / f"repair-{recipe['name']}")
        trained = {name: tensor for name, tensor in model.state_dict().items() if "layers." in name}
        save_file({name: tensor.contiguous() for name, tensor in trained.items()}, str(file))
        write_json(record_file, record)
        return model, record

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

    def item(self, stage: str, recipe: dict, split: str, estimate: float) -> dict | None:
        result_file = self.out / stage / f"{recipe['name']}.json"
        if result_file.exists():
            return json.loads(result_file.read_text())
        if not self.time_left(estimate):
            log.info("deadline: %s/%s left for the next call", stage, recipe["name"])
            return None
        log.info("%s: %s", stage, recipe["name"])
        started = time.perf_counter()
        model, record = self.pruned(recipe)
        metrics, records = self.score(model, split)
        result = {"name": recipe["name"], "recipe": recipe, "pruning": record, "metrics": metrics,
                  "seconds": round(time.perf_counter() - started, 1), "environment": environment(),
                  "command": ["python", *sys.argv]}
        (self.out / stage / f"{recipe['name']}.records.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in records))
        write_json(result_file, result)
        log.info("%s %s: %s", stage, recipe["name"], {k: v for k, v in metrics.items() if k != "seconds"})
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return result

    # stages ------------------------------------------------------------------------------------------------------
    def dev(self) -> None:
        for recipe in [{"name": "dense", "dense": True}, *self.plan["recipes"]]:
            self.item("dev", recipe, "dev", recipe.get("estimate_s", 120))

    def picks(self) -> dict[str, dict]:
        """The selection rule: per family, the highest mean dev pass@1 over both wordings, ties by lower dev KL."""
        chosen = {}
        for family, names in self.plan["families"].items():
            results = [json.loads((self.out / "dev" / f"{name}.json").read_text()) for name in names
                       if (self.out / "dev" / f"{name}.json").exists()]
            if len(results) < len(names):
                raise SystemExit(f"family {family}: dev results missing; run --stage dev first")
            best = max(results, key=lambda r: (r["metrics"]["pass@1_mean"], -r["metrics"]["kl"]))
            chosen[family] = {**best["recipe"], "name": f"{family}-{best['recipe']['name']}",
                              "model": best["recipe"]["name"]}
        return chosen

    def final(self) -> None:
        chosen = self.picks()
        write_json(self.out / "final" / "picks.json", chosen)
        for recipe in [{"name": "dense", "dense": True}, *chosen.values(), *self.plan["baselines"]]:
            if self.item("final", recipe, "eval", recipe.get("estimate_s", 120)) is None:
                return
        self.report(chosen)

    def report(self, chosen: dict) -> None:
        results = {path.stem: json.loads(path.read_text()) for path in (self.out / "final").glob("*.json")
                   if path.stem != "picks"}
        solved = {}
        for name in results:
            rows = [json.loads(line) for line in (self.out / "final" / f"{name}.records.jsonl").read_text().splitlines()]
            solved[name] = {w: [row["passed"] for row in rows if row["wording"] == w] for w in WORDINGS}
        lines = ["# Held-out results (odd half of HumanEval, 82 problems)", "",
                 "| model | pattern | pass@1 fenced | pass@1 plain | KL(dense‖model) | Lee ppl |", "|---|---|---|---|---|---|"]
        for name, result in results.items():
            m = result["metrics"]
            pattern = result["recipe"].get("pattern", "dense")
            lines.append(f"| {name} | {pattern} | {m['pass@1_fenced']:.3f} ({m['passed_fenced']}) | "
                         f"{m['pass@1_plain']:.3f} ({m['passed_plain']}) | {m['kl']:.4f} | {m['ppl']:.1f} |")
        lines += ["", "Paired exact McNemar tests (problems solved by the pick only / by the baseline only):", ""]
        for pick in chosen.values():
            for base in self.plan["baselines"]:
                if base.get("pattern") != pick.get("pattern") or base["name"] not in solved:
                    continue
                for wording in WORDINGS:
                    pairs = list(zip(solved[pick["name"]][wording], solved[base["name"]][wording]))
                    only_a = sum(a and not b for a, b in pairs)
                    only_b = sum(b and not a for a, b in pairs)
                    lines.append(f"- {pick['name']} vs {base['name']} ({wording}): {only_a} vs {only_b}, "
                                 f"p = {mcnemar(only_a, only_b):.3g}")
        env = environment()
        lines += ["", f"Run: {env['date']}, {env['device']}, {json.dumps(env['versions'])}",
                  f"Command: `python {' '.join(sys.argv)}`"]
        (self.out / "report.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--plan", default="benchmarks/recipes/plan.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage", choices=["dev", "final", "all"], default="all")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no item starts")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=6.0, help="sandbox seconds per problem")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of a split (smoke runs)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    run = Run(args)
    if args.stage in ("dev", "all"):
        run.dev()
    if args.stage in ("final", "all"):
        run.final()


if __name__ == "__main__":
    main()
