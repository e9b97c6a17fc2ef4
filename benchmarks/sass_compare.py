"""Whether a change to sp24.cu leaves its other kernels alone: compile the working tree's sp24.cu and a git revision's
offline (as the library is built), and compare the SASS of every kernel both hold, instruction by instruction
(addresses left out). No GPU needed.

    python benchmarks/sass_compare.py --rev HEAD
    python benchmarks/sass_compare.py --rev HEAD --define=-DSP24_COLUMNS   # the second build (the columns order)

In the sixteenth session, instantiating one more kernel changed the SASS of every RMSNorm-fused instance of the
default build (nvcc unrolled their staging loops differently), which no test would have caught: the change was
moved into its own build. Exit status 1 when a kernel of the revision differs or is missing.
"""

from __future__ import annotations

import argparse
import re
import sys

from sass_loop_count import ADDRESS, REPO, SOURCE, compile_sass, source_at  # benchmarks/ is on sys.path


def kernels(sass: str) -> dict[str, list[str]]:
    """Mangled name (without the anonymous namespace's per-source hash) -> its instructions without addresses and
    encodings."""
    found = {}
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = function.partition("\n")
        name = re.sub(r"_GLOBAL__N__\w+?_sp24_cu_[0-9a-f]+", "", name.strip())  # the source's hash: not the kernel
        found[name] = [ADDRESS.sub("", line.split(";")[0]).strip() for line in body.split("\n")
                               if ADDRESS.search(line)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD", help="the revision to compare against (default: HEAD)")
    parser.add_argument("--define", action="append", default=[],
                        help="an nvcc -D flag for both builds (the revision's and the working tree's)")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    before = source_at(args.rev)
    if before is None:
        print(f"error: no {SOURCE} at revision {args.rev}", file=sys.stderr)
        return 2
    try:
        old = kernels(compile_sass(before, args.arch, tuple(args.define))[0])  # both sides the same build
        new = kernels(compile_sass((REPO / SOURCE).read_text(), args.arch, tuple(args.define))[0])
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    changed = [name for name in old if name in new and old[name] != new[name]]
    missing = [name for name in old if name not in new]
    added = [name for name in new if name not in old]
    same = len(old) - len(changed) - len(missing)
    print(f"{SOURCE} ({' '.join(args.define) or 'default build'}) against {args.rev}: {same} of {len(old)} kernels "
          f"identical, {len(changed)} changed, {len(missing)} missing, {len(added)} new")
    for name in changed:
        print(f"  changed: {name} ({len(old[name])} -> {len(new[name])} instructions)")
    for name in missing:
        print(f"  missing: {name}")
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
