"""Result folders that are complete or absent: refuse an existing folder up front (before any work), then fill
`OUT.partial/` and rename it to OUT only when everything is written."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputExistsError, OutputNotWritableError
from .runenv import json_text

# The pruning record inside a checkpoint written by `sparsedecoding prune` (a packed checkpoint's is packed.PACKED_MANIFEST).
PRUNED_MANIFEST = "sparsedecoding.json"


def partial_path(out: Path) -> Path:
    """OUT.partial, where OUT is built before its rename."""
    return out.with_name(out.name + ".partial")


def path_exists(path: Path) -> bool:
    """Whether a user's output path exists; an OSError (a name too long for the filesystem, a folder that cannot be
    searched) is an OutputNotWritableError rather than a traceback."""
    try:
        return path.exists()
    except OSError as exc:
        raise OutputNotWritableError(f"cannot use {path} ({exc.strerror}); choose another --out") from None


# A model folder's files by name: its tokenizer's (what `save_pretrained` of one writes, in its several kinds), and
# every file the folder is read from (weights, config, records, tokenizer), which no output may replace.
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "chat_template")
_TOKENIZER_SUFFIXES = (".model", ".tiktoken")
_MODEL_RECORDS = {"config.json", "generation_config.json", "packed.json", "manifest.json", PRUNED_MANIFEST}


def is_tokenizer_file(name: str) -> bool:
    return name.startswith(TOKENIZER_PREFIXES) or name.endswith(_TOKENIZER_SUFFIXES)


def is_model_file(name: str) -> bool:
    return name in _MODEL_RECORDS or is_tokenizer_file(name) or name.endswith((".safetensors", ".index.json", ".gguf",
                                                                                 ".bin"))


def output_target(out: str | Path) -> Path:
    """The folder an --out names, as every later step must use it: OutputNotWritableError for one that names no
    folder of its own (empty, `.`, `/`, ending in `..`) or is a symbolic link (its rename would replace the link, and
    --overwrite could not remove it), and with `..` in it the path resolved. `missing/../keep` is `keep` (making
    OUT.partial creates `missing`, and the final rename then lands on `keep`), so it must be checked as `keep`."""
    text = os.fspath(out)
    if not text.strip():
        raise OutputNotWritableError("--out is empty; name the folder to create, such as runs/first")
    path = Path(text)
    if path.name in ("", ".", ".."):  # `.`, `/`, `sub/..`: an existing folder above, which --overwrite would remove
        raise OutputNotWritableError(f"--out {text} names no folder of its own to create or replace; give one, such "
                                     f"as {Path(text) / 'run1'}")
    if os.path.islink(os.path.normpath(path)):  # `missing/../link` too, which realpath would follow
        raise OutputNotWritableError(f"--out {text} is a symbolic link (to {os.readlink(os.path.normpath(path))}); "
                                     f"give the folder it points to or another --out")
    return Path(os.path.realpath(path)) if ".." in path.parts else path


def check_output(out: Path, overwrite: bool, inputs: tuple = ()) -> Path:
    """Refuse, before any work, an output folder that exists (without `overwrite`), could not be created, or is or
    holds one of `inputs` (`check_not_source`); then clear OUT.partial of an earlier, stopped run (as
    `output_folder` would at the end), so that something there that cannot be removed is refused now. Returns the
    folder as `output_target` resolves it."""
    out = output_target(out)
    check_writable(out)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; choose another --out or pass --overwrite")
    check_not_source(out, *inputs)
    remove_partial(out)
    return out


def check_writable(out: Path, partial: bool = True) -> None:
    """Refuse an output that could not be created, before any work is spent on it. Its name must fit the
    filesystem's limit (with `.partial` added, where it is built, unless `partial` is False), and the nearest
    existing ancestor must be a folder we can create entries in; a real probe folder is made and removed there
    because permission bits say nothing about read-only mounts or root. A folder (`partial` True) is first checked
    by `output_target`."""
    out = output_target(out) if partial else Path(out)
    ancestor = out.absolute().parent
    while not path_exists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputNotWritableError(f"cannot create {out}: {ancestor} is a file, not a folder; choose another --out")
    size = len(os.fsencode(partial_path(out).name if partial else out.name))
    limit = os.pathconf(ancestor, "PC_NAME_MAX")
    if size > limit:
        what = "its name with .partial (the folder it is built in)" if partial else "its name"
        raise OutputNotWritableError(f"cannot create {out}: {what} has {size} bytes, more than the {limit} a name may "
                                     f"have in {ancestor}; choose a shorter --out")
    if path_exists(out) and not out.is_dir():
        raise OutputNotWritableError(f"{out} is a file, not a folder; choose another --out")
    try:
        probe = tempfile.mkdtemp(prefix=".probe-", dir=ancestor)
    except OSError as exc:
        raise OutputNotWritableError(f"cannot create {out}: {ancestor} is not writable ({exc.strerror}); "
                                     f"choose another --out") from None
    os.rmdir(probe)


def check_not_source(out: Path, *sources: str | Path | None) -> None:
    """Refuse an output folder that is an input (a model folder, a GGUF or prompt file) or holds one, and one whose
    OUT.partial is or holds one: writing (or --overwrite's replacing) the output would destroy it. One inside an
    input folder is harmless (inputs are read from its top level). A source not on disk (None, an offline model
    name, `humaneval:eval`) has nothing to destroy."""
    out = Path(out).resolve()
    for source in sources:
        if source is None or not os.path.lexists(source):
            continue
        source = Path(source).resolve()
        if any(source == target or source.is_relative_to(target) for target in (out, partial_path(out))):
            raise OutputNotWritableError(f"--out {out} would overwrite the input {source}; choose another --out")


def remove_partial(out: Path, keep_folder: bool = False) -> None:
    """Remove what an earlier run left at OUT.partial: a file or link itself (never what a link points to) and,
    unless `keep_folder` (prune resumes from its work folder), a folder with its tree. OutputNotWritableError when
    it cannot be removed."""
    partial = partial_path(out)
    try:
        if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
            partial.unlink()
        elif partial.is_dir() and not keep_folder:
            shutil.rmtree(partial)
    except OSError as exc:
        raise OutputNotWritableError(f"cannot remove {partial}, left by an earlier run ({exc.strerror}); remove it "
                                     f"or choose another --out") from None


@contextmanager
def output_folder(out: Path, overwrite: bool):
    """Yield OUT.partial/ to write into; on success it replaces OUT, on any error it is removed. The caller checks
    its inputs up front (`check_output(..., inputs=...)` or `check_not_source`)."""
    out = check_output(out, overwrite)
    partial = partial_path(out)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)


def write_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json_text(record) + "\n")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub markdown table; floats with 4 significant digits."""
    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
