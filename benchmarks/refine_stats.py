"""Summary of the block-wise refinement recorded in `sparsedecoding prune` manifests: per manifest, the ratio of each
layer's held-out calibration error after refinement to before (min / median / max) and how many layers kept it.

    python benchmarks/refine_stats.py OUT/sparsedecoding.json [...]
"""

from __future__ import annotations

import json
import statistics
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("error: usage: refine_stats.py MANIFEST.json [...]")
    for path in sys.argv[1:]:
        refinement = json.load(open(path)).get("refinement")
        if not refinement:
            print(f"{path}: no refinement recorded")
            continue
        ratios = [layer["held_out_error_after"] / layer["held_out_error_before"] for layer in refinement.values()]
        kept = sum(layer["kept"] for layer in refinement.values())
        print(f"{path}: after/before min {min(ratios):.2f} median {statistics.median(ratios):.2f} "
              f"max {max(ratios):.2f}; kept in {kept} of {len(ratios)} layers")


if __name__ == "__main__":
    main()
