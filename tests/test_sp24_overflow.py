"""The sp24 kernel with overflow slots (`sp24.tile_overflow`, sp24.cu's OVER path): a 16:32+K weight run as its 2:4
part plus two slots a row and 32 columns inside one kernel. On CPU: the slot tiling read back two ways (its inverse,
and `tiled_to_dense` through the lane semantics the kernel uses) against the weight itself, odd shapes and GLU
order included; on the GPU: every launch shape (splits, slices, batch 1-16, GLU) against a float64 product of the
whole weight, and the refusals."""

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.kernels.sp24 import (_staged_column, staged_offset, tile, tile_overflow, tiled_to_dense, untile,
                                         untile_slots)
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import keep_mask


def capped_weight(out, in_features, pattern="16:32+2", dtype=torch.bfloat16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, in_features, generator=g)
    return (weight * keep_mask(weight.abs(), SparsityPattern.parse(pattern))).to(dtype).to(device)


def test_staged_offsets_follow_the_staging_and_invert():
    """Column c = 8i + 2t + e of a k-tile sits at byte 16t + 4i + 2e of its staged 64 bytes (sp24.cu's layout)."""
    c = torch.arange(32)
    offsets = staged_offset(c).long()
    i, t, e = c // 8, (c % 8) // 2, c % 2
    assert torch.equal(offsets, 16 * t + 4 * i + 2 * e)
    assert sorted(offsets.tolist()) == list(range(0, 64, 2))  # a permutation of the 32 two-byte places
    assert torch.equal(_staged_column(staged_offset(c)).long(), c)


