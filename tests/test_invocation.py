"""The command a run records: `cli.main(argv)`'s own arguments, whoever calls it; a script's sys.argv otherwise."""

from __future__ import annotations

import sys

import pytest

from sparsedecoding.invocation import command, running_command


def test_outside_the_cli_the_command_is_the_processes_own(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["my_script.py", "--flag"])
    assert command() == ["my_script.py", "--flag"]


def test_inside_running_command_it_is_the_cli_arguments_and_afterwards_it_is_restored(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])
    with running_command(["bench", "--preset", "smollm2-135m"]):
        assert command() == ["sparsedecoding", "bench", "--preset", "smollm2-135m"]
        with running_command(["eval"]):
            assert command() == ["sparsedecoding", "eval"]
        assert command() == ["sparsedecoding", "bench", "--preset", "smollm2-135m"]
    assert command() == ["pytest", "-q"]


def test_it_is_restored_when_the_command_raises(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pytest"])
    with pytest.raises(RuntimeError):
        with running_command(["prune"]):
            raise RuntimeError("stop")
    assert command() == ["pytest"]


def test_cli_main_runs_its_command_with_the_arguments_it_was_given(monkeypatch):
    """main(argv) from Python (tests, scripts) records argv, not the process's sys.argv: `bench --out`'s JSON named
    pytest's command line before this (found by the GPU test of bench's JSON, fifty-seventh session)."""
    import sparsedecoding.cli as cli

    seen = []
    parser = cli.build_parser()
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "-m", "gpu"])
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.commands["fetch"].set_defaults(func=lambda args: seen.append(command()) or 0)
    assert cli.main(["fetch", "smollm2-135m"]) == 0
    assert seen == [["sparsedecoding", "fetch", "smollm2-135m"]]
    assert command() == ["pytest", "-q", "-m", "gpu"]
