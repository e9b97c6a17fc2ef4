"""Which kernel serves `nm_spmv` on CUDA (`kernels.op.choose_kernel`): the table against the committed H200
report, the SPARSEDECODING_KERNEL override and its errors, the one warning when the tensor-core kernel cannot be
built; on GPU the dispatched op against a float64 product, eagerly and replayed from a CUDA graph."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import nm_spmv, op, pack_nm
from sparsedecoding.kernels.cuda_mma import CudaKernelUnavailableError

REPORT = Path(__file__).parent.parent / "benchmarks" / "results" / "cuda_dispatch_h200.md"


def never_asked() -> str | None:
    raise AssertionError("the tensor-core kernel's availability was asked (it may build) where it is not chosen")


def available() -> None:
    return None


def missing() -> str:
    return "nvcc not found"


@pytest.fixture
def fresh_dispatch(monkeypatch):
    """No cached runners, no earlier build attempt or warning, and no SPARSEDECODING_KERNEL from outside."""
    monkeypatch.setattr(op, "_runners", {})
    monkeypatch.setattr(op, "_fallback_logged", False)
    monkeypatch.delenv(op.KERNEL_SETTING, raising=False)


# --- CPU: the decision ----------------------------------------------------------------------------------------

def report_speedups() -> dict[str, dict[int, tuple[float, float]]]:
    """pattern -> batch -> (cuda geomean, triton geomean) from the report's summary table."""
    lines = REPORT.read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| pattern | batch | cuda geomean"))
    names = [c.strip() for c in lines[header].strip("|").split("|")]
    found: dict[str, dict[int, tuple[float, float]]] = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
        speed = lambda name: float(re.sub("x$", "", cells[name]))  # noqa: E731
        found.setdefault(cells["pattern"], {})[int(cells["batch"])] = (speed("cuda geomean"), speed("triton geomean"))
    return found


def test_table_follows_the_committed_measurements():
    """CUDA_FROM_BATCH is, per measured pattern, the smallest batch from which the tensor-core kernel was faster
    than Triton at every measured batch."""
    measured = report_speedups()
    assert set(measured) == {"2:4", "16:32"}
    for pattern, by_batch in measured.items():
        n, m = (int(v) for v in pattern.split(":"))
        batches = sorted(by_batch)
        first = next(b for b in batches if all(by_batch[c][0] > by_batch[c][1] for c in batches if c >= b))
        assert op.CUDA_FROM_BATCH[n, m] == first, pattern


@pytest.mark.parametrize("batch", range(1, 17))
def test_auto_takes_the_table(batch):
    assert op.choose_kernel(2, 4, batch, "auto", available if batch >= 2 else never_asked) == \
        ("cuda" if batch >= 2 else "triton", None)
    assert op.choose_kernel(16, 32, batch, "auto", available if batch >= 5 else never_asked)[0] == \
        ("cuda" if batch >= 5 else "triton")
    for n, m in ((4, 8), (8, 16), (1, 2), (1, 4), (2, 8)):  # unmeasured or not 50%: never the tensor-core kernel
        assert op.choose_kernel(n, m, batch, "auto", never_asked) == ("triton", None)


def test_auto_without_the_tensor_core_kernel_takes_triton_and_says_why():
    assert op.choose_kernel(2, 4, 4, "auto", missing) == ("triton", "nvcc not found")


@pytest.mark.parametrize("n,m,batch", [(2, 4, 1), (2, 4, 16), (16, 32, 1), (1, 4, 8)])
def test_triton_setting_never_asks_for_the_tensor_core_kernel(n, m, batch):
    assert op.choose_kernel(n, m, batch, "triton", never_asked) == ("triton", None)


@pytest.mark.parametrize("n,m,batch", [(2, 4, 1), (16, 32, 2), (4, 8, 16), (8, 16, 5)])
def test_cuda_setting_forces_the_tensor_core_kernel_for_50_percent_patterns(n, m, batch):
    assert op.choose_kernel(n, m, batch, "cuda", available) == ("cuda", None)


def test_cuda_setting_when_unavailable_is_an_error():
    with pytest.raises(CudaKernelUnavailableError, match="SPARSEDECODING_KERNEL=cuda.*nvcc not found"):
        op.choose_kernel(2, 4, 4, "cuda", missing)


@pytest.mark.parametrize("n,m", [(1, 4), (2, 8), (8, 32)])
def test_cuda_setting_for_a_pattern_it_does_not_run_is_an_error(n, m):
    with pytest.raises(KernelInputError, match=f"runs only 50% patterns.*got {n}:{m}"):
        op.choose_kernel(n, m, 4, "cuda", never_asked)


