"""The tensor-core kernel's generic expansion (`nm_mma.cu`, FAST24 false: 4:8, 8:16, 16:32 and any 50% pattern), on
CPU: an integer emulation of what each lane computes (per-nibble counts by SWAR, the prefix multiply, the value
window of three 4-byte loads and a funnel shift, the nibble table's selectors and byte-7 mask, the byte permutes)
must rebuild every A register of the MMA layout from the packed values and masks exactly. The compiled kernel
itself is checked against float64 products on a GPU by test_cuda_mma.py."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.kernels import pack_nm

from helpers import random_nm_weight

M32 = 0xFFFFFFFF


def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32, default mode: byte i of the result is byte (nibble i of the selector) of b:a."""
    source = (b << 32) | a
    result = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        assert nibble < 8, "the kernel never asks for sign replication"
        result |= ((source >> (8 * nibble)) & 0xFF) << (8 * i)
    return result


def funnelshift_r(lo: int, hi: int, shift: int) -> int:
    return (((hi << 32) | lo) >> (shift & 31)) & M32


def nibble_selectors(nib: int) -> int:
    kept = ((nib * 0x204081) & M32) & 0x01010101
    rank = (kept * 0x01010100) & M32
    take = (0x10101010 + rank * 0x22) & M32
    keep = (kept * 0xFF) & M32
    return (take & keep) | (0x77777777 & ~keep & M32)


def nibble_entry(nib: int) -> tuple[int, int, int]:
    sel = nibble_selectors(nib)
    return sel, sel >> 16, M32 if nib == 0xF else 0x00FFFFFF


def nibble_counts(halves: int) -> int:
    pairs = (halves - ((halves >> 1) & 0x55555555)) & M32
    return (pairs & 0x33333333) + ((pairs >> 2) & 0x33333333)


def value_window(words: list[int], rank: int) -> tuple[int, int]:
    """`words`: a word pair row's values as 32-bit words (two 16-bit values each, the first in the low half)."""
    first = (rank & ~1) // 2
    w0, w1, w2 = words[first], words[first + 1], words[first + 2]
    shift = (rank & 1) * 16
    return funnelshift_r(w0, w1, shift), funnelshift_r(w1, w2, shift)


def lane_registers(words: list[list[int]], word_g: int, word_g8: int, t: int) -> list[tuple[int, int, int, int]]:
    """(a0, a1, a2, a3) of k-steps s = 0..3 for lane (g, t): `words[0]` / `words[1]` are rows g / g+8."""
    half_g = (word_g >> 16) if t % 2 else word_g & 0xFFFF
    half_g8 = (word_g8 >> 16) if t % 2 else word_g8 & 0xFFFF
    rank_g = 16 * (t // 2) + (bin(word_g & 0xFFFF).count("1") if t % 2 else 0)
    rank_g8 = 16 * (t // 2) + (bin(word_g8 & 0xFFFF).count("1") if t % 2 else 0)
    counts = nibble_counts(half_g | (half_g8 << 16))
    before_g = ((counts & 0xFFFF) * 0x1110) & M32
    before_g8 = ((counts >> 16) * 0x1110) & M32
    table = [nibble_entry(nib) for nib in range(16)]
    out = []
    for s in range(4):
        nib_g, nib_g8 = (half_g >> (4 * s)) & 0xF, (half_g8 >> (4 * s)) & 0xF
        r_g = rank_g + (0 if s == 0 else (before_g >> (4 * s)) & 0xF)
        r_g8 = rank_g8 + (0 if s == 0 else (before_g8 >> (4 * s)) & 0xF)
        q0_g, q1_g = value_window(words[0], r_g)
        q0_g8, q1_g8 = value_window(words[1], r_g8)
        e_g, e_g8 = table[nib_g], table[nib_g8]
        q1_g &= e_g[2]
        q1_g8 &= e_g8[2]
        out.append((prmt(q0_g, q1_g, e_g[0]), prmt(q0_g8, q1_g8, e_g8[0]), prmt(q0_g, q1_g, e_g[1]),
                    prmt(q0_g8, q1_g8, e_g8[1])))
    return out


def bits16(weight_row: torch.Tensor) -> list[int]:
    """A bf16 row's values as their 16-bit patterns."""
    return [int(v) & 0xFFFF for v in weight_row.contiguous().view(torch.int16)]


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (8, 16), (16, 32)])
def test_each_lane_rebuilds_its_columns_of_every_word_pair_exactly(n, m):
    """For random N:M rows (and rows with all-kept / all-dropped nibbles), every lane's four A registers of each
    k-step hold exactly its columns 16t + 4s + {0, 1} / {2, 3} of rows g and g + 8, zeros where dropped."""
    weight = random_nm_weight(16, 64 * 6, n, m, torch.bfloat16, seed=n)
    if m == 32:  # extreme nibble counts: whole nibbles kept / dropped in one row
        row = torch.zeros(64 * 6, dtype=torch.bfloat16)
        for word in range(12):
            row[32 * word:32 * word + 16] = torch.arange(1, 17) * (word + 1)
        weight[3] = row
        weight[11] = row.flip(0)
    packed = pack_nm(weight, n, m)
    bits = [bits16(weight[r]) for r in range(16)]
    padding = [0, 0, 0, 0, 0, 0, 0, 0]  # the smem row padding read past the last pair (any value; zeros here)
    for pair in range(3):
        vals = {}
        for r in range(16):
            pair_values = bits16(packed.values[r, 32 * pair:32 * pair + 32])
            following = bits16(packed.values[r, 32 * pair + 32:32 * pair + 48]) or padding
            words = pair_values + following + padding
            vals[r] = [words[2 * i] | (words[2 * i + 1] << 16) for i in range(len(words) // 2)]
        masks = packed.bitmask[:, 2 * pair:2 * pair + 2].to(torch.int64) & M32
        for g in range(8):
            for t in range(4):
                registers = lane_registers([vals[g], vals[g + 8]], int(masks[g, t // 2]), int(masks[g + 8, t // 2]),
                                           t)
                for s, (a0, a1, a2, a3) in enumerate(registers):
                    for register, row, k in ((a0, g, 0), (a2, g, 2), (a1, g + 8, 0), (a3, g + 8, 2)):
                        column = 64 * pair + 16 * t + 4 * s + k
                        expected = bits[row][column] | (bits[row][column + 1] << 16)
                        assert register == expected, (n, m, pair, g, t, s, k)
