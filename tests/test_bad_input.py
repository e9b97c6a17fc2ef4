"""Bad input never ends half-done: every row of CASES gives exactly one stderr line, `error: ...`, exit code 2, no
traceback, and leaves no OUT or OUT.partial behind (an OUT that existed before is left as it was). Each row builds
its bad input from tiny random models and runs the CLI in-process, as a user would type it."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsedecoding import solvers
from sparsedecoding.cli import main
from sparsedecoding.errors import PackingError
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.models import check_pattern_fits
from sparsedecoding.outputs import PRUNED_MANIFEST
from sparsedecoding.packed import PACKED_MANIFEST, PRUNABLE, pack_checkpoint
from sparsedecoding.patterns import SparsityPattern
from helpers import make_tiny_model


def prune_to(source: Path, folder: Path, pattern: str) -> Path:
    """A copy of `source` whose decoder linears are magnitude-pruned to `pattern` (what `pack` reads)."""
    shutil.copytree(source, folder)
    edit_weights(folder, lambda tensors: tensors.update(
        {name: solvers.magnitude(weight, None, pattern) for name, weight in tensors.items() if PRUNABLE.match(name)}))
    return folder


def on_int8_grid(source: Path, folder: Path) -> Path:
    """A copy of the pruned `source` whose decoder linears lie on an int8 grid, recorded as `prune --quantize int8`
    records it: what `pack` stores as int8 codes."""
    shutil.copytree(source, folder)

    def to_grid(weight):
        scale = solvers.grid_scale(weight.float().abs().amax(1, keepdim=True), "int8")
        return solvers.round_to_grid(weight.float(), scale, "int8").to(weight.dtype)

    edit_weights(folder, lambda tensors: tensors.update(
        {name: to_grid(weight) for name, weight in tensors.items() if PRUNABLE.match(name)}))
    (folder / PRUNED_MANIFEST).write_text(json.dumps({"solver_options": {"quantize": "int8", "group_size": 128}}))
    return folder


def edit_weights(folder: Path, change) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny llama folders: hidden 64 / intermediate 128 (`tiny`), hidden 96 / intermediate 192 / head_dim 24 (`by3`,
    every input size divisible by 3), and pruned copies for `pack`."""
    root = tmp_path_factory.mktemp("models")
    found = {"tiny": make_tiny_model(root / "tiny"),
             "by3": make_tiny_model(root / "by3", hidden_size=96, intermediate_size=192)}
    found["2:4"] = prune_to(found["tiny"], root / "pruned-2of4", "2:4")
    found["50%"] = prune_to(found["tiny"], root / "pruned-50", "50%")
    found["2:3"] = prune_to(found["by3"], root / "pruned-2of3", "2:3")
    found["int8"] = on_int8_grid(found["2:4"], root / "pruned-2of4-int8")
    return found


def _can_create_in(folder: Path) -> bool:
    try:
        (folder / "probe").mkdir()
    except OSError:
        return False
    (folder / "probe").rmdir()
    return True


@pytest.fixture
def read_only(tmp_path):
    """A folder nothing can be created in: a chmod 555 folder, or for root (whom permission bits do not stop) /sys,
    which no process may create entries in."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    found = Path("/sys") if _can_create_in(folder) else folder
    if _can_create_in(found):
        pytest.skip("no folder on this machine refuses new entries")
    yield found
    folder.chmod(0o755)


@pytest.fixture(autouse=True)
def _no_progress_bars():
    """transformers draws a loading bar on stderr; it is not an error line, and it would hide a second one."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


