"""Run untrusted model-written Python in a child process, sealed by the kernel rather than by the program's goodwill.

Each program gets:
- its own PID, mount, network, IPC and UTS namespaces (util-linux `unshare`). The first process in the PID namespace
  is a small supervisor; when it ends, or is killed at the timeout, the kernel kills every process in the namespace,
  so nothing the program started (forked, `setsid`, daemonized) outlives the run;
- a read-only view of the system's folders (`VISIBLE`: /usr, /etc, /lib, /bin, /proc, /dev, ...), and nothing of
  any other top-level folder (homes, /root, /tmp, /run, /var, /srv, /opt, a project's /work) or /dev/shm: empty
  read-only mounts cover them, with the interpreter's own folders moved back in where a cover hides them
  (`mount_setattr`, Linux 5.12 or later). The host's files, other runs' files and the host's Unix sockets (which a
  network namespace does not fence off) are not there. Its working directory is a fresh tmpfs of `disk_mb` and
  `WORK_INODES` files, gone with the run, so what it writes never reaches the host's disk;
- no network at all: the new network namespace has only a loopback interface, and it is down;
- an unprivileged user id of its own (no capabilities, `no_new_privs`, no supplementary groups), so it cannot undo
  the read-only mounts, and limits on address space, CPU seconds, file size, open files, process count (for that
  user id, so parallel sandboxes do not share it) and core dumps; a seccomp filter refuses the calls that would
  hold memory outside the address-space limit (memfd_create, memfd_secret, System V shared memory, queues and
  semaphores) and new namespaces (unshare, setns, clone with a namespace flag; clone3 gets ENOSYS, on which the C
  library falls back to clone). Address space is per process: a run may hold up to `processes` x `memory_mb`, plus
  `disk_mb` in its folder, plus the kernel's buffers of its pipes and Unix sockets, which no limit here counts
  (`OPEN_FILES` of them a process; a cgroup's memory.max would, where the host lets the sandbox make one);
- its output files kept outside that folder, in one only root may enter: it can write them, not replace them. Whether
  the walls stood comes back on a pipe closed before the program starts, so nothing it writes or erases turns a
  failed run into a setup error;
- a scrubbed environment and `python -I` (no user site, no PYTHON* variables, no script dir on sys.path).

The sandbox needs root (true in the containers this project runs in, and on CI) and fails closed: when the isolation
cannot be set up, `SandboxError` says why and nothing runs. On top of the kernel's walls, a guard replaces the socket
constructors and process creation in Python so that ordinary code gets a clear `PermissionError`.

A program passes when it runs to its end: the guard prints a per-run random token after the program returns, so a
program that calls `sys.exit(0)` or `os._exit(0)` before its tests ran does not pass. The token reaches the guard on
a pipe (not the command line, which /proc shows) and lives only in the guard's function; this stops accidental early
exits, not code written to forge a pass (code in the same interpreter can always find a value the interpreter
holds), which a pass@1 score of a model's answers does not need. Nor does the harness stop a program written to
pass dishonestly in other ways (reading the tests from its own file, returning an object equal to everything): as in
the reference HumanEval harness, the tests run in the program's interpreter. The program runs under the module name
`__sandbox__`, not `__main__`, as under the reference HumanEval harness (`exec` in fresh globals): an answer's
`if __name__ == "__main__":` block (often `unittest.main()`) does not run before the tests.
"""

from __future__ import annotations

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
READY = "sandbox-ready"  # what the supervisor writes on its status pipe once every wall stands
# The top-level folders a run sees (read-only): the system's programs, libraries and settings, and the kernel's
# views. Every other one (homes, /root, /tmp, /run, /var, /srv, /opt, /mnt, a project's /work), and /dev/shm, is
# covered by an empty read-only tmpfs; the interpreter's own folders are moved back in where a cover hides them.
VISIBLE = ("bin", "dev", "etc", "gnu", "lib", "lib32", "lib64", "libx32", "nix", "proc", "sbin", "sys", "usr")
WORK_INODES = 8192  # files and folders a program may make in its work folder
OPEN_FILES = 64  # file descriptors each of its processes may hold (each socket's buffers are kernel memory)
# machine: (its audit architecture, whether x32 numbers share its table, the numbers the seccomp filter refuses
# (memfd_create, memfd_secret, shmget, msgget, semget, unshare, setns), clone's number, clone3's), for that filter
SECCOMP_TABLES = {"x86_64": (0xC000003E, True, (319, 447, 29, 68, 64, 272, 308), 56, 435),
                  "aarch64": (0xC00000B7, False, (279, 447, 194, 186, 190, 97, 268), 220, 435)}
