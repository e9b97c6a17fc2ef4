"""Sparsity patterns: semi-structured N:M (keep N of every M consecutive input columns) or unstructured (a fraction)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SparsityPatternError

_NM = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*(?:\+\s*(\d+)\s*([lq])?\s*|(g)(\d+)?\s*)?$", re.ASCII)  # ASCII digits only
# Placements of the weights beyond two in a group of four (`SparsityPattern.placement`), by suffix: each pattern they
# apply to, as (n, m, overflow)
PLACEMENTS = {"l": ("lanes", (16, 32, 2)), "q": ("quads", (16, 32, 4))}
GROUPED = ("groups", (16, 32, -1))  # "16:32g": the placement and the one pattern it applies to
GROUPED_SPLIT_ROWS = (8,)  # "16:32g8": rows sharing a split other than the tile's 16 (SparsityPattern.split_rows)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$", re.ASCII)
# The N:M patterns the packed format and its kernels are built and tuned for, densest first.
KERNEL_PATTERNS = ((2, 4), (4, 8), (8, 16), (16, 32))
# The decoder linears that are pruned (and packed), by their name inside a layer; the rest stays dense.
PRUNABLE_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class SparsityPattern:
    """`n:m` keeps n weights in every group of m consecutive columns of a row; `unstructured` prunes `sparsity`
    of each row's weights (the solvers choose per row, or per block for SparseGPT).

    Exactly one of the two forms is set: (n, m) for N:M, or `sparsity` with n = m = 0 for unstructured.

    `overflow` (`"16:32+2"`): a 50% N:M pattern whose groups of 4 columns keep at most 2, except for at most
    `overflow` kept weights beyond 2 in each group of m. 0 is the 2:4 mask, m / 4 the plain N:M mask; in between, a
    mask that a 2:4 weight plus `overflow` entries per group would hold. `pack` writes such a model as plain N:M; the
    engine runs a 16:32 linear whose mask fits 16:32+2 on the 2:4 kernel as its 2:4 tiles plus two overflow slots a
    row and word (`kernels.sp24_linear.Sp24Linear`, SPARSEDECODING_SP24_SLOTS). -1: no such limit.

    `placement` (a suffix, for a kernel that would keep each such weight in the tensor-core lane that owns its group
    of four; benchmarks/CUDA_KERNEL_NOTES.md, thirty-eighth session): `"16:32+2l"` (lanes) lets row r of each 16-row
    tile (h = 1 for rows 8-15) keep its two in one group of {h, h + 4} and one of {h + 2, h + 6}; `"16:32+4q"`
    (quads) lets the two rows g and g + 8 of a tile share four, one a group class (group index mod 4). Both are
    16:32 masks (at most three kept in a group of four) that also fit 16:32+2 or 16:32+4; weights need a multiple of
    16 rows. `"16:32g"` (groups): the 16 rows of each tile share a split of each 32-column word into eight groups of
    four (any columns), and each row keeps two of every group; the sparse tensor-core kernel runs it as 2:4 in that
    order (`kernels.sp24.tile_grouped`). "": none.

    `split_rows` (groups only; `"16:32g8"`): the rows that share a split, 8 (each half of a tile its own split; the
    kernel takes two gathers and two mma.sp a k-tile, `tile_grouped(..., split_rows=8)`); 0 is the tile's 16."""

    n: int = 0
    m: int = 0
    sparsity: float = 0.0
    overflow: int = -1
    placement: str = ""
    split_rows: int = 0

    def __post_init__(self) -> None:
        """The fields must form one of the patterns `parse` reads, so that one built directly is checked too."""
        if self.m or self.n:
            wrong = None
            if not (type(self.n) is int and type(self.m) is int and 0 < self.n < self.m):
                wrong = "N must satisfy 0 < N < M"
            elif self.overflow != -1 and (self.overflow < 0 or 2 * self.n != self.m or self.m % 8
                                          or self.overflow > self.m // 4):
                wrong = "an overflow K needs a 50% pattern whose M is a multiple of 8 and 0 ≤ K ≤ M / 4"
            elif self.placement and (self.placement, (self.n, self.m, self.overflow)) not in \
                    (*PLACEMENTS.values(), GROUPED):
                wrong = "placements are lanes (16:32+2l), quads (16:32+4q) and groups (16:32g)"
            elif self.split_rows and (self.placement != GROUPED[0] or self.split_rows not in GROUPED_SPLIT_ROWS):
                wrong = "split_rows is 0 (16:32g) or 8 (16:32g8), for grouped columns only"
            if wrong:
                raise SparsityPatternError(f"SparsityPattern(n={self.n!r}, m={self.m!r}, overflow={self.overflow!r}, "
                                           f"placement={self.placement!r}, split_rows={self.split_rows!r}): {wrong}; "
                                           f"try SparsityPattern.parse('2:4')")
        elif not (isinstance(self.sparsity, (int, float)) and 0.0 < self.sparsity < 1.0) or self.overflow != -1 \
                or self.placement or self.split_rows:
            raise SparsityPatternError(f"SparsityPattern(sparsity={self.sparsity!r}) is not a pattern: an unstructured "
                                       f"sparsity is strictly between 0 and 1 (0.5 = 50%); try "
                                       f"SparsityPattern.parse('50%')")

    @classmethod
    def parse(cls, text: str | SparsityPattern) -> SparsityPattern:
        """`"2:4"`, `"4:8"`, `"16:32"`, any `"N:M"` with 0 < N < M, `"N:M+K"` (a 50% N:M with M a multiple of 8 and
        at most K ≤ M / 4 kept weights beyond 2 in a group of 4: `overflow`), `"16:32+2l"` / `"16:32+4q"` (those weights
        placed by lanes or quads: `placement`), `"16:32g"` (grouped columns: `placement`), `"16:32g8"` (the same with a
        split for every 8 rows: `split_rows`), or `"50%"` (0 < p < 100)."""
        if isinstance(text, SparsityPattern):
            return text
        if not isinstance(text, str):
            raise SparsityPatternError(f"{text!r} is not a pattern string; use e.g. '2:4' or '50%'")
        match = _NM.match(text)
        if match:
            n, m = int(match.group(1)), int(match.group(2))
            if not 0 < n < m:
                raise SparsityPatternError(f"{text!r} — N must satisfy 0 < N < M; try 2:4")
            if match.group(5):
                if (n, m) != GROUPED[1][:2]:
                    raise SparsityPatternError(f"{text!r} — grouped columns are defined for 16:32g only")
                rows = int(match.group(6)) if match.group(6) else 0
                if rows and rows not in GROUPED_SPLIT_ROWS:
                    raise SparsityPatternError(f"{text!r} — a split is shared by a tile's 16 rows (16:32g) or by 8 "
                                               f"(16:32g8)")
                return cls(n=n, m=m, sparsity=0.5, placement=GROUPED[0], split_rows=rows)
            if match.group(3) is None:
                return cls(n=n, m=m, sparsity=1.0 - n / m)
            overflow = int(match.group(3))
            if 2 * n != m or m % 8 or overflow > m // 4:
                raise SparsityPatternError(f"{text!r} — N:M+K needs a 50% pattern whose M is a multiple of 8 (8:16, "
                                           f"16:32) and K at most M / 4; try 16:32+4")
            placement = ""
            if match.group(4):
                placement, fits = PLACEMENTS[match.group(4)]
                if (n, m, overflow) != fits:
                    raise SparsityPatternError(f"{text!r} — the {placement} placement is defined for "
                                               f"{fits[0]}:{fits[1]}+{fits[2]}{match.group(4)} only")
            return cls(n=n, m=m, sparsity=0.5, overflow=overflow, placement=placement)
        match = _PERCENT.match(text)
        if match:
            percent = float(match.group(1))
            if not 0.0 < percent < 100.0:
                raise SparsityPatternError(f"{text!r} — the percentage must be strictly between 0 and 100; try 50%")
            return cls(sparsity=percent / 100.0)
        raise SparsityPatternError(f"{text!r} is not a sparsity pattern; use N:M (2:4, 4:8, 8:16, 16:32) or a percentage (50%)")

    @property
    def is_nm(self) -> bool:
        return self.m > 0

    def __str__(self) -> str:
        if self.is_nm:
            if self.placement == GROUPED[0]:
                return f"{self.n}:{self.m}g" + (str(self.split_rows) if self.split_rows else "")
            suffix = next((key for key, (name, _) in PLACEMENTS.items() if name == self.placement), "")
            return f"{self.n}:{self.m}" + (f"+{self.overflow}{suffix}" if self.overflow >= 0 else "")
        return f"{self.sparsity * 100:g}%"
