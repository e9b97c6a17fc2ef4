"""The command line a run records: `cli.main(argv)`'s arguments while it runs a command, else the process's sys.argv.

Kept apart from `runenv` (which imports torch) so the CLI's modules can name it at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

_COMMAND: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("command", default=None)


@contextlib.contextmanager
def running_command(argv: list[str]):
    """Within it, `command()` is `sparsedecoding` and `argv`. `cli.main(argv)` runs its command inside it, so a record
    names the arguments main was given even when main is called from Python (a test, a script), whose own sys.argv
    is something else."""
    token = _COMMAND.set(("sparsedecoding", *argv))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def command() -> list[str]:
    """The command line of this run, as records store it: the CLI's inside `running_command`, else the process's
    sys.argv (a script calling the Python API)."""
    found = _COMMAND.get()
    return list(found if found is not None else sys.argv)