@pytest.mark.parametrize("setting", ["cublas", "", "Auto"])
def test_unknown_setting_is_an_error(setting):
    with pytest.raises(op.KernelChoiceError, match="SPARSEDECODING_KERNEL=.*auto, triton, cuda"):
        op.choose_kernel(2, 4, 4, setting, never_asked)


def test_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(op.KERNEL_SETTING, raising=False)
    assert op.kernel_setting() == "auto"
    monkeypatch.setenv(op.KERNEL_SETTING, " CUDA ")
    assert op.kernel_setting() == "cuda"
    monkeypatch.setenv(op.KERNEL_SETTING, "fast")
    with pytest.raises(op.KernelChoiceError, match="'fast'"):
        op.choose_kernel(2, 4, 4, op.kernel_setting(), never_asked)


def test_fallback_is_logged_once_and_triton_serves(fresh_dispatch, monkeypatch, caplog):
    built = []
    monkeypatch.setattr(op, "_cuda_problem", missing)
    monkeypatch.setattr(op, "_TritonRunner", lambda *args: built.append("triton") or "triton runner")
    monkeypatch.setattr(op, "_CudaRunner", lambda *args: built.append("cuda") or "cuda runner")
    packed = pack_nm(torch.zeros(8, 64).bfloat16(), 2, 4)
    with caplog.at_level(logging.WARNING, logger=op.log.name):
        for batch in (1, 2, 4, 16):
            assert op._gpu_runner(torch.zeros(batch, 64).bfloat16(), packed.values, packed.bitmask, 2, 4) \
                == "triton runner"
    assert built == ["triton"] * 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nvcc not found" in warnings[0] and "SPARSEDECODING_KERNEL=triton" in warnings[0]


def test_clear_runners_forgets_the_quantized_launches_too(monkeypatch):
    """A setting A/B (SPARSEDECODING_NM_MMA_GEOMETRY) rebuilds every tensor-core launch, packed or quantized."""
    from sparsedecoding.kernels import quantized

    monkeypatch.setattr(op, "_runners", {"problem": "runner"})
    monkeypatch.setattr(quantized, "_cuda_launches", {"problem": "launch"})
    op.clear_runners()
    assert op._runners == {} and quantized._cuda_launches == {}


def test_forced_triton_never_warns(fresh_dispatch, monkeypatch, caplog):
    monkeypatch.setenv(op.KERNEL_SETTING, "triton")
    monkeypatch.setattr(op, "_cuda_problem", never_asked)
    monkeypatch.setattr(op, "_TritonRunner", lambda *args: "triton runner")
    packed = pack_nm(torch.zeros(8, 64).bfloat16(), 2, 4)
    with caplog.at_level(logging.WARNING, logger=op.log.name):
        assert op._gpu_runner(torch.zeros(4, 64).bfloat16(), packed.values, packed.bitmask, 2, 4) == "triton runner"
    assert not caplog.records


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without a GPU")
def test_without_a_gpu_the_tensor_core_kernel_reports_why(monkeypatch):
    monkeypatch.setattr(op, "_cuda_checked", False)
    monkeypatch.setattr(op, "_cuda_reason", None)
    assert "no CUDA GPU" in op._cuda_problem()


@pytest.mark.parametrize("setting", ["auto", "triton", "cuda"])
def test_cpu_runs_the_reference_whatever_the_setting(fresh_dispatch, monkeypatch, setting):
    monkeypatch.setenv(op.KERNEL_SETTING, setting)
    weight = torch.randn(16, 64).bfloat16() * (torch.arange(64) % 4 < 2)
    x = torch.randn(4, 64).bfloat16()
    y = nm_spmv(x, pack_nm(weight, 2, 4))
    assert torch.allclose(y.double(), x.double() @ weight.double().T, rtol=1e-2, atol=1e-2)


# --- GPU: the dispatched op -----------------------------------------------------------------------------------

SHAPES = [(77, 96), (130, 416), (200, 4128), (1000, 4096)]


