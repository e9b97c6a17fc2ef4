"""`sparsedecoding` command line. Each sub-command lives in its own module here and exposes
`register(subparsers)`, which adds its parser and sets `func` to a function taking the parsed arguments.
Heavy imports (torch, transformers, triton) happen inside those functions so that `--help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import SparseDecodingError
from ..invocation import running_command

# Module names under sparsedecoding.cli, in the order their commands appear in --help.
_COMMAND_MODULES = ["fetch", "prune", "demo", "evaluate", "compare", "analyze", "check", "pack", "engine"]


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one `error:` line (with the command to get help) and exit 2, like every other error."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sparsedecoding",
        description="Prune LLMs with Hessians calibrated on their own decode steps; decode fast with N:M kernels.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    parser.commands = subparsers.choices  # each command's own parser, for its errors
    return parser


def _attach_pattern_value(argv: list[str]) -> list[str]:
    """`--pattern -1%` -> `--pattern=-1%`: argparse reads a value starting with "-" as an unknown option, so attach it
    and let the pattern parser say what is wrong with it."""
    joined: list[str] = []
    for token in argv:
        if joined and joined[-1] == "--pattern" and token.startswith("-") and not token.startswith("--"):
            joined[-1] = f"--pattern={token}"
        else:
            joined.append(token)
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(_attach_pattern_value(argv))
    if unknown:  # said by the command's parser, whose --help lists its options
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # Our progress at INFO; other libraries' (torch's compile and cache statistics, say) only from WARNING, unless -v
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("sparsedecoding").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        with running_command(argv):  # what the run's records name as their command
            result = args.func(args)
    except SparseDecodingError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
