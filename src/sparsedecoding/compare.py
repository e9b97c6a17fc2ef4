"""`sparsedecoding compare`: the quality grid behind the paper's table, one report.

Configurations (names are what `--configs` globs match):
- `dense`: the unpruned model.
- `{text,decode}-{sparsegpt,wanda}-{2of4,50pct}`: text- vs decode-calibrated pruning, dense propagation (every
  Hessian from the dense model); `…-seq` with sequential propagation (SparseGPT); `mix-sparsegpt-…`: half the tokens
  from each source.
- `small-…`: the cross-model ablation on a small model (SmolLM2-135M): `small-dense`, `small-text-…`, `small-decode-…`
  (calibrated on its own generations) and `small-cross-…` (on the main model's generations of the same prompts,
  re-tokenized as text: prompt in the small model's chat template, continuation kept).
Every calibration source gets the same token budget. Calibration sets are built once per source with the dense model
and cached in OUT/calibration/. Each configuration prunes an in-memory copy of the dense model (`pipeline.prune_layers`,
nothing written: `sparsedecoding prune` with the same settings gives the checkpoint), is evaluated against the dense
model (one set of greedy answers serves pass@1, on-policy KL and repetition) and written to OUT/configs/NAME.json.
Configurations whose result exists are skipped, so a run can be split (`--configs`) and resumed; OUT/quality.md and
quality.json are rebuilt from every result present after each configuration.
Every input (the selection, the settings, the report folder and what it already holds, the models, prompt and text
files, and the sandbox of pass@1) is checked before any model is loaded or anything is written.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from .calibration import CalibrationSet, decode_set_from_generations, describe
from .data import chat_format, read_prompts, read_text_file
from .errors import OutputNotWritableError, SparseDecodingError
from .outputs import check_not_source, check_writable, markdown_table, path_exists, write_jsonl
from .evaluation.suite import HARNESS_VERSION, check_settings, evaluate, harness_version
from .generation import Generation, generate, tokenize_prompts
from .models import check_pattern_fits, load_model, resolve_model
from .pipeline import build_calibration, prune_layers
from .runenv import environment, peak_memory_gb, pick_device, write_json
from .settings import CompareSettings, PruneConfig

log = logging.getLogger(__name__)

PATTERNS = {"2of4": "2:4", "50pct": "50%"}


@dataclass(frozen=True)
class GridConfig:
    """One row of the report. role: `main` or `small` model. calibration: None for the dense model, else decode,
    text, mix or cross (decode on the main model's generations, for the small model only)."""

    name: str
    role: str
    calibration: str | None = None
    solver: str = "sparsegpt"
    pattern: str = "2of4"
    propagation: str = "dense"


def grid() -> list[GridConfig]:
    """Every configuration, in report order."""
    configs = [GridConfig("dense", "main")]
    for pattern in PATTERNS:
        for solver in ("sparsegpt", "wanda"):
            for calibration in ("text", "decode"):
                configs.append(GridConfig(f"{calibration}-{solver}-{pattern}", "main", calibration, solver, pattern))
        for calibration in ("text", "decode"):
            configs.append(GridConfig(f"{calibration}-sparsegpt-{pattern}-seq", "main", calibration, "sparsegpt",
                                      pattern, "sequential"))
        configs.append(GridConfig(f"mix-sparsegpt-{pattern}", "main", "mix", "sparsegpt", pattern))
    configs.append(GridConfig("small-dense", "small"))
    for pattern in PATTERNS:
        for calibration in ("text", "decode", "cross"):
            configs.append(GridConfig(f"small-{calibration}-sparsegpt-{pattern}", "small", calibration, "sparsegpt",
                                      pattern))
    return configs


def select(patterns: list[str] | None) -> list[GridConfig]:
    """The grid filtered by name globs (all of it for None); no glob at all, or a glob matching nothing, is an
    error."""
    configs = grid()
    if patterns is None:
        return configs
    if not patterns:
        raise SparseDecodingError("--configs names no configuration; give comma-separated name globs such as "
                                  "'dense,*-sparsegpt-2of4' (see --list), or leave --configs out for the whole grid")
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(config.name, pattern) for config in configs):
            raise SparseDecodingError(f"--configs {pattern!r} matches no configuration; choose from "
                                      f"{', '.join(config.name for config in configs)}")
    return [config for config in configs if any(fnmatch.fnmatchcase(config.name, pattern) for pattern in patterns)]


