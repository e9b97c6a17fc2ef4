"""The sparse kernel against a float64 dense product. Without a GPU the Triton kernel itself runs under the Triton
interpreter on CPU tensors (TRITON_INTERPRET=1 must be set before the kernel module is imported, which the
package defers until the Triton path runs); with a GPU the same tests run it on CUDA."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding.errors import KernelInputError  # noqa: E402
from sparsedecoding.kernels import PackedLinear, nm_spmv, nm_spmv_reference, pack_nm  # noqa: E402

from helpers import PATTERNS, random_nm_weight  # noqa: E402


def assert_matches_float64(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """|y - x·Wᵀ| within the rounding of the output (unit roundoff u of y's dtype) plus the worst case of an
    fp32 sum of `in` exact products: u·|exact| + in·2⁻²⁴·Σ|w·x| (+ one subnormal spacing). The Triton
    interpreter converts float32 to bfloat16 by truncation, not to nearest, so there the output term is 2u."""
    x64, w64 = x.double().cpu(), weight.double().cpu()
    exact = x64 @ w64.T
    magnitude = x64.abs() @ w64.abs().T
    info = torch.finfo(y.dtype)
    output_rounding = info.eps if DEVICE == "cpu" and y.dtype == torch.bfloat16 else info.eps / 2
    bound = output_rounding * exact.abs() + (1 + info.eps) * weight.shape[1] * 2.0**-24 * magnitude \
        + info.tiny * info.eps
    excess = (y.double().cpu() - exact).abs() - bound
    assert excess.max() <= 0, f"worst excess over the bound {excess.max():.3g}"


def packed_problem(out, in_features, batch, n, m, dtype=torch.bfloat16, seed=0):
    weight = random_nm_weight(out, in_features, n, m, dtype, seed)
    x = torch.randn(batch, in_features, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return weight.to(DEVICE), pack_nm(weight, n, m).to(DEVICE), x.to(DEVICE)


# (out, in, batch, config, dtype): whole words per lane with one row of x; ragged rows, an uneven split-K with
# a partial last loop step and a zero-padded batch; fp16; batch 16 with split-K; word halves per lane (2 words
# of a row per warp with a ragged batch, 4 words with split-K and a partial step); 16-bit transposed x (bf16 with
# word halves, fp16 with whole words; batch 2 and 4 with 4 words of a row per warp, the batch-1 layouts).
KERNEL_CASES = [
    (64, 128, 1, dict(block_rows=32, block_words=2), torch.bfloat16),
    (40, 160, 5, dict(block_rows=16, block_words=2, split_k=3), torch.bfloat16),
    (32, 256, 8, dict(block_rows=32, block_words=4), torch.float16),
    (48, 64, 16, dict(block_rows=32, block_words=2, split_k=2), torch.bfloat16),
    (40, 192, 3, dict(block_rows=8, block_words=4, word_lanes=2, warp_words=2), torch.bfloat16),
    (24, 320, 1, dict(block_rows=4, block_words=8, split_k=3, word_lanes=2, warp_words=4), torch.float16),
    (48, 256, 8, dict(block_rows=8, block_words=4, word_lanes=2, warp_words=2, x_float32=False), torch.bfloat16),
    (40, 160, 16, dict(block_rows=16, block_words=2, split_k=2, x_float32=False), torch.float16),
    (40, 320, 4, dict(block_rows=8, block_words=8, word_lanes=2, warp_words=4, x_float32=False), torch.bfloat16),
    (24, 256, 2, dict(block_rows=4, block_words=4, split_k=2, word_lanes=2, warp_words=4, x_float32=False),
     torch.float16),
]


@pytest.mark.parametrize("n,m", PATTERNS)
@pytest.mark.parametrize("out,in_features,batch,config,dtype", KERNEL_CASES)
def test_triton_kernel_matches_float64(n, m, out, in_features, batch, config, dtype):
    from sparsedecoding.kernels.triton_spmv import SpmvConfig, launch

    weight, packed, x = packed_problem(out, in_features, batch, n, m, dtype)
    y = launch(x, packed.values, packed.bitmask, n, m, SpmvConfig(**config))
    assert y.shape == (batch, out) and y.dtype == dtype
    assert_matches_float64(y, x, weight)


def test_word_halves_need_a_multiple_of_16_values_per_word():
    from sparsedecoding.kernels.triton_spmv import SpmvConfig, launch

    _, packed, x = packed_problem(32, 64, 1, 1, 4)  # 8 values per word
    with pytest.raises(KernelInputError, match="multiple of 16"):
        launch(x, packed.values, packed.bitmask, 1, 4, SpmvConfig(8, 4, word_lanes=2, warp_words=2))
    with pytest.raises(KernelInputError, match="powers of two"):
        SpmvConfig(12, 4)


def test_tuner_check_accepts_the_kernel_and_catches_a_lost_word():
    from sparsedecoding.kernels.autotune import output_error
    from sparsedecoding.kernels.triton_spmv import SpmvConfig, launch

    _, packed, x = packed_problem(32, 256, 3, 2, 4)
    y = launch(x, packed.values, packed.bitmask, 2, 4, SpmvConfig(8, 4, word_lanes=2, warp_words=2))
    assert output_error(y, x, packed.values, packed.bitmask) <= 1
    lost_word = packed.values.clone()
    lost_word[5, 16:32] = 0  # the second word of row 5 contributes nothing
    y_lost = launch(x, lost_word, packed.bitmask, 2, 4, SpmvConfig(8, 4))
    assert output_error(y_lost, x, packed.values, packed.bitmask) > 10
    assert not output_error(torch.full_like(y, float("nan")), x, packed.values, packed.bitmask) <= 1


def test_triton_kernel_split_k_leaves_counters_zero_and_repeats_bitwise():
    from sparsedecoding.kernels.triton_spmv import SpmvConfig, _arrival_counters, launch

    _, packed, x = packed_problem(64, 256, 2, 2, 4)
    config = SpmvConfig(block_rows=16, block_words=2, split_k=4, word_lanes=2, warp_words=2)
    first = launch(x, packed.values, packed.bitmask, 2, 4, config)
    second = launch(x, packed.values, packed.bitmask, 2, 4, config)
    assert torch.equal(first, second)
    assert int(_arrival_counters[x.device].abs().sum()) == 0


def test_candidates_fit_the_problem():
    from sparsedecoding.kernels.autotune import candidate_configs

    for batch in (1, 3, 16):
        for k in (8, 16, 24):
            configs = candidate_configs(4096, 128, batch, k, 132)
            assert configs and len(set(configs)) == len(configs)
            assert all(c.word_lanes == 1 for c in configs) or k % 16 == 0
            assert all(c.x_float32 for c in configs) or batch > 1
            assert all(c.split_k == 1 or 128 >= 2 * c.block_words * c.split_k for c in configs)  # two steps a split


@pytest.mark.parametrize("shape", [(128,), (3, 128)])
def test_nm_spmv_matches_float64_and_reference(shape):
    weight, packed, x = packed_problem(48, 128, 1, 4, 8)
    x = torch.randn(shape).bfloat16().to(DEVICE)
    y = nm_spmv(x, packed)
    assert y.shape == (*shape[:-1], 48)
    assert_matches_float64(y.view(-1, 48), x.view(-1, 128), weight)
    if DEVICE == "cpu":  # the op's CPU implementation is the reference itself
        assert torch.equal(y, nm_spmv_reference(x, packed))


def _bad_inputs():
    """(what, x, values, bitmask, n, m, message) with a valid packed 2:4 weight [32, 64] unless stated."""
    packed = pack_nm(random_nm_weight(32, 64, 2, 4), 2, 4)
    v, b = packed.values, packed.bitmask
    x = torch.randn(2, 64).bfloat16()
    yield "float32 x", x.float(), v.float(), b, 2, 4, "bfloat16 or float16"
    yield "dtype mismatch", x.half(), v, b, 2, 4, "cast x to torch.bfloat16"
    yield "int64 bitmask", x, v, b.long(), 2, 4, "must be int32"
    yield "non-contiguous x", torch.randn(64, 2).bfloat16().t(), v, b, 2, 4, "x is not contiguous"
    yield "non-contiguous values", x, torch.randn(64, 32).bfloat16().t(), b, 2, 4, "values is not contiguous"
    yield "wrong in_features", torch.randn(2, 96).bfloat16(), v, b, 2, 4, r"expected \[64\] or \[batch, 64\]"
    yield "3-D x", torch.randn(1, 2, 64).bfloat16(), v, b, 2, 4, "expected"
    yield "values do not fit bitmask", x, v[:, :-8].contiguous(), b, 2, 4, "do not form a packed 2:4 weight"
    yield "pattern does not fit values", x, v, b, 4, 16, "do not form a packed 4:16 weight"
    yield "batch 17", torch.randn(17, 64).bfloat16(), v, b, 2, 4, "outside 1..16"
    yield "batch 0", torch.randn(0, 64).bfloat16(), v, b, 2, 4, "outside 1..16"
    yield "x on another device", x.to("meta"), v, b, 2, 4, "one device"
    yield "float32 values", x, v.float(), b, 2, 4, "pack the weight in one of those"
    p18 = pack_nm(random_nm_weight(32, 64, 1, 8), 1, 8)
    yield "1:8 pattern", x, p18.values, p18.bitmask, 1, 8, "32·N/M a multiple of 8"
    yield "M not dividing 32", x, v, b, 2, 5, "M dividing 32"


BAD_INPUTS = list(_bad_inputs())


@pytest.mark.parametrize("what,x,values,bitmask,n,m,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_raise_kernel_input_error(what, x, values, bitmask, n, m, message):
    to = (lambda t: t) if x.device.type == "meta" else (lambda t: t.to(DEVICE))
    with pytest.raises(KernelInputError, match=message):
        torch.ops.sparsedecoding.nm_spmv(to(x), values.to(DEVICE), bitmask.to(DEVICE), n, m)


@pytest.mark.parametrize("what,x,values,bitmask,n,m,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_eager_entry_raises_the_same_errors(what, x, values, bitmask, n, m, message):
    from sparsedecoding.kernels.op import spmv

    to = (lambda t: t) if x.device.type == "meta" else (lambda t: t.to(DEVICE))
    with pytest.raises(KernelInputError, match=message):
        spmv(to(x), values.to(DEVICE), bitmask.to(DEVICE), n, m)


def test_cached_signature_still_checks_layout_and_batch():
    """After a good call has cached its problem, an equal-signature x that is not contiguous, and a wider batch,
    still raise."""
    weight, packed, x = packed_problem(32, 64, 16, 2, 4)
    assert_matches_float64(nm_spmv(x, packed), x, weight)
    strided = torch.randn(64, 16).bfloat16().to(DEVICE).t()
    assert strided.shape == x.shape
    with pytest.raises(KernelInputError, match="x is not contiguous"):
        nm_spmv(strided, packed)
    with pytest.raises(KernelInputError, match="outside 1..16"):
        nm_spmv(torch.cat([x, x[:1]]), packed)


@pytest.mark.parametrize("rows_shape", [(3,), (2, 5), (4, 9)])  # 3 and 10 rows: kernel; 36 rows: dense
def test_packed_linear_matches_float64(rows_shape):
    weight = random_nm_weight(48, 96, 8, 16).to(DEVICE)
    bias = torch.randn(48).bfloat16().to(DEVICE)
    plain = PackedLinear.from_dense(weight, 8, 16)
    with_bias = PackedLinear.from_dense(weight, 8, 16, bias=bias)
    x = torch.randn(*rows_shape, 96).bfloat16().to(DEVICE)
    y = plain(x)
    assert y.shape == (*rows_shape, 48)
    assert_matches_float64(y.view(-1, 48), x.view(-1, 96), weight)
    assert torch.equal(with_bias(x), y + bias)


@pytest.mark.parametrize("x_shape", [(0, 96), (2, 0, 96)])
def test_packed_linears_take_an_empty_batch_as_nn_linear_does(x_shape):
    from sparsedecoding.kernels.quantized import pack_nm_quantized
    from sparsedecoding.kernels.quantized_linear import QuantizedPackedLinear
    from sparsedecoding.solvers import grid_scale, round_to_grid

    weight = random_nm_weight(48, 96, 2, 4).to(DEVICE)
    bias = torch.randn(48).bfloat16().to(DEVICE)
    scale = grid_scale(weight.float().abs().amax(1, keepdim=True), "int8")
    on_grid = round_to_grid(weight.float(), scale, "int8").bfloat16()
    x = torch.randn(*x_shape).bfloat16().to(DEVICE)
    for module in (PackedLinear.from_dense(weight, 2, 4, bias=bias),
                   QuantizedPackedLinear(pack_nm_quantized(on_grid, 2, 4, "int8", 128), bias)):
        y = module(x)
        assert y.shape == (*x_shape[:-1], 48) and y.dtype == x.dtype


# PackedLinear's eager path: the runner cached per call signature (kernels/op.py) and the module's lean forward.
# (x shape, contiguous): a row, a batch, the widest kernel batch, HF's [batch, tokens, in], a vector, a transposed x.
EAGER_CASES = [((1, 96), True), ((3, 96), True), ((16, 96), True), ((2, 1, 96), True), ((96,), True),
               ((3, 96), False)]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape,contiguous", EAGER_CASES)
def test_packed_linear_cached_calls_equal_a_runner_built_for_the_call(monkeypatch, x_shape, contiguous, with_bias):
    """The first call (which checks and builds the runner) and later ones (a signature lookup) give bitwise what a
    runner built for this one call gives, bias added after; the problem is cached once."""
    from sparsedecoding.kernels import op

    monkeypatch.setattr(op, "_runners", {})
    weight = random_nm_weight(48, 96, 2, 4).to(DEVICE)
    bias = torch.randn(48).bfloat16().to(DEVICE) if with_bias else None
    layer = PackedLinear.from_dense(weight, 2, 4, bias=bias)
    x = torch.randn(x_shape).bfloat16().to(DEVICE)
    if not contiguous:
        x = torch.randn(tuple(reversed(x_shape))).bfloat16().to(DEVICE).t()
    x2 = x.reshape(-1, 96).contiguous()
    product = op._make_runner(x2, layer.values, layer.bitmask, 2, 4)(x2, layer.values, layer.bitmask)
    assert_matches_float64(product, x2, weight)
    expected = (product if bias is None else product + bias).view(*x_shape[:-1], 48)
    for _ in range(3):
        assert torch.equal(layer(x), expected)
    assert len(op._runners) == 1


def test_packed_linear_checks_again_when_the_batch_dtype_device_or_weight_changes():
    """After a call has cached its problem, every change that could make the kernel compute wrongly is checked
    again: the batch, x's dtype and device, a replaced weight, a weight resized in place, the layer cast."""
    weight = random_nm_weight(48, 96, 2, 4).to(DEVICE)
    layer = PackedLinear.from_dense(weight, 2, 4)
    x = torch.randn(2, 96).bfloat16().to(DEVICE)
    layer(x)
    wide = torch.randn(17, 96).bfloat16().to(DEVICE)
    assert torch.equal(layer(wide), torch.nn.functional.linear(wide, weight))  # past 16 rows: the dense product
    assert layer(x[:0]).shape == (0, 48)  # no rows: the empty product, as nn.Linear gives
    for bad, message in [(x.half(), "cast x to torch.bfloat16"),
                         (x.float(), "bfloat16 or float16"), (x.to("meta"), "move them to one device")]:
        with pytest.raises(KernelInputError, match=message):
            layer(bad)
    other = PackedLinear.from_dense(random_nm_weight(48, 96, 2, 4, seed=1).to(DEVICE), 2, 4)
    layer.values, layer.bitmask = other.values, other.bitmask
    assert torch.equal(layer(x), other(x))
    layer.half()
    with pytest.raises(KernelInputError, match="cast x to torch.float16"):
        layer(x)
    assert torch.equal(layer(x.half()), other.half()(x.half()))
    layer.values.data = layer.values.data[:24]  # the same tensor object, another shape
    with pytest.raises(KernelInputError, match="do not form a packed 2:4 weight"):
        layer(x.half())


@pytest.mark.parametrize("x_shape", [(2, 95), (20, 95), (2, 1, 95), (95,), ()])
def test_packed_linear_wrong_in_features_is_one_clear_error(x_shape):
    layer = PackedLinear.from_dense(random_nm_weight(48, 96, 2, 4).to(DEVICE), 2, 4)
    with pytest.raises(KernelInputError) as info:
        layer(torch.randn(x_shape).bfloat16().to(DEVICE))
    assert f"x has shape {x_shape}; this PackedLinear takes [..., 96]" == str(info.value)


def test_untuned_problem_inside_cuda_graph_capture_raises(monkeypatch):
    from sparsedecoding.kernels import autotune

    _, packed, x = packed_problem(32, 64, 1, 2, 4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(KernelInputError, match="before capturing a CUDA graph"):
        autotune.tuned_config(x, packed.values, packed.bitmask, 2, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 8, 16])
@pytest.mark.parametrize("n,m", PATTERNS)
def test_cuda_tuned_kernel_matches_float64(n, m, batch):
    weight, packed, x = packed_problem(1000, 2048, batch, n, m)
    assert_matches_float64(nm_spmv(x, packed), x, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 8, 16])