# clone's flags that make new namespaces (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): refused, for a
# user namespace would let the program make IPC namespaces whose message queues no limit of the run counts
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
SETUP_PREFIX = "sandbox-setup-failed: "
SETUP_EXIT = 125

NAMESPACES = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--net", "--ipc", "--uts")

# Runs as PID 1 of the new namespaces (as `python -I -c GUARD program.py MEMORY CPU FILE PROCESSES UID TOKEN_FD
# STATUS_FD DISK`, the token on the first pipe; READY or why the setup failed goes back on the second, which is
# closed before the program starts, so the program can neither forge nor erase it).
# Everything lives in one function so the token is in no module global (see the module docstring).
GUARD = r'''
def _sandbox():
    import ctypes, os, resource, sys, traceback
    path, memory, cpu, file_size, processes, uid, token_fd, status_fd, disk = sys.argv[1], *map(int, sys.argv[2:10])
    token = os.read(token_fd, 64).decode()
    os.close(token_fd)
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, encoding="utf-8") as handle:  # read before the work folder's own mount hides the parent's file
        source = handle.read()

    def failed(step, known=False):
        why = "" if known else ": " + os.strerror(ctypes.get_errno())
        message = "''' + SETUP_PREFIX + r'''" + step + why + "\n"
        os.write(status_fd, message.encode())
        os._exit(''' + str(SETUP_EXIT) + r''')

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                    ("userns_fd", ctypes.c_uint64)]

    # mount_setattr has the same number on every architecture (new system calls share one table since Linux 5.1).
    MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MS_BIND = 442, -100, 0x8000, 0x1000
    MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, PR_SET_NO_NEW_PRIVS = 0x1, 0x2, 38
    MS_MOVE, MS_REC, MS_NOSUID, MS_NODEV = 0x2000, 0x4000, 0x2, 0x4
    # The work folder is a tmpfs of its own, owned by the program's user: its size and inode count bound what the
    # program can write there (and the memory that takes), and it vanishes with the mount namespace.
    home = os.getcwd().encode()
    options = "mode=0700,uid=%d,gid=%d,size=%d,nr_inodes=%d" % (uid, uid, disk, ''' + str(WORK_INODES) + r''')
    if libc.mount(b"tmpfs", home, b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        failed("mount the work folder")
    os.chdir(home)  # the working directory still pointed into the mount below the new one
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    # Every top-level folder but the system's (VISIBLE), and /dev/shm, is covered by an empty tmpfs: the host's
    # files (homes, /work, /srv, /var), other runs' scratch files and the host's Unix sockets (which a network
    # namespace does not fence off) are not there. The program runs as another user, who must still read the
    # interpreter and its libraries: where one of them sits below a covered folder, or below a folder only root may
    # enter (a Python under /root), the cover holds just the library folders, moved in from a staging mount.
    import stat
    wanted = sorted({os.path.realpath(entry or ".") for entry in (sys.base_prefix, sys.prefix, *sys.path)})
    wanted = [entry for entry in wanted if os.path.isdir(entry)]
    wanted = [entry for entry in wanted if not any(entry.startswith(other + "/") for other in wanted)]
    covered = ["/" + name for name in sorted(os.listdir("/")) if name not in ''' + repr(VISIBLE) + r'''] + ["/dev/shm"]
    closed = {folder: [] for folder in covered if os.path.isdir(folder) and not os.path.islink(folder)}
    # The work folder is staged in too, so that the program reaches it by its absolute path (os.getcwd(),
    # Path.resolve(), tempfile), not only as its working directory.
    work = os.getcwd()
    for entry in wanted + ([work] if not any(work.startswith(other + "/") for other in wanted) else []):
        parts = entry.split("/")
        for depth in range(2, len(parts)):
            ancestor = "/".join(parts[:depth])
            if ancestor in closed or not os.stat(ancestor).st_mode & stat.S_IXOTH:
                closed.setdefault(ancestor, []).append(entry)
                break
    for ancestor, entries in closed.items():
        stages = []
        for entry in entries:
            stage = ".stage%d" % len(stages)  # relative: the cover may hide the work folder's path
            os.mkdir(stage)
            # The work folder without the stages inside it (MS_REC would copy them along).
            if libc.mount(entry.encode(), stage.encode(), None, MS_BIND | (0 if entry == work else MS_REC), None):
                failed("stage " + entry)
            stages.append(stage)
        if libc.mount(b"tmpfs", ancestor.encode(), b"tmpfs", 0, b"mode=0755,size=64k") != 0:
            failed("cover " + ancestor)
        for entry, stage in zip(entries, stages):
            os.makedirs(entry, mode=0o755)
            if libc.mount(stage.encode(), entry.encode(), None, MS_MOVE, None) != 0:
                failed("move " + entry)
            os.rmdir(stage)
    # Into the work folder's mount at its path (the staged one where a cover hid the first), for "." below.
    os.chdir(work)
    for target, flags, attr, step in (
            (b"/", AT_RECURSIVE, MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0),
             "make every mount read-only (needs Linux 5.12 or later)"),
            (b".", 0, MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0), "make the work folder writable")):
        if libc.syscall(ctypes.c_long(MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), ctypes.c_char_p(target),
                        ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))) != 0:
            failed(step)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        failed("set no_new_privs")
    # A seccomp filter refuses (EPERM) the system calls that hold memory outside the address-space limit: memory
    # files (memfd_create, memfd_secret), System V shared memory, message queues and semaphores (shmget, msgget,
    # semget), and new namespaces (unshare, setns, clone with a namespace flag), in which a user namespace's own IPC
    # namespaces would hold more queues. clone3, whose flags a filter cannot read, gets ENOSYS, on which the C
    # library falls back to clone (threads still start). x32's numbers get EPERM too and calls through another
    # table (i386's int 0x80) ENOSYS, so these numbers are the only way to those calls. Installed here, before the
    # fork, it binds the program and everything it starts; no_new_privs first, as seccomp needs.
    arch, x32, refused, clone, clone3 = ''' + repr(SECCOMP_TABLES) + r'''.get(
        os.uname().machine, (None, False, (), 0, 0))
    if arch is None:
        failed("no seccomp filter for the " + os.uname().machine + " architecture (x86_64 and aarch64 have one)",
               known=True)

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Filter(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    LOAD, EQUAL, AT_LEAST, ANY_BIT, RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    # (opcode, where to go if true, where to go if false, k): a place is a label or None (the next instruction)
    lines = [(LOAD, None, None, 4), (EQUAL, None, "nosys", arch), (LOAD, None, None, 0)]
    lines += [(AT_LEAST, "perm", None, 0x40000000)] if x32 else []
    lines += [(EQUAL, "perm", None, number) for number in refused]
    lines += [(EQUAL, "nosys", None, clone3), (EQUAL, "clone", None, clone), (RETURN, None, None, ALLOW)]
    labels = {"clone": len(lines)}  # clone: its flags (the low word of its first argument) must make no namespace
    lines += [(LOAD, None, None, 16), (ANY_BIT, "perm", None, ''' + str(CLONE_NAMESPACES) + r'''),
              (RETURN, None, None, ALLOW)]
    labels["perm"] = len(lines)
    lines += [(RETURN, None, None, ERRNO | 1)]
    labels["nosys"] = len(lines)
    lines += [(RETURN, None, None, ERRNO | 38)]
    code = [(kind, 0 if yes is None else labels[yes] - index - 1, 0 if no is None else labels[no] - index - 1, k)
            for index, (kind, yes, no, k) in enumerate(lines)]
    program = Filter(len(code), (Instruction * len(code))(*[Instruction(*line) for line in code]))
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        failed("install the seccomp filter")
    os.write(status_fd, b"''' + READY + r'''\n")
    os.close(status_fd)

    child = os.fork()
    if child:
        # PID 1 only waits; its exit takes every other process of the namespace with it.
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        os._exit(status if status >= 0 else 128 - status)

    # The CPU hard limit is one second above the soft one so the kernel sends SIGXCPU (reported as a timeout)
    # before SIGKILL. Limits are set while still root; the program, as another user, can only lower them.
    # Few open files, so that pipe and socket buffers (kernel memory no other limit counts) stay small.
    for limit, soft, hard in ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_FSIZE, file_size, file_size), (resource.RLIMIT_CORE, 0, 0),
                              (resource.RLIMIT_NPROC, processes, processes),
                              (resource.RLIMIT_NOFILE, ''' + str(OPEN_FILES) + ", " + str(OPEN_FILES) + r''')):
        resource.setrlimit(limit, (soft, hard))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)

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
    sys.argv = [path]
    try:
        exec(compile(source, path, "exec"), {"__name__": "__sandbox__", "__file__": path})
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
    """timeout_s: wall clock (the CPU limit is the same number of seconds, rounded up); memory_mb: address space
    of each process; file_mb: largest file (and stdout/stderr, which go to files) the program may write; processes:
    processes and threads the program may run at once, itself included; disk_mb: all it may write into its work
    folder (a tmpfs: memory too), at most WORK_INODES files and folders."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 16
    processes: int = 16
    disk_mb: int = 64

    def check(self) -> None:
        if not self.timeout_s > 0:
            raise SandboxError(f"the sandbox timeout must be positive, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise SandboxError(f"the sandbox memory limit must be at least 64 MB (Python needs that much to start), "
                               f"got {self.memory_mb}")
        if self.file_mb < 1:
            raise SandboxError(f"the sandbox file size limit must be at least 1 MB, got {self.file_mb}")
        if self.processes < 1:
            raise SandboxError(f"the sandbox process limit must be at least 1, got {self.processes}")
        if self.disk_mb < 1:
            raise SandboxError(f"the sandbox work folder limit must be at least 1 MB, got {self.disk_mb}")


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


def isolation_command() -> tuple[str, ...]:
    """The `unshare` prefix that gives the supervisor its namespaces; refuses (fails closed) where it cannot work."""
    if os.geteuid() != 0:
        raise SandboxError("the code sandbox needs root (it creates PID, mount and network namespaces and runs each "
                           "program as an unprivileged user); run evaluation as root, e.g. in a container")
    if shutil.which(NAMESPACES[0]) is None:
        raise SandboxError("the code sandbox needs the `unshare` command from util-linux; install util-linux")
    return NAMESPACES


def scrubbed_environment() -> dict[str, str]:
    """Only what an interpreter needs; nothing from the parent (tokens, proxies, CUDA settings) leaks in. HOME and
    TMPDIR are the working directory, the one place the program may write."""
    return {"PATH": "/usr/bin:/bin", "HOME": ".", "TMPDIR": ".", "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def sandbox_user() -> int:
    """A user id no account has, fresh for each run, so the process limit counts this run's processes only."""
    return 1_000_000_000 + secrets.randbelow(1_000_000_000)


def kill_group(process: subprocess.Popen) -> None:
    """Kill `unshare` and the supervisor (they share the process group); the supervisor's death empties its PID
    namespace, whatever sessions or groups the program's processes moved to."""
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
    # The supervisor reports a program killed by signal S as exit code 128 + S.
    signum = returncode - 128 if returncode > 128 else -returncode
    if signum == signal.SIGXCPU:  # the CPU-seconds limit: a timeout that the kernel enforced first
        return "timeout", "SIGXCPU"
    if signum in signal.valid_signals():
        try:
            return "failed", signal.Signals(signum).name
        except ValueError:  # a real-time signal (SIGRTMIN..SIGRTMAX) has no name in the enum
            return "failed", f"signal {signum}"
    return "failed", f"exit code {returncode}"


def last_line(text: str, width: int = 300) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(ERROR_PREFIX)]
    return lines[-1][:width] if lines else ""


def run_sandboxed(program: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run one program (Python source) under `limits` and report how it ended. See the module docstring. The
    program works in a fresh folder of its own, a tmpfs that ends with the run: what it wrote there is gone."""
    limits.check()
    prefix = isolation_command()
    try:
        program.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 file holds it, so no interpreter could run it
        return SandboxResult("failed", "UnicodeEncodeError", str(exc)[:300], 0.0)
    with tempfile.TemporaryDirectory(prefix="sparsedecoding-sandbox-") as scratch:
        return _run_in(Path(scratch), program, limits, prefix)


def _write_program(home: Path, program: str) -> None:
    """program.py, created in the fresh folder (never through a link), for the guard to read."""
    descriptor = os.open(home / "program.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with open(descriptor, "w", encoding="utf-8") as handle:
        handle.write(program)


def _tail(handle, limit: int = 1 << 20) -> str:
    """The last `limit` bytes the program wrote to one of its output files, read through the parent's own handle."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - limit))
    return handle.read().decode("utf-8", errors="replace")


def _drain(descriptor: int) -> str:
    """Everything on a pipe whose write ends are all closed; closes it."""
    chunks = []
    with open(descriptor, "rb") as pipe:
        while chunk := pipe.read(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _run_in(home: Path, program: str, limits: SandboxLimits, prefix: tuple[str, ...]) -> SandboxResult:
    token, uid = secrets.token_hex(16), sandbox_user()
    _write_program(home, program)  # the guard copies it into the run's own folder, a tmpfs mounted over this one
    started = time.perf_counter()
    # The output files live in a folder only root may enter, outside the program's folder: the program holds them
    # open for writing (and the file size limit bounds them), but cannot replace them by links, pipes or devices.
    with tempfile.TemporaryDirectory(prefix="sparsedecoding-sandbox-output-") as private, \
            open(Path(private) / "stdout", "w+b") as stdout, open(Path(private) / "stderr", "w+b") as stderr:
        token_read, token_write = os.pipe()  # closed on every path below: the child holds its own copy
        os.write(token_write, token.encode())
        os.close(token_write)
        status_read, status_write = os.pipe()
        command = [*prefix, sys.executable, "-I", "-c", GUARD, "program.py", str(limits.memory_mb << 20),
                   str(math.ceil(limits.timeout_s)), str(limits.file_mb << 20), str(limits.processes), str(uid),
                   str(token_read), str(status_write), str(limits.disk_mb << 20)]
        try:
            process = subprocess.Popen(command, cwd=home, env=scrubbed_environment(), stdin=subprocess.DEVNULL,
                                       stdout=stdout, stderr=stderr, start_new_session=True,
                                       pass_fds=(token_read, status_write))
        except OSError as exc:
            os.close(status_read)
            raise SandboxError(f"could not start the sandbox ({exc})") from None
        finally:
            os.close(token_read)
            os.close(status_write)
        try:
            process.wait(timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            # only here: once `unshare` has been reaped, its number (so its group's) may belong to a new process
            kill_group(process)
        returncode = process.wait()
        status = _drain(status_read)  # every writer is gone with the namespace
        out, err = _tail(stdout), _tail(stderr)
    seconds = time.perf_counter() - started
    ready = status.split("\n", 1)[0]
    if ready != READY:
        reason = ready[len(SETUP_PREFIX):] if ready.startswith(SETUP_PREFIX) else last_line(err)
        raise SandboxError(f"could not isolate the program, so it was not run: {reason or 'no reason given'}"
                           f"{' (timed out during setup)' if timed_out else ''}")
    if timed_out:
        return SandboxResult("timeout", "timeout", f"killed after {limits.timeout_s:g} s", seconds)
    outcome, error = classify(returncode, out, err, token)
    return SandboxResult(outcome, error, last_line(err), seconds)


def run_many(programs: list[str], limits: SandboxLimits = SandboxLimits(), workers: int | None = None,
             ) -> list[SandboxResult]:
    """Run programs in parallel, one sandbox each (threads only wait on the child processes); results in order."""
    limits.check()
    isolation_command()  # refuse once, before any thread starts
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run_sandboxed(program, limits), programs))
