"""sp24.cu's `int8_pair` (int8 offset-binary codes to the bf16 pair the MMA takes, by PRMT, two LOP3 and one HSUB2)
emulated bit for bit on the CPU: the byte selector, the LOP3 constants and truth tables, and the magic word are read
out of the kernel source, so the test checks the instructions the kernel compiles, on all 256 bytes at both byte
positions. The GPU tests (test_sp24.py) check the kernel against float64 besides."""

from __future__ import annotations

import re
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parents[1] / "src" / "sparsedecoding" / "kernels" / "csrc" / "sp24.cu"


def _int8_pair_body() -> str:
    text = SOURCE.read_text()
    start = text.index("__device__ __forceinline__ uint32_t int8_pair(")
    return text[start:text.index("\n}\n", start)]


def byte_perm(x: int, y: int, selector: int) -> int:
    """CUDA's __byte_perm: result byte i is byte (selector nibble i) & 7 of the 8 bytes y:x."""
    pool = (y << 32) | x
    return sum(((pool >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def lop3(a: int, b: int, c: int, lut: int) -> int:
    """PTX lop3.b32: bit i of the result is bit (a_i·4 + b_i·2 + c_i) of the truth table."""
    out = 0
    for i in range(32):
        index = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1)
        out |= ((lut >> index) & 1) << i
    return out


def bf16_pair(bits: int) -> tuple[float, float]:
    halves = torch.tensor([bits & 0xFFFF, bits >> 16], dtype=torch.int32).to(torch.int16)
    low, high = halves.view(torch.bfloat16).double().tolist()
    return low, high


def emulate(word: int, k: int) -> tuple[float, float]:
    body = _int8_pair_body()
    base, = re.findall(r"__byte_perm\(w, 0u, (0x[0-9A-Fa-f]+)u \| k \| \(\(k \+ 1\) << 8\)\)", body)
    magic, = re.findall(r'mov\.b32 %0, (0x[0-9A-Fa-f]+);', body)
    (mask_m, lut_m), (mask_b, lut_b) = re.findall(r"lop3\.b32 %0, %1, (0x[0-9A-Fa-f]+), %2, (0x[0-9A-Fa-f]+);", body)
    spread = byte_perm(word, 0, int(base, 16) | k | ((k + 1) << 8))
    magnitude = lop3(spread, int(mask_m, 16), int(magic, 16), int(lut_m, 16))
    bias = lop3(spread, int(mask_b, 16), int(magic, 16), int(lut_b, 16))
    (m0, m1), (b0, b1) = bf16_pair(magnitude), bf16_pair(bias)
    # HSUB2 in bf16, round to nearest: the differences are checked to be integers bf16 holds, so exact
    return m0 - b0, m1 - b1


def test_the_source_has_the_instructions_this_test_reads():
    body = _int8_pair_body()
    assert body.count("lop3.b32") == 2 and "__hsub2(" in body and "__byte_perm(" in body


def test_every_byte_becomes_its_code_exactly_at_both_positions():
    for k in (0, 2):
        for u in range(256):
            other = (u * 37 + 11) & 0xFF  # the pair's second byte: every value too, in another order
            word = (u << (8 * k)) | (other << (8 * (k + 1))) | (0x5A << (8 * ((k + 2) % 4)))
            low, high = emulate(word, k)
            assert (low, high) == (u - 128, other - 128), (k, u, other)
            rounded = torch.tensor([low, high], dtype=torch.float64).bfloat16().double().tolist()
            assert rounded == [low, high]  # representable in bf16, so the HSUB2 is exact
