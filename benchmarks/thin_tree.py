"""Thin the working tree for a model-carrying lease, and put it back afterwards.

    python benchmarks/thin_tree.py --plan benchmarks/recipes/plan-grouped-repair.json   # thin
    python benchmarks/gguf_pieces.py                                                  # larger pieces, fewer calls
    ... the lease's device calls ...
    python benchmarks/thin_tree.py --restore                                          # put the files back

A device call copies the working tree (tracked files and untracked ones git does not ignore) beside the one piece of
the model it carries, and carries at most 64 MiB. By the seventy-eighth session benchmarks/results had grown the tree
to 47 MiB, which left room for 13.7 MiB pieces: 78 calls to bring the 1.1 GB model. A lease's calls read none of the
committed results but the few a plan names (its `earlier` rounds and `calibration_files`), so thinning deletes every
other tracked file under benchmarks/results from the working tree only (nothing is committed or staged; the tree was
9.3 MiB and the pieces 51.7 MiB, 21 calls). `--restore` checks out exactly the deleted files again, so an edit made
to a tracked file there meanwhile is left alone; a report copied in meanwhile is untracked and stays too.

Thinning refuses while any file under benchmarks/results is modified, staged or untracked: such a file could not be
told from the committed ones when restoring, and a restore must never overwrite work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_pieces import tree_mib  # noqa: E402


RESULTS = "benchmarks/results"


def fail(message: str) -> None:
    """One error line and exit status 2, as for every bad input."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def git(root: Path, command: str, *args: str) -> list[str]:
    """The NUL-separated names a git listing prints."""
    out = subprocess.run(["git", "-C", str(root), command, "-z", *args], check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name]


def plan_paths(plan_file: Path) -> list[str]:
    """What a recipes plan reads from benchmarks/results: its earlier rounds and its calibration files, each set's
    tensors with the statistics beside them (SET.json, which `quality_recipes.committed_calibration` reads too: the
    eightieth session's lease stopped on it missing)."""
    plan = json.loads(plan_file.read_text())
    earlier = plan.get("earlier", [])
    sets = [path for tensors in plan.get("calibration_files", {}).values()
            for path in (tensors, str(Path(tensors).with_suffix(".json")))]
    return ([earlier] if isinstance(earlier, str) else list(earlier)) + sets


def kept(name: str, keep: list[str]) -> bool:
    return any(name == path or name.startswith(path.rstrip("/") + "/") for path in keep)


def thin(root: Path, keep: list[str]) -> int:
    """Delete every tracked file under RESULTS but those under `keep`; returns how many went."""
    missing = [path for path in keep if not (root / path).exists()]
    if missing:
        fail(f"{', '.join(missing)} is named to keep but does not exist; nothing was deleted")
    dirty = git(root, "status", "--porcelain", "--untracked-files=all", "--", RESULTS)
    if dirty:
        fail(f"{len(dirty)} file(s) under {RESULTS} are modified, staged, untracked or already "
                         f"deleted (first: {dirty[0][3:]}); commit them or run --restore first; nothing was deleted")
    names = [name for name in git(root, "ls-files", "--", RESULTS) if not kept(name, keep)]
    for name in names:
        (root / name).unlink()
    for folder in sorted({(root / name).parent for name in names}, key=lambda path: len(path.parts), reverse=True):
        while folder != root and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return len(names)


def restore(root: Path) -> int:
    """Check out the tracked files under RESULTS that are missing from the working tree; returns how many."""
    deleted = git(root, "ls-files", "--deleted", "--", RESULTS)
    staged = [line[3:] for line in git(root, "status", "--porcelain", "--", RESULTS) if line.startswith("D ")]
    if staged:
        fail(f"{len(staged)} deletion(s) under {RESULTS} are staged (first: {staged[0]}); "
                         f"unstage them (git restore --staged) if they were not meant; nothing was restored")
    if deleted:
        subprocess.run(["git", "-C", str(root), "checkout", "--", *deleted], check=True)
    return len(deleted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--plan", type=Path, action="append",
                        help="a recipes plan whose earlier rounds and calibration files stay (repeatable)")
    action.add_argument("--restore", action="store_true", help="check the deleted results out again")
    parser.add_argument("--keep", action="append", default=[],
                        help=f"a further path under {RESULTS} to keep (repeatable)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    before = tree_mib(root)
    if args.restore:
        count = restore(root)
        print(f"restored {count} files under {RESULTS}: the tree is {tree_mib(root):.1f} MiB (was {before:.1f})")
        return
    for plan in args.plan:
        if not plan.is_file():
            fail(f"no plan file {plan}")
    try:
        keep = [path for plan in args.plan for path in plan_paths(plan)] + args.keep
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        fail(f"a plan is not a recipes plan's JSON ({exc}); nothing was deleted")
    outside = [path for path in keep if not kept(path, [RESULTS])]
    if outside:
        fail(f"{outside[0]} is not under {RESULTS}; nothing was deleted")
    count = thin(root, keep)
    print(f"deleted {count} tracked files under {RESULTS} from the working tree (kept {len(keep)} paths): the tree is "
          f"{tree_mib(root):.1f} MiB (was {before:.1f}); cut the pieces now, and run --restore after the lease")


if __name__ == "__main__":
    main()