def random_nm(out: int, in_features: int, n: int, m: int) -> torch.Tensor:
    keys = torch.rand(out, in_features // m, m)
    kept = keys.argsort(-1).argsort(-1) < n
    return (torch.randn(out, in_features // m, m) * kept).view(out, in_features).bfloat16().cuda()


def float64_error(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """Largest |y - x·Wᵀ| over its bound: output rounding plus any order of an fp32 sum."""
    x64, w64 = x.double().view(-1, weight.shape[1]), weight.double()
    exact = x64 @ w64.T
    bound = torch.finfo(y.dtype).eps / 2 * exact.abs() + w64.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs().T)
    return float(((y.double().view_as(exact) - exact).abs() / bound.clamp_min(1e-30)).max())


def runner_kind(x: torch.Tensor, packed) -> str:
    runner = next(r for key, r in op._runners.items() if key[0] == x.shape and key[6] == packed.bitmask.shape)
    return {op._CudaRunner: "cuda", op._TritonRunner: "triton"}[type(runner)]


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", SHAPES)
def test_dispatched_op_matches_float64_eagerly_and_in_graph_replay(fresh_dispatch, out, in_features):
    weight = random_nm(out, in_features, 2, 4)
    packed = pack_nm(weight, 2, 4)
    static_x = [torch.randn(batch, in_features, device="cuda").bfloat16() for batch in range(1, 17)]
    for x in static_x:
        assert float64_error(nm_spmv(x, packed), x, weight) <= 1, x.shape
        assert runner_kind(x, packed) == ("cuda" if x.shape[0] >= 2 else "triton")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = [nm_spmv(x, packed) for x in static_x]
    for _ in range(2):
        for x in static_x:
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        for x, y in zip(static_x, static_y):
            assert float64_error(y, x, weight) <= 1, x.shape
            assert torch.equal(y, nm_spmv(x, packed))


@pytest.mark.gpu
@pytest.mark.parametrize("setting,expected", [("triton", "triton"), ("cuda", "cuda")])
def test_forced_kernel_serves_every_batch(fresh_dispatch, monkeypatch, setting, expected):
    monkeypatch.setenv(op.KERNEL_SETTING, setting)
    weight = random_nm(130, 416, 16, 32)
    packed = pack_nm(weight, 16, 32)
    for batch in (1, 3, 8, 16):
        x = torch.randn(batch, 416, device="cuda").bfloat16()
        assert float64_error(nm_spmv(x, packed), x, weight) <= 1
        assert runner_kind(x, packed) == expected


@pytest.mark.gpu
def test_tensor_core_runner_takes_vectors_and_misaligned_x(fresh_dispatch, monkeypatch):
    weight = random_nm(200, 4128, 2, 4)
    packed = pack_nm(weight, 2, 4)
    x = torch.randn(4, 4128, device="cuda").bfloat16()
    assert float64_error(nm_spmv(x, packed), x, weight) <= 1
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view_as(x).copy_(x)
    assert shifted.data_ptr() % 16 and runner_kind(x, packed) == "cuda"
    assert torch.equal(nm_spmv(shifted, packed), nm_spmv(x, packed))
    monkeypatch.setenv(op.KERNEL_SETTING, "cuda")  # batch 1 is Triton's under auto
    vector = x[1].clone()
    y = nm_spmv(vector, packed)
    assert y.shape == (200,) and float64_error(y, vector, weight) <= 1 and runner_kind(vector, packed) == "cuda"


@pytest.mark.gpu
def test_dispatched_op_under_torch_compile_in_a_cuda_graph(fresh_dispatch):
    weight = random_nm(1000, 4096, 2, 4)
    packed = pack_nm(weight, 2, 4)
    x = torch.randn(5, 4096, device="cuda").bfloat16()
    compiled = torch.compile(lambda v: nm_spmv(v, packed) * 2, fullgraph=True)
    eager = nm_spmv(x, packed) * 2
    assert torch.equal(compiled(x), eager) and runner_kind(x, packed) == "cuda"
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = compiled(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert float64_error(static_y / 2, x, weight) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape,dtype,device,message", [
    ((17, 416), torch.bfloat16, "cuda", "batch 17 is outside 1..16"),
    ((4, 416), torch.float32, "cuda", "x is torch.float32"),
    ((4, 416), torch.float16, "cuda", "cast x to torch.bfloat16"),
    ((4, 416), torch.bfloat16, "cpu", "move them to one device"),
    ((4, 415), torch.bfloat16, "cuda", "expected [416] or [batch, 416]"),
])
def test_bad_inputs_give_one_clear_error(fresh_dispatch, x_shape, dtype, device, message):
    packed = pack_nm(random_nm(130, 416, 2, 4), 2, 4)
    x = torch.randn(x_shape, device=device).to(dtype)
    with pytest.raises(KernelInputError) as info:
        nm_spmv(x, packed)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sparse_mma_setting_is_off_unless_1_and_refuses_other_values(monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, sparse_mma_setting

    monkeypatch.delenv("SPARSEDECODING_SPARSE_MMA", raising=False)
    assert sparse_mma_setting() is False
    monkeypatch.setenv("SPARSEDECODING_SPARSE_MMA", "1")
    assert sparse_mma_setting() is True
    monkeypatch.setenv("SPARSEDECODING_SPARSE_MMA", "yes")
    with pytest.raises(KernelChoiceError, match="use 1"):
        sparse_mma_setting()