# Settings that folders made by older versions may hold, with the value under which their results match today's code
# (None: any value). Block-wise refinement was removed; see benchmarks/results/SUMMARY.md for its last commit.
RETIRED_SETTINGS = {"refine_steps": 0, "refine_lr": None}


# The keys of a result file that the report is built from.
RESULT_KEYS = ("name", "config", "pruning", "metrics", "environment")


def read_object(path: Path, remedy: str) -> dict:
    """A JSON object from the report folder; a SparseDecodingError naming the file and `remedy` when it is not one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SparseDecodingError(f"{path} cannot be read ({exc.strerror}); {remedy}") from None
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        problem = "is empty" if not data.strip() else f"is not valid JSON ({exc})"
        raise SparseDecodingError(f"{path} {problem}; {remedy}") from None
    if not isinstance(value, dict):
        raise SparseDecodingError(f"{path} holds a JSON {type(value).__name__}, not an object; {remedy}")
    return value


def check_folder_writable(root: Path) -> None:
    """Refuse, before any work, a report folder that could not be written: for a new one, a parent it cannot be
    created in (`outputs.check_writable`); for an existing one, a file where it or its calibration/ or configs/ must
    be, or a folder in which no entry can be created (probed for real, as check_writable does: permission bits say
    nothing about read-only mounts or root)."""
    if not path_exists(root):
        check_writable(root, partial=False)
        return
    for folder in (root, root / "calibration", root / "configs"):
        if folder.exists() and not folder.is_dir():
            raise OutputNotWritableError(f"cannot write the report into {root}: {folder} is a file, not a folder; "
                                         f"choose another --out")
        if folder.is_dir():
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=folder))
            except OSError as exc:
                raise OutputNotWritableError(f"cannot write the report into {root}: {folder} is not writable "
                                             f"({exc.strerror}); choose another --out") from None


class Report:
    """The folder: settings.json (fixed at the first run), calibration/, configs/, quality.{md,json}. `check` reads
    it and `create` writes, so that every input can be checked in between."""

    def __init__(self, settings: CompareSettings):
        if not settings.out.strip():
            raise SparseDecodingError("--out is empty; name the report folder")
        self.root = Path(settings.out)
        self.settings = settings
        self.now = json.loads(json.dumps(settings.comparable()))  # tuples become lists, as in the stored file

    def check(self) -> None:
        """Refuse a folder that cannot be written, or whose settings differ from these or whose files are
        unreadable; writes nothing."""
        check_folder_writable(self.root)
        fixed = self.root / "settings.json"
        if fixed.exists():
            self.check_stored(read_object(fixed, f"it records the settings of every result in {self.root}: restore "
                                                 f"it (each result in configs/ holds them), or use another --out"))
        for path in sorted((self.root / "configs").glob("*.json")):
            remedy = f"delete it to run {path.stem} again"
            missing = [key for key in RESULT_KEYS if key not in read_object(path, remedy)]
            if missing:
                raise SparseDecodingError(f"{path} lacks {', '.join(missing)}, which every result has; {remedy}")
        for path in sorted((self.root / "calibration").glob("*.json")):
            read_object(path, f"delete it and {path.stem}.safetensors to build that calibration set again")

    def check_stored(self, stored: dict) -> None:
        """The stored settings must be these; a setting added after the folder was made counts as its default
        there."""
        for key, value in RETIRED_SETTINGS.items():
            if value is not None and stored.get(key, value) != value:
                raise SparseDecodingError(f"{self.root} holds results made with {key}={stored[key]}, a setting "
                                          f"that no longer exists; use another --out")
            stored.pop(key, None)
        defaults = json.loads(json.dumps(CompareSettings().comparable()))
        earlier = {**{key: defaults[key] for key in self.now.keys() - stored.keys()}, **stored}
        if earlier != self.now:
            changed = sorted(key for key in earlier.keys() | self.now.keys() if earlier.get(key) != self.now.get(key))
            raise SparseDecodingError(f"{self.root} holds results made with other settings ({', '.join(changed)});"
                                      f" use another --out, or the same settings to add configurations")

    def create(self) -> None:
        for sub in ("calibration", "configs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        fixed = self.root / "settings.json"
        if not fixed.exists():
            write_json(fixed, self.now)

    def result_file(self, name: str) -> Path:
        return self.root / "configs" / f"{name}.json"

    def done(self, name: str) -> bool:
        return self.result_file(name).exists()

    def has_calibration(self, key: str) -> bool:
        return (self.root / "calibration" / f"{key}.json").exists()

    def calibration(self, key: str, build) -> tuple[CalibrationSet, dict]:
        """A calibration set and its statistics from OUT/calibration/, built by `build()` the first time. The
        statistics are written last (atomically), so their file marks a complete set."""
        file, stats_file = self.root / "calibration" / f"{key}.safetensors", self.root / "calibration" / f"{key}.json"
        if stats_file.exists():
            return CalibrationSet.load(file), json.loads(stats_file.read_text())
        calib, stats = build()
        calib.save(file)
        write_json(stats_file, stats)
        return calib, stats

    def save_result(self, name: str, payload: dict, records: list[dict]) -> None:
        if records:
            write_jsonl(self.root / "configs" / f"{name}.humaneval.jsonl", records)
        write_json(self.result_file(name), payload)

    def results(self) -> list[dict]:
        order = {config.name: index for index, config in enumerate(grid())}
        found = [json.loads(path.read_text()) for path in (self.root / "configs").glob("*.json")]
        return sorted(found, key=lambda result: order.get(result["name"], len(order)))


def cross_model_set(main, main_tokenizer, small_tokenizer, prompts: list[str], settings: CompareSettings,
                    ) -> tuple[CalibrationSet, dict]:
    """The main model's greedy continuations of `prompts`, re-tokenized for the small model: each prompt in the small
    model's chat template, the continuation's text (special tokens dropped) as its generated tokens."""
    prompt_ids = tokenize_prompts(main_tokenizer, chat_format(main_tokenizer, prompts))
    generations = generate(main, main_tokenizer, prompt_ids, settings.max_new_tokens,
                           batch_size=settings.gen_batch_size)
    small_prompts = tokenize_prompts(small_tokenizer, chat_format(small_tokenizer, prompts))
    retokenized = [
        Generation(small_ids, small_tokenizer(main_tokenizer.decode(gen.new_ids, skip_special_tokens=True),
                                              add_special_tokens=False)["input_ids"], gen.stopped)
        for small_ids, gen in zip(small_prompts, generations)
    ]
    calib = decode_set_from_generations(retokenized, small_tokenizer.pad_token_id, settings.tokens)
    return calib, {**describe(calib), "generated_by": str(resolve_model(settings.model))}


def prune_config(settings: CompareSettings, config: GridConfig, folder: Path) -> PruneConfig:
    """The pipeline settings of one configuration (`out` stays empty: the grid prunes in memory). Every grid setting
    named like a PruneConfig field is passed on, so a knob added to both reaches the pipeline without more code."""
    shared = {field.name for field in fields(PruneConfig)} - {"model", "out"}
    values = {field.name: getattr(settings, field.name) for field in fields(CompareSettings) if field.name in shared}
    return PruneConfig(
        **values, model=str(folder), out="", prompts=settings.calib_prompts,
        calibration="decode" if config.calibration == "cross" else config.calibration,
        pattern=PATTERNS[config.pattern], solver=config.solver, propagation=config.propagation,
        do_sample=settings.samples_per_prompt > 1)


def pruned_copy(dense, calib: CalibrationSet, config: PruneConfig) -> tuple[torch.nn.Module, dict]:
    """A copy of the dense model pruned in memory, and the pipeline's per-layer statistics."""
    model = copy.deepcopy(dense)
    return model, prune_layers(model, calib, config)


