"""The patches waiting in benchmarks/patches/ (kernel changes built and CPU-tested, not yet run on a GPU) still apply
to the tree, so that the lease that runs them needs no rebase; each is listed in that folder's README."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "benchmarks" / "patches").glob("*.patch"))


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "true"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_a_prepared_patch_applies_and_is_listed(patch):
    listed = (ROOT / "benchmarks" / "patches" / "README.md").read_text()
    assert f"`{patch.name}`" in listed
    if not _in_git_checkout():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
