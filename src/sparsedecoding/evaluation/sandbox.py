"""Run untrusted model-written Python in a child process: one fresh temp dir per program as its working directory,
a scrubbed environment, `python -I` (no user site, no PYTHON* variables, no script dir on sys.path), resource limits
(address space, CPU seconds, file size, no core dumps), a wall-clock timeout after which the whole process group is
killed, and no network.

Network is refused twice where possible: the child runs in a fresh network namespace (`unshare --net`, only if this
machine allows unprivileged user namespaces) and, always, a guard replaces the socket constructors, DNS lookups and
process creation before the program runs. This is isolation for honest-but-buggy code (infinite loops, memory
blow-ups, stray `os.system`), not a security boundary against code written to escape.

A program passes when it runs to its end: the guard prints a per-run random token after the program returns, so a
program that calls `sys.exit(0)` or `os._exit(0)` before its tests ran does not pass.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError

log = logging.getLogger(__name__)

ERROR_PREFIX = "sandbox-error: "

# Runs in the child before the program (as `python -I -c GUARD program.py MEMORY CPU FILE TOKEN`). Everything lives in
# one function so the program cannot read the token from module globals.
GUARD = r'''
def _sandbox():
    import os, resource, sys, traceback
    path, memory, cpu, file_size, token = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    # The CPU hard limit is one second above the soft one so the kernel sends SIGXCPU (reported as a timeout)
    # before SIGKILL.
    for limit, soft, hard in ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_FSIZE, file_size, file_size), (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(limit, (soft, hard))

    import _socket, socket, subprocess

    def refuse(*args, **kwargs):
        raise PermissionError("network access and process creation are disabled in the sandbox")

    def disabled(original):
        # Classes stay classes (the standard library subclasses socket.socket at import) but cannot be built.
        if isinstance(original, type):
            return type(original.__name__, (original,), {"__init__": refuse})
        return refuse

    for module, names in ((socket, ("socket", "socketpair", "fromfd", "create_connection", "create_server",
                                    "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr")),
                          (_socket, ("socket", "socketpair", "getaddrinfo", "gethostbyname", "gethostbyaddr")),
                          (subprocess, ("Popen", "run", "call", "check_call", "check_output")),
                          (os, ("system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execl",
                                "execle", "execlp", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                                "posix_spawn", "posix_spawnp"))):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, disabled(getattr(module, name)))

    leave, stdout, stderr = os._exit, sys.stdout, sys.stderr
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    sys.argv = [path]
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__", "__file__": path})
    except BaseException as error:
        traceback.print_exc(file=stderr)
        stderr.write("\n''' + ERROR_PREFIX + r'''" + type(error).__name__ + "\n")
        stderr.flush()
        leave(1)
    stdout.write("\n" + token + "\n")
    stdout.flush()
    leave(0)

_sandbox()
'''


@dataclass(frozen=True)
class SandboxLimits:
    """timeout_s: wall clock (the CPU limit is the same number of seconds, rounded up); memory_mb: address space;
    file_mb: largest file (and stdout/stderr, which go to files) the program may write."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 16

    def check(self) -> None:
        if not self.timeout_s > 0:
            raise SandboxError(f"the sandbox timeout must be positive, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise SandboxError(f"the sandbox memory limit must be at least 64 MB (Python needs that much to start), "
                               f"got {self.memory_mb}")
        if self.file_mb < 1:
            raise SandboxError(f"the sandbox file size limit must be at least 1 MB, got {self.file_mb}")


@dataclass(frozen=True)
class SandboxResult:
    """outcome: passed | failed | timeout. error: the exception class (`AssertionError`), a signal (`SIGXCPU` for the
    CPU limit, `SIGKILL`), `timeout` (wall clock), or an exit code; None when passed. message: the last line of
    stderr."""

    outcome: str
    error: str | None
    message: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


@functools.cache
def network_namespace_prefix() -> tuple[str, ...]:
    """`unshare` arguments that give the child an empty network namespace, or () where this machine forbids it
    (common in containers and on CI); the guard refuses sockets either way."""
    command = ("unshare", "--user", "--map-root-user", "--net")
    if shutil.which("unshare") is None:
        log.info("sandbox: no unshare binary; network is refused by the in-process guard only")
        return ()
    probe = subprocess.run([*command, "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        log.info("sandbox: no unprivileged network namespace here; network is refused by the in-process guard only")
        return ()
    return command


def scrubbed_environment(home: Path) -> dict[str, str]:
    """Only what an interpreter needs; nothing from the parent (tokens, proxies, CUDA settings) leaks in."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def kill_group(process: subprocess.Popen) -> None:
    """Kill the program and anything it started (they share the session's process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone: nothing left to kill
        pass


def classify(returncode: int, stdout: str, stderr: str, token: str) -> tuple[str, str | None]:
    lines = stdout.rstrip("\n").rsplit("\n", 1)
    if returncode == 0 and lines[-1] == token:
        return "passed", None
    marked = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    if marked:
        return "failed", marked[-1][len(ERROR_PREFIX):]
    if returncode == -signal.SIGXCPU:  # the CPU-seconds limit: a timeout that the kernel enforced first
        return "timeout", "SIGXCPU"
    if returncode < 0:
        return "failed", signal.Signals(-returncode).name
    return "failed", f"exit code {returncode}"


def last_line(text: str, width: int = 300) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(ERROR_PREFIX)]
    return lines[-1][:width] if lines else ""


def run_sandboxed(program: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run one program (Python source) under `limits` and report how it ended. See the module docstring."""
    limits.check()
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="sparsedecoding-sandbox-") as scratch:
        home = Path(scratch)
        (home / "program.py").write_text(program, encoding="utf-8")
        command = [*network_namespace_prefix(), sys.executable, "-I", "-c", GUARD, "program.py",
                   str(limits.memory_mb << 20), str(math.ceil(limits.timeout_s)), str(limits.file_mb << 20), token]
        started = time.perf_counter()
        with open(home / "stdout", "wb") as stdout, open(home / "stderr", "wb") as stderr:
            try:
                process = subprocess.Popen(command, cwd=home, env=scrubbed_environment(home), stdin=subprocess.DEVNULL,
                                           stdout=stdout, stderr=stderr, start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start the sandboxed interpreter {sys.executable} ({exc})") from None
            try:
                process.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            kill_group(process)
            returncode = process.wait()
        seconds = time.perf_counter() - started
        out = (home / "stdout").read_text(encoding="utf-8", errors="replace")
        err = (home / "stderr").read_text(encoding="utf-8", errors="replace")
    if timed_out:
        return SandboxResult("timeout", "timeout", f"killed after {limits.timeout_s:g} s", seconds)
    outcome, error = classify(returncode, out, err, token)
    return SandboxResult(outcome, error, last_line(err), seconds)


def run_many(programs: list[str], limits: SandboxLimits = SandboxLimits(), workers: int | None = None,
             ) -> list[SandboxResult]:
    """Run programs in parallel, one sandbox each (threads only wait on the child processes); results in order."""
    limits.check()
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run_sandboxed(program, limits), programs))
