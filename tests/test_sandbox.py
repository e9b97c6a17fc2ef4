import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparsedecoding.errors import SandboxError
from sparsedecoding.evaluation import sandbox
from sparsedecoding.evaluation.sandbox import SandboxLimits, run_many, run_sandboxed

FAST = SandboxLimits(timeout_s=1.0, memory_mb=256, file_mb=1, processes=8)


def test_a_plain_program_passes_in_a_fresh_private_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = (
        "import os\n"
        "assert os.listdir('.') == ['program.py'], os.listdir('.')  # its output files are kept elsewhere\n"
        f"assert os.getcwd() != {os.getcwd()!r}\n"
        "open('scratch.txt', 'w').write('x')\n"
    )
    result = run_sandboxed(program, FAST)
    assert result.passed, result
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed afterwards


# --- Probes: each is an attack that a generated program made or could make; each must fail. The attacks go through
# ctypes, around the Python-level guard, so what stops them is the kernel. ----------------------------------------

@pytest.fixture
def open_folder():
    """A folder anyone may write to below /usr, which every run sees (sandbox.VISIBLE), so only the read-only mount
    stands between the program and it."""
    base = Path("/usr/local")
    if not base.is_dir():
        pytest.skip("no /usr/local to make a world-writable probe folder in")
    folder = Path(tempfile.mkdtemp(dir=base, prefix="sandbox-probe-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


def test_a_write_outside_the_folder_fails(open_folder):
    outside = open_folder / "outside.txt"
    program = ("open('inside.txt', 'w').write('fine')\n"
               "assert open('inside.txt').read() == 'fine'  # the same write inside the folder works\n"
               f"assert {str(open_folder)!r} and __import__('os').path.isdir({str(open_folder)!r})  # seen\n"
               f"open({str(outside)!r}, 'w').write('escaped')\n")
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and "Read-only file system" in result.message, result
    assert not outside.exists()


def test_a_shell_command_through_ctypes_cannot_write_outside(open_folder):
    outside = open_folder / "from_shell.txt"
    program = ("import ctypes, os\nlibc = ctypes.CDLL(None)\n"
               "libc.system(b'touch inside.txt')\n"
               "assert os.path.exists('inside.txt')  # the shell did run\n"
               f"libc.system(b'touch {outside}')\n")
    assert run_sandboxed(program, FAST).passed
    assert not outside.exists()


def sandbox_processes() -> list[str]:
    """The host's processes running as a sandbox user id (sandbox_user: 10^9 and above)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            uids = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue  # not a process, or gone
        if int(uids.split()[1]) >= 1_000_000_000:
            found.append(entry.name)
    return found


@pytest.mark.parametrize("ending", ["while True:\n    pass\n", "time.sleep(0.6)\n"],
                         ids=["past the timeout", "after a normal end"])
def test_no_process_outlives_the_run(ending):
    """A forked child leaves the session and sleeps for 5 s, far past the run's end: while the run goes on it is
    there, and within a second of the run's end no process of a sandbox user is left on the host (the kernel
    kills what is left of a PID namespace; a killed process takes a moment to go)."""
    program = ("import ctypes, time\nlibc = ctypes.CDLL(None)\n"
               "if libc.fork() == 0:\n"
               "    libc.setsid()\n"
               "    time.sleep(5)\n"
               "    libc._exit(0)\n" + ending)
    assert not sandbox_processes()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_sandboxed, program, FAST)
        time.sleep(0.3)
        during = sandbox_processes()
        running.result()
    assert len(during) >= 2  # the program and its child (the supervisor stays root)
    deadline = time.perf_counter() + 1.0
    while sandbox_processes() and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not sandbox_processes()


def test_a_fork_bomb_stops_at_the_process_limit():
    program = ("import ctypes, time\nlibc = ctypes.CDLL(None)\nforks = 0\n"
               "while forks < 1000:\n"
               "    pid = libc.fork()\n"
               "    if pid == 0:\n"
               "        time.sleep(30)\n"
               "        libc._exit(0)\n"
               "    if pid < 0:\n"
               "        break\n"
               "    forks += 1\n"
               "raise RuntimeError(f'forked {forks}')\n")
    started = time.perf_counter()
    result = run_sandboxed(program, FAST)
    assert result.message == f"RuntimeError: forked {FAST.processes - 1}"  # the program itself is one process
    assert time.perf_counter() - started < FAST.timeout_s  # the sleeping children did not hold the run open


def test_memory_is_capped_and_the_cap_cannot_be_raised():
    assert run_sandboxed("block = bytearray(32 << 20)\n", FAST).passed  # below the cap: fine
    program = ("import resource\n"
               "try:\n"
               "    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
               "except ValueError:\n"
               "    pass\n"
               "block = bytearray(2 << 30)\n")
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and result.error == "MemoryError", result


def test_a_huge_file_stops_at_the_file_size_limit():
    program = ("import os\ntry:\n    open('big', 'wb').write(b'x' * (8 << 20))\n"
               "except OSError:\n    raise OSError(os.path.getsize('big'))\n")
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and result.error in ("OSError", "SIGXFSZ"), result
    if result.error == "OSError":
        assert int(result.message.split(":")[1]) <= FAST.file_mb << 20


def test_the_work_folder_is_bounded_in_bytes_and_files():
    """The work folder is a tmpfs of disk_mb with WORK_INODES inodes: many files of the file size limit stop at
    its size (the host's disk is never touched), and a folder tree as deep as the program likes stops at the inode
    count, with the run reported normally (a deep tree once broke the parent's clean-up)."""
    many_files = ("n = 0\ntry:\n    while True:\n        open(f'f{n}', 'wb').write(b'x' * (1 << 20))\n"
                  "        n += 1\nexcept OSError as error:\n    raise RuntimeError(f'{n} made: {error.strerror}')\n")
    result = run_sandboxed(many_files, SandboxLimits(timeout_s=2, memory_mb=256, file_mb=1, disk_mb=4))
    assert result.error == "RuntimeError" and result.message.endswith("made: No space left on device"), result
    assert int(result.message.split()[1]) <= 4  # files of 1 MB written
    deep = ("import os\nn = 0\ntry:\n    while True:\n        os.mkdir('d')\n        os.chdir('d')\n"
            "        n += 1\nexcept OSError as error:\n    raise RuntimeError(f'{n} made: {error.strerror}')\n")
    result = run_sandboxed(deep, FAST)
    assert result.error == "RuntimeError" and result.message.endswith("made: No space left on device"), result
    assert int(result.message.split()[1]) < sandbox.WORK_INODES


@pytest.mark.parametrize("program", [
    "import os\nos.memfd_create('held')\n",
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.shmget(0, 1 << 20, 0o1600) == -1:\n"
    "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n",
], ids=["memfd_create", "shmget"])
def test_memory_outside_the_address_space_limit_is_refused(program):
    """A memory file's or System V segment's pages count against no address space: the seccomp filter refuses the
    calls that make them (a memfd-backed gigabyte once passed a 128 MB limit)."""
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and "Operation not permitted" in result.message, result


@pytest.mark.parametrize("call", [
    "libc.msgget(0, 0o1600)",  # IPC_PRIVATE message queue
    "libc.semget(0, 1, 0o1600)",
    "libc.unshare(0x10000000 | 0x08000000)",  # a user and an IPC namespace of its own
    "libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, 0, 0, 0, 0)",  # clone NEWUSER
], ids=["msgget", "semget", "unshare", "clone-newuser"])
def test_queues_semaphores_and_new_namespaces_are_refused(call):
    """System V queues hold kernel memory no limit of the run counts, and a user namespace would let the program
    make IPC namespaces with more of them: the seccomp filter refuses each way."""
    program = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               f"if {call} == -1:\n    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n")
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and "Operation not permitted" in result.message, result


def test_threads_still_start_under_the_filter():
    """clone3 gets ENOSYS (its flags are out of the filter's reach); the C library then starts threads by clone."""
    program = ("import threading\nresults = []\n"
               "threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]\n"
               "for thread in threads:\n    thread.start()\nfor thread in threads:\n    thread.join()\n"
               "assert sorted(results) == [0, 1, 2, 3]\n")
    assert run_sandboxed(program, FAST).passed


@pytest.mark.parametrize("program, error", [
    ("import signal\nsignal.raise_signal(40)\n", "signal 40"),  # a real-time signal: no name in signal.Signals
    ("import os\nos._exit(170)\n", "signal 42"),  # an exit code the supervisor's encoding reads as a signal
    ("x = '\\ud800'\n".encode().decode("unicode_escape"), "UnicodeEncodeError"),  # a lone surrogate in the text
])
def test_odd_endings_are_one_failed_result_not_an_aborted_evaluation(program, error):
    results = run_many(["assert True\n", program], FAST, workers=2)
    assert results[0].passed and results[1].outcome == "failed" and results[1].error == error, results


def test_open_files_are_few():
    program = ("import resource\nassert resource.getrlimit(resource.RLIMIT_NOFILE) == "
               f"({sandbox.OPEN_FILES}, {sandbox.OPEN_FILES})\n")
    assert run_sandboxed(program, FAST).passed


def test_output_is_capped_by_the_file_size_limit():
    result = run_sandboxed("while True:\n    print('x' * 4096)\n", FAST)
    assert result.outcome == "failed" and result.error in ("OSError", "SIGXFSZ")


RAW_CONNECT = """import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
address = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)
if libc.connect(fd, address, len(address)) != 0:
    raise ConnectionError(os.strerror(ctypes.get_errno()))
"""


def test_a_raw_network_connect_fails():
    with socket.create_server(("127.0.0.1", 0)) as server:
        probe = RAW_CONNECT.format(port=server.getsockname()[1])
        result = run_sandboxed(probe, FAST)
        # A completed TCP handshake would sit in the listen backlog and make the server readable.
        assert select.select([server], [], [], 0)[0] == []
        subprocess.run([sys.executable, "-c", probe], check=True, timeout=30)  # the same probe, unsandboxed, connects
        assert select.select([server], [], [], 1)[0] == [server]
    assert result.outcome == "failed" and result.error == "ConnectionError", result


@pytest.mark.parametrize("attempt", [
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)\n",
])
def test_python_network_calls_are_refused(attempt):
    with socket.create_server(("127.0.0.1", 0)) as server:
        result = run_sandboxed(attempt.format(port=server.getsockname()[1]), FAST)
        readable, _, _ = select.select([server], [], [], 0)
    assert result.outcome == "failed", result
    assert readable == []


def test_the_parent_environment_and_processes_are_not_visible(monkeypatch):
    monkeypatch.setenv("SPARSEDECODING_TEST_SECRET", "hunter2")
    program = ("import os\n"
               "assert 'SPARSEDECODING_TEST_SECRET' not in os.environ\n"
               "assert 'hunter2' not in str(os.environ)\n"
               "pids = [name for name in os.listdir('/proc') if name.isdigit()]\n"
               "assert len(pids) <= 2, pids  # its supervisor and itself\n"
               "for pid in pids:\n"
               "    try:\n"
               "        assert b'hunter2' not in open(f'/proc/{pid}/environ', 'rb').read()\n"
               "    except PermissionError:\n"
               "        pass\n")
    assert run_sandboxed(program, FAST).passed
    assert not run_sandboxed("import os\nassert 'SPARSEDECODING_TEST_SECRET' in os.environ\n", FAST).passed


# --- Timeouts, results and refusals --------------------------------------------------------------------------------

def test_an_infinite_loop_is_killed_at_the_timeout():
    started = time.perf_counter()
    result = run_sandboxed("while True:\n    pass\n", FAST)
    assert result.outcome == "timeout" and not result.passed
    assert time.perf_counter() - started < FAST.timeout_s + 1.5


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
    started = time.perf_counter()
    result = run_sandboxed("import time\ntime.sleep(60)\n", FAST)
    assert result.outcome == "timeout"
    assert time.perf_counter() - started < FAST.timeout_s + 1.5


@pytest.mark.parametrize("program", ["import os\nos.system('true')\n", "import subprocess\nsubprocess.run(['true'])\n",
                                     "import os\nos.kill(os.getppid(), 9)\n"])
def test_python_process_creation_and_signals_are_refused(program):
    result = run_sandboxed(program, FAST)
    assert result.outcome == "failed" and result.error == "PermissionError"


@pytest.mark.parametrize("program", ["import sys\nsys.exit(0)\nassert False\n", "import os\nos._exit(0)\n"])
def test_exiting_early_does_not_pass(program):
    assert not run_sandboxed(program, FAST).passed


def test_failures_name_the_exception_class_and_results_keep_their_order():
    programs = ["pass\n", "raise KeyError('k')\n", "assert 1 == 2, 'wrong'\n", "x = 1 +\n"]
    results = run_many(programs, FAST, workers=2)
    assert [result.error for result in results] == [None, "KeyError", "AssertionError", "SyntaxError"]
    assert results[2].message == "AssertionError: wrong"


@pytest.mark.parametrize("limits, message", [
    (SandboxLimits(timeout_s=0), "timeout must be positive"), (SandboxLimits(memory_mb=8), "at least 64 MB"),
    (SandboxLimits(file_mb=0), "file size limit must be at least 1 MB"),
    (SandboxLimits(processes=0), "process limit must be at least 1")])
def test_bad_limits_are_refused(limits, message):
    with pytest.raises(SandboxError, match=message):
        run_sandboxed("pass\n", limits)


def test_without_root_nothing_runs(monkeypatch, open_folder):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="needs root"):
        run_sandboxed(f"open({str(open_folder / 'ran')!r}, 'w')\n", FAST)
    with pytest.raises(SandboxError, match="needs root"):
        run_many(["pass\n"], FAST)
    assert not (open_folder / "ran").exists()


