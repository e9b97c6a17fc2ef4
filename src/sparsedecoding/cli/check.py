"""`sparsedecoding check`: the decode engine's correctness on a real checkpoint, as a markdown report (dense engine
logits against transformers; sparse against dense engine greedy tokens). See evaluation/engine_check.py for the
rules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser("check", help="engine correctness: logits vs transformers, sparse vs dense tokens",
                                   description=__doc__)
    parser.add_argument("--model", required=True, type=Path,
                        help="HF safetensors folder: dense (logits check) or N:M-pruned (both checks)")
    parser.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per prompt (default: 256)")
    parser.add_argument("--prompt", action="append",
                        help="prompt text (repeatable) (default: four built-in prompts)")
    parser.add_argument("--checks", nargs="+", choices=["logits", "tokens"], default=["logits", "tokens"],
                        help="which checks to run (default: logits tokens)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                        help="weights and activations of the engines and of transformers; the tokens check packs "
                             "linears, which needs bfloat16 or float16 (default: bfloat16)")
    parser.add_argument("--no-wide-reference", action="store_true",
                        help="skip transformers in float32 (float64 for --dtype float32), for a model whose wide "
                             "copy does not fit; logits are then judged by the fixed tolerance (default: off)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1 ... "
                        "(default: auto)")
    parser.add_argument("--no-compile", action="store_true",
                        help="eager engine (CPU, or to isolate compile issues) (default: off)")
    parser.add_argument("--out", type=Path, help="markdown report path (default: print only)")
    parser.set_defaults(func=run)


def check_report_path(out: Path, model: Path | None = None) -> None:
    """OutputNotWritableError, before any work, for a report file that could not be written: a name the filesystem
    refuses (too long), a folder stands there, the file exists but cannot be opened for writing, or no file can be
    created where it would go; and for one that would replace a file `model`'s folder is read from (its config,
    weights or tokenizer: the report is written after the model is read); an earlier report there may be replaced."""
    from ..errors import OutputNotWritableError
    from ..outputs import check_writable, is_model_file, path_exists

    if not path_exists(out):
        check_writable(out, partial=False)
        return
    if out.is_dir():
        raise OutputNotWritableError(f"--out {out} is a folder; give the report file's path, such as "
                                     f"{out / 'report.md'}")
    if model is not None and is_model_file(out.name) and out.resolve().is_relative_to(Path(model).resolve()):
        raise OutputNotWritableError(f"--out {out} would overwrite a file of the model folder {model}; choose "
                                     f"another --out")
    try:
        with open(out, "a"):  # appending nothing leaves the file as it is
            pass
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write {out} ({exc.strerror}); choose another --out") from None


def run(args: argparse.Namespace) -> int:
    import torch

    from ..engine.config import check_model_folder
    from ..errors import EngineError
    from ..evaluation.engine_check import DEFAULT_PROMPTS, run as run_check
    from ..invocation import command
    from ..kernels.op import settings
    from ..runenv import pick_device

    settings()  # the engine's environment settings: a bad value fails here, before the models load
    if args.new_tokens < 1:
        raise EngineError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if args.prompt and not all(args.prompt):
        raise EngineError("--prompt is empty; give the text to continue")
    if "tokens" in args.checks and args.dtype == "float32":
        raise EngineError("--checks tokens packs the N:M linears, which run in bfloat16 or float16, not float32; "
                          "pass --dtype bfloat16 or float16, or --checks logits")
    if args.out:
        check_report_path(args.out, args.model)
    device = pick_device(args.device)
    check_model_folder(args.model)
    report, failed = run_check(args.model, args.prompt or list(DEFAULT_PROMPTS), args.new_tokens, device,
                               compile=device.type == "cuda" and not args.no_compile, checks=args.checks,
                               dtype=getattr(torch, args.dtype), wide_reference=not args.no_wide_reference,
                               command=" ".join(command()), verdict=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    print(report)
    if failed:  # the report says which; a script or CI sees it in the exit status
        print(f"check failed: {failed} row{'s' if failed > 1 else ''} of the report did not pass", file=sys.stderr)
        return 1
    return 0