@pytest.mark.parametrize("out,in_features,pattern,slots", [(48, 512, "16:32+2", 2), (40, 96, "16:32+1", 1),
                                                           (13, 320, "16:32+2", 2), (64, 256, "16:32+0", 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_slots_rebuild_the_weight(out, in_features, pattern, slots, dtype):
    weight = capped_weight(out, in_features, pattern, dtype, seed=out)
    split = split_overflow(weight, slots)
    w = tile_overflow(split)
    values, columns = untile_slots(w)
    assert values.shape == (out, in_features // 32, 2)
    assert torch.equal(values[..., :slots], split.values) and torch.equal(columns[..., :slots], split.columns)
    assert torch.equal(tiled_to_dense(w), weight.double())  # through mma.sp's registers plus the lane slots
    assert w.nbytes == tile(split.w24).nbytes + w.over_v.numel() * 3


def stage(x):
    """x [batch, in] staged as sp24.cu's stage_unit writes it: 16-byte unit u (columns 8u..8u+7, four 32-bit words
    v.x..v.w) at byte 64·(u / 4) + 4·(u % 4), word i 16·i bytes further; as 2-byte elements."""
    batch, in_features = x.shape
    staged = torch.zeros(batch, in_features, dtype=x.dtype)
    for u in range(in_features // 8):
        for i in range(4):
            for e in range(2):
                staged[:, (64 * (u >> 2) + 4 * (u & 3) + 16 * i + 2 * e) // 2] = x[:, 8 * u + 2 * i + e]
    return staged


def emulate_slots(w, out, rows, x_of):
    """The slots' products as sp24.cu's CUDA-core loops form them: lane (g, t) of row tile r reads 16 bytes at over_v
    + (r·steps + step)·512 + 16·lane and 8 at over_o + (r·steps + step)·256 + 8·lane, and adds value k times
    x_of(step, j, k, offset k) (that slot's x for `rows` rows of x; j = (t - g) % 4, the lane's first word) into row
    g + 8·((k / 2) % 2). Returns y [rows, row tiles · 16]."""
    values = w.over_v.view(torch.uint8).view(-1)
    offsets = w.over_o.view(-1)
    y = torch.zeros(rows, -(-out // 16) * 16, dtype=torch.float64)
    for r in range(-(-out // 16)):
        for step in range(w.steps):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                base = (r * w.steps + step)
                v = values[base * 512 + 16 * lane: base * 512 + 16 * lane + 16].view(torch.bfloat16).double()
                o = offsets[base * 256 + 8 * lane: base * 256 + 8 * lane + 8].long()
                for k in range(8):
                    y[:, 16 * r + g + 8 * ((k >> 1) & 1)] += v[k] * x_of(step, (t - g) & 3, k, int(o[k])).double()
    return y


def test_the_kernels_slot_arithmetic_emulated_gives_the_overflow():
    """sp24.cu's OVER path step by step in Python: lane (g, t) of row tile r reads 16 bytes at over_v + (r·steps +
    step)·512 + 16·lane and 8 at over_o + (r·steps + step)·256 + 8·lane, multiplies value k by staged x at byte
    64·(8·step + (t - g) % 4 + 4·(k / 4)) + offset k, into row g + 8·((k / 2) % 2); the quad's sums are the
    overflow's product."""
    out, in_features, batch = 24, 320, 3
    weight = capped_weight(out, in_features, seed=11).float()
    split = split_overflow(weight.bfloat16())
    w = tile_overflow(split)
    x = torch.randn(batch, in_features).bfloat16()
    staged = stage(torch.cat([x.float(), torch.zeros(batch, w.steps * 256 - in_features)], 1)).float()
    y = emulate_slots(w, out, batch, lambda step, j, k, o: staged[:, (64 * (8 * step + j + 4 * (k >> 2)) + o) // 2])
    over = weight.double() - split.w24.to_dense().double()
    assert torch.allclose(y[:, :out], x.double() @ over.T, rtol=1e-12, atol=1e-12)


def stage_columns(staged, rows):
    """sp24.cu's column-major copy (OVER 3) of a staging as `stage` returns it: place q of the staged row (its
    byte / 2) holds 8·NT rows of x, `rows` of them real, the rest zeros; emulated from the kernel's own index
    arithmetic (unit u's element e at place 32·(u / 4) + 2·(u % 4) + 8·(e / 2) + e % 2, row r at 2r)."""
    batch, places = staged.shape
    copy = torch.zeros(places, rows, dtype=staged.dtype)
    for u in range(places // 8):
        for e in range(8):
            place = 32 * (u >> 2) + 2 * (u & 3) + 8 * (e >> 1) + (e & 1)
            # stage_unit wrote element e of unit u at byte 64·(u / 4) + 4·(u % 4) + 16·(e / 2) + 2·(e % 2)
            source = (64 * (u >> 2) + 4 * (u & 3) + 16 * (e >> 1) + 2 * (e & 1)) // 2
            copy[place, :batch] = staged[:, source]
    return copy


@pytest.mark.parametrize("batch", [1, 3, 8, 11])
def test_the_column_order_emulated_gives_the_overflow(batch):
    """OVER 3 step by step: the copy places column c where its staged byte / 2 is (so the slot's staged offset / 2
    finds it, with no new format), and a lane's slot k reads 8·NT rows of x at place 32·(8·step + (t - g) % 4) +
    128·(k / 4) + offset k / 2 of the copy."""
    out, in_features = 24, 320
    rows = 8 if batch <= 8 else 16
    weight = capped_weight(out, in_features, seed=12).float()
    split = split_overflow(weight.bfloat16())
    w = tile_overflow(split)
    x = torch.randn(batch, in_features).bfloat16()
    staged = stage(torch.cat([x.float(), torch.zeros(batch, w.steps * 256 - in_features)], 1)).float()
    copy = stage_columns(staged, rows)
    assert torch.equal(copy[:, :batch].T, staged)  # place q holds staged element q of every row
    y = emulate_slots(w, out, rows, lambda step, j, k, o: copy[32 * (8 * step + j) + 128 * (k >> 2) + (o >> 1)])
    over = weight.double() - split.w24.to_dense().double()
    assert torch.allclose(y[:batch, :out], x.double() @ over.T, rtol=1e-12, atol=1e-12)
    assert not y[batch:].any()  # rows past the batch read zeros


def emulate_slot_mmas(w, out, copy):
    """sp24.cu's OVER 4 (over_mma_step) in Python from its own index arithmetic: per row tile, step and k-tile j, lane
    (g, t)'s four A registers (its two 32-bit words of k-tile j where it holds that k-tile, else zeros), read as
    mma.sp m16n8k32's A under the constant metadata 0xEEEE4444 (lanes t = 0, 1 hold groups 4t..4t+3, row g's
    nibbles in bits 0-15, row g + 8's in bits 16-31, each the lower kept position in bits 0-1 and the upper in bits
    2-3); B row l from the copy at the place that lane l's holder lane passes by shuffle. Returns y [rows of the
    copy, row tiles · 16]."""
    values = w.over_v.view(torch.int32).view(-1)
    offsets = w.over_o.view(torch.int32).view(-1)
    meta = 0xEEEE4444
    rows = copy.shape[1]
    y = torch.zeros(rows, -(-out // 16) * 16, dtype=torch.float64)

    def halves(word):
        pair = torch.tensor([word], dtype=torch.int32).view(w.over_v.dtype)
        return pair.double().tolist()

    for r in range(-(-out // 16)):
        for step in range(w.steps):
            base = r * w.steps + step
            words = values[base * 128: base * 128 + 128].view(32, 4).tolist()
            offset_words = offsets[base * 64: base * 64 + 64].view(32, 2).tolist()
            for j in range(8):
                a = torch.zeros(16, 32, dtype=torch.float64)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    j0 = (t - g) & 3
                    upper = ((g + j0) & 4) != 0
                    holds = (j & 3) == j0
                    low, high = holds and upper == (j >= 4), holds and upper != (j >= 4)
                    w0, w1 = (words[lane][0], words[lane][1]) if j < 4 else (words[lane][2], words[lane][3])
                    regs = [w0 if low else 0, w1 if low else 0, w0 if high else 0, w1 if high else 0]
                    for i, reg in enumerate(regs):  # a0 / a1: group t of rows g / g + 8, a2 / a3: group t + 4
                        row, group = g + 8 * (i & 1), t + 4 * (i >> 1)
                        nibble = (meta >> (16 * (i & 1) + 4 * (group % 4))) & 0xF
                        lo, hi = halves(reg)
                        a[row, 4 * group + (nibble & 3)] += lo
                        a[row, 4 * group + (nibble >> 2)] += hi
                b = torch.zeros(32, rows, dtype=torch.float64)
                for lane in range(32):
                    holder = (((lane & 28) - 4 * j) & 28) | ((lane >> 2) & 3)
                    word = offset_words[holder][j >> 2] & 0xFFFFFFFF
                    offset = (word >> (8 * (lane & 3))) & 0xFF  # the staged byte: place · 2
                    b[lane] = copy[32 * (8 * step + j) + offset // 2]
                y[:, 16 * r: 16 * r + 16] += (a @ b).T
    return y


@pytest.mark.parametrize("batch", [2, 8, 13])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tensor_core_slot_loop_emulated_gives_the_overflow(batch, dtype):
    """OVER 4 step by step: each k-tile's slots as one mma.sp whose A is built from the holder lanes' words and
    whose B rows the ldmatrix addresses gather from the column copy give the overflow's product, odd rows and a
    k-tile tail included."""
    out, in_features = 24, 320
    rows = 8 if batch <= 8 else 16
    weight = capped_weight(out, in_features, dtype=dtype, seed=13).float()
    split = split_overflow(weight.to(dtype))
    w = tile_overflow(split)
    x = torch.randn(batch, in_features).to(dtype)
    staged = stage(torch.cat([x.float(), torch.zeros(batch, w.steps * 256 - in_features)], 1)).double()
    y = emulate_slot_mmas(w, out, stage_columns(staged, rows))
    over = weight.double() - split.w24.to_dense().double()
    assert over.abs().sum() > 0
    assert torch.allclose(y[:batch, :out], x.double() @ over.T, rtol=1e-12, atol=1e-12)
    assert not y[batch:].any()


def test_glu_order_keeps_each_row_with_its_slots():
    """A GLU-tiled weight's slots, read as the kernel's lanes read them, give row glu_order[r] of the overflow's
    product in tiled row r (the row the MMAs of that tile compute), and the inverses give the weight back."""
    from sparsedecoding.kernels.sp24 import glu_order

    out, in_features, batch = 64, 256, 2
    weight = capped_weight(out, in_features, seed=3)
    split = split_overflow(weight)
    w = tile_overflow(split, glu=True)
    assert w.glu and torch.equal(tiled_to_dense(w), weight.double())
    values, _ = untile_slots(w)
    assert torch.equal(values, split.values)
    x = torch.randn(batch, in_features).bfloat16()
    staged = stage(torch.cat([x.float(), torch.zeros(batch, w.steps * 256 - in_features)], 1)).float()
    y = emulate_slots(w, out, batch, lambda step, j, k, o: staged[:, (64 * (8 * step + j + 4 * (k >> 2)) + o) // 2])
    over = weight.double() - split.w24.to_dense().double()
    assert not torch.equal(glu_order(out), torch.arange(out))
    assert torch.allclose(y, (x.double() @ over.T)[:, glu_order(out)], rtol=1e-12, atol=1e-12)


def test_refusals_are_one_clear_error():
    weight = capped_weight(32, 256, "16:32+4", seed=1)
    with pytest.raises(KernelInputError, match="at most 2"):
        tile_overflow(split_overflow(weight, 4))
    w = tile_overflow(split_overflow(capped_weight(32, 256)))
    with pytest.raises(KernelInputError, match="overflow slots"):
        untile(w)
    with pytest.raises(KernelInputError, match="no overflow slots"):
        untile_slots(tile(split_overflow(capped_weight(32, 256)).w24))


def test_the_loop_setting_is_checked_and_keys_the_tuned_launch(monkeypatch):
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING as OVER_LOOP_SETTING, KernelChoiceError, \
        sp24_over_loop_setting
    from sparsedecoding.kernels.sp24 import problem_key

    w = tile_overflow(split_overflow(capped_weight(32, 256)))
    plain = tile(split_overflow(capped_weight(32, 256)).w24)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    monkeypatch.delenv(OVER_LOOP_SETTING, raising=False)
    assert sp24_over_loop_setting() == "auto"  # measured no slower than either order at any batch
    keys = {}
    for value in ("rows", "slots", "auto"):
        monkeypatch.setenv(OVER_LOOP_SETTING, value)
        keys[value] = (problem_key(x, w), problem_key(x, plain))
    assert len({k[0] for k in keys.values()}) == 3  # one tuned launch per loop order
    assert len({k[1] for k in keys.values()}) == 1  # a plain 2:4 weight does not depend on it
    monkeypatch.setenv(OVER_LOOP_SETTING, "fast")
    with pytest.raises(KernelChoiceError, match="use rows"):
        sp24_over_loop_setting()


def test_auto_loop_order_resolves_by_batch(monkeypatch):
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
    from sparsedecoding.kernels.sp24 import COLUMNS, MMA, min_splits, over_loop

    w = tile_overflow(split_overflow(capped_weight(32, 8192)))
    plain = tile(split_overflow(capped_weight(32, 8192)).w24)
    monkeypatch.delenv(SP24_OVER_LOOP_SETTING, raising=False)
    assert [over_loop(w, b) for b in (1, 4, 5, 8, 9, 12, 13, 16)] == [1, 1, MMA, MMA, 1, 1, MMA, MMA]
    assert {over_loop(plain, b) for b in range(1, 17)} == {1}
    auto = [min_splits(w, b) for b in range(1, 17)]
    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, "columns")
    assert [over_loop(w, b) for b in (1, 16)] == [COLUMNS, COLUMNS]
    columns = [min_splits(w, b) for b in range(1, 17)]
    assert auto[4:8] == columns[4:8] and auto[12:] == columns[12:]  # auto stages the column copy there too
    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, "rows")
    assert [over_loop(w, b) for b in (1, 8, 16)] == [1, 1, 1]
    rows = [min_splits(w, b) for b in range(1, 17)]
    assert auto[:4] == rows[:4] and auto[8:12] == rows[8:12]
    assert any(c > r for c, r in zip(columns, rows))  # the copy costs shared memory at this width
    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, "mma")
    assert {over_loop(w, b) for b in range(1, 17)} == {MMA}
    assert [min_splits(w, b) for b in range(1, 17)] == columns  # the same column copy
    assert {over_loop(plain, b) for b in range(1, 17)} == {1}


def test_the_tensor_core_loop_takes_16_bit_values_only(monkeypatch):
    """Under SPARSEDECODING_SP24_OVER_LOOP=mma a weight of int8 / int4 codes with slots takes auto's order (the
    kernel has no tensor-core slot loop for codes)."""
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
    from sparsedecoding.engine.loading import random_quantized
    from sparsedecoding.kernels.overflow import split_overflow_quantized
    from sparsedecoding.kernels.sp24 import COLUMNS, over_loop

    for quantize in ("int8", "int4"):
        packed = random_quantized(32, 1024, SparsityPattern.parse("16:32+2"), quantize, 128, torch.bfloat16, "cpu",
                                  torch.Generator().manual_seed(5))
        w = tile_overflow(split_overflow_quantized(packed))
        monkeypatch.delenv(SP24_OVER_LOOP_SETTING, raising=False)
        auto = [over_loop(w, b) for b in range(1, 17)]
        assert auto[4] == auto[15] == COLUMNS  # where 16-bit values take the tensor cores, codes the column order
        monkeypatch.setenv(SP24_OVER_LOOP_SETTING, "mma")
        assert [over_loop(w, b) for b in range(1, 17)] == auto


def float64_error(y, x, weight):
    """|y − x·Wᵀ| over one ulp of y plus an fp32 sum of `in` products, computed from the definition."""
    x64, w64 = x.double().cpu(), weight.double().cpu()
    exact = x64 @ w64.T
    bound = torch.finfo(x.dtype).eps * exact.abs() + 2 * x.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs().T) + 1e-300
    return float(((y.double().cpu() - exact).abs() / bound).max())


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["rows", "slots", "auto", "columns", "mma"])
@pytest.mark.parametrize("out,in_features", [(128, 256), (40, 96), (4096, 4096), (1000, 14336), (6144, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_with_slots_matches_float64(out, in_features, dtype, loop, monkeypatch):
    from helpers import sp24_outputs
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING

    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, loop)
    weight = capped_weight(out, in_features, dtype=dtype, seed=out, device="cuda")
    w = tile_overflow(split_overflow(weight))
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, dtype):
        assert float64_error(y, x, weight) <= 1, (out, in_features, batch, splits, slices)


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["auto", "mma"])
def test_glu_with_slots_matches_float64(loop, monkeypatch):
    from sparsedecoding.kernels.sp24 import GluReference, sp24_mm
    from sparsedecoding.kernels.autotune import Float64Reference
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING

    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, loop)

    weight = capped_weight(512, 1024, seed=7, device="cuda")
    w = tile_overflow(split_overflow(weight), glu=True)
    for batch in (1, 7, 16):
        x = torch.randn(batch, 1024, device="cuda").bfloat16()
        reference = GluReference(Float64Reference.of_rows(x, 512, lambda r0, r1: weight[r0:r1].double()),
                                 torch.bfloat16)
        for splits in (None, 1, 2):
            assert reference.error(sp24_mm(x, w, splits)) <= 1, (batch, splits)


@pytest.mark.gpu
def test_dense_expansion_with_slots():
    """The GPU expansion of a slotted weight is the weight (the RMSNorm in front of slots is checked in
    test_sp24_slots.py since the two paths compose)."""
    from sparsedecoding.kernels.sp24 import to_dense

    weight = capped_weight(1000, 1536, seed=2, device="cuda")
    w = tile_overflow(split_overflow(weight))
    assert torch.equal(to_dense(w), weight)


@pytest.mark.gpu
def test_timed_tuner_keeps_slotted_weights_from_batch_5_in_the_default_build(monkeypatch):
    """Under timed, the default: a slotted weight's launches at batch 1-4 are timed in both builds (the fastest
    kept), from batch 5 on only in the default build (`sp24.times_both_builds`); the kept launch matches float64."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_EARLY_TRIGGER_SETTING

    monkeypatch.delenv(SP24_EARLY_TRIGGER_SETTING, raising=False)
    monkeypatch.setenv("SPARSEDECODING_SP24_PDL", "1")
    weight = capped_weight(2048, 4096, seed=45, device="cuda")
    w = tile_overflow(split_overflow(weight))
    for batch, builds in ((2, {True, False}), (8, {False})):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        launch = sp24.tuned_launch(x, w)
        assert {choice[2] for choice in sp24.launch_timings(sp24.problem_key(x, w))} == builds, batch
        assert launch.early_trigger in builds
        assert float64_error(launch(x, w), x, weight) <= 1, batch