def test_when_the_namespaces_cannot_be_made_nothing_runs(monkeypatch, open_folder):
    monkeypatch.setattr(sandbox, "NAMESPACES", ("unshare", "--no-such-namespace"))
    with pytest.raises(SandboxError, match="could not isolate"):
        run_sandboxed(f"open({str(open_folder / 'ran')!r}, 'w')\n", FAST)
    assert not (open_folder / "ran").exists()
    monkeypatch.setattr(sandbox, "NAMESPACES", ("no-such-unshare-command",))
    with pytest.raises(SandboxError, match="util-linux"):
        run_sandboxed("pass\n", FAST)


def test_the_pass_token_is_not_on_the_command_line():
    """/proc/self/cmdline shows the guard's arguments: the token is not among them, so echoing them and leaving
    early does not pass."""
    program = ("import os\nargs = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
               "print()\nprint('\\n'.join(arg.decode(errors='replace') for arg in args), flush=True)\nos._exit(0)\n")
    result = run_sandboxed(program, FAST)
    assert not result.passed


def test_the_pass_token_is_in_no_argument_or_environment_variable(monkeypatch):
    """Wherever in an argument the token sat (whole or inside a longer one), a program could read it from
    /proc/self/cmdline or its environment and print it: every argument and variable the sandbox starts with is
    searched for it."""
    known = "0123456789abcdef" * 2
    monkeypatch.setattr(sandbox.secrets, "token_hex", lambda nbytes: known)
    started = []
    real = sandbox.subprocess.Popen

    def recording(command, *args, **kwargs):
        started.append((list(command), dict(kwargs.get("env") or {})))
        return real(command, *args, **kwargs)

    monkeypatch.setattr(sandbox.subprocess, "Popen", recording)
    assert run_sandboxed("assert 1 + 1 == 2\n", FAST).passed  # the token did reach the guard
    assert started
    for command, environment in started:
        assert not [arg for arg in command if known in arg]
        assert not [name for name, value in environment.items() if known in name or known in value]


