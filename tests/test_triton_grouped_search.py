"""16:32g's split search as one Triton kernel (`kernels.triton_grouped_search`; SPARSEDECODING_GROUPED_SEARCH, auto
on CUDA): the torch search's orders exactly where every sum is exact (integer scores: ties and all), from the 2:4 groups and
from a given split, with a round limit, for 4, 8 and 16 rows a split; the same ADMM 16:32g mask on a small layer;
the setting checked, recorded by a prune and refused before the model loads; one clear error per bad input. Under
the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the kernel module is imported) and on the GPU."""

import json
import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding import solvers  # noqa: E402
from sparsedecoding.errors import KernelInputError, SolverSettingsError, SparseDecodingError  # noqa: E402
from sparsedecoding.kernels.triton_grouped_search import grouped_search  # noqa: E402
from sparsedecoding.patterns import SparsityPattern  # noqa: E402
from sparsedecoding.pipeline import prune  # noqa: E402
import test_pipeline  # noqa: E402
from test_pipeline import config  # noqa: E402

# the pipeline tests' tiny model and prompts
tiny_folder, prompts_file = test_pipeline.tiny_folder, test_pipeline.prompts_file
SETTING = solvers.GROUPED_SEARCH_SETTING


@pytest.fixture(autouse=True)
def torch_search_unless_set(monkeypatch):
    """`solvers.grouped_partition` is the torch search here (auto would run the kernel on a GPU) unless a test sets
    the kernel."""
    monkeypatch.setenv(SETTING, "torch")


