"""benchmarks/gguf_pieces.py: the tree a device call carries is counted in whole disk blocks."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gguf_pieces  # noqa: E402


def test_the_tree_counts_each_file_in_whole_blocks_and_leaves_ignored_files_out(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("needs git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("big/\n")  # 4 KiB
    (tmp_path / "one.txt").write_text("x")  # 4 KiB
    (tmp_path / "two.bin").write_bytes(b"\0" * 4097)  # 8 KiB
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "piece").write_bytes(b"\0" * 10_000)  # ignored: carried on its own
    assert gguf_pieces.tree_mib(tmp_path) == 16 * 1024 / 2**20