def test_a_main_block_does_not_run_before_the_tests():
    """As under the reference HumanEval harness: an answer ending in `unittest.main()` (which exits) or a block
    that reads input still reaches the tests after it."""
    for block in ("    import unittest\n    unittest.main()\n", "    input()\n"):
        program = f"def f():\n    return 1\n\nif __name__ == '__main__':\n{block}\nassert f() == 1\n"
        assert run_sandboxed(program, FAST).passed, block
    assert not run_sandboxed("def f():\n    return 1\n\nassert f() == 2\n", FAST).passed


def test_the_program_cannot_erase_or_forge_the_setup_report():
    """Whether the walls stood comes back on a pipe closed before the program starts: truncating or writing its
    own stdout and stderr makes a failed run, not a setup error (which would stop a whole batch)."""
    programs = ["import os\nos.ftruncate(1, 0)\nos.ftruncate(2, 0)\nraise AssertionError('tests failed')\n",
                "import sys\nsys.stderr.write('sandbox-setup-failed: x\\n')\nsys.stderr.flush()\nassert False\n",
                "import os\nos.write(2, b'sandbox-ready\\n')\nassert False\n"]
    results = run_many(programs, FAST, workers=2)
    assert [result.outcome for result in results] == ["failed"] * 3


@pytest.fixture
def host_socket():
    """A Unix socket anyone may connect to, in each shared folder the runs cover, as a host service's would be."""
    import socket

    made = []
    for base in ("/tmp", "/run"):
        if os.path.isdir(base):
            folder = Path(tempfile.mkdtemp(dir=base, prefix="sandbox-probe-"))
            folder.chmod(0o777)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(folder / "service.sock"))
            (folder / "service.sock").chmod(0o777)
            server.listen(1)
            made.append((folder, server))
    yield [folder / "service.sock" for folder, _ in made]
    for folder, server in made:
        server.close()
        shutil.rmtree(folder)


