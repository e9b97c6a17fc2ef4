"""Broad decode-time data written by the dense model itself: it invents task prompts, then answers them.

Stage 1 (prompts): meta-prompts built from `TOPICS` × `KINDS` × `LEVELS` ask the model, sampled, for one user request
each: a Python task, a user question, a HumanEval-style function stub (signature + docstring), a debug or refactor
request with code, a general writing request. The replies are cleaned (preambles and code fences stripped; empty,
too short, too long and duplicate prompts dropped).
Stage 2 (answers): prompts from several sources, mixed by weight (`self` = stage 1, `humaneval:fit` or
`humaneval:calib`, prompt files), are answered in the chat template. Every prompt goes to `train` or `dev` by a hash of
its normalized text (`dev_share`), so a prompt and all its samples sit on one side; dev is kept apart for early
stopping and for choosing recipes. The held-out half of HumanEval (`humaneval:eval`) is refused as a source; a
self-written prompt that contains one of its problems or function names is dropped, and any other prompt that does
stops the build.

Both stages run in shards that are written to a folder as JSON lines (text, then token ids) with an atomic rename, so
an interrupted build resumes at the first missing shard. The answers become `CalibrationSet`s through
`calibration.decode_set_from_generations`, whose keep mask covers exactly the decode positions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .batchgen import DEFAULT_KV_BUDGET, check_backend, generate_many
from .calibration import CalibrationSet, decode_set_from_generations
from .data import HUMANEVAL_INSTRUCTIONS, chat_format, humaneval_problems, read_prompts
from .errors import CalibrationError, PromptsError
from .generation import Generation, tokenize_prompts

log = logging.getLogger(__name__)

TOPICS = (
    "string manipulation", "list processing", "dictionaries and counting", "sorting and searching", "recursion",
    "dynamic programming", "graphs and shortest paths", "trees", "linked lists", "stacks and queues", "heaps",
    "bit manipulation", "prime numbers and divisibility", "geometry", "matrices", "dates and times", "parsing text",
    "regular expressions", "file formats such as CSV and JSON", "unit testing", "object-oriented design",
    "iterators and generators", "error handling", "concurrency", "HTTP APIs", "SQL databases", "data analysis with "
    "pandas", "numerical computing with numpy", "machine learning basics", "command-line tools", "shell scripting",
    "git and version control", "web front-ends with JavaScript", "C and memory management", "Rust ownership",
    "Java collections", "algorithmic complexity", "caching", "encryption and hashing", "simulations and games",
    "probability and statistics", "finance and interest", "physics formulas", "text adventure games",
    "scheduling and calendars", "inventory and shopping carts", "cooking and recipes", "travel planning", "history",
    "health and fitness", "personal productivity", "science explanations", "writing and grammar", "job interviews",
)
LEVELS = ("easy", "intermediate", "hard")
# kind -> (meta-prompt, how the cleaned reply becomes the user turn of stage 2)
KINDS = {
    "task": ("Write one self-contained Python programming task about {topic}, of {level} difficulty, phrased as a "
             "user would ask an assistant. Reply with the task only: no solution, no preamble.", "{prompt}"),
    "question": ("Write one question that a user might ask an AI assistant about {topic} ({level} level). Reply "
                 "with the question only.", "{prompt}"),
    "function": ("Write the signature and docstring of one Python function about {topic}, of {level} difficulty, in "
                 "the style of HumanEval: imports if needed, the def line and a docstring with a description and two "
                 "examples, no body. Reply with the code only.", HUMANEVAL_INSTRUCTIONS["fenced"]),
    "debug": ("Write a message a programmer might send to an assistant: a short Python snippet about {topic} that has "
              "a bug ({level} level), and a request to find and fix it. Reply with the message only.", "{prompt}"),
    "refactor": ("Write a message asking an assistant to explain or refactor a short piece of code about {topic} "
                 "({level} level); include the code. Reply with the message only.", "{prompt}"),
    "writing": ("Write one general writing request that a user might send to an assistant (an email, a summary, a "
                "short essay, a plan or a story) related to {topic}. Reply with the request only.", "{prompt}"),
}
HELD_OUT = ("humaneval:eval", "humaneval:all")
# Settings that may change when resuming a folder: they decide how much is built or how fast, not what (the batch
# and the backend change which tokens a seed draws, not the distribution they are drawn from).
RESUMABLE = ("decode_tokens", "batch_size", "kv_budget_bytes", "backend")


@dataclass
class SelfDataConfig:
    """Every knob of a self-data build.

    sources: comma-separated `name=weight` pairs; names are `self` (stage 1), `humaneval:fit` / `humaneval:calib`
    (never `humaneval:eval`) or a prompt file; weights are relative shares of the `n_answers` answered prompts.
    n_meta: meta-prompts sent in stage 1 (every TOPICS × KINDS × LEVELS combination once in a seeded order,
    then again).
    prompt_max_new_tokens / prompt_temperature / prompt_top_p: stage-1 sampling (always sampled: diversity is the point).
    min_prompt_chars / max_prompt_chars: cleaned prompts outside this range are dropped.
    n_answers: prompts answered in stage 2 (a source with fewer prompts than its share repeats them when sampling, and
    gives what it has when greedy). answer_max_new_tokens / answer_do_sample / answer_temperature / answer_top_p:
    stage-2 decoding. decode_tokens: stop stage 2 after the shard in which the train side reaches this many decode
    tokens (None: answer all). dev_share: share of prompts (by hash) kept for dev. shard_size: prompts per shard
    (the unit of resumption; each shard ends with a drain in which finished rows are not replaced).
    batch_size / kv_budget_bytes / backend: the generator's (`batchgen.generate_many`); backend "engine" (default:
    the engine's transformer, 5.9x hf's tokens/s on an H200; Llama, Qwen2, Qwen3 and Mistral) or "hf" (the model's
    own forward). seed: shuffles and sampling."""

    sources: str = "self=0.9,humaneval:fit=0.1"
    n_meta: int = 8192
    prompt_max_new_tokens: int = 320
    prompt_temperature: float = 1.0
    prompt_top_p: float = 0.95
    min_prompt_chars: int = 16
    max_prompt_chars: int = 2000
    n_answers: int = 8192
    answer_max_new_tokens: int = 512
    answer_do_sample: bool = True
    answer_temperature: float = 0.7
    answer_top_p: float = 0.95
    decode_tokens: int | None = None
    dev_share: float = 0.1
    shard_size: int = 4096
    batch_size: int = 256
    kv_budget_bytes: int = DEFAULT_KV_BUDGET
    backend: str = "engine"
    seed: int = 0

    def mix(self) -> list[tuple[str, float]]:
        """The parsed `sources`, checked: known names, positive weights, no held-out split."""
        pairs = []
        for item in self.sources.split(","):
            name, sep, weight = item.strip().rpartition("=")
            try:
                value = float(weight)
            except ValueError:
                value = -1.0
            if not sep or not name or not 0 < value < math.inf:
                raise PromptsError(f"source {item.strip()!r} is not name=weight with a positive, finite weight; write "
                                   f"e.g. self=0.9,humaneval:fit=0.1")
            if name in HELD_OUT:
                raise PromptsError(f"source {name} contains the held-out half of HumanEval; use humaneval:fit or "
                                   f"humaneval:calib")
            pairs.append((name, value))
        return pairs

    def validate(self) -> None:
        self.mix()
        check_backend(self.backend)
        counts = {"n_meta": self.n_meta, "n_answers": self.n_answers, "shard_size": self.shard_size,
                  "batch_size": self.batch_size, "prompt_max_new_tokens": self.prompt_max_new_tokens,
                  "answer_max_new_tokens": self.answer_max_new_tokens}
        for name, value in counts.items():
            if value < 1:
                raise PromptsError(f"{name} must be at least 1, got {value}")
        if not 0.0 < self.dev_share < 1.0:
            raise PromptsError(f"dev_share must be strictly between 0 and 1, got {self.dev_share}")
        if not 0 < self.min_prompt_chars < self.max_prompt_chars:
            raise PromptsError(f"need 0 < min_prompt_chars < max_prompt_chars, got {self.min_prompt_chars} and "
                               f"{self.max_prompt_chars}")
        if self.decode_tokens is not None and self.decode_tokens < 1:
            raise PromptsError(f"decode_tokens must be positive or None, got {self.decode_tokens}")

    def fingerprint(self) -> dict:
        """The settings that decide the data; a folder built with other values cannot be resumed."""
        return {key: value for key, value in asdict(self).items() if key not in RESUMABLE}


@dataclass
class SelfData:
    """Answered prompts split by prompt hash, and build statistics for the manifest."""

    train: list[Generation]
    dev: list[Generation]
    stats: dict


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def is_dev(prompt: str, dev_share: float) -> bool:
    """A prompt's side is a pure function of its normalized text, so it never changes between builds."""
    digest = hashlib.sha256(normalize(prompt).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < dev_share


_FENCE = re.compile(r"```[\w+-]*\n(.*?)```", re.DOTALL)
_SOLUTION = re.compile(r"^[#*_ \t]*(?:(?:example |sample )?(?:solution|answer)|here(?:'s| is) (?:a|the|one) "
                       r"(?:possible )?(?:solution|answer)[^\n]*)[*_: \t]*$.*", re.IGNORECASE | re.MULTILINE | re.DOTALL)
_PREAMBLE = re.compile(r"^(sure|certainly|of course|here(?:'s| is| are)|okay|ok)\b[^\n]*:\s*\n", re.IGNORECASE)


def clean_prompt(reply: str, kind: str, min_chars: int, max_chars: int) -> str | None:
    """The request inside a stage-1 reply, or None when nothing usable remains. A function stub is taken from its
    code block; other kinds lose a leading "Here is ...:" line, everything from a "Solution" or "Answer" line on,
    and wrapping quotes or a `Task:` label."""
    text = reply.strip()
    if kind == "function":
        match = _FENCE.search(text)
        text = match.group(1).strip() if match else text
        if "def " not in text:
            return None
    else:
        text = _SOLUTION.sub("", _PREAMBLE.sub("", text)).strip()  # the request, not an answer the model added
        text = re.sub(r"^\**(task|question|request|message)\**:\**\s*", "", text, flags=re.IGNORECASE).strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            text = text[1:-1].strip()
    if not min_chars <= len(text) <= max_chars:
        return None
    return text


def meta_prompts(n: int, seed: int) -> list[dict]:
    """`n` meta-prompts: every (topic, kind, level) once in a seeded order, then again in a new order, and so on."""
    combos = [(topic, kind, level) for topic in TOPICS for kind in KINDS for level in LEVELS]
    rng = random.Random(seed)
    chosen: list[tuple[str, str, str]] = []
    while len(chosen) < n:
        rnd = combos[:]
        rng.shuffle(rnd)
        chosen += rnd[:n - len(chosen)]
    return [{"topic": topic, "kind": kind, "level": level, "text": KINDS[kind][0].format(topic=topic, level=level)}
            for topic, kind, level in chosen]


_WHITESPACE = re.compile(r"\s+")


def heldout_markers() -> list[str]:
    """Strings no training prompt may contain: each held-out HumanEval problem's text and its `def name(` line. The
    dense model may have memorized HumanEval, so a self-written stub could reproduce a held-out problem nearly
    verbatim; its function name gives it away even when the docstring differs. Three names (correct_bracketing,
    solve, sum_squares) also name problems of the calibration half and are not markers."""
    problems = humaneval_problems("eval")
    calibration_names = {problem["entry_point"] for problem in humaneval_problems("calib")}
    names = sorted({problem["entry_point"] for problem in problems} - calibration_names)
    return [problem["prompt"].strip() for problem in problems] + [f"def {name}(" for name in names]


def find_heldout(prompt: str, held_out: list[str]) -> str | None:
    """The first marker that `prompt` contains, whitespace ignored on both sides (another indentation, tabs, CRLF
    or `def name (` still match)."""
    squeezed = _WHITESPACE.sub("", prompt)
    return next((marker for marker, plain in zip(held_out, _squeezed(tuple(held_out))) if plain in squeezed), None)


@functools.lru_cache(maxsize=4)
def _squeezed(markers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_WHITESPACE.sub("", marker) for marker in markers)


def check_no_heldout(prompts: list[str], held_out: list[str]) -> None:
    for index, prompt in enumerate(prompts):
        marker = find_heldout(prompt, held_out)
        if marker is not None:
            raise PromptsError(f"prompt {index} contains a held-out HumanEval problem ({marker[:40]!r}…); remove it "
                               f"from the prompt source")


ANSWER_KEYS = ("prompt_ids", "new_ids", "stopped", "source", "split")  # an answers shard's record


def shard_seed(seed: int, stage: str, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{stage}:{index}".encode()).digest()[:4], "big")


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Atomic: a shard file either exists complete or not at all."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    os.replace(temporary, path)


def read_jsonl(path: Path, keys: tuple[str, ...] = ()) -> list[dict]:
    """A shard's records, each a JSON object with `keys`; CalibrationError naming the shard otherwise (shards are
    written whole, so a damaged one was edited or copied in part: it is rebuilt once deleted)."""
    try:
        with open(path, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path} is damaged ({exc}); delete it and run again to rebuild it") from None
    for record in records:
        missing = [key for key in keys if not isinstance(record, dict) or key not in record]
        if missing:
            raise CalibrationError(f"{path} holds a record without {', '.join(missing)}; delete it and run again "
                                   f"to rebuild it")
    return records


def open_folder(folder: Path, config: SelfDataConfig) -> None:
    """Create the folder, or check that it was built with the same data-deciding settings."""
    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    (folder / "answers").mkdir(exist_ok=True)
    settings = folder / "settings.json"
    wanted = config.fingerprint()
    if settings.exists():
        try:
            found = json.loads(settings.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            found = None
        if not isinstance(found, dict):
            raise CalibrationError(f"{settings} is damaged; delete {folder} (its data is rebuilt) or use another")
        differing = sorted(key for key in wanted.keys() | found.keys() if wanted.get(key) != found.get(key))
        if differing:
            raise CalibrationError(f"{folder} holds data built with other settings ({', '.join(differing)}); use "
                                   f"another folder or delete it")
    else:
        settings.write_text(json.dumps(wanted, indent=2))


def shards(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def write_prompts(model, tokenizer, folder: Path, config: SelfDataConfig, held_out: list[str],
                  progress: bool = True) -> tuple[list[dict], dict]:
    """Stage 1: the cleaned, deduplicated self-written prompts [{"prompt", "kind", "topic", "level"}] without any
    that touch a held-out marker, and counts of what was dropped."""
    metas = meta_prompts(config.n_meta, config.seed)
    for index, shard in enumerate(shards(metas, config.shard_size)):
        path = folder / "prompts" / f"{index:05d}.jsonl"
        if path.exists():
            continue
        ids = tokenize_prompts(tokenizer, chat_format(tokenizer, [meta["text"] for meta in shard]))
        generations = generate_many(model, tokenizer, ids, config.prompt_max_new_tokens, config.batch_size,
                                    do_sample=True, temperature=config.prompt_temperature, top_p=config.prompt_top_p,
                                    seed=shard_seed(config.seed, "prompts", index),
                                    kv_budget_bytes=config.kv_budget_bytes, progress=progress, backend=config.backend)
        replies = [tokenizer.decode(gen.new_ids, skip_special_tokens=True) for gen in generations]
        write_jsonl(path, [{**meta, "reply": reply} for meta, reply in zip(shard, replies)])
    prompts, seen = [], set()
    dropped = {"unusable": 0, "duplicate": 0, "held_out": 0}
    for index in range(len(shards(metas, config.shard_size))):
        for record in read_jsonl(folder / "prompts" / f"{index:05d}.jsonl", ("reply", "kind", "topic", "level")):
            text = clean_prompt(record["reply"], record["kind"], config.min_prompt_chars, config.max_prompt_chars)
            reason = ("unusable" if text is None else "duplicate" if normalize(text) in seen
                      else "held_out" if find_heldout(text, held_out) else None)
            if reason is not None:
                dropped[reason] += 1
                continue
            seen.add(normalize(text))
            user_turn = KINDS[record["kind"]][1].format(prompt=text + "\n" if record["kind"] == "function" else text)
            prompts.append({"prompt": user_turn, "kind": record["kind"], "topic": record["topic"],
                            "level": record["level"]})
    return prompts, dropped


def plan_answers(sources: dict[str, list[str]], config: SelfDataConfig) -> tuple[list[dict], dict]:
    """The answered prompts in order [{"prompt", "source", "split"}] and per-source counts. Each source's share of
    `n_answers` is filled by its prompts in a seeded order, then (sampling only) again in a new order; the sources are
    interleaved in a seeded order so that cutting the list at any point keeps the mix."""
    mix = config.mix()
    total_weight = sum(weight for _, weight in mix)
    rng = random.Random(config.seed)
    plan, counts = [], {}
    for name, weight in mix:
        available = sources[name]
        wanted = round(config.n_answers * weight / total_weight)
        if not config.answer_do_sample and wanted > len(available):
            log.warning("source %s has %d prompts, fewer than its share of %d; greedy answers would repeat, so each "
                        "is answered once", name, len(available), wanted)
            wanted = len(available)
        chosen: list[str] = []
        while len(chosen) < wanted:
            order = available[:]
            rng.shuffle(order)
            chosen += order[:wanted - len(chosen)]
        counts[name] = {"available": len(available), "answered": len(chosen)}
        plan += [{"prompt": prompt, "source": name, "split": "dev" if is_dev(prompt, config.dev_share) else "train"}
                 for prompt in chosen]
    rng.shuffle(plan)
    return plan, counts


def load_sources(model, tokenizer, folder: Path, config: SelfDataConfig, held_out: list[str],
                 progress: bool) -> tuple[dict[str, list[str]], dict]:
    """Prompts by source name, and what stage 1 dropped (empty without a `self` source)."""
    sources, dropped = {}, {}
    for name, _ in config.mix():
        if name == "self":
            records, dropped = write_prompts(model, tokenizer, folder, config, held_out, progress)
            sources[name] = [record["prompt"] for record in records]
        else:
            sources[name] = read_prompts(name)
        if not sources[name]:
            raise PromptsError(f"source {name} gave no prompts; raise n_meta or check the source")
    return sources, dropped


def build(model, tokenizer, folder: str | Path, config: SelfDataConfig, progress: bool = True,
          held_out: list[str] | None = None) -> SelfData:
    """Run (or resume) both stages in `folder` with `model` (the dense model) and return the answers by split.
    held_out: the strings no prompt may contain (default: `heldout_markers()`); self-written prompts that contain
    one are dropped, any other source that contains one is refused."""
    config.validate()
    folder = Path(folder)
    held_out = heldout_markers() if held_out is None else held_out
    open_folder(folder, config)
    sources, dropped = load_sources(model, tokenizer, folder, config, held_out, progress)
    plan, counts = plan_answers(sources, config)
    check_no_heldout(sorted({entry["prompt"] for entry in plan}), held_out)
    write_jsonl(folder / "plan.jsonl", plan)
    train_tokens = 0
    answered = 0
    for index, shard in enumerate(shards(plan, config.shard_size)):
        if config.decode_tokens is not None and train_tokens >= config.decode_tokens:
            break
        path = folder / "answers" / f"{index:05d}.jsonl"
        ids = tokenize_prompts(tokenizer, chat_format(tokenizer, [entry["prompt"] for entry in shard]))
        if not path.exists():
            generations = generate_many(model, tokenizer, ids, config.answer_max_new_tokens, config.batch_size,
                                        do_sample=config.answer_do_sample, temperature=config.answer_temperature,
                                        top_p=config.answer_top_p, seed=shard_seed(config.seed, "answers", index),
                                        kv_budget_bytes=config.kv_budget_bytes, progress=progress,
                                        backend=config.backend)
            write_jsonl(path, [{"prompt_ids": gen.prompt_ids, "new_ids": gen.new_ids, "stopped": gen.stopped,
                                "source": entry["source"], "split": entry["split"]}
                               for gen, entry in zip(generations, shard)])
        records = read_jsonl(path, ANSWER_KEYS)
        # the plan's prompts were checked against the held-out markers; its answers must be to exactly those
        if [record["prompt_ids"] for record in records] != ids or \
                [record["split"] for record in records] != [entry["split"] for entry in shard]:
            raise CalibrationError(f"{path} holds answers to other prompts than the plan's shard {index} (written by "
                                   f"another run, or with other held-out markers); delete it and run again")
        answered += len(records)
        train_tokens += sum(len(record["new_ids"]) - 1 for record in records if record["split"] == "train")
    data = load_answers(folder, answered, counts)
    data.stats["self_prompts_dropped"] = dropped
    return data


def load_answers(folder: Path, limit: int, counts: dict) -> SelfData:
    """The first `limit` answered prompts of the folder's plan, split, with statistics."""
    train, dev = [], []
    tokens = {"train": 0, "dev": 0}
    by_source: dict[str, int] = {}
    stopped = 0
    for path in sorted((folder / "answers").glob("*.jsonl")):
        for record in read_jsonl(path, ANSWER_KEYS):
            if len(train) + len(dev) == limit:
                break
            gen = Generation(record["prompt_ids"], record["new_ids"], record["stopped"])
            (dev if record["split"] == "dev" else train).append(gen)
            tokens[record["split"]] += len(gen.consumed_ids)
            by_source[record["source"]] = by_source.get(record["source"], 0) + len(gen.consumed_ids)
            stopped += gen.stopped
    answered = len(train) + len(dev)
    stats = {"prompts_by_source": counts, "answered": answered, "train_sequences": len(train),
             "dev_sequences": len(dev), "decode_tokens": tokens, "decode_tokens_by_source": by_source,
             "stopped_share": round(stopped / max(answered, 1), 4)}
    return SelfData(train, dev, stats)


def calibration_sets(data: SelfData, pad_id: int, token_budget: int | None = None,
                     ) -> tuple[CalibrationSet, CalibrationSet]:
    """(train, dev) sets whose keep masks cover the decode positions; `token_budget` cuts the train side only."""
    train = decode_set_from_generations(data.train, pad_id, token_budget)
    if not data.dev:
        raise CalibrationError("the dev split is empty; raise --self-answers (n_answers)")
    dev = decode_set_from_generations(data.dev, pad_id)
    train.source = dev.source = "selfdata"
    return train, dev