def integer_words(count: int, rows: int, seed: int, high: int = 12) -> torch.Tensor:
    """Scores that are small integers: every sum the search takes is exact in float32, whatever its order, so the
    kernel must pick the very swaps torch picks, ties included."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (count, rows, 32), generator=generator).float().to(DEVICE)


def kernel_order(words: torch.Tensor, start: torch.Tensor | None = None,
                 rounds: int = solvers.GROUP_SEARCH_ROUNDS) -> torch.Tensor:
    order = torch.arange(32, device=words.device).repeat(words.shape[0], 1) if start is None else start.clone()
    grouped_search(words.contiguous(), order, rounds, solvers.GROUP_SWAPS)
    return order


@pytest.mark.parametrize("rows", [4, 8, 16])
def test_the_torch_search_exactly_from_the_2of4_groups(rows):
    words = integer_words(12, rows, seed=rows)
    torch_order = solvers.grouped_partition(words)
    order = kernel_order(words)
    assert torch.equal(order, torch_order)
    assert torch.equal(order.sort(1).values, torch.arange(32, device=DEVICE).expand(12, 32))  # permutations
    assert bool((solvers.grouped_fit(words, order) > solvers.grouped_fit(words, kernel_order(words, rounds=0))).all())


def test_the_torch_search_exactly_from_a_given_split_and_with_few_rounds():
    words = integer_words(10, 16, seed=3, high=40)
    start = torch.rand(10, 32, generator=torch.Generator().manual_seed(4)).argsort(1).to(DEVICE)
    assert torch.equal(kernel_order(words, start), solvers.grouped_partition(words, start=start))
    for rounds in (1, 3):
        assert torch.equal(kernel_order(words, rounds=rounds), solvers.grouped_partition(words, rounds=rounds))
    settled = kernel_order(words)
    assert torch.equal(kernel_order(words, settled), settled)  # a settled split does not move again


def test_each_swap_list_keeps_its_own_table():
    """The kernel's padded swap tables are kept per device and swap list: a shorter list after the full one moves
    only by its own swaps (one swap here: columns 1 and 9), and the full list after it searches all of them again."""
    words = integer_words(6, 8, seed=6, high=40)
    full = kernel_order(words)
    only = torch.arange(32, device=DEVICE).repeat(6, 1)
    grouped_search(words.contiguous(), only, 8, [(1, 9)])
    moved = only != torch.arange(32, device=DEVICE)
    assert bool(moved[:, [1, 9]].any()) and not bool(moved[:, [i for i in range(32) if i not in (1, 9)]].any())
    assert torch.equal(kernel_order(words), full)


def test_float_scores_reach_the_torch_fit(monkeypatch):
    """Float scores: the order of the sums over rows may differ, so the orders may too, where two gains are within
    rounding; the kept score must not differ beyond that."""
    words = torch.rand(16, 16, 32, generator=torch.Generator().manual_seed(5)).to(DEVICE) ** 3
    torch_fit = solvers.grouped_fit(words, solvers.grouped_partition(words))
    monkeypatch.setenv(SETTING, "triton")
    fit = solvers.grouped_fit(words, solvers.grouped_partition(words))
    torch.testing.assert_close(fit, torch_fit, rtol=1e-5, atol=0)


def test_admm_16of32g_keeps_the_same_mask_either_way(monkeypatch):
    generator = torch.Generator().manual_seed(6)
    W = torch.randn(32, 64, generator=generator).to(DEVICE)
    X = torch.randn(256, 64, generator=generator).to(DEVICE)
    H = X.T @ X / 256
    pattern = SparsityPattern.parse("16:32g")
    D, kept, _ = solvers.admm_prune(W, H, 0.01, pattern, 6, split="magnitude")
    monkeypatch.setenv(SETTING, "triton")
    D_kernel, kept_kernel, _ = solvers.admm_prune(W, H, 0.01, pattern, 6, split="magnitude")
    assert torch.equal(kept_kernel, kept)
    torch.testing.assert_close(D_kernel, D)


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv(SETTING, "numpy")
    with pytest.raises(SolverSettingsError, match="SPARSEDECODING_GROUPED_SEARCH='numpy'"):
        solvers.grouped_partition(integer_words(2, 16, seed=7))
    monkeypatch.setenv(SETTING, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SolverSettingsError, match="runs on CUDA or under TRITON_INTERPRET=1"):
        solvers.grouped_search_setting(torch.device("cpu"))
    monkeypatch.delenv(SETTING)  # auto: the kernel on CUDA only (the interpreter is far slower than torch)
    assert solvers.grouped_search_setting(torch.device("cpu")) == "torch"
    assert solvers.grouped_search_setting(torch.device("cuda")) == "triton"
    monkeypatch.setenv(SETTING, "torch")
    assert solvers.grouped_search_setting(torch.device("cuda")) == "torch"


def test_a_prune_records_the_search_and_refuses_a_bad_one_before_loading(tiny_folder, prompts_file, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv(SETTING, "triton")
    out = prune(config(tiny_folder, tmp_path / "triton", prompts_file, pattern="16:32g", admm_iterations=1),
                progress=False)
    assert json.loads((out / "sparsedecoding.json").read_text())["solver_options"]["grouped_search"] == "triton"
    out = prune(config(tiny_folder, tmp_path / "plain", prompts_file, pattern="2:4", admm_iterations=2),
                progress=False)
    assert json.loads((out / "sparsedecoding.json").read_text())["solver_options"]["grouped_search"] is None
    monkeypatch.setenv(SETTING, "fast")
    with pytest.raises(SparseDecodingError, match="SPARSEDECODING_GROUPED_SEARCH='fast'"):
        prune(config(tiny_folder, tmp_path / "bad", prompts_file, pattern="16:32g"), progress=False)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_bad_inputs_get_one_clear_error():
    words = integer_words(3, 16, seed=8)
    order = torch.arange(32, device=DEVICE).repeat(3, 1)
    with pytest.raises(KernelInputError, match=r"words \[W, 4 \| 8 \| 16, 32\]"):
        grouped_search(words[:, :, :16].contiguous(), order, 4, solvers.GROUP_SWAPS)
    with pytest.raises(KernelInputError, match="float32 words and an int64 order"):
        grouped_search(words.double(), order, 4, solvers.GROUP_SWAPS)
    with pytest.raises(KernelInputError, match=r"order must be \[3, 32\]"):
        grouped_search(words, order[:2].contiguous(), 4, solvers.GROUP_SWAPS)
    with pytest.raises(KernelInputError, match="contiguous"):
        grouped_search(words.transpose(1, 2).contiguous().transpose(1, 2), order, 4, solvers.GROUP_SWAPS)
    with pytest.raises(KernelInputError, match="at most 512 swaps"):
        grouped_search(words, order, 4, solvers.GROUP_SWAPS * 2)