@dataclass
class Case:
    """What a row's builder may use: the tiny models, a scratch folder, the OUT path and a valid prompt file."""

    models: dict[str, Path]
    tmp: Path
    out: Path
    prompts: Path
    read_only: Path

    def prune(self, *extra, model: Path | str | None = None) -> list[str]:
        """A prune command that would succeed in seconds on the tiny model, plus `extra` (later flags win)."""
        return ["prune", "--model", str(model or self.models["tiny"]), "--out", str(self.out), "--prompts",
                str(self.prompts), "--tokens", "8", "--max-new-tokens", "8", "--device", "cpu", *map(str, extra)]

    def pack(self, model: Path, out: Path | None = None) -> list[str]:
        return ["pack", "--model", str(model), "--out", str(out or self.out)]

    def copy(self, name: str = "tiny") -> Path:
        return Path(shutil.copytree(self.models[name], self.tmp / f"copy-{name}"))


def truncated(case: Case, name: str = "tiny") -> Path:
    folder = case.copy(name)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def a_file(case: Case) -> Path:
    path = case.tmp / "a-file"
    path.write_text("not a folder")
    return path


def malformed_json(case: Case, name: str) -> Path:
    folder = case.copy()
    text = (folder / name).read_text()
    (folder / name).write_text(text[: len(text) // 2])
    return folder


def not_gguf(case: Case) -> Path:
    path = case.tmp / "model.gguf"
    path.write_text("this is a text file, not a GGUF\n")
    return path


def truncated_gguf(case: Case) -> Path:
    path = case.tmp / "model.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x00" * 10)  # magic and version, header cut short
    return path


def with_nan(case: Case, name: str = "tiny") -> Path:
    folder = case.copy(name)
    edit_weights(folder, lambda tensors: tensors["model.layers.1.mlp.up_proj.weight"].view(-1)[5].fill_(math.nan))
    return folder


def packed_with_bits(case: Case, bits: str) -> Path:
    """The int8 checkpoint packed, its manifest then claiming `bits` codes."""
    folder = case.tmp / "packed"
    pack_checkpoint(case.models["int8"], folder, quantize="int8")
    manifest = json.loads((folder / PACKED_MANIFEST).read_text())
    for info in manifest["tensors"].values():
        if "quantize" in info:
            info["quantize"] = bits
    (folder / PACKED_MANIFEST).write_text(json.dumps(manifest))
    return folder


def row(name: str, build, expected: str, *marks):
    """One bad input: its id, a builder returning the argv, and text the error line must contain."""
    return pytest.param(build, expected, id=name, marks=marks)


CASES = [
    row("truncated-safetensors", lambda c: c.prune(model=truncated(c)), "truncated"),
    row("malformed-config", lambda c: c.prune(model=malformed_json(c, "config.json")), "config.json is not valid JSON"),
    row("malformed-tokenizer", lambda c: c.prune(model=malformed_json(c, "tokenizer.json")), "tokenizer.json is not"),
    row("not-a-gguf", lambda c: c.prune(model=not_gguf(c)), "not a GGUF file"),
    row("truncated-gguf", lambda c: c.prune(model=truncated_gguf(c)), "could not be read as a GGUF"),
    row("out-read-only", lambda c: c.prune("--out", c.read_only / "out"), "not writable"),
    row("missing-text-file", lambda c: c.prune("--calibration", "text", "--text", c.tmp / "none"), "does not exist"),
    row("pattern-2:3-shapes", lambda c: c.prune("--pattern", "2:3"), "divisible by 3"),
    row("pattern-2:5-shapes", lambda c: c.prune("--pattern", "2:5"), "divisible by 5"),
    row("pattern-2:3-blocksize", lambda c: c.prune("--pattern", "2:3", model=c.models["by3"]), "--blocksize 126"),
    row("nan-weights", lambda c: c.prune(model=with_nan(c)), "NaN or inf weights"),
    row("pattern-minus-1%", lambda c: c.prune("--pattern", "-1%"), "SparsityPatternError"),
    row("batch-size-0", lambda c: c.prune("--batch-size", "0"), "--batch-size"),
    row("blocksize-0", lambda c: c.prune("--blocksize", "0"), "--blocksize"),
    row("gen-batch-size-0", lambda c: c.prune("--gen-batch-size", "0"), "--gen-batch-size"),
    row("max-new-tokens-0", lambda c: c.prune("--max-new-tokens", "0"), "--max-new-tokens"),
    row("percdamp-0", lambda c: c.prune("--percdamp", "0"), "--percdamp"),
    row("percdamp-negative", lambda c: c.prune("--percdamp", "-1"), "--percdamp"),
    row("percdamp-nan", lambda c: c.prune("--percdamp", "nan"), "--percdamp"),
    row("n-prompts-0", lambda c: c.prune("--n-prompts", "0"), "--n-prompts"),
    row("repair-lr-0", lambda c: c.prune("--repair-steps", "2", "--repair-lr", "0"), "--repair-lr"),
    row("repair-batch-0", lambda c: c.prune("--repair-steps", "2", "--repair-batch", "0"), "--repair-batch"),
    row("self-sources-held-out", lambda c: c.prune("--calibration", "self", "--self-sources",
                                                   "self=0.9,humaneval:eval=0.1"), "held-out"),
    row("self-sources-missing-file", lambda c: c.prune("--calibration", "self", "--self-sources",
                                                       f"self=1,{c.tmp / 'none.txt'}=1"), "does not exist"),
    row("repair-dev-split-empty", lambda c: c.prune("--repair-steps", "2"), "train/dev split"),
    row("repair-on-policy-text", lambda c: c.prune("--calibration", "text", "--repair-steps", "2"), "task prompts"),
    row("device-tpu", lambda c: c.prune("--device", "tpu"), "tpu"),
    row("device-cuda-without-cuda", lambda c: c.prune("--device", "cuda"), "CUDA",
        pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    row("self-sources-nan", lambda c: c.prune("--calibration", "self", "--self-sources", "self=nan"), "finite"),
    row("out-is-a-file", lambda c: c.prune("--out", a_file(c), "--overwrite"), "is a file, not a folder"),
    row("prune-onto-its-model", lambda c: c.prune("--out", c.copy(), "--overwrite", model=c.tmp / "copy-tiny"),
        "would overwrite the input"),
    row("demo-eval-prompts-0", lambda c: ["demo", "--model", str(c.models["tiny"]), "--out", str(c.out),
                                          "--eval-prompts", "0", "--device", "cpu"], "--eval-prompts 0"),
    row("demo-to-read-only", lambda c: ["demo", "--model", str(c.models["tiny"]), "--out", str(c.read_only / "d"),
                                        "--device", "cpu"], "not writable"),
    row("pack-to-read-only", lambda c: c.pack(c.models["2:4"], c.read_only / "out"), "not writable"),
    row("pack-out-is-a-file", lambda c: c.pack(c.models["2:4"], a_file(c)) + ["--overwrite"], "is a file, not a"),
    row("pack-onto-its-model", lambda c: c.pack(c.copy("2:4"), c.tmp / "copy-2:4") + ["--overwrite"],
        "would overwrite the input"),
    row("pack-truncated", lambda c: c.pack(truncated(c, "2:4")), "truncated"),
    row("pack-nan", lambda c: c.pack(with_nan(c, "2:4")), "NaN or inf"),
    row("pack-dense", lambda c: c.pack(c.models["tiny"]), "no decoder linear"),
    row("pack-50%", lambda c: c.pack(c.models["50%"]), "no decoder linear"),
    row("pack-2:3", lambda c: c.pack(c.models["2:3"]), "no decoder linear"),
    row("pack-quantized-1:8", lambda c: c.pack(c.models["int8"]) + ["--pattern", "1:8"],
        "quantized kernel cannot run 1:8"),
    row("prune-int4-group-16", lambda c: c.prune("--quantize", "int4", "--group-size", "16"), "multiple of 32"),
    row("pack-int4-group-16", lambda c: c.pack(c.models["int8"]) + ["--quantize", "int4", "--group-size", "16"],
        "multiple of 32"),
    row("pack-quantize-off-grid", lambda c: c.pack(c.models["2:4"]) + ["--quantize", "int4"], "not on an int4 grid"),
    row("generate-int2-codes", lambda c: ["generate", "--model", str(packed_with_bits(c, "int2")), "--prompt", "hi",
                                          "--device", "cpu", "--new-tokens", "2"], "'int2' is not a packed format"),
]


def run_case(capsys, case: Case, build) -> tuple[int, list[str], str]:
    argv = build(case)
    capsys.readouterr()  # only what the command itself prints
    code = main(argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()], err


@pytest.fixture
def case(models, tmp_path, read_only, cache_dir) -> Case:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\nhello\n")
    return Case(models, tmp_path, tmp_path / "out", prompts, read_only)


def assert_one_error_line(code: int, lines: list[str], err: str, expected: str) -> None:
    assert "Traceback" not in err, err
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("build,expected", CASES)
def test_bad_input_gives_one_error_line_and_leaves_nothing(capsys, case, build, expected):
    code, lines, err = run_case(capsys, case, build)
    assert_one_error_line(code, lines, err, expected)
    for path in (case.out, case.out.with_name("out.partial")):
        assert not path.exists(), f"{path} left behind"


@pytest.mark.parametrize("build,expected", [(lambda c: c.prune("--overwrite", model=with_nan(c)), "NaN"),
                                            (lambda c: c.pack(c.models["tiny"]) + ["--overwrite"], "no decoder")],
                         ids=["prune", "pack"])
def test_failed_overwrite_keeps_the_existing_output(capsys, case, build, expected):
    case.out.mkdir()
    (case.out / "keep.txt").write_text("mine")
    code, lines, err = run_case(capsys, case, build)
    assert_one_error_line(code, lines, err, expected)
    assert (case.out / "keep.txt").read_text() == "mine"
    assert not case.out.with_name("out.partial").exists()


def test_the_pattern_fix_the_error_suggests_is_accepted(models):
    """The blocksize that the 2:3 error names passes the check (so the advice is not a dead end)."""
    check_pattern_fits(models["by3"], SparsityPattern.parse("2:3"), "sparsegpt", 126)
    check_pattern_fits(models["tiny"], SparsityPattern.parse("2:4"), "sparsegpt", 128)


def nm_weight(rows: int = 4, cols: int = 32, dtype=torch.float32) -> torch.Tensor:
    return solvers.magnitude(torch.randn(rows, cols), None, "2:4").to(dtype)


def _with(value: float) -> torch.Tensor:
    weight = nm_weight()
    weight[1, 0] = value  # column 0 of a 2:4 group may hold a value without breaking the pattern
    weight[1, 1:4] = 0
    return weight


@pytest.mark.parametrize("weight,message", [
    (_with(math.nan), "NaN or inf"),
    (_with(math.inf), "NaN or inf"),
    (nm_weight().to(torch.float8_e4m3fn), "float8_e4m3fn"),
    (nm_weight(dtype=torch.float64), "float64"),
    (torch.zeros(0, 32), "no rows"),
], ids=["nan", "inf", "float8", "float64", "zero-rows"])
def test_pack_nm_refuses(weight, message):
    with pytest.raises(PackingError, match=message):
        pack_nm(weight, 2, 4)


SINGULAR_SOLVE = """
import torch
from sparsedecoding import solvers
from sparsedecoding.errors import SparseDecodingError
try:
    solvers.sparsegpt(torch.randn(8, 64), torch.ones(64, 64), "2:4", percdamp=0.0)  # rank 1: singular undamped
except SparseDecodingError as exc:
    print(type(exc).__name__)
"""


def test_sparsegpt_with_zero_damping_on_a_singular_hessian_errors_instead_of_hanging():
    """Run in a child process: a hung solver can be killed there, not in a thread."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(solvers.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")])}
    try:
        result = subprocess.run([sys.executable, "-c", SINGULAR_SOLVE], capture_output=True, text=True, timeout=20,
                                env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("sparsegpt(percdamp=0) on a singular H still runs after 20 s")
    assert result.returncode == 0 and result.stdout.strip().endswith("Error"), result.stderr[-2000:]
