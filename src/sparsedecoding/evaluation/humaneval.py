"""HumanEval pass@1 for chat models: extract the answer's code, build a test program, run it in the sandbox.

The instruction (`data.HUMANEVAL_INSTRUCTION`) asks for the complete function in one ```python block. The program is
the problem's prompt (its imports and any helper functions it defines, e.g. `encode_cyclic` in HumanEval/38), then the
extracted code, then the problem's tests and `check(entry_point)`. When the code defines the entry point it replaces the
prompt's stub (a function whose body is only its docstring); otherwise the code is taken as the body that continues
the prompt. A block indented as a whole (a fence under a list item) is dedented when that makes it define the entry
point. Where the program does not even compile, the answer's code is looked for again (`fallback_codes`: the block
without a last line of one or two backticks, a closing fence short of a backtick; the block dedented; `~~~` fences;
the code lines of an answer with no fence, prose around them left out) and the first that compiles is used.
Compiling runs none of the answer's code. With greedy decoding pass@1 is the share of problems whose program passes.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from dataclasses import dataclass

from .sandbox import SandboxLimits, SandboxResult, run_many

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_TILDE_FENCE = re.compile(r"~~~[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:~~~|\Z)", re.DOTALL)
# A line that starts top-level Python code, and one that starts prose (a capitalised word, then a space).
_CODE_LINE = re.compile(r"^(?:from\s+\S+\s+import\s|import\s+\w|(?:async\s+)?def\s+\w|class\s+\w|@\w)")
_PROSE_LINE = re.compile(r"^[A-Z][a-z]+[,:]?\s")
# A block's last line of one or two backticks: a closing fence short of a backtick, which `_FENCE` does not end on
# (2:4-pruned Qwen2.5-Coder-1.5B closes many plain-wording answers so, then stops; results/fence_change_cpu.md).
_SHORT_CLOSING_FENCE = re.compile(r"\n[ \t]*`{1,2}\s*\Z")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block; an unclosed last block (generation cut at max tokens) runs to the end."""
    return [(match.group(1).lower(), match.group(2)) for match in _FENCE.finditer(text)]


def extract_code(completion: str, entry_point: str) -> str:
    """The code of the answer: the first python (or unlabelled) block that defines `entry_point`, else the first
    python block, else the first block of any language, else the whole text."""
    blocks = code_blocks(completion)
    python = [code for language, code in blocks if language in ("python", "py", "python3", "")]
    for code in python:
        if defines(code, entry_point):
            return code
    if python:
        return python[0]
    if blocks:
        return blocks[0][1]
    return completion


def defines(code: str, entry_point: str) -> bool:
    """Whether `code` defines the function at top level."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def short_fence_readings(code: str) -> list[str]:
    """`code` without a last line of one or two backticks (a closing fence short of a backtick), if it has one."""
    trimmed = _SHORT_CLOSING_FENCE.sub("\n", code)
    return [trimmed, textwrap.dedent(trimmed)] if trimmed != code else []


def fallback_codes(completion: str, code: str, entry_point: str) -> list[str]:
    """Other readings of an answer whose extracted `code` does not compile (see the module docstring), in order."""
    found = [*short_fence_readings(code), textwrap.dedent(code)]
    tilde = [block for language, block in ((m.group(1).lower(), m.group(2)) for m in _TILDE_FENCE.finditer(completion))
             if language in ("python", "py", "python3", "")]
    found += sorted(tilde, key=lambda block: not defines(block, entry_point))[:1]
    lines = completion.splitlines()
    start = next((index for index, line in enumerate(lines) if _CODE_LINE.match(line)), None)
    if start is not None:
        end = next((index for index in range(start + 1, len(lines)) if _PROSE_LINE.match(lines[index])), len(lines))
        found += ["\n".join(lines[start:end]) + "\n", "\n".join(lines[start:]) + "\n"]
    return [candidate for candidate in dict.fromkeys(found) if candidate != code]


def _solution(problem: dict, code: str) -> str:
    if defines(code, problem["entry_point"]):
        return problem["prompt"] + "\n\n" + code
    return problem["prompt"] + code


def _compiles(source: str) -> bool:
    """Whether `source` compiles (nothing of it runs); the compiler's warnings (`"is" with a literal`, an invalid
    escape) are neither printed nor, under -W error, taken for failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, "<answer>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return False
    return True


def build_program(problem: dict, completion: str) -> str:
    """The test program for one problem and one model answer (see the module docstring)."""
    entry_point = problem["entry_point"]
    code = extract_code(completion, entry_point)
    if not defines(code, entry_point) and defines(textwrap.dedent(code), entry_point):
        code = textwrap.dedent(code)  # a fence indented under a list item; as a body it would nest the function
    solution = _solution(problem, code)
    if not _compiles(solution):
        solution = next((candidate for candidate in (_solution(problem, other) for other in
                                                     fallback_codes(completion, code, entry_point))
                         if _compiles(candidate)), solution)
    return f"{solution}\n\n{problem['test']}\n\ncheck({entry_point})\n"


@dataclass(frozen=True)
class ProblemResult:
    task_id: str
    passed: bool
    outcome: str
    error: str | None
    message: str
    completion: str

    @classmethod
    def from_run(cls, problem: dict, completion: str, run: SandboxResult) -> ProblemResult:
        return cls(problem["task_id"], run.passed, run.outcome, run.error, run.message, completion)


def check_completions(problems: list[dict], completions: list[str], limits: SandboxLimits = SandboxLimits(),
                      workers: int | None = None) -> list[ProblemResult]:
    """Run every (problem, completion) pair in its own sandbox, in parallel; results in problem order."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    runs = run_many([build_program(problem, completion) for problem, completion in zip(problems, completions)],
                    limits, workers)
    return [ProblemResult.from_run(problem, completion, run)
            for problem, completion, run in zip(problems, completions, runs)]


def pass_at_1(results: list[ProblemResult]) -> float:
    """Share of problems solved by the single greedy answer."""
    return sum(result.passed for result in results) / len(results)
