import os
import select
import socket
import tempfile
import time

import pytest

from sparsedecoding.errors import SandboxError
from sparsedecoding.evaluation import sandbox
from sparsedecoding.evaluation.sandbox import SandboxLimits, run_many, run_sandboxed

FAST = SandboxLimits(timeout_s=1.0, memory_mb=256, file_mb=1)


def test_a_plain_program_passes_in_a_fresh_private_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = (
        "import os\n"
        "assert sorted(os.listdir('.')) == ['program.py', 'stderr', 'stdout'], os.listdir('.')\n"
        f"assert os.getcwd() != {os.getcwd()!r}\n"
        "open('scratch.txt', 'w').write('x')\n"
    )
    result = run_sandboxed(program, FAST)
    assert result.passed, result
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed afterwards


def test_the_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("SPARSEDECODING_TEST_SECRET", "hunter2")
    program = "import os\nassert 'SPARSEDECODING_TEST_SECRET' not in os.environ\nassert 'hunter2' not in str(os.environ)\n"
    assert run_sandboxed(program, FAST).passed
    assert not run_sandboxed("import os\nassert 'SPARSEDECODING_TEST_SECRET' in os.environ\n", FAST).passed


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


def test_memory_is_capped():
    assert run_sandboxed("block = bytearray(32 << 20)\n", FAST).passed  # below the cap: fine
    result = run_sandboxed("block = bytearray(2 << 30)\n", FAST)
    assert result.outcome == "failed" and result.error == "MemoryError"


def test_output_is_capped_by_the_file_size_limit():
    result = run_sandboxed("while True:\n    print('x' * 4096)\n", FAST)
    assert result.outcome == "failed" and result.error in ("OSError", "SIGXFSZ")


@pytest.fixture(params=["guard only", "network namespace"])
def isolation(request, monkeypatch):
    """The guard must refuse network on its own (CI has no user namespaces); the namespace is an extra layer."""
    if request.param == "guard only":
        monkeypatch.setattr(sandbox, "network_namespace_prefix", lambda: ())
    elif not sandbox.network_namespace_prefix():
        pytest.skip("this machine does not allow unprivileged network namespaces")
    return request.param


@pytest.mark.parametrize("attempt", [
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n",
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', {port}))\n",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)\n",
])
def test_network_is_refused(isolation, attempt):
    with socket.create_server(("127.0.0.1", 0)) as server:
        result = run_sandboxed(attempt.format(port=server.getsockname()[1]), FAST)
        # A completed TCP handshake would sit in the listen backlog and make the server readable.
        readable, _, _ = select.select([server], [], [], 0)
    assert result.outcome == "failed", result
    assert readable == []


@pytest.mark.parametrize("program", ["import os\nos.system('true')\n", "import subprocess\nsubprocess.run(['true'])\n",
                                     "import os\nos.kill(os.getppid(), 9)\n"])
def test_process_creation_and_signals_are_refused(program):
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


@pytest.mark.parametrize("limits", [SandboxLimits(timeout_s=0), SandboxLimits(memory_mb=8), SandboxLimits(file_mb=0)])
def test_bad_limits_are_refused(limits):
    with pytest.raises(SandboxError):
        run_sandboxed("pass\n", limits)