class Group:
    """One dense model (main or small) loaded once, with everything its configurations need."""

    def __init__(self, report: Report, role: str, folder: Path, device: torch.device):
        self.report, self.role, self.settings, self.folder = report, role, report.settings, folder
        self.dense, self.tokenizer, _ = load_model(folder, device)

    def calibration(self, config: GridConfig, main: Group | None) -> tuple[CalibrationSet, dict]:
        key = f"{self.role}-{config.calibration}"
        if config.calibration == "cross":
            prompts = read_prompts(self.settings.calib_prompts)
            return self.report.calibration(key, lambda: cross_model_set(
                main.dense, main.tokenizer, self.tokenizer, prompts, self.settings))
        build_config = self.prune_settings(config)
        return self.report.calibration(key, lambda: build_calibration(build_config, self.dense, self.tokenizer))

    def prune_settings(self, config: GridConfig) -> PruneConfig:
        """The configuration's pipeline settings. Text and mix sources get exactly as many tokens as this model's
        decode source produced (greedy decoding can fall short of the budget), so every source has the same count."""
        settings = prune_config(self.settings, config, self.folder)
        if config.calibration in ("text", "mix"):
            decode, _ = self.calibration(replace(config, calibration="decode"), None)
            settings = replace(settings, tokens=min(settings.tokens, decode.tokens))
        return settings

    def run(self, config: GridConfig, main: Group | None) -> tuple[dict, list[dict]]:
        """Prune (unless dense) and evaluate one configuration; returns its result and per-problem records."""
        started = time.perf_counter()
        if config.calibration is None:  # against itself: KL is exactly 0, dense NLL is measured as for the others
            evaluated, pruning = self.dense, None
        else:
            calib, stats = self.calibration(config, main)
            prune_settings = self.prune_settings(config)
            device = next(self.dense.parameters()).device
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            evaluated, outcome = pruned_copy(self.dense, calib, prune_settings)
            errors = [layer["relative_error"] for layer in outcome["layers"].values()]
            pruning = {"pattern": PATTERNS[config.pattern], "solver": config.solver, "propagation": config.propagation,
                       "calibration": stats, "solver_seconds": outcome["solver_seconds"],
                       "peak_memory_gb": peak_memory_gb(device),
                       "median_relative_error": statistics.median(errors), "max_relative_error": max(errors),
                       "pipeline": asdict(prune_settings)}
        prune_seconds = time.perf_counter() - started
        metrics, records = evaluate(evaluated, self.tokenizer, self.settings.evaluation, reference=self.dense)
        result = {"name": config.name, "config": asdict(config), "model": str(self.folder),
                  "harness": HARNESS_VERSION, "pruning": pruning,
                  "metrics": metrics, "seconds": {"prune": round(prune_seconds, 1),
                                                  "total": round(time.perf_counter() - started, 1)}}
        return result, records


