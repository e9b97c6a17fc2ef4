"""`sparsedecoding pack`: convert a pruned HF model folder into a packed N:M checkpoint (values + bitmask for every
N:M sparse decoder linear, everything else dense, packed.json with shapes and the source's sha256). A checkpoint
written by `prune --quantize int8|int4` is packed with int8 / int4 codes and scales instead of bf16 values."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser("pack", help="store a pruned model's N:M weights packed for the sparse kernel",
                                   description=__doc__)
    parser.add_argument("--model", required=True, type=Path, help="pruned HF model folder (safetensors)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (written atomically)")
    parser.add_argument("--pattern", default="auto",
                        help="N:M pattern every decoder linear must satisfy (2:4, 4:8, 8:16, 16:32), or auto: pack "
                             "each linear in the sparsest pattern the kernel runs that keeps at most half its "
                             "weights, and keep the rest dense (default: auto)")
    parser.add_argument("--quantize", choices=["auto", "none", "int8", "int4"], default="auto",
                        help="store kept values as int8 or int4 codes and scales (the weights must lie on that grid, "
                             "as `prune --quantize` leaves them), or as they are (none); auto: what the pruned "
                             "checkpoint's sparsedecoding.json records (default: auto)")
    parser.add_argument("--group-size", type=int,
                        help="int4: input columns that share a scale, a multiple of 32 (default: the recorded one, "
                             "else 128)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (default: off)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..errors import PackingError
    from ..models import check_hf_folder
    from ..packed import PACKED_MANIFEST, pack_checkpoint, recorded_quantization

    if args.model.is_dir():  # what generate and eval load must load: checked before anything is written
        check_hf_folder(args.model)
    quantize, group_size = recorded_quantization(args.model) if args.model.is_dir() else (None, 128)
    if args.quantize != "auto":
        quantize = None if args.quantize == "none" else args.quantize
    if args.group_size is not None:
        if args.group_size <= 0 or args.group_size % 32:
            raise PackingError(f"--group-size {args.group_size} must be a positive multiple of 32, such as 128")
        if quantize != "int4":
            log.warning("--group-size %d is not read: only int4 codes have scale groups (this pack stores %s)",
                        args.group_size, f"{quantize} codes" if quantize else "the values as they are")
        group_size = args.group_size
    manifest = pack_checkpoint(args.model, args.out, pattern=args.pattern, overwrite=args.overwrite,
                               quantize=quantize, group_size=group_size)
    packed = sum("pattern" in info for info in manifest["tensors"].values())
    patterns = ", ".join(manifest["patterns"]) or "none"
    if quantize is not None:
        patterns += f"; {quantize} codes" + (f", {group_size} columns a scale" if quantize == "int4" else "")
    print(f"packed {packed} of {len(manifest['tensors'])} tensors (patterns: {patterns}) into {args.out} "
          f"(details in {args.out / PACKED_MANIFEST})")
    return 0