@pytest.mark.parametrize("n,m", PATTERNS)
def test_cuda_every_candidate_matches_float64_eagerly_and_in_cuda_graph_replay(n, m, batch):
    """Each configuration the tuner may pick, on ragged rows and a partial last loop step (65 words), run eagerly
    and replayed from a CUDA graph with fresh x: the PTX bit scan against float64, bitwise equal both ways."""
    from concurrent.futures import ThreadPoolExecutor

    from sparsedecoding.kernels.autotune import candidate_configs
    from sparsedecoding.kernels.triton_spmv import compile_for, launch

    weight, packed, x = packed_problem(1000, 2080, batch, n, m)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    configs = candidate_configs(1000, 65, batch, 32 * n // m, sm_count)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda c: compile_for(x, packed.values, packed.bitmask, n, m, c), configs))
    for config in configs:
        call = lambda v: launch(v, packed.values, packed.bitmask, n, m, config)  # noqa: E731
        static_x = x.clone()
        eager = call(static_x)
        assert_matches_float64(eager, x, weight)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = call(static_x)
        fresh = torch.randn_like(x)
        static_x.copy_(fresh)
        graph.replay()
        graph.replay()  # split-K counters are back to zero after every launch
        torch.cuda.synchronize()
        assert torch.equal(static_y, call(fresh)), str(config)
        assert_matches_float64(static_y, fresh, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", PATTERNS)
def test_cuda_nm_spmv_under_torch_compile(n, m):
    for batch in (1, 3, 8, 16):
        weight, packed, x = packed_problem(512, 1024, batch, n, m)
        compiled = torch.compile(lambda v: nm_spmv(v, packed) * 2, fullgraph=True)
        eager = nm_spmv(x, packed) * 2
        assert torch.equal(compiled(x), eager)
        assert_matches_float64(eager / 2, x, weight)


@pytest.mark.gpu
def test_cuda_tuned_op_in_cuda_graph_capture_and_replay():
    weight, packed, x = packed_problem(768, 1024, 8, 8, 16)
    static_x = x.clone()
    nm_spmv(static_x, packed)  # tunes and allocates split-K counters before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = nm_spmv(static_x, packed)
    fresh = torch.randn_like(x)
    static_x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, nm_spmv(fresh, packed))
    assert_matches_float64(static_y, fresh, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", PATTERNS)
def test_cuda_eager_runner_equals_triton_launch_at_every_batch(n, m, monkeypatch):
    """The cached eager Triton runner launches exactly the kernel Triton's own launch runs (bitwise equal), for
    1-D x, every batch 1..16, and x at an address off 16-byte alignment (served by Triton's launch)."""
    from sparsedecoding.kernels import op
    from sparsedecoding.kernels.autotune import tuned_config
    from sparsedecoding.kernels.triton_spmv import launch

    monkeypatch.setenv(op.KERNEL_SETTING, "triton")  # the tensor-core kernel serves some batches under auto
    monkeypatch.setattr(op, "_runners", {})

    for batch in range(1, 17):
        weight, packed, x = packed_problem(1000, 2080, batch, n, m, seed=batch)
        config = tuned_config(x, packed.values, packed.bitmask, n, m)
        expected = launch(x, packed.values, packed.bitmask, n, m, config)
        for _ in range(2):  # the first call builds the runner, the second only launches it
            assert torch.equal(nm_spmv(x, packed), expected)
        shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)[1:].view_as(x).copy_(x)
        assert shifted.data_ptr() % 16
        assert torch.equal(nm_spmv(shifted, packed), expected)
        assert_matches_float64(expected, x, weight)
        if batch == 1:
            assert torch.equal(nm_spmv(x[0], packed), expected[0])


def test_a_dense_copy_follows_a_loaded_state_dict():
    layer = PackedLinear.from_dense(random_nm_weight(48, 96, 2, 4).to(DEVICE), 2, 4)
    layer.keep_dense_copy(2)
    other = random_nm_weight(48, 96, 2, 4, seed=1).to(DEVICE)
    layer.load_state_dict(PackedLinear.from_dense(other, 2, 4).state_dict())
    x = torch.randn(4, 96).bfloat16().to(DEVICE)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, other))


def test_wide_batches_and_quantized_layers_name_a_wrong_input():
    from sparsedecoding.kernels.quantized import pack_nm_quantized
    from sparsedecoding.kernels.quantized_linear import QuantizedPackedLinear

    layer = PackedLinear.from_dense(random_nm_weight(48, 96, 2, 4).to(DEVICE), 2, 4)
    with pytest.raises(KernelInputError, match="cast x to torch.bfloat16"):
        layer(torch.randn(20, 96).half().to(DEVICE))
    quantized = QuantizedPackedLinear(pack_nm_quantized(torch.zeros(48, 256).bfloat16(), 2, 4, "int8", 256))
    with pytest.raises(KernelInputError, match=r"takes \[\.\.\., 256\]"):
        quantized(torch.randn(2, 128).bfloat16())