def check_inputs(settings: CompareSettings, todo: list[GridConfig], needs_cross: bool) -> dict[str, Path]:
    """Everything the configurations to run read, checked before any model is loaded or anything written: each model
    they need (resolved: an offline model is fetched, a GGUF converted, once), each pattern on it, the calibration
    prompts and text, the evaluation prompts and the sandbox of pass@1. Returns the folder of each model needed."""
    roles = {config.role for config in todo} | ({"main"} if needs_cross else set())
    folders = {role: resolve_model(spec) for role, spec in (("main", settings.model), ("small", settings.small_model))
               if role in roles}
    check_not_source(Path(settings.out), *folders.values())  # an offline model's name, resolved to its folder
    pruned = [config for config in todo if config.calibration is not None]
    for config in pruned:
        prune_settings = prune_config(settings, config, folders[config.role])
        check_pattern_fits(folders[config.role], prune_settings.sparsity_pattern(), config.solver,
                           prune_settings.blocksize)
    if pruned:  # every source needs the decode set (text and mix take its token count), cross the same prompts
        read_prompts(settings.calib_prompts)
    if settings.text and any(config.calibration in ("text", "mix") for config in pruned):
        read_text_file(settings.text)
    if todo:
        evaluation = settings.evaluation
        check_settings(evaluation, has_reference=True)
        if {"kl", "repetition"} & set(evaluation.metrics):
            read_prompts(evaluation.prompts or f"humaneval:{evaluation.split}")
    return folders


