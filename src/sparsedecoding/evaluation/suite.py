"""`sparsedecoding eval`: every metric of one model, each usable alone, sharing one set of greedy generations.

The evaluated model continues the held-out HumanEval prompts greedily once; those continuations serve pass@1 (run in
the sandbox), on-policy KL and dense NLL against `--reference`, and the repetition statistics. Perplexity reads the
held-out Lee corpus (`lee.cor`; calibration uses `lee_background.cor`). Results go to OUT/metrics.json and the
per-problem records to OUT/humaneval.jsonl (see `outputs.output_folder`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..data import chat_format, humaneval_problems, humaneval_prompts, lee_text, prompts_hash, read_prompts
from ..errors import ModelFileError, SparseDecodingError
from ..generation import Generation, generate, tokenize_prompts
from ..models import check_fits_context, load_model, read_json, resolve_model
from ..invocation import command
from ..runenv import environment, pick_device, versions, write_json
from ..settings import EvalSettings
from .humaneval import check_completions, pass_at_1
from .metrics import on_policy_scores, perplexity, repetition_summary
from ..outputs import PRUNED_MANIFEST, check_output, output_folder, write_jsonl
from .sandbox import SandboxLimits, isolation_command

log = logging.getLogger(__name__)

# The version of how answers are made and checked, stored with every result (`eval`'s metrics.json, each `compare`
# result) so that results of different versions are never mixed unseen. The field exists since version 3; results
# without it (read as 0) were made by version 1 (until the forty-ninth session: answers ran as `__main__` and
# generation also applied the model folder's own generation settings) or 2 (the forty-ninth session: answers run as
# `__sandbox__`, generation applies only its own settings, and under the plain wording KL and repetition read the
# plain prompts as pass@1 does). 3: code extraction also reads an indented fence, `~~~` fences and unfenced code amid
# prose (`evaluation.humaneval`; 1 of 18,860 committed answers gets another program, with the same outcome:
# benchmarks/results/extraction_change_cpu.md). 4 (the sixty-third session): a block whose last line is one or two
# backticks, a closing fence short of a backtick, is read without that line where it does not compile otherwise
# (benchmarks/results/fence_change_cpu.md).
HARNESS_VERSION = 4


def harness_version(result: dict) -> int:
    """The harness version a stored result was made with (0 where it predates the field: version 1 or 2)."""
    return result.get("harness", 0)


class GenerationCache:
    """Greedy continuations of one model, made once per prompt list and shared by the metrics that read them."""

    def __init__(self, model, tokenizer, settings: EvalSettings, progress: bool):
        self.model, self.tokenizer, self.settings, self.progress = model, tokenizer, settings, progress
        self.made: dict[str, list[Generation]] = {}
        self.seconds = 0.0

    def get(self, prompts: list[str]) -> list[Generation]:
        key = prompts_hash(prompts)
        if key not in self.made:
            started = time.perf_counter()
            prompt_ids = tokenize_prompts(self.tokenizer, chat_format(self.tokenizer, prompts))
            self.made[key] = generate(self.model, self.tokenizer, prompt_ids, self.settings.max_new_tokens,
                                      batch_size=self.settings.gen_batch_size, progress=self.progress)
            self.seconds += time.perf_counter() - started
        return self.made[key]


def check_settings(settings: EvalSettings, has_reference: bool) -> None:
    """Everything that can fail before any model work: the values, and the sandbox pass@1 runs its programs in (it
    needs root and util-linux; refusing here beats refusing after every completion has been generated)."""
    settings.validate(has_reference)
    if "pass@1" in settings.metrics:
        isolation_command()


def evaluate(model, tokenizer, settings: EvalSettings, reference=None, progress: bool = True,
             ) -> tuple[dict, list[dict]]:
    """Metrics of a loaded model (and per-problem HumanEval records); `reference` is the dense model for kl."""
    check_settings(settings, reference is not None)
    if reference is not None and reference.get_output_embeddings().out_features != \
            model.get_output_embeddings().out_features:
        raise SparseDecodingError("the reference model has another vocabulary than the evaluated one; KL needs the "
                                  "dense model the pruned one came from")
    cache = GenerationCache(model, tokenizer, settings, progress)
    results: dict = {}
    seconds: dict[str, float] = {}
    records: list[dict] = []
    if {"kl", "repetition"} & set(settings.metrics):
        if settings.prompts:
            source, task_prompts = settings.prompts, read_prompts(settings.prompts)[:settings.limit]
        else:  # the pass@1 prompts in their wording, so one set of answers serves every metric
            source = f"humaneval:{settings.split} ({settings.wording} wording)"
            task_prompts = humaneval_prompts(settings.split, settings.wording)[:settings.limit]
        results["task_prompts"] = {"source": source, "count": len(task_prompts), "hash": prompts_hash(task_prompts)}

    if "pass@1" in settings.metrics:
        generations = cache.get(humaneval_prompts(settings.split, settings.wording)[:settings.limit])
        completions = [tokenizer.decode(gen.new_ids, skip_special_tokens=True) for gen in generations]
        started = time.perf_counter()
        problems = humaneval_problems(settings.split)[:settings.limit]
        checked = check_completions(problems, completions, SandboxLimits(settings.timeout_s, settings.memory_mb),
                                    settings.workers)
        seconds["sandbox"] = time.perf_counter() - started
        results["pass@1"] = pass_at_1(checked)
        results["humaneval_passed"] = sum(item.passed for item in checked)
        results["humaneval_problems"] = len(checked)
        records = [{**asdict(item), "new_tokens": len(gen.new_ids), "stopped": gen.stopped}
                   for item, gen in zip(checked, generations)]

    if "kl" in settings.metrics:
        generations = cache.get(task_prompts)
        started = time.perf_counter()
        scores = on_policy_scores(reference, model, generations, tokenizer.pad_token_id, settings.score_batch_size)
        seconds["scoring"] = time.perf_counter() - started
        tokens = sum(score.tokens for score in scores)
        results["kl"] = sum(score.kl for score in scores) / tokens
        results["dense_nll"] = sum(score.dense_nll for score in scores) / tokens
        results["scored_tokens"] = tokens

    if "repetition" in settings.metrics:
        generations = cache.get(task_prompts)
        results.update(repetition_summary([gen.new_ids for gen in generations]))
        results["stopped_share"] = sum(gen.stopped for gen in generations) / len(generations)

    if "ppl" in settings.metrics:
        started = time.perf_counter()
        ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"]
        results["ppl"], results["ppl_tokens"] = perplexity(model, ids, settings.ppl_window, settings.score_batch_size)
        seconds["perplexity"] = time.perf_counter() - started

    seconds["generation"] = cache.seconds
    results["seconds"] = {key: round(value, 2) for key, value in seconds.items()}
    return results, records


def model_manifest(folder: Path) -> dict | None:
    """The pruning record of a model written by `sparsedecoding prune` (None for a dense model)."""
    file = folder / PRUNED_MANIFEST
    if not file.exists():
        return None
    manifest = read_json(file)
    if not isinstance(manifest, dict):
        raise ModelFileError(f"{file} is not a pruning record (a JSON object); restore it or prune again")
    return {key: manifest.get(key) for key in ("pattern", "solver", "propagation", "calibration", "source_model",
                                               "seed")}


@torch.no_grad()
def run_eval(model: str, out: str | Path, settings: EvalSettings, reference: str | None = None,
             device: str = "auto", overwrite: bool = False, progress: bool = True) -> Path:
    """Load the model (and reference), evaluate, write OUT; returns OUT. See the module docstring."""
    out = Path(out)
    check_settings(settings, reference is not None)
    check_output(out, overwrite, inputs=(model, reference, settings.prompts))
    folder = resolve_model(model)
    reference_folder = resolve_model(reference) if reference else None
    if {"pass@1", "kl", "repetition"} & set(settings.metrics):  # they generate
        check_fits_context(folder, settings.max_new_tokens, "--max-new-tokens")
    if "ppl" in settings.metrics:  # each window is one forward pass over that many positions
        check_fits_context(folder, settings.ppl_window, "--ppl-window")
    pruning = model_manifest(folder)
    if settings.prompts and {"kl", "repetition"} & set(settings.metrics):  # a bad file fails before any loading
        read_prompts(settings.prompts)
    if "pass@1" in settings.metrics:  # so does a damaged HumanEval file (fetched now if absent)
        humaneval_problems(settings.split)
    torch_device = pick_device(device)
    started = time.perf_counter()
    evaluated, tokenizer, _ = load_model(folder, torch_device)
    dense = load_model(reference_folder, torch_device)[0] if reference_folder else None
    results, records = evaluate(evaluated, tokenizer, settings, dense, progress)
    payload = {
        "model": str(folder), "reference": str(reference_folder) if reference_folder else None,
        "harness": HARNESS_VERSION, "pruning": pruning, "metrics": results, "settings": asdict(settings),
        "device": str(torch_device), "dtype": str(next(evaluated.parameters()).dtype),
        "total_seconds": round(time.perf_counter() - started, 2), "versions": versions(),
        "environment": environment(torch_device),
        "command": command(),
    }
    with output_folder(out, overwrite) as folder:
        if records:
            write_jsonl(folder / "humaneval.jsonl", records)
        write_json(folder / "metrics.json", payload)
    return out
