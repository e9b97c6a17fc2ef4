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


def check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; choose another --out or pass --overwrite")
    check_writable(out)


def check_writable(out: Path) -> None:
    """Refuse an output folder that could not be created, before any work is spent on it. The nearest existing
    ancestor must be a folder we can create entries in; a real probe folder is made and removed there because
    permission bits say nothing about read-only mounts or root."""
    if Path(out).exists() and not Path(out).is_dir():
        raise OutputNotWritableError(f"{out} is a file, not a folder; choose another --out")
    ancestor = Path(out).absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputNotWritableError(f"cannot create {out}: {ancestor} is a file, not a folder; choose another --out")
    try:
        probe = tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=ancestor)
    except OSError as exc:
        raise OutputNotWritableError(f"cannot create {out}: {ancestor} is not writable ({exc.strerror}); "
                                     f"choose another --out") from None
    os.rmdir(probe)


def check_not_source(out: Path, source: Path) -> None:
    """Refuse an output folder that is the input folder or holds it: writing (or --overwrite's replacing) the
    output would destroy the input. One inside the input is harmless (inputs are read from its top level)."""
    out, source = Path(out).resolve(), Path(source).resolve()
    if out == source or source.is_relative_to(out):
        raise OutputNotWritableError(f"--out {out} would overwrite the input {source}; choose another --out")


@contextmanager
def output_folder(out: Path, overwrite: bool):
    """Yield OUT.partial/ to write into; on success it replaces OUT, on any error it is removed."""
    check_output(out, overwrite)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
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
