"""The dense int8 baseline kernel (`kernels.triton_w8`): every path (batch 1 products, batch 2-16 tl.dot, split-K,
a column count no tile divides, rows past the end) against a float64 product, under the Triton interpreter on CPU
(TRITON_INTERPRET=1 set before the kernel module is imported) and on the GPU; one clear error per bad input."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels.triton_w8 import W8Config, candidate_configs, float64_reference, w8_mm  # noqa: E402


def int8_problem(out, in_features, batch, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (out, in_features), generator=g, dtype=torch.int8)
    scales = (torch.rand(out, generator=g) * 0.02 + 1e-3).to(dtype)
    x = torch.randn(batch, in_features, generator=g).to(dtype)
    return x.to(DEVICE), weight.to(DEVICE), scales.to(DEVICE)


def float64_error(y, x, weight, scales):
    """Largest |y − x·(scale·W)ᵀ| over the float64 bound, computed here from the definition (not the kernel
    module's helper), ≤ 1 passes."""
    w64 = weight.double().cpu() * scales.double().cpu()[:, None]
    exact = x.double().cpu() @ w64.T
    bound = torch.finfo(x.dtype).eps * exact.abs() + 2 * x.shape[1] * 2.0**-24 * (x.double().cpu().abs() @ w64.abs().T)
    return float(((y.double().cpu() - exact).abs() / (bound + 1e-300)).max())


CASES = [  # out, in, batch, config
    (24, 256, 1, W8Config(8, 64, 1, 4)),
    (13, 200, 1, W8Config(8, 64, 2, 4)),  # rows past the end, columns no tile divides, split-K
    (16, 256, 3, W8Config(16, 64, 1, 4)),
    (40, 160, 16, W8Config(16, 32, 2, 4)),  # tl.dot path, uneven split
    (8, 96, 2, W8Config(32, 32, 1, 4)),  # more tile rows than the weight has
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out,in_features,batch,config", CASES)
def test_kernel_matches_float64(out, in_features, batch, config, dtype):
    x, weight, scales = int8_problem(out, in_features, batch, dtype, seed=out + batch)
    y = w8_mm(x, weight, scales, config)
    assert y.shape == (batch, out) and y.dtype == dtype
    assert float64_error(y, x, weight, scales) <= 1
    assert float64_reference(x, weight, scales).error(y) <= 1


def test_a_wrong_output_fails_the_check():
    """The float64 check the tuner relies on rejects a product that lost one column block."""
    x, weight, scales = int8_problem(16, 128, 1)
    wrong = weight.clone()
    wrong[:, :32] = 0
    y = w8_mm(x, wrong, scales, W8Config(8, 32))
    assert float64_reference(x, weight, scales).error(y) > 1


def test_candidates_split_only_short_problems():
    one = candidate_configs(4096, 4096, 1)
    assert all(c.block_rows * c.block_k >= 512 * c.num_warps for c in one)  # 16 bytes a lane or more
    assert all(c.block_rows >= 16 for c in candidate_configs(4096, 4096, 8))  # tl.dot needs 16 rows
    assert max(c.split_k for c in candidate_configs(64, 4096, 1)) == 4  # few row blocks: split up to 4
    big = candidate_configs(28672, 4096, 1)
    assert all(c.split_k == 1 or -(-28672 // c.block_rows) * c.split_k <= 4096 for c in big)
    assert any(c.split_k == 1 for c in big)


def test_bad_inputs_give_one_clear_error():
    x, weight, scales = int8_problem(8, 64, 1)
    for args, message in (((x.float(), weight, scales), "bf16 or fp16"),
                          ((x, weight.float(), scales), "int8 weight"),
                          ((x[:, :32], weight, scales), r"expected \[batch, 64\]"),
                          ((torch.zeros(17, 64, dtype=x.dtype, device=DEVICE), weight, scales), "batch 1..16"),
                          ((x, weight, scales[:4]), r"expected \[8\]")):
        with pytest.raises(KernelInputError, match=message):
            w8_mm(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 5, 16])
def test_tuned_kernel_on_gpu_matches_float64(batch):
    x, weight, scales = int8_problem(4096, 4096, batch, seed=batch)
    assert float64_error(w8_mm(x, weight, scales), x, weight, scales) <= 1
