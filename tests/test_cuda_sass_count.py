"""benchmarks/cuda_sass_count.py's parser on a small synthetic disassembly: which instances it keeps, and the loop
spans and mma.sp spacing it reads off the branch addresses (the real run needs nvcc, which CI has not)."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"

NAME = "_ZN4_GLOBAL__N_13nm_mma_kernelI13__nv_bfloat16Li1ELb1ELi2ELi{code}ELb{sp}ELi0EEEvPKT_"


def function(code: int, sp: int, body: list[str]) -> str:
    lines = [f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(body)]
    return f"\n\t\tFunction : {NAME.format(code=code, sp=sp)}\n" + "\n".join(lines)


def test_spans_and_mma_spacing(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    pytest.importorskip("triton")
    import cuda_sass_count

    body = ["NOP"] * 2 + ["HMMA.SP.16832.F32.BF16 R0, R1, R2, R3, R4, 0x0"] + ["IADD3 R1, R1, 1, RZ"] * 3 \
        + ["HMMA.SP.16832.F32.BF16 R0, R1, R2, R3, R4, 0x0", "@P0 BRA 0x20", "NOP", "@P1 BRA 0x0", "EXIT"]
    other = function(4, 0, ["NOP"]).replace("13__nv_bfloat16", "6__half")  # fp16 instances are left out
    rows = cuda_sass_count.instance_rows(function(0, 1, body) + other)
    assert rows == [{"values": "bf16", "path": "mma.sp", "group_words": "0", "loop": 9, "compute": 5,
                     "per_word": "4-4"}]