def run_compare(settings: CompareSettings, patterns: list[str] | None = None) -> Path:
    """Run the selected configurations that have no result yet; rebuild the report; returns OUT/quality.md."""
    chosen = select(patterns)
    settings.validate()
    device = pick_device(settings.device)
    report = Report(settings)
    # the report folder gains settings.json, configs/ and calibration/: never a model folder (or one holding it)
    check_not_source(report.root, settings.model, settings.small_model)
    report.check()
    todo = [config for config in chosen if not report.done(config.name)]
    older = older_harness(report.results())
    if older:
        log.warning("%s were evaluated by an older harness (%s); the report marks them, and deleting their "
                    "configs/NAME.json evaluates them again", ", ".join(older), harness_history(report.results()))
    needs_cross = any(config.calibration == "cross" for config in todo) and not report.has_calibration("small-cross")
    folders = check_inputs(settings, todo, needs_cross)
    report.create()
    log.info("%d configuration(s) selected, %d already done, %d to run", len(chosen), len(chosen) - len(todo),
             len(todo))
    groups: dict[str, Group] = {}
    if "main" in folders:
        groups["main"] = Group(report, "main", folders["main"], device)
    for role in ("main", "small"):
        configs = [config for config in todo if config.role == role]
        if not configs:
            continue
        group = groups.get(role) or Group(report, role, folders[role], device)
        if role == "small":
            if needs_cross:  # while the main model is still loaded
                group.calibration(next(config for config in configs if config.calibration == "cross"), groups["main"])
            groups.pop("main", None)
        for number, config in enumerate(configs, 1):
            log.info("[%s %d/%d] %s", role, number, len(configs), config.name)
            result, records = group.run(config, groups.get("main"))
            result.update(environment=environment(next(group.dense.parameters()).device),
                          settings=settings.comparable(), command=settings.command)
            report.save_result(config.name, result, records)
            log.info("%s: %s (%.0f s)", config.name, compact(result["metrics"]), result["seconds"]["total"])
            write_report(report)
    return write_report(report)


def compact(metrics: dict) -> str:
    keys = ("pass@1", "kl", "dense_nll", "ppl", "mean_length")
    return " ".join(f"{key}={metrics[key]:.4g}" for key in keys if isinstance(metrics.get(key), (int, float)))


COLUMNS = [("pass@1", "pass@1"), ("KL(dense‖pruned)", "kl"), ("dense NLL", "dense_nll"), ("ppl lee.cor", "ppl"),
           ("distinct-4", "distinct_4"), ("longest repeat", "longest_repeat"), ("mean length", "mean_length"),
           ("stopped", "stopped_share")]


def cell(metrics: dict, key: str):
    """A metric for the table: "—" where it was not measured, "n/a" where it was not finite (stored as null)."""
    value = metrics.get(key, "—")
    return "n/a" if value is None else value


def table(results: list[dict]) -> str:
    headers = ["config", "calibration", "solver", "pattern", "propagation", "calib tokens", *[h for h, _ in COLUMNS]]
    rows = []
    for result in results:
        config, pruning = result["config"], result["pruning"] or {}
        tokens = pruning.get("calibration", {}).get("tokens", "—")
        metrics = result["metrics"]
        rows.append([result["name"], config["calibration"] or "—", pruning.get("solver", "—"),
                     pruning.get("pattern", "—"), pruning.get("propagation", "—"), tokens,
                     *[cell(metrics, key) for _, key in COLUMNS]])
    return markdown_table(headers, rows)