def test_host_unix_sockets_and_shared_folders_are_out_of_reach(host_socket):
    """The network namespace does not fence off Unix sockets that have a path; the run covers /tmp, /run and the
    other shared folders with empty read-only mounts, so neither a host socket nor another run's files are there."""
    for path in host_socket:
        program = ("import _socket\nraw = _socket.socket.__mro__[1]  # around the guard's Python-level block\n"
                   f"client = raw(_socket.AF_UNIX, _socket.SOCK_STREAM)\nclient.connect({str(path)!r})\n")
        result = run_sandboxed(program, FAST)
        assert result.outcome == "failed" and result.error == "FileNotFoundError", (path, result)
    listing = ("import os\nfor folder in ('/tmp', '/var/tmp', '/dev/shm', '/run'):\n"
               "    if os.path.isdir(folder):\n"
               "        probes = [name for name in os.listdir(folder) if name.startswith('sandbox-probe-')]\n"
               "        assert not probes, folder\n")
    assert run_sandboxed(listing, FAST).passed


def test_host_folders_outside_the_system_ones_are_hidden():
    """Every top-level folder but the system's is covered: a world-readable file in a fresh folder under /var, /srv,
    /opt, /home or /mnt (whichever exists here) is not there, and /root shows only what the interpreter needs."""
    base = next((Path(path) for path in ("/var/lib", "/srv", "/opt", "/home", "/mnt") if os.path.isdir(path)), None)
    if base is None:
        pytest.skip("none of /var/lib, /srv, /opt, /home, /mnt here")
    folder = Path(tempfile.mkdtemp(dir=base, prefix="sandbox-probe-"))
    try:
        folder.chmod(0o755)
        (folder / "notes.txt").write_text("private")
        (folder / "notes.txt").chmod(0o644)
        assert run_sandboxed(f"assert open({str(folder / 'notes.txt')!r}).read() == 'private'\n",
                             SandboxLimits(timeout_s=1.0, memory_mb=256)).outcome == "failed"
        program = (f"import os\nassert not os.path.exists({str(folder)!r})\n"
                   "top = [name for name in os.listdir('/')\n"
                   "       if os.path.isdir('/' + name) and not os.path.islink('/' + name)]\n"
                   "for name in top:\n"
                   f"    if name not in {sandbox.VISIBLE!r}:\n"
                   "        for entry in os.listdir('/' + name):  # only folders the interpreter or the run need\n"
                   "            assert os.path.isdir(os.path.join('/', name, entry)), (name, entry)\n")
        assert run_sandboxed(program, FAST).passed
    finally:
        shutil.rmtree(folder)


def test_the_program_reaches_its_folder_by_its_absolute_path_too(tmp_path, monkeypatch):
    """The work folder lies under /tmp, which every run covers: it is staged back at its path, so answers that
    write through os.getcwd(), Path.resolve() or tempfile work as they would outside."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = ("import os, pathlib, tempfile\n"
               "open(os.path.join(os.getcwd(), 'a'), 'w').write('1')\n"
               "pathlib.Path('b').resolve().write_text('2')\n"
               "with tempfile.NamedTemporaryFile() as handle:\n    handle.write(b'3')\n"
               "with tempfile.TemporaryDirectory() as folder:\n    open(os.path.join(folder, 'c'), 'w').write('4')\n"
               "assert sorted(os.listdir('.')) == ['a', 'b', 'program.py'], os.listdir('.')\n")
    assert run_sandboxed(program, FAST).passed
