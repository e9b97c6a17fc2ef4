"""The dense int4 baseline kernel (`kernels.triton_w4`): every path (batch 1 with several groups a step, batch
2-16 tl.dot, split-K, a column count no step divides, rows past the end, every group size) against a float64
product computed here from the codes, under the Triton interpreter on CPU (TRITON_INTERPRET=1 set before the
kernel module is imported) and on the GPU; the layout's round trip; one clear error per bad input."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels.triton_w4 import (W4Config, _codes_f32, candidate_configs,  # noqa: E402
                                              float64_reference, pack_w4, unpack_w4, w4_mm)


def int4_problem(out, in_features, batch, group, dtype=torch.bfloat16, seed=0):
    """(x, bytes, scales, codes, float scales): random codes -8..7 and positive scales."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (out, in_features), generator=g, dtype=torch.int8)
    scales = torch.rand(out, in_features // group, generator=g) * 0.05 + 1e-3
    x = torch.randn(batch, in_features, generator=g).to(dtype)
    weight, packed_scales = pack_w4(codes, scales, dtype)
    return x.to(DEVICE), weight.to(DEVICE), packed_scales.to(DEVICE), codes, packed_scales


def float64_error(y, x, codes, scales):
    """Largest |y − x·Wᵀ| over the float64 bound, W = code · scale (the scales as stored), ≤ 1 passes."""
    group = codes.shape[1] // scales.shape[1]
    w64 = codes.double() * scales.double().repeat_interleave(group, dim=1)
    x64 = x.double().cpu()
    exact = x64 @ w64.T
    bound = torch.finfo(x.dtype).eps * exact.abs() + 2 * x.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs().T)
    return float(((y.double().cpu() - exact).abs() / (bound + 1e-300)).max())


CASES = [  # out, in, batch, group, config
    (24, 512, 1, 128, W4Config(8, 2, 1, 4)),  # two groups a step
    (13, 448, 1, 64, W4Config(8, 4, 2, 4)),  # rows past the end, 7 groups: a step of 4 ends early; split-K
    (16, 256, 1, 32, W4Config(16, 1, 1, 4)),
    (16, 256, 3, 128, W4Config(16, 1, 1, 4)),  # tl.dot path
    (40, 768, 16, 256, W4Config(16, 1, 2, 4)),  # tl.dot path, 3 groups over two splits
    (8, 192, 2, 64, W4Config(32, 1, 1, 4)),  # more tile rows than the weight has
    (24, 512, 1, 128, W4Config(8, 2, 1, 4, x_words=True)),  # x read as words of two columns
    (13, 448, 1, 64, W4Config(8, 4, 2, 4, x_words=True)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out,in_features,batch,group,config", CASES)
def test_kernel_matches_float64(out, in_features, batch, group, config, dtype):
    x, weight, scales, codes, stored = int4_problem(out, in_features, batch, group, dtype, seed=out + batch)
    y = w4_mm(x, weight, scales, config)
    assert y.shape == (batch, out) and y.dtype == dtype
    assert float64_error(y, x, codes, stored) <= 1
    assert float64_reference(x, weight, scales).error(y) <= 1


def test_the_layout_round_trips_and_puts_the_even_column_low():
    codes = torch.tensor([[-8, 7, 0, -1], [3, -3, 5, 2]], dtype=torch.int8)
    weight, scales = pack_w4(codes, torch.tensor([[0.5], [2.0]]), torch.bfloat16)
    assert weight.tolist() == [[0 | 15 << 4, 8 | 7 << 4], [11 | 5 << 4, 13 | 10 << 4]]
    assert torch.equal(unpack_w4(weight, scales, torch.float32), codes.float() * torch.tensor([[0.5], [2.0]]))


def test_a_wrong_output_fails_the_check():
    """The float64 check the tuner relies on rejects a product that lost one group."""
    x, weight, scales, _, _ = int4_problem(16, 256, 1, 64)
    wrong = weight.clone()
    wrong[:, :32] = 0x88  # codes 0
    y = w4_mm(x, wrong, scales, W4Config(8, 2))
    assert float64_reference(x, weight, scales).error(y) > 1


def test_candidates_read_enough_a_step_and_split_only_short_problems():
    one = candidate_configs(4096, 4096, 1, 128)
    assert all(c.block_rows * c.groups * 64 >= 256 * c.num_warps for c in one)  # 8 bytes a lane or more
    assert all(c.block_rows >= 16 and c.groups == 1 for c in candidate_configs(4096, 4096, 8, 128))
    assert max(c.split_k for c in candidate_configs(64, 4096, 1, 128)) == 4
    big = candidate_configs(28672, 4096, 1, 128)
    assert all(c.split_k == 1 or -(-28672 // c.block_rows) * c.split_k <= 4096 for c in big)
    assert {c.groups for c in candidate_configs(4096, 4096, 1, 32)} <= {1, 2, 4, 8, 16, 32, 64}
    assert {c.x_words for c in one} == {False, True}  # batch 1 tries both ways of reading x
    assert not any(c.x_words for c in candidate_configs(4096, 4096, 4, 128))


def test_bad_inputs_give_one_clear_error():
    x, weight, scales, _, _ = int4_problem(8, 128, 1, 64)
    for args, message in (((x.float(), weight, scales), "bf16 or fp16"),
                          ((x, weight.to(torch.int8), scales), "uint8 weight"),
                          ((x[:, :64], weight, scales), r"expected \[batch, 128\]"),
                          ((torch.zeros(17, 128, dtype=x.dtype, device=DEVICE), weight, scales), "batch 1..16"),
                          ((x, weight, torch.ones(8, 3, dtype=x.dtype, device=DEVICE)), "group size"),
                          ((x, weight, scales[:4]), r"expected \[8, ")):
        with pytest.raises(KernelInputError, match=message):
            w4_mm(*args)
    with pytest.raises(KernelInputError, match="-8..7"):
        pack_w4(torch.full((2, 4), 8), torch.ones(2, 1), torch.bfloat16)



@triton.jit
def _convert(n_ptr, f32_ptr):
    i = tl.arange(0, 16)
    tl.store(f32_ptr + i, _codes_f32(tl.load(n_ptr + i)))


def test_the_codes_come_out_of_their_nibbles_exactly():
    """The bit trick that replaces the int-to-float conversion gives every code exactly."""
    out = torch.empty(16, dtype=torch.float32, device=DEVICE)
    _convert[(1,)](torch.arange(16, dtype=torch.uint8, device=DEVICE), out)
    assert out.cpu().tolist() == list(range(-8, 8))