def sampling(settings: CompareSettings) -> str:
    if settings.samples_per_prompt == 1:
        return "greedy"
    return (f"{settings.samples_per_prompt} sampled continuations per prompt (temperature {settings.temperature:g}, "
            f"top-p {settings.top_p:g})")


def older_harness(results: list[dict]) -> list[str]:
    """The results evaluated by an older harness than today's (`evaluation.suite.HARNESS_VERSION`)."""
    return [result["name"] for result in results if harness_version(result) < HARNESS_VERSION]


def harness_history(results: list[dict]) -> str:
    """Which harness version evaluated how many of `results`."""
    counts = {}
    for result in results:
        counts[harness_version(result)] = counts.get(harness_version(result), 0) + 1
    return ", ".join(f"{'not recorded (before the fiftieth session)' if version == 0 else f'version {version}'}: "
                     f"{count}" for version, count in sorted(counts.items()))


def harness_note(results: list[dict]) -> str:
    """A report section naming results of an older harness, which differ in how answers were made and run; empty
    when every result is of today's."""
    older = older_harness(results)
    if not older:
        return ""
    return (f"\n## Results of an older harness\n\n{len(older)} of {len(results)} results ({', '.join(older)}) were "
            f"evaluated by an older harness than version {HARNESS_VERSION} ({harness_history(results)}; see "
            f"`HARNESS_VERSION` in `sparsedecoding/evaluation/suite.py` for what changed). Delete their "
            f"`configs/NAME.json` and run the same command again to evaluate them under today's.\n")


def write_report(report: Report) -> Path:
    """quality.md and quality.json from every result in the folder."""
    results = report.results()
    settings = report.settings
    commands = sorted({" ".join(result["command"]) for result in results if result.get("command")})
    environments = sorted({(r["environment"]["date"], r["environment"]["device"],
                            json.dumps(r["environment"]["versions"], sort_keys=True)) for r in results})
    main = [result for result in results if result["config"]["role"] == "main"]
    small = [result for result in results if result["config"]["role"] == "small"]
    evaluation = settings.evaluation
    text = (
        "# Quality: dense vs text- vs decode-calibrated pruning\n\n"
        f"Main model `{settings.model}`; cross-model ablation on `{settings.small_model}`. Calibration prompts "
        f"`{settings.calib_prompts}` (decode sources), `{settings.text or 'lee_background.cor'}` (text), "
        f"{settings.tokens} tokens per "
        f"source (mix: {settings.mix_ratio:g} decode), {settings.max_new_tokens} new tokens per calibration prompt, "
        f"{sampling(settings)}, seed {settings.seed}, SparseGPT damping {settings.percdamp:g}"
        + (f", columns in the {settings.solver_order} order" if settings.solver_order != "columns" else "")
        + (f", kept weights refit by {settings.refit_steps} steps" if settings.refit_steps else "")
        + ". "
        f"Evaluation: pass@1 on HumanEval `{evaluation.split}` (greedy, sandboxed, "
        f"{evaluation.timeout_s:g} s and {evaluation.memory_mb} MB per problem); on-policy KL(dense‖evaluated), "
        f"the dense model's NLL per token and repetition over the evaluated model's own greedy answers (at most "
        f"{evaluation.max_new_tokens} tokens) to `{evaluation.prompts or 'humaneval:' + evaluation.split}`; "
        f"perplexity on `lee.cor` (windows of {evaluation.ppl_window} tokens).\n\n"
        f"## {Path(settings.model).name}\n\n" + table(main)
        + f"\n## Cross-model ablation: {Path(settings.small_model).name}\n\n"
        "`small-cross-…` is calibrated on the main model's generations of the calibration prompts (re-tokenized), "
        "`small-decode-…` on its own.\n\n" + table(small)
        + harness_note(results)
        + "\n## Runs\n\n" + "".join(f"- {date}, {device}, {versions}\n" for date, device, versions in environments)
        + "\nCommands:\n\n" + "".join(f"    {command}\n" for command in commands)
    )
    path = report.root / "quality.md"
    write_json(report.root / "quality.json", {"settings": settings.comparable(), "results": results})
    partial = path.with_suffix(".md.tmp")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
    return path
