"""The tiled 2:4 sparse tensor-core kernel (`kernels/sp24.py`, `csrc/sp24.cu`): on CPU, the tiled layout read back
through mma.sp's register semantics equals the packed weight (bf16, fp16, int8, int4 with several group sizes,
odd shapes), the x staging permutation gives each lane the B registers the instruction expects, and bad inputs
raise; on GPU, the kernel against a float64 product (batch 1-16, split-K, graph replay)."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.kernels.sp24 import meta_codes, min_splits, sp24_mm, tile, tiled_to_dense, untile

from helpers import fake_sp24_libraries, random_nm_weight, sp24_outputs
from test_cuda_mma_codes import float64_error, grid_weight

SHAPES = [(16, 256), (40, 96), (128, 544), (24, 1024)]


# --- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out,in_features", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_values_read_back_to_the_weight(out, in_features, dtype):
    weight = random_nm_weight(out, in_features, 2, 4, dtype, seed=out + in_features)
    packed = pack_nm(weight, 2, 4)
    assert torch.equal(tiled_to_dense(tile(packed)), packed.to_dense().double())


@pytest.mark.parametrize("out,in_features", SHAPES)
def test_tiled_int8_codes_read_back_to_the_weight(out, in_features):
    packed = pack_nm_quantized(grid_weight(out, in_features, "int8"), 2, 4, "int8", in_features)
    assert torch.equal(tiled_to_dense(tile(packed)), packed.to_dense(torch.float64))


@pytest.mark.parametrize("group", [32, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("out,in_features", [(40, 1024), (16, 2048)])
def test_tiled_int4_codes_read_back_to_the_weight(group, out, in_features):
    packed = pack_nm_quantized(grid_weight(out, in_features, "int4", group), 2, 4, "int4", group)
    assert torch.equal(tiled_to_dense(tile(packed)), packed.to_dense(torch.float64))


def _same_packed(a, b) -> bool:
    fields = ("values", "bitmask") if not hasattr(a, "codes") else ("codes", "scales", "bitmask")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) and a.shape == b.shape and (
        a.n, a.m, getattr(a, "quantize", None), getattr(a, "group_size", None)) == (
        b.n, b.m, getattr(b, "quantize", None), getattr(b, "group_size", None))


@pytest.mark.parametrize("out,in_features", SHAPES)
def test_untile_gives_back_the_packed_weight(out, in_features):
    seed = out * in_features
    cases = [pack_nm(random_nm_weight(out, in_features, 2, 4, torch.bfloat16, seed=seed), 2, 4),
             pack_nm(random_nm_weight(out, in_features, 2, 4, torch.float16, seed=seed + 1), 2, 4),
             pack_nm_quantized(grid_weight(out, in_features, "int8", seed=seed), 2, 4, "int8", in_features),
             pack_nm_quantized(grid_weight(out, in_features, "int4", 32, seed=seed), 2, 4, "int4", 32)]
    for packed in cases:
        assert _same_packed(untile(tile(packed)), packed)


def _glu_cases(out, in_features, seed):
    return [pack_nm(random_nm_weight(out, in_features, 2, 4, torch.bfloat16, seed=seed), 2, 4),
            pack_nm_quantized(grid_weight(out, in_features, "int8", seed=seed), 2, 4, "int8", in_features),
            pack_nm_quantized(grid_weight(out, in_features, "int4", 64, seed=seed), 2, 4, "int4", 64)]


@pytest.mark.parametrize("out,in_features", [(32, 256), (96, 576), (64, 1024)])
def test_glu_tiling_pairs_gate_and_up_tiles_and_reads_back_in_order(out, in_features):
    from dataclasses import replace

    from sparsedecoding.kernels.sp24 import glu_order

    order = glu_order(out)
    half = out // 2
    assert order[:16].tolist() == list(range(16)) and order[16:32].tolist() == list(range(half, half + 16))
    assert sorted(order.tolist()) == list(range(out))
    for packed in _glu_cases(out, in_features, seed=out + in_features):
        w = tile(packed, glu=True)
        assert w.glu and w.out_features == half
        dense = packed.to_dense(torch.float64) if hasattr(packed, "codes") else packed.to_dense().double()
        assert torch.equal(tiled_to_dense(w), dense)
        as_tiled = tiled_to_dense(replace(w, glu=False))  # row tile 2k is gate tile k, 2k + 1 up tile k
        for k in range(half // 16):
            assert torch.equal(as_tiled[32 * k:32 * k + 16], dense[16 * k:16 * k + 16])
            assert torch.equal(as_tiled[32 * k + 16:32 * k + 32], dense[half + 16 * k:half + 16 * k + 16])
        assert _same_packed(untile(w), packed)


def test_reference_rows_are_the_packed_weights_rows():
    from sparsedecoding.kernels.sp24 import _dense_rows

    packed = pack_nm(random_nm_weight(48, 256, 2, 4, torch.bfloat16, seed=1), 2, 4)
    assert torch.equal(_dense_rows(packed, 16, 40), packed.to_dense().double()[16:40])
    codes = pack_nm_quantized(grid_weight(48, 256, "int4", 32), 2, 4, "int4", 32)
    assert torch.equal(_dense_rows(codes, 8, 48), codes.to_dense(torch.float64)[8:48])


def test_glu_needs_whole_tile_pairs():
    with pytest.raises(KernelInputError, match="multiple of 32 rows"):
        tile(pack_nm(random_nm_weight(48, 256, 2, 4, torch.bfloat16, seed=2), 2, 4), glu=True)


def test_glu_reference_bounds_the_rounded_activation_and_catches_a_wrong_one():
    from sparsedecoding.kernels.autotune import Float64Reference
    from sparsedecoding.kernels.sp24 import GluReference

    weight = random_nm_weight(64, 512, 2, 4, torch.bfloat16, seed=9).double()
    x = torch.randn(3, 512).bfloat16()
    reference = GluReference(Float64Reference.of_rows(x, 64, lambda r0, r1: weight[r0:r1]), torch.bfloat16)
    product = x.double() @ weight.T
    exact = torch.nn.functional.silu(product[:, :32]) * product[:, 32:]
    assert torch.allclose(reference.exact, exact)
    assert reference.error(exact.bfloat16()) <= 1
    assert reference.error((product[:, :32] * product[:, 32:]).bfloat16()) > 1  # the activation left out


def test_clone_copies_every_tensor():
    w = tile(pack_nm_quantized(grid_weight(32, 512, "int4", 128), 2, 4, "int4", 128))
    c = w.clone()
    assert c.a is not w.a and c.meta is not w.meta and c.scales is not w.scales and c.row_scales is None
    assert _same_packed(untile(c), untile(w))


def test_int4_group_not_a_power_of_two_raises():
    packed = pack_nm_quantized(grid_weight(16, 384, "int4", 96), 2, 4, "int4", 96)
    with pytest.raises(KernelInputError, match="power-of-two"):
        tile(packed)


def test_meta_codes_name_the_two_kept_positions():
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]  # the six 2-of-4 nibbles
    chosen = [[pairs[(i + q) % 6] for q in range(8)] for i in range(6)]
    words = torch.tensor([[sum((1 << a | 1 << b) << (4 * q) for q, (a, b) in enumerate(row))] for row in chosen])
    codes = meta_codes(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32))
    for i, row in enumerate(chosen):
        for q, (a, b) in enumerate(row):
            nibble = int(codes[i, 0] >> (4 * q)) & 0xF
            assert (nibble & 3, nibble >> 2) == (a, b)


def test_mask_without_two_per_group_raises():
    weight = random_nm_weight(16, 64, 2, 4, torch.bfloat16, seed=1)
    packed = pack_nm(weight, 2, 4)
    bad = packed.bitmask.clone()
    bad[0, 0] = 0x7  # three kept in the first group
    with pytest.raises(KernelInputError, match="exactly 2"):
        meta_codes(bad)


def test_pattern_other_than_2of4_raises():
    packed = pack_nm(random_nm_weight(16, 64, 16, 32, torch.bfloat16, seed=2), 16, 32)
    with pytest.raises(KernelInputError, match="2:4"):
        tile(packed)


def test_emulated_x_staging_gives_each_lane_its_b_registers():
    """sp24.cu stages 8 columns (unit u) at byte 64·(u >> 2) + 4·(u & 3) + 16·pair, and lane (g, t) reads 16 bytes
    at 64·s + 16·t; register i element j must be column 32·s + 2t + 8i + j (mma.sp's B layout)."""
    columns = 96
    staged = [None] * (columns // 2)  # 4-byte slots, 2 columns each
    for u in range(columns // 8):
        for pair in range(4):
            slot = (64 * (u >> 2) + 4 * (u & 3) + 16 * pair) // 4
            staged[slot] = (8 * u + 2 * pair, 8 * u + 2 * pair + 1)
    for s in range(columns // 32):
        for t in range(4):
            for i in range(4):
                assert staged[(64 * s + 16 * t) // 4 + i] == (32 * s + 2 * t + 8 * i, 32 * s + 2 * t + 8 * i + 1)


def test_tuner_candidates_leave_every_slice_a_step_and_fit_shared_memory():
    from sparsedecoding.kernels.sp24 import SLICES, _candidates

    w = tile(pack_nm(random_nm_weight(256, 4096, 2, 4, torch.bfloat16, seed=3), 2, 4))  # 16 steps
    for batch in (1, 16):
        low = min_splits(w, batch)
        found = _candidates(w, batch, sms=132, low=low)
        assert {slices for slices, _ in found} == set(SLICES)
        assert (1, low) in found and (1, 16) in found
        for slices, splits in found:
            assert low <= splits <= w.steps and -(-w.steps // splits) >= slices
        assert (8, 3) not in found  # 6 steps a split cannot give 8 warps one each


def test_tuner_rotation_reads_three_l2_caches_within_the_copy_limit():
    from sparsedecoding.kernels.sp24 import TUNE_ROTATION_L2S, _MAX_COPIES, rotation_copies

    l2 = 60 << 20
    o_int4 = 6_422_528  # a 4096x4096 2:4 + int4 weight's tiled bytes, about
    copies = rotation_copies(o_int4, l2)
    assert TUNE_ROTATION_L2S == 3 and (copies + 1) * o_int4 >= 3 * l2 > copies * o_int4
    assert rotation_copies(o_int4, l2, l2s=2, most=8) == 8  # the tuner before: 58 MB a round, inside the L2
    assert rotation_copies(4 * l2, l2) == 0  # a weight past three L2s rotates alone
    assert rotation_copies(1000, l2) == _MAX_COPIES


def test_forgetting_a_tuning_drops_only_that_problem(monkeypatch):
    import sparsedecoding.kernels.sp24 as sp24

    for name in ("_launches", "_timings", "_choices"):
        monkeypatch.setattr(sp24, name, {"a": 1, "b": 2})
    sp24.forget_tuning("a")
    sp24.forget_tuning("missing")
    assert sp24._launches == sp24._timings == sp24._choices == {"b": 2}


def test_interleaved_timing_checks_its_rounds_before_any_capture():
    from sparsedecoding.kernels.autotune import interleaved_replay_ms

    assert interleaved_replay_ms([], [object()]) == []
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        interleaved_replay_ms([lambda weight: None], [object()], rounds=0)


def test_slices_other_than_a_divisor_of_the_warps_raise():
    from sparsedecoding.kernels.sp24 import Sp24Launch

    w = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    with pytest.raises(KernelInputError, match="slices = 3"):
        Sp24Launch(torch.randn(1, 256).bfloat16(), w, 1, 3)


def test_sp24_builds_follow_the_half_meta_setting(monkeypatch):
    """SPARSEDECODING_SP24_HALF_META=0 loads a second library built with -DSP24_HALF_META=0 (the default build has
    no such flag), each kept once."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_HALF_META_SETTING, KernelChoiceError, settings

    built = fake_sp24_libraries(monkeypatch)
    monkeypatch.delenv(SP24_HALF_META_SETTING, raising=False)
    default = sp24._load()
    monkeypatch.setenv(SP24_HALF_META_SETTING, "0")
    full = sp24._load()
    assert full is not default and sp24._load() is full and sp24._load(half_meta=True) is default
    sp24._load(columns=True)
    assert built == [(), ("-DSP24_HALF_META=0",), ("-DSP24_COLUMNS", "-DSP24_HALF_META=0")]
    monkeypatch.setenv(SP24_HALF_META_SETTING, "half")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_HALF_META='half'"):
        settings()


def test_sp24_builds_follow_the_early_trigger_setting(monkeypatch):
    """SPARSEDECODING_SP24_EARLY_TRIGGER=1 loads a library built with -DSP24_EARLY_TRIGGER=1 (the default build has no
    such flag), each kept once and beside the other builds' flags; a tuned launch is not reused across the two; a
    value other than auto, 0 or 1 is refused by name."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_EARLY_TRIGGER_SETTING, KernelChoiceError, settings

    built = fake_sp24_libraries(monkeypatch)
    monkeypatch.delenv(SP24_EARLY_TRIGGER_SETTING, raising=False)
    default = sp24._load()
    w = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    x = torch.randn(1, 256).bfloat16()
    key = sp24.problem_key(x, w)
    monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "1")
    early = sp24._load()
    assert early is not default and sp24._load() is early and sp24._load(early_trigger=False) is default
    assert sp24.problem_key(x, w) != key
    sp24._load(columns=True, int8_ks=8)
    assert built == [(), ("-DSP24_EARLY_TRIGGER=1",),
                     ("-DSP24_COLUMNS", "-DSP24_INT8_KS=8", "-DSP24_EARLY_TRIGGER=1")]
    monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "early")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_EARLY_TRIGGER='early'"):
        settings()


def _plain_and_slotted():
    """(a plain 2:4 bf16 tiled weight 16x256, a 16:32+2 one 32x1024 with slots, x for each, 8 rows), on the CPU."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.overflow import split_overflow
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.solvers import capped_keep_mask

    plain = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    weight = random_nm_weight(32, 1024, 16, 32, torch.bfloat16, seed=5)
    slotted = sp24.tile_overflow(split_overflow(weight * capped_keep_mask(weight.abs(), SparsityPattern.parse(
        "16:32+2"))))
    return plain, slotted, torch.randn(8, 256).bfloat16(), torch.randn(8, 1024).bfloat16()


def test_sp24_builds_follow_the_mma_ctas_setting(monkeypatch):
    """SPARSEDECODING_SP24_MMA_CTAS=1 asks launches of the tensor-core slot order for a build with
    -DSP24_OVER_MMA_CTAS=1 (the default asks for none); a slotted weight's tuned launch is not reused across the two
    values, a plain 2:4 weight's is; a value other than 1 or 2 is refused by name."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_MMA_CTAS_SETTING, KernelChoiceError, settings, sp24_mma_ctas_setting

    built = fake_sp24_libraries(monkeypatch)
    monkeypatch.delenv(SP24_MMA_CTAS_SETTING, raising=False)
    assert sp24_mma_ctas_setting() == 2
    plain, slotted, x, x_slotted = _plain_and_slotted()
    keys = sp24.problem_key(x, plain), sp24.problem_key(x_slotted, slotted)
    two = sp24._load(columns=True)
    monkeypatch.setenv(SP24_MMA_CTAS_SETTING, "1")
    assert sp24_mma_ctas_setting() == 1
    one = sp24._load(columns=True, mma_ctas=1)
    assert one is not two and sp24._load(columns=True, mma_ctas=2) is two
    assert built == [("-DSP24_COLUMNS",), ("-DSP24_COLUMNS", "-DSP24_OVER_MMA_CTAS=1")]
    assert sp24.problem_key(x, plain) == keys[0] and sp24.problem_key(x_slotted, slotted) != keys[1]
    monkeypatch.setenv(SP24_MMA_CTAS_SETTING, "3")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_MMA_CTAS='3'"):
        settings()


def test_sp24_builds_follow_the_multicast_setting(monkeypatch):
    """SPARSEDECODING_SP24_MULTICAST=2 (the default) or 4 asks plain launches (no RMSNorm in front, no slots, not
    dense) for a build with -DSP24_MULTICAST=C, after the other defines (the order the offline builds use), and keeps
    their tuned launches apart from those under 0; launches with the RMSNorm in front and slotted weights keep theirs;
    a value other than 0, 2 or 4 is refused by name."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_MULTICAST_SETTING, KernelChoiceError, settings, sp24_multicast_setting

    built = fake_sp24_libraries(monkeypatch)
    monkeypatch.delenv(SP24_MULTICAST_SETTING, raising=False)
    assert sp24_multicast_setting() == 2
    monkeypatch.setenv(SP24_MULTICAST_SETTING, "0")
    plain, slotted, x, x_slotted = _plain_and_slotted()
    keys = sp24.problem_key(x, plain), sp24.problem_key(x, plain, norm=True), sp24.problem_key(x_slotted, slotted)
    assert sp24.multicast_of(plain, False) == 0
    monkeypatch.setenv(SP24_MULTICAST_SETTING, "2")
    assert sp24.multicast_of(plain, False) == 2
    assert sp24.multicast_of(plain, True) == 0 and sp24.multicast_of(slotted, False) == 0
    assert sp24.problem_key(x, plain) != keys[0]
    assert sp24.problem_key(x, plain, norm=True) == keys[1] and sp24.problem_key(x_slotted, slotted) == keys[2]
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, sp24.problem_key(x, plain)))["multicast"] == 2
    sp24._load(early_trigger=True, multicast=2)
    sp24._load(early_trigger=False, multicast=4)
    assert built == [("-DSP24_EARLY_TRIGGER=1", "-DSP24_MULTICAST=2"), ("-DSP24_MULTICAST=4",)]
    monkeypatch.setenv(SP24_MULTICAST_SETTING, "3")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_MULTICAST='3'"):
        settings()


def test_multicast_needs_compute_capability_9(monkeypatch):
    """Clusters and multicast bulk copies exist from compute capability 9.0: a CUDA device below it gets no multicast
    build whatever the setting (an A100 or L40S keeps the plain build), one at 9.0 gets the setting's."""
    import sparsedecoding.kernels.sp24 as sp24

    capability = {"value": (8, 0)}
    monkeypatch.setattr(sp24.torch.cuda, "get_device_capability", lambda device=None: capability["value"])
    cuda = torch.device("cuda", 0)
    assert not sp24.clusters_on(cuda)
    for value in ((8, 6), (8, 9)):
        capability["value"] = value
        assert not sp24.clusters_on(cuda)
    capability["value"] = (9, 0)
    assert sp24.clusters_on(cuda)
    assert sp24.clusters_on(torch.device("cpu"))


def test_auto_early_trigger_follows_the_engine_measurements(monkeypatch):
    """Under auto (and first under timed, the default) a launch takes the early-trigger build for 2:4 bf16 values and
    int8 codes (steps of 16) and for slotted bf16 weights at batch 1-4, the default build for int4 codes, dense int8
    weights, int8 codes in steps of 8, slotted codes and slotted weights from batch 5 on; 0 and 1 force either for
    every launch; the builds no launch chose (a probe, a prefill's expansion) stay the default."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_EARLY_TRIGGER_SETTING
    from sparsedecoding.kernels.overflow import split_overflow, split_overflow_quantized
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.solvers import capped_keep_mask

    from helpers import coded_24, slotted_codes

    bf16 = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    int8, int4 = tile(coded_24("int8", 32, 512)), tile(coded_24("int4", 32, 512))
    dense = sp24.tile_dense(torch.randint(-127, 128, (32, 256), dtype=torch.int8), torch.ones(32, dtype=torch.bfloat16),
                            "int8", 256)
    slotted_int8 = sp24.tile_overflow(split_overflow_quantized(slotted_codes("int8", 32, 1024, seed=1)))
    weight = random_nm_weight(32, 1024, 16, 32, torch.bfloat16, seed=5)
    slotted = sp24.tile_overflow(split_overflow(weight * capped_keep_mask(weight.abs(), SparsityPattern.parse(
        "16:32+2"))))
    monkeypatch.setenv("SPARSEDECODING_SP24_INT8_STEP", "8")
    int8_step8 = tile(coded_24("int8", 32, 512))
    monkeypatch.delenv("SPARSEDECODING_SP24_INT8_STEP")
    cases = [(bf16, 1), (bf16, 16), (int8, 1), (int8, 8), (int4, 1), (dense, 1), (int8_step8, 1), (slotted, 1),
             (slotted, 4), (slotted, 5), (slotted, 12), (slotted_int8, 1)]
    monkeypatch.delenv(SP24_EARLY_TRIGGER_SETTING, raising=False)
    assert [sp24.early_trigger(w, b) for w, b in cases] == [True] * 4 + [False] * 3 + [True] * 2 + [False] * 3
    built = fake_sp24_libraries(monkeypatch)
    sp24._load()
    assert built == [()]
    for value in ("0", "1"):
        monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, value)
        assert [sp24.early_trigger(w, b) for w, b in cases] == [value == "1"] * len(cases)


def test_timed_early_trigger_starts_from_the_auto_choice_and_keys_its_own_launches(monkeypatch):
    """SPARSEDECODING_SP24_EARLY_TRIGGER=timed (the default, unset too): every launch's first build is auto's (the
    tuners then time the other build too, a GPU test below) except for slotted weights from batch 5 on, which keep
    the default build untimed against the other; a launch tuned under timed is not reused under auto; `+e` marks
    the early build in reports only under timed, where the setting does not say which build ran."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import (SP24_EARLY_TRIGGER_SETTING, settings_line, sp24_early_trigger_setting,
                                           sp24_early_trigger_timed)
    from sparsedecoding.kernels.overflow import split_overflow
    from sparsedecoding.patterns import SparsityPattern
    from sparsedecoding.solvers import capped_keep_mask

    from helpers import coded_24

    bf16 = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    int4 = tile(coded_24("int4", 32, 512))
    weight = random_nm_weight(32, 1024, 16, 32, torch.bfloat16, seed=5)
    slotted = sp24.tile_overflow(split_overflow(weight * capped_keep_mask(weight.abs(), SparsityPattern.parse(
        "16:32+2"))))
    x = torch.randn(1, 256).bfloat16()
    monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "auto")
    key = sp24.problem_key(x, bf16)
    assert sp24.choice_label((1, 4, True, 0)) == "1/4s" and not sp24_early_trigger_timed()
    assert not any(sp24.times_both_builds(w, b) for w, b in ((bf16, 1), (int4, 1), (slotted, 1)))
    for unset in (False, True):
        if unset:
            monkeypatch.delenv(SP24_EARLY_TRIGGER_SETTING)
        else:
            monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "timed")
        assert sp24_early_trigger_setting() is None and sp24_early_trigger_timed()
        assert [sp24.early_trigger(bf16, 1), sp24.early_trigger(int4, 1)] == [True, False]
        assert [sp24.times_both_builds(w, b) for w, b in ((bf16, 1), (bf16, 16), (int4, 8), (slotted, 1),
                                                            (slotted, 4), (slotted, 5), (slotted, 16))] == [
            True] * 5 + [False] * 2
        assert [sp24.early_trigger(slotted, b) for b in (4, 5)] == [True, False]
        assert sp24.problem_key(x, bf16) != key
        assert [sp24.choice_label(c) for c in ((1, 4, True, 0), (8, 1, False, 0), (2, 2, True, 0))] == [
            "1/4s+e", "8", "2/2s+e"]
        assert f"{SP24_EARLY_TRIGGER_SETTING}=timed" in settings_line()
    monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "1")
    assert not sp24_early_trigger_timed() and not sp24.times_both_builds(bf16, 1)


def test_norm_inputs_are_checked_before_a_launch():
    """The RMSNorm-in-front launch refuses a residual or norm weight of another shape or dtype, with one message
    naming what it got and what it expected (checked before any kernel work, on any device)."""
    from sparsedecoding.kernels.sp24 import check_norm_inputs

    w = tile(pack_nm(random_nm_weight(16, 256, 2, 4, torch.bfloat16, seed=4), 2, 4))
    x = torch.randn(2, 256).bfloat16()
    check_norm_inputs(x, w, torch.randn(2, 256).bfloat16(), torch.ones(256).bfloat16())
    check_norm_inputs(x, w, None, torch.ones(256).bfloat16())
    with pytest.raises(KernelInputError, match=r"res is torch.bfloat16 \(1, 256\) on cpu; expected torch.bfloat16 "
                                               r"\(2, 256\)"):
        check_norm_inputs(x, w, torch.randn(1, 256).bfloat16(), torch.ones(256).bfloat16())
    with pytest.raises(KernelInputError, match="norm weight is torch.float32"):
        check_norm_inputs(x, w, None, torch.ones(256))
    with pytest.raises(KernelInputError, match="norm weight must be contiguous"):
        check_norm_inputs(x, w, None, torch.ones(512).bfloat16()[::2])


@pytest.mark.parametrize("glu", [False, True])
def test_norm_op_fake_gives_the_shapes_compile_traces_with(glu):
    from sparsedecoding.kernels.sp24 import _sp24_norm_fake

    x = torch.empty(3, 256, dtype=torch.bfloat16)
    y, total = _sp24_norm_fake(x, x, torch.empty(256, dtype=torch.bfloat16), 1e-5, x, x, None, None, 64, 256, 0, 1,
                               0, 0, glu)
    assert y.shape == (3, 32 if glu else 64) and y.dtype == x.dtype
    assert total.shape == x.shape and total.dtype == x.dtype


def test_min_splits_keep_staged_x_in_shared_memory():
    packed = pack_nm(random_nm_weight(16, 14336, 2, 4, torch.bfloat16, seed=3), 2, 4)
    w = tile(packed)
    assert min_splits(w, 1) == 1
    assert min_splits(w, 16) > 1
    per = -(-w.steps // min_splits(w, 16))
    assert 16 * (2 * per * 8 * 32 + 64) <= 66 * 1024


@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_to_dense_on_cpu_is_the_packed_weight(kind):
    from sparsedecoding.kernels.sp24 import to_dense

    if kind == "bf16":
        packed = pack_nm(random_nm_weight(40, 96, 2, 4, torch.bfloat16, seed=9), 2, 4)
        expected = packed.to_dense()
    else:
        group = 96 if kind == "int8" else 32
        packed = pack_nm_quantized(grid_weight(40, 96, kind, group), 2, 4, kind, group)
        expected = packed.to_dense(torch.bfloat16)
    assert torch.equal(to_dense(tile(packed)), expected)


@pytest.mark.parametrize("x,message", [
    (torch.randn(1, 32).bfloat16(), r"expected \[64\] or \[batch, 64\]"),
    (torch.randn(1, 64).half(), "runs with torch.bfloat16 activations"),
    (torch.randn(17, 64).bfloat16(), "batch 17 is outside 1..16"),
    (torch.randn(2, 3, 64).bfloat16(), "expected"),
    (torch.randn(64, 2).bfloat16().t(), "not contiguous"),
])
def test_bad_inputs_raise_one_line_before_any_launch(x, message):
    from sparsedecoding.kernels.sp24 import check_inputs

    w = tile(pack_nm(random_nm_weight(16, 64, 2, 4, torch.bfloat16, seed=10), 2, 4))
    with pytest.raises(KernelInputError, match=message) as info:
        check_inputs(x, w)
    assert "\n" not in str(info.value)


def test_cpu_input_raises_one_line():
    packed = pack_nm(random_nm_weight(16, 64, 2, 4, torch.bfloat16, seed=4), 2, 4)
    with pytest.raises(KernelInputError, match="CUDA"):
        sp24_mm(torch.randn(1, 64).bfloat16(), tile(packed))


# --- GPU ---------------------------------------------------------------------------------------------------------

GPU_SHAPES = [(128, 256), (40, 96), (4096, 4096), (1000, 14336), (6144, 1024)]


@pytest.mark.parametrize("glu", [False, True])
def test_norm_reference_accepts_the_kernels_arithmetic_and_not_a_wrong_scale(glu):
    """`NormReference` (the tuner's check of the RMSNorm-in-front launches) passes the kernel's arithmetic emulated
    in fp32 (u = w ⊙ (x + res) rounded, fp32 sums, fp32 1/rms, y rounded; silu(gate)·up for a GLU weight) and
    fails the same with a wrong 1/rms (off by 2⁻⁶, GLU 2⁻³) or a wrong residual."""
    from sparsedecoding.kernels.sp24 import GluReference, NormReference

    out, in_features, eps = 64, 512, 1e-5
    packed = pack_nm(random_nm_weight(out, in_features, 2, 4, torch.bfloat16, seed=21), 2, 4)
    weight = packed.to_dense()
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, in_features, generator=generator).bfloat16()
    res = torch.randn(3, in_features, generator=generator).bfloat16()
    norm_weight = (1 + torch.randn(in_features, generator=generator) / 4).bfloat16()

    def emulated(scale_error=0.0, residual=res):
        total = (x.float() + residual.float()).bfloat16()
        staged = (norm_weight.float() * total.float()).bfloat16()
        inv_rms = torch.rsqrt(total.float().pow(2).sum(-1, keepdim=True) / in_features + eps) * (1 + scale_error)
        sums = (staged.float() @ weight.float().T) * inv_rms
        if glu:
            gate, up = sums.chunk(2, dim=-1)
            sums = gate / (1 + torch.exp(-gate)) * up
        return sums.bfloat16()

    reference = NormReference(x, res, norm_weight, eps, out, lambda r0, r1: weight[r0:r1].double())
    assert torch.equal(reference.sum, (x.float() + res.float()).bfloat16())
    if glu:
        reference = GluReference(reference, torch.bfloat16)
    assert reference.error(emulated()) <= 1
    assert reference.error(emulated(scale_error=2.0**-3 if glu else 2.0**-6)) > 1  # GLU carries looser bounds
    assert reference.error(emulated(residual=res * (1.5 if glu else 1.01))) > 1


def _packed_on_gpu(kind: str, out: int, in_features: int, seed: int):
    """(a packed 2:4 weight of `kind` on the GPU, its activation dtype): bf16 / fp16 values, int8 (a scale a row)
    or int4 (32 columns a scale) on the solvers' grid."""
    if kind in ("bf16", "fp16"):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        return pack_nm(random_nm_weight(out, in_features, 2, 4, dtype, seed=seed).cuda(), 2, 4), dtype
    group = in_features if kind == "int8" else 32
    return pack_nm_quantized(grid_weight(out, in_features, kind, group).cuda(), 2, 4, kind, group), torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", GPU_SHAPES)
@pytest.mark.parametrize("kind", ["bf16", "fp16", "int8", "int4"])
def test_kernel_matches_float64(out, in_features, kind):
    packed, dtype = _packed_on_gpu(kind, out, in_features, seed=5)
    weight = packed.to_dense() if kind in ("bf16", "fp16") else packed.to_dense(torch.float64)
    w = tile(packed)
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, dtype):
        assert float64_error(y, x, weight) <= 1, (kind, out, in_features, batch, splits, slices)


def test_stream_k_setting_defaults_on_keys_the_launches_and_refuses_other_values(monkeypatch):
    """SPARSEDECODING_SP24_STREAM_K: on unset, 0 turns the tuner's stream-K candidates off (no grid is tried), a
    launch tuned under one value is not reused under the other, and anything but 0 / 1 is refused by name."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_STREAM_K_SETTING, KernelChoiceError, settings, sp24_stream_k_setting

    plain, _, x, _ = _plain_and_slotted()
    monkeypatch.delenv(SP24_STREAM_K_SETTING, raising=False)
    assert sp24_stream_k_setting()
    key = sp24.problem_key(x, plain)
    assert sp24._stream_candidates(plain, 1, 1, False) == [1] and sp24._stream_candidates(plain, 1, 1, True) == []
    monkeypatch.setenv(SP24_STREAM_K_SETTING, "0")
    assert not sp24_stream_k_setting() and sp24._stream_candidates(plain, 1, 1, False) == []
    assert sp24.problem_key(x, plain) != key
    monkeypatch.setenv(SP24_STREAM_K_SETTING, "yes")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_STREAM_K='yes'"):
        settings()


def test_handoff_setting_defaults_on_keys_the_launches_and_refuses_other_values(monkeypatch):
    """SPARSEDECODING_SP24_HANDOFF: on unset, part of the tuned launches' key, anything but 0 / 1 refused by name."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_HANDOFF_SETTING, KernelChoiceError, settings, sp24_handoff_setting

    plain, _, x, _ = _plain_and_slotted()
    monkeypatch.delenv(SP24_HANDOFF_SETTING, raising=False)
    assert sp24_handoff_setting()
    key = sp24.problem_key(x, plain)
    assert dict(zip(sp24.PROBLEM_KEY_FIELDS, key))["handoff"] is True
    monkeypatch.setenv(SP24_HANDOFF_SETTING, "0")
    assert not sp24_handoff_setting() and sp24.problem_key(x, plain) != key
    monkeypatch.setenv(SP24_HANDOFF_SETTING, "maybe")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_HANDOFF='maybe'"):
        settings()


def test_slot_workspace_is_empty_grows_keeps_the_old_and_refuses_capture(monkeypatch):
    """The handoff's workspace: every entry kEmpty (all bits set), at least the size asked, grown by at least doubling
    with the outgrown one kept alive (graphs may hold it), and never allocated during CUDA graph capture."""
    import sparsedecoding.kernels.sp24 as sp24

    monkeypatch.setattr(sp24, "_workspaces", {})
    monkeypatch.setattr(sp24, "_retired", [])
    monkeypatch.setattr(sp24, "_WORKSPACE_FLOATS", 64)
    cpu = torch.device("cpu")
    first = sp24.slot_workspace(cpu, 7, 10)
    assert first.dtype == torch.float32 and first.numel() == 64
    assert bool((first.view(torch.int32) == -1).all()) and bool(first.isnan().all())
    assert sp24.slot_workspace(cpu, 7, 64) is first  # big enough: the same tensor
    grown = sp24.slot_workspace(cpu, 7, 65)
    assert grown.numel() == 128 and sp24._retired == [first] and bool((grown.view(torch.int32) == -1).all())
    assert sp24.slot_workspace(cpu, 8, 1) is not grown  # one a device
    monkeypatch.setattr(sp24, "_capturing", lambda device: True)
    assert sp24.slot_workspace(cpu, 7, 100) is grown
    with pytest.raises(KernelInputError, match="outside CUDA graph capture"):
        sp24.slot_workspace(cpu, 7, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_handoff_matches_counting_bit_for_bit_and_leaves_the_slots_empty(kind, monkeypatch):
    """Split-K (plain, GLU, the RMSNorm in front, slices) and stream-K launches give the same bits with their sums
    added by handoff as by counting, over grids the GPU holds at once and grids it does not (8 splits of 5000 rows
    at batch 16; stream-K over every unit), and leave every slot entry kEmpty and every counter zero behind."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_HANDOFF_SETTING

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for out, in_features, glu in ((5000, 4096, False), (1024, 4096, True), (40, 2048, False)):
        packed, dtype = _packed_on_gpu(kind, out, in_features, seed=31)
        w = tile(packed, glu=glu)
        norm_weight = (1 + torch.randn(in_features, device="cuda") / 4).to(dtype)
        for batch in (1, 9, 16):
            x = torch.randn(batch, in_features, device="cuda").to(dtype)
            res = torch.randn(batch, in_features, device="cuda").to(dtype)
            cases = [dict(splits=s, slices=sl, norm=n) for s, sl in ((2, 1), (3, 2), (8, 1)) for n in (False, True)
                     if s >= min_splits(w, batch) and -(-w.steps // s) >= sl]
            if not glu:
                cases += [dict(ctas=c) for c in (sms, 2 * sms, sp24.stream_units(w)) if sp24.stream_fits(w, batch, c)]
            for case in cases:
                ys = []
                for handoff in ("1", "0"):
                    monkeypatch.setenv(SP24_HANDOFF_SETTING, handoff)
                    launch = sp24.Sp24Launch(x, w, **case)
                    y = launch(x, w, res, norm_weight, 1e-6)[0] if case.get("norm") else launch(x, w)
                    ys.append(launch(x, w, res, norm_weight, 1e-6)[0] if case.get("norm") else launch(x, w))
                    assert torch.equal(ys[-1], y), (kind, out, batch, case, handoff)
                    torch.cuda.synchronize()
                    workspace = sp24._workspaces[0]
                    assert bool((workspace.view(torch.int32) == -1).all()), (kind, out, batch, case, handoff)
                    assert not sp24._counters[0].any(), (kind, out, batch, case, handoff)
                assert torch.equal(ys[0], ys[1]), (kind, out, in_features, batch, case)


def test_stream_k_owner_formula_inverts_the_start():
    """sp24.cu's StreamUnits: CTA c of G takes units [c·V / G, (c + 1)·V / G), and stream_owner(u) =
    ((u + 1)·G - 1) / V must name the CTA whose units hold u (empty ranges, G > V, included), so that a row block's
    last CTA adds exactly the slots of the CTAs that wrote them."""
    for units in (1, 7, 10, 64, 272 * 10, 1009):
        for ctas in (1, 2, 3, 7, 132, 264, units):
            start = [c * units // ctas for c in range(ctas + 1)]
            for u in range(units):
                owner = ((u + 1) * ctas - 1) // units
                assert start[owner] <= u < start[owner + 1], (units, ctas, u)


def test_stream_k_fits_only_where_the_kernel_runs_it():
    from sparsedecoding.kernels import sp24

    plain = tile(pack_nm(random_nm_weight(300, 1024, 2, 4, torch.bfloat16, seed=2), 2, 4))  # 3 row blocks, 4 steps
    assert sp24.stream_units(plain) == 12
    assert sp24.stream_staged_steps(plain, 12) == 1 and sp24.stream_staged_steps(plain, 5) == 3
    assert sp24.stream_staged_steps(plain, 1) == 4  # at most every step, however many units a CTA has
    assert sp24.stream_fits(plain, 16, 12) and not sp24.stream_fits(plain, 1, 13)  # no more CTAs than units
    assert not sp24.stream_fits(plain, 1, 4, norm=True)
    glu = tile(pack_nm(random_nm_weight(256, 1024, 2, 4, torch.bfloat16, seed=2), 2, 4), glu=True)
    assert not sp24.stream_fits(glu, 1, 4)
    wide = tile(pack_nm(random_nm_weight(128, 40960, 2, 4, torch.bfloat16, seed=2), 2, 4))  # 80 KB of x a row
    assert sp24.stream_fits(wide, 1, 160) and not sp24.stream_fits(wide, 1, 1) and not sp24.stream_fits(wide, 16, 2)
    assert sp24.choice_label((1, 1, False, 264)) == "sk264"


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(40, 96), (1000, 1536), (4096, 4096), (5000, 14336), (34816, 512)])
@pytest.mark.parametrize("kind", ["bf16", "fp16", "int8", "int4", "int4-128"])
def test_stream_k_matches_float64(out, in_features, kind):
    """Stream-K launches (sp24.cu's StreamUnits) against float64 at batches 1-16 over grids from one CTA to one per
    unit, the tuner's included; the same launch twice gives the same bits (the counters were left at zero)."""
    from sparsedecoding.kernels.sp24 import Sp24Launch, stream_fits, stream_units

    if kind == "int4-128":
        if in_features % 128:
            pytest.skip("128-column scale groups need a multiple of 128 columns")
        packed, dtype = pack_nm_quantized(grid_weight(out, in_features, "int4", 128).cuda(), 2, 4, "int4", 128), \
            torch.bfloat16
    else:
        packed, dtype = _packed_on_gpu(kind, out, in_features, seed=13)
    weight = packed.to_dense() if kind in ("bf16", "fp16") else packed.to_dense(torch.float64)
    w = tile(packed)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tried = 0
    for batch in (1, 3, 8, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").to(dtype)
        for ctas in sorted({1, 3, sms, 2 * sms, stream_units(w) - 1, stream_units(w)} - {0}):
            if not stream_fits(w, batch, ctas):
                with pytest.raises(KernelInputError, match="stream-K"):
                    Sp24Launch(x, w, ctas=ctas)
                continue
            launch = Sp24Launch(x, w, ctas=ctas)
            y = launch(x, w)
            assert float64_error(y, x, weight) <= 1, (kind, out, in_features, batch, ctas)
            assert torch.equal(launch(x, w), y), (kind, out, in_features, batch, ctas)
            tried += 1
    assert tried >= 5


@pytest.mark.gpu
def test_stream_k_refuses_what_it_cannot_run():
    from sparsedecoding.kernels.sp24 import Sp24Launch

    w = tile(pack_nm(random_nm_weight(256, 512, 2, 4, torch.bfloat16, seed=3).cuda(), 2, 4))
    x = torch.randn(2, 512, device="cuda").bfloat16()
    for kwargs in ({"slices": 2}, {"splits": 2}, {"norm": True}):
        with pytest.raises(KernelInputError, match="stream-K"):
            Sp24Launch(x, w, ctas=2, **kwargs)
    glu = tile(pack_nm(random_nm_weight(256, 512, 2, 4, torch.bfloat16, seed=3).cuda(), 2, 4), glu=True)
    with pytest.raises(KernelInputError, match="stream-K"):
        Sp24Launch(x, glu, ctas=2)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 128, 1024])
def test_int4_with_any_bf16_scales_matches_float64(group):
    """Scales off the solvers' grid (8 significant bits): code·scale is not exact in bf16, so the kernel must scale
    each group's fp32 sums, not the codes."""
    from sparsedecoding.engine.loading import random_quantized
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator("cuda").manual_seed(group)
    packed = random_quantized(512, 2048, SparsityPattern.parse("2:4"), "int4", group, torch.bfloat16, "cuda",
                              generator)
    w, weight = tile(packed), packed.to_dense(torch.float64)
    for batch in (1, 8, 16):
        x = torch.randn(batch, 2048, device="cuda").bfloat16()
        for splits in (None, 1, 2):
            assert float64_error(sp24_mm(x, w, splits), x, weight) <= 1, (group, batch, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "fp16", "int8", "int4"])
def test_dense_expansion_equals_the_packed_weight(kind):
    """`to_dense` (one kernel) gives exactly the packed format's dense weight, odd shapes included."""
    from sparsedecoding.kernels.sp24 import to_dense

    for out, in_features in ((40, 96), (1000, 1536), (4096, 4096)):
        packed, dtype = _packed_on_gpu(kind, out, in_features, seed=8)
        expected = packed.to_dense() if kind in ("bf16", "fp16") else packed.to_dense(dtype)
        assert torch.equal(to_dense(tile(packed)), expected), (kind, out, in_features)


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(64, 256), (1024, 4096), (28672, 4096), (2 * 8960, 1536)])
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_glu_kernel_matches_float64(out, in_features, kind):
    """silu(gate)·up from the kernel's epilogue (one CTA's pairs, and the last split-K CTA's) against float64."""
    from sparsedecoding.kernels.autotune import Float64Reference
    from sparsedecoding.kernels.sp24 import GluReference

    packed, dtype = _packed_on_gpu(kind, out, in_features, seed=11)
    weight = packed.to_dense() if kind == "bf16" else packed.to_dense(torch.float64)
    w = tile(packed, glu=True)
    for batch in (1, 5, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").to(dtype) / 8  # gate sums of a few units
        reference = GluReference(Float64Reference.of_rows(x, out, lambda r0, r1: weight[r0:r1].double()), dtype)
        for splits, slices in ((None, None), (1, 1), (3, 1), (1, 2), (2, 4)):
            try:
                y = sp24_mm(x, w, splits, slices)
            except KernelInputError:
                assert splits is not None and splits < min_splits(w, batch)
                continue
            assert y.shape == (batch, out // 2)
            assert reference.error(y) <= 1, (kind, out, in_features, batch, splits, slices)


@pytest.mark.gpu
def test_glu_rejects_eight_slices():
    w = tile(pack_nm(random_nm_weight(64, 256, 2, 4, torch.bfloat16, seed=3).cuda(), 2, 4), glu=True)
    with pytest.raises(KernelInputError, match="at most 4 slices"):
        sp24_mm(torch.randn(1, 256, device="cuda").bfloat16(), w, 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(64, 256), (1000, 4096), (6144, 4096), (2 * 8960, 1536)])
@pytest.mark.parametrize("kind", ["bf16", "fp16", "int8", "int4"])
@pytest.mark.parametrize("glu", [False, True])
def test_norm_kernel_matches_float64(out, in_features, kind, glu):
    """The RMSNorm in front (residual sum written exactly, 1/rms from one CTA's Σs² or from every split's): against
    float64 for batch 1-16, with and without split-K and slices, with and without res, plain and GLU."""
    from sparsedecoding.kernels.sp24 import GluReference, NormReference, Sp24Launch, sp24_norm_linear

    if glu and (kind == "fp16" or out % 32):
        pytest.skip("GLU weights: bf16 activations, rows a multiple of 32")
    packed, dtype = _packed_on_gpu(kind, out, in_features, seed=13)
    weight = packed.to_dense() if kind in ("bf16", "fp16") else packed.to_dense(torch.float64)
    w = tile(packed, glu=glu)
    norm_weight = (1 + torch.randn(in_features, device="cuda") / 4).to(dtype)
    for batch in (1, 3, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").to(dtype)
        for res in (torch.randn(batch, in_features, device="cuda").to(dtype), None):
            reference = NormReference(x, res, norm_weight, 1e-6, out, lambda r0, r1: weight[r0:r1].double())
            expected_sum = reference.sum
            if glu:
                reference = GluReference(reference, dtype)
            for splits, slices in ((1, 1), (3, 1), (1, 2), (2, 4), (5, 1)):
                if splits < min_splits(w, batch) or -(-w.steps // splits) < slices:
                    continue
                y, total = Sp24Launch(x, w, splits, slices, norm=True)(x, w, res, norm_weight, 1e-6)
                assert y.shape == (batch, out // 2 if glu else out)
                assert torch.equal(total, expected_sum), (kind, out, batch, splits, slices)
                assert reference.error(y) <= 1, (kind, out, in_features, batch, splits, slices, res is None)
            if batch == 9 and res is not None:  # the tuner's choice, once a test (tuning times every candidate)
                y, total = sp24_norm_linear(x, w, res, norm_weight, 1e-6)
                assert torch.equal(total, expected_sum) and reference.error(y) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_codes_keep_rows_of_any_magnitude(kind):
    """Rows of x near bf16's extremes, a zero row, and rows whose elements span far more than fp16's range all match
    float64 on codes, with split-K and slices, and with the RMSNorm in front where Σx² fits fp32 (a kernel that
    staged x in fp16, as one version did, must pass this too)."""
    from sparsedecoding.kernels.sp24 import NormReference, Sp24Launch

    packed, _ = _packed_on_gpu(kind, 384, 4096, seed=23)
    weight = packed.to_dense(torch.float64)
    w = tile(packed)
    scales = torch.tensor([1e-30, 1e-6, 1.0, 3e4, 1e30, 0.0, 1.0, 1.0, 1.0], device="cuda")
    x = torch.randn(9, 4096, device="cuda") * scales[:, None]
    x[6, ::7] *= 1e6  # elements six orders above the rest of their row
    x[7, 5] = 7e4  # one element above fp16's largest
    x[8, :100] *= 1e-12  # some far below the rest
    x = x.bfloat16()
    for splits, slices in ((2, 1), (3, 1), (2, 4)):  # 9 rows of 4096 columns need two splits of shared memory
        y = Sp24Launch(x, w, splits, slices)(x, w)
        assert float64_error(y, x, weight) <= 1, (splits, slices)
        assert torch.equal(y[5], torch.zeros_like(y[5]))
    norm_weight = torch.ones(4096, device="cuda").bfloat16()
    # with the RMSNorm in front, rows whose Σx² fits fp32 (as the unfused norm needs too)
    for row in (x[:1] * 0 + 1e-20, x[3:4] * 1e12, x[6:7]):
        row = row.bfloat16().contiguous()
        reference = NormReference(row, None, norm_weight, 1e-6, 384, lambda r0, r1: weight[r0:r1])
        y, total = Sp24Launch(row, w, 2, 1, norm=True)(row, w, None, norm_weight, 1e-6)
        assert reference.error(y) <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("early", ["0", "1"])
@pytest.mark.parametrize("kind", ["bf16", "int4"])
def test_programmatic_launches_give_the_plain_chain_bit_for_bit(kind, early, monkeypatch):
    """Under SPARSEDECODING_SP24_PDL=1 a chain of sp24 kernels, each reading the output of the one before (split-K
    and the fused norm included), captured in a CUDA graph and replayed with new inputs, gives bit for bit what plain
    launches give: the wait holds every read of x, res and the split-K buffers until the previous kernel is done.
    Also with the trigger at each CTA's start (SPARSEDECODING_SP24_EARLY_TRIGGER=1), where the next kernel's CTAs
    start while the one before still runs."""
    from sparsedecoding.kernels.sp24 import Sp24Launch

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic launches need compute capability 9.0")
    shapes = [(2048, 1024), (1024, 2048), (3072, 1024)]
    weights = [tile(_packed_on_gpu(kind, out, in_features, seed=29 + i)[0]) for i, (out, in_features) in
               enumerate(shapes)]
    norm_weight = torch.ones(1024, device="cuda").bfloat16()
    x = torch.randn(4, 1024, device="cuda").bfloat16()
    res = torch.randn(4, 1024, device="cuda").bfloat16()

    def launches(value):
        monkeypatch.setenv("SPARSEDECODING_SP24_PDL", value)
        return [Sp24Launch(x, weights[0], 3, 1), Sp24Launch(torch.empty(4, 2048, device="cuda").bfloat16(),
                                                             weights[1], 1, 4),
                Sp24Launch(x, weights[2], 2, 1, norm=True)]

    def chain(steps):  # no other kernel between them: each sp24 launch depends on the sp24 launch before it
        h = steps[0](x, weights[0])
        h = steps[1](h, weights[1])
        return steps[2](h, weights[2], res, norm_weight, 1e-6)

    monkeypatch.setenv("SPARSEDECODING_SP24_EARLY_TRIGGER", "0")
    plain = launches("0")
    monkeypatch.setenv("SPARSEDECODING_SP24_EARLY_TRIGGER", early)
    programmatic = launches("1")
    assert not any(step.pdl for step in plain)
    assert all(step.pdl for step in programmatic)
    for steps in (plain, programmatic):
        chain(steps)  # counters allocated outside capture
    graphs, outputs = [], []
    for steps in (plain, programmatic):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(chain(steps))
        graphs.append(graph)
    for _ in range(3):
        x.copy_(torch.randn(4, 1024, device="cuda").bfloat16())
        res.copy_(torch.randn(4, 1024, device="cuda").bfloat16())
        for graph in graphs:
            graph.replay()
        torch.cuda.synchronize()
        expected = chain(plain)
        for y, total in outputs:
            assert torch.equal(y, expected[0]) and torch.equal(total, expected[1])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "fp16", "int8", "int4"])
def test_half_meta_build_gives_the_full_meta_build_bit_for_bit(kind, monkeypatch):
    """Metadata from both lane pairs (sparsity selectors 0 and 1, the default build) gives bit for bit what the
    build with every lane holding all of its row pair's metadata (selector 0 only) gives, with and without the
    RMSNorm in front."""
    from sparsedecoding.kernels.op import SP24_HALF_META_SETTING
    from sparsedecoding.kernels.sp24 import Sp24Launch

    packed, dtype = _packed_on_gpu(kind, 1000, 4096, seed=31)
    w = tile(packed)
    norm_weight = (1 + torch.randn(4096, device="cuda") / 4).to(dtype)
    for batch in (1, 5, 16):
        x = torch.randn(batch, 4096, device="cuda").to(dtype)
        outputs = []
        for value in ("1", "0"):
            monkeypatch.setenv(SP24_HALF_META_SETTING, value)
            plain, normed = Sp24Launch(x, w, 4, 1), Sp24Launch(x, w, 4, 1, norm=True)
            outputs.append((plain(x, w), *normed(x, w, None, norm_weight, 1e-6)))
        assert all(torch.equal(a, b) for a, b in zip(*outputs)), (kind, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_early_trigger_build_gives_the_default_build_bit_for_bit(kind, monkeypatch):
    """The build whose CTAs trigger the next programmatic launch at their start (SPARSEDECODING_SP24_EARLY_TRIGGER=1)
    gives bit for bit the default build's products, one split and several, slices, and with the RMSNorm in front;
    and both stay within the float64 bound."""
    from sparsedecoding.kernels.op import SP24_EARLY_TRIGGER_SETTING
    from sparsedecoding.kernels.sp24 import Sp24Launch

    packed, dtype = _packed_on_gpu(kind, 1000, 4096, seed=37)
    w = tile(packed)
    norm_weight = (1 + torch.randn(4096, device="cuda") / 4).to(dtype)
    dense = packed.to_dense() if kind in ("bf16", "fp16") else packed.to_dense(torch.float64)
    for batch in (1, 5, 16):
        x = torch.randn(batch, 4096, device="cuda").to(dtype)
        fewest = min_splits(w, batch)  # one split where the staged x fits, else the fewest that do
        outputs = []
        for value in ("0", "1"):
            monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, value)
            launches = [Sp24Launch(x, w, fewest, 1), Sp24Launch(x, w, max(4, fewest), 1), Sp24Launch(x, w, fewest, 8)]
            normed = Sp24Launch(x, w, max(4, fewest), 1, norm=True)
            outputs.append((*(launch(x, w) for launch in launches), *normed(x, w, None, norm_weight, 1e-6)))
        assert all(torch.equal(a, b) for a, b in zip(*outputs)), (kind, batch)
        assert all(float64_error(y, x, dense) <= 1 for y in outputs[1][:3]), (kind, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "int4"])
def test_timed_tuner_times_every_candidate_in_both_builds_and_keeps_the_fastest(kind, monkeypatch):
    """Under SPARSEDECODING_SP24_EARLY_TRIGGER=timed the tuner (`tuned_launch`, float64 checks inside) times every
    candidate in both builds (TIMED_OTHER_BUILD None, the default) and keeps the fastest of all, whose launch runs its
    build's library; with TIMED_OTHER_BUILD = 2, only the two fastest of auto's build again in the other."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_EARLY_TRIGGER_SETTING

    monkeypatch.setenv(SP24_EARLY_TRIGGER_SETTING, "timed")
    monkeypatch.setenv("SPARSEDECODING_SP24_PDL", "1")
    packed, dtype = _packed_on_gpu(kind, 2048, 4096, seed=41)
    w = tile(packed)
    x = torch.randn(1, 4096, device="cuda").to(dtype)
    first = sp24.early_trigger(w, 1)
    launch = sp24.tuned_launch(x, w)
    key = sp24.problem_key(x, w)
    timings = sp24.launch_timings(key)
    mine = [choice for choice in timings if choice[2] == first]
    others = [choice for choice in timings if choice[2] != first]
    assert len(mine) > 2 and sorted(c[:2] + c[3:] for c in others) == sorted(c[:2] + c[3:] for c in mine)
    assert sp24.chosen_launch(key) == next(iter(timings))  # fastest first
    assert launch.library is sp24._load(early_trigger=launch.early_trigger, multicast=launch.multicast)
    dense = packed.to_dense() if kind == "bf16" else packed.to_dense(torch.float64)
    assert float64_error(launch(x, w), x, dense) <= 1
    sp24.forget_tuning(key)
    monkeypatch.setattr(sp24, "TIMED_OTHER_BUILD", 2)
    sp24.tuned_launch(x, w)
    timings = sp24.launch_timings(key)
    others = [choice for choice in timings if choice[2] != first]
    assert len(others) == 2 and all(choice[:2] + (first,) + choice[3:] in timings for choice in others)
    assert sp24.chosen_launch(key) == next(iter(timings))


@pytest.mark.gpu
def test_interleaved_timing_ranks_a_heavier_call_slower():
    from sparsedecoding.kernels.autotune import interleaved_replay_ms

    a = torch.randn(2048, 2048, device="cuda")
    light, heavy = interleaved_replay_ms([lambda w: w.sum(), lambda w: w @ w @ w], [a, a.clone()], rounds=3)
    assert 0 < light < heavy


@pytest.mark.gpu
def test_kernel_vector_input_and_graph_replay():
    packed = pack_nm(random_nm_weight(4096, 4096, 2, 4, torch.bfloat16, seed=6).cuda(), 2, 4)
    w = tile(packed)
    x = torch.randn(4096, device="cuda").bfloat16()
    y = sp24_mm(x, w)
    assert y.shape == (4096,)
    assert float64_error(y[None], x[None], packed.to_dense()) <= 1
    xs = torch.randn(4, 4096, device="cuda").bfloat16()
    sp24_mm(xs, w, 4)  # counters allocated outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sp24_mm(xs, w, 4)
        sliced = sp24_mm(xs, w, 2, 4)
    for _ in range(3):
        xs.copy_(torch.randn(4, 4096, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(out, xs, packed.to_dense()) <= 1
        assert float64_error(sliced, xs, packed.to_dense()) <= 1


@pytest.mark.gpu
def test_kernel_rejects_batch_17_and_wrong_dtype():
    packed = pack_nm(random_nm_weight(64, 256, 2, 4, torch.bfloat16, seed=7).cuda(), 2, 4)
    w = tile(packed)
    with pytest.raises(KernelInputError, match="batch 17"):
        sp24_mm(torch.randn(17, 256, device="cuda").bfloat16(), w)
    with pytest.raises(KernelInputError, match="float16"):
        sp24_mm(torch.randn(1, 256, device="cuda").half(), w)


def test_settings_fingerprint_follows_the_environment(monkeypatch):
    """`op.settings_fingerprint` (read from CPython's encoded environment where there is one, from `os.environ`
    elsewhere) changes when a setting is set, changed or unset, and comes back to its value when the environment
    does."""
    from sparsedecoding.kernels import op

    for name in (None, "nt"):  # the encoded mapping, then os.environ itself
        if name is not None:
            monkeypatch.setattr(op.os, "name", name)
        monkeypatch.delenv(op.SP24_MIXED_SETTING, raising=False)
        base = op.settings_fingerprint()
        assert len(base) == len(op.SETTINGS) and base[op.SETTINGS.index(op.SP24_MIXED_SETTING)] is None
        seen = {base}
        for value in ("0", "1", " 1"):
            monkeypatch.setenv(op.SP24_MIXED_SETTING, value)
            seen.add(op.settings_fingerprint())
        assert len(seen) == 4
        monkeypatch.delenv(op.SP24_MIXED_SETTING)
        assert op.settings_fingerprint() == base


def test_problem_key_memo_follows_the_settings(monkeypatch):
    """`problem_key`, memoised on the settings' raw values, equals the key computed afresh under each value, and a
    bad value raises every time it is read (never memoised)."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels.op import SP24_MIXED_SETTING, KernelChoiceError

    monkeypatch.delenv(SP24_MIXED_SETTING, raising=False)
    w = tile(pack_nm(random_nm_weight(32, 256, 2, 4, torch.bfloat16, seed=1), 2, 4))
    x = torch.randn(1, 256).bfloat16()
    field = sp24.PROBLEM_KEY_FIELDS.index("mixed")
    key = sp24.problem_key(x, w)
    assert key == sp24._problem_key(x, w, False) and key[field] == "1"
    monkeypatch.setenv(SP24_MIXED_SETTING, "0")
    off = sp24.problem_key(x, w)
    assert off == sp24._problem_key(x, w, False) and off[field] == "0"
    assert sp24.problem_key(x, w, norm=True) == sp24._problem_key(x, w, True) != off
    assert sp24.problem_key(x[:, :128].contiguous(), tile(pack_nm(random_nm_weight(32, 128, 2, 4, torch.bfloat16,
                                                                                      seed=2), 2, 4)))[1] == (1, 128)
    monkeypatch.setenv(SP24_MIXED_SETTING, "maybe")
    for _ in range(2):
        with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_MIXED"):
            sp24.problem_key(x, w)
    monkeypatch.delenv(SP24_MIXED_SETTING)
    assert sp24.problem_key(x, w) == key


def test_sp24_call_struct_mirrors_sp24_launch():
    """sp24.py's `Sp24Call` has sp24.cu's `Sp24Call` fields in their order and C types (pointers as c_void_p; `in`
    is `in_features` in Python), which are `sp24_launch`'s parameters in order, and `sp24_call` passes them to it in
    that order."""
    import ctypes
    import re

    import sparsedecoding.kernels.sp24 as sp24

    source = sp24.SOURCE.read_text(encoding="utf-8")

    def declared(text: str) -> list[tuple[str, str]]:  # (C type class, name) of "T a, b" declarations
        out = []
        for part in text.split(";"):
            part = part.strip()
            if not part:
                continue
            head, *rest = [p.strip() for p in part.split(",")]
            base, first = head.rsplit(" ", 1)
            pointer = "*" in base or first.startswith("*")
            kind = "pointer" if pointer else base.replace("const ", "").strip()
            out += [(kind, name.lstrip("*")) for name in (first, *rest)]
        return out

    struct = re.search(r"struct Sp24Call \{(.*?)\};", source, re.S).group(1)
    fields = declared(struct)
    params = declared(re.search(r"int sp24_launch\((.*?)\) \{", source, re.S).group(1).replace(",", ";"))
    assert [kind for kind, _ in fields] == [kind for kind, _ in params]
    assert [name for _, name in fields] == [name for _, name in params]
    call = re.search(r"return sp24_launch\((.*?)\);", source[source.index("int sp24_call("):], re.S).group(1)
    assert [arg.strip().removeprefix("c->") for arg in call.split(",")] == [name for _, name in fields]
    ctypes_of = {"pointer": ctypes.c_void_p, "int": ctypes.c_int, "float": ctypes.c_float}
    assert [(name if name != "in" else "in_features", ctypes_of[kind]) for kind, name in fields] == \
        list(sp24.Sp24Call._fields_)


def test_a_launch_passes_every_argument_in_its_call_struct(monkeypatch):
    """`Sp24Launch.__call__` hands the library one `Sp24Call` whose fields are what the positional `sp24_launch`
    call took: the tensors' addresses, the launch's fixed values, a fresh y, and with the RMSNorm in front and two
    splits the norm's tensors, eps, the partial and Σs² slots, the counters and the handoff slots (CPU: the CUDA
    queries, the build and the library stand in)."""
    from types import SimpleNamespace

    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels import cuda_mma

    fake_sp24_libraries(monkeypatch)
    for name, value in (("load", lambda: None), ("check_inputs", lambda x, w: None), ("_counters", {}),
                        ("_workspaces", {})):
        monkeypatch.setattr(sp24, name, value)
    for name, value in (("current_device", lambda: 0), ("get_device_capability", lambda device=None: (9, 0)),
                        ("get_device_properties", lambda device=None: SimpleNamespace(multi_processor_count=132)),
                        ("is_current_stream_capturing", lambda: False)):
        monkeypatch.setattr(sp24.torch.cuda, name, value)
    monkeypatch.setattr(cuda_mma, "_current_raw_stream", lambda index: 0xABC0)
    w = tile(pack_nm(random_nm_weight(64, 1024, 2, 4, torch.bfloat16, seed=3), 2, 4))
    x = torch.randn(1, 1024).bfloat16()
    res, norm_weight = torch.randn(1, 1024).bfloat16(), torch.ones(1024).bfloat16()
    for norm, splits, slices in ((False, 1, 4), (True, 2, 1)):
        launch = sp24.Sp24Launch(x, w, splits, slices, norm=norm)
        seen = []
        probes = []

        def record(call):
            seen.append({name: getattr(call, name) for name, _ in sp24.Sp24Call._fields_})
            # Each scratch buffer must still be held while the kernel may write it: memory freed before the launch
            # is what the allocator hands out next (split-K partials once overwrote the residual sum).
            for name, floats in (("partials", launch._partial_floats()), ("ss_slots", launch._ss_floats())):
                if getattr(call, name):
                    probes.extend((name, torch.empty(floats, dtype=torch.float32).data_ptr()) for _ in range(4))
            return 0

        launch.library.sp24_call = record
        out = launch(x, w, res, norm_weight, 1e-5) if norm else launch(x, w)
        y, total = out if norm else (out, None)
        (fields,) = seen
        expected = dict(
            x=x.data_ptr(), a=w.a.data_ptr(), meta=w.meta.data_ptr(), scales=None, row_scales=None, y=y.data_ptr(),
            batch=1, out=64, in_features=1024, steps=w.steps, is_bf16=1, code_bits=0, gk_shift=w.gk_shift,
            groups=w.groups, splits=splits, slices=slices, glu=0, pdl=1, stream=0xABC0, over_v=None, over_o=None,
            over_loop=launch.over_loop, dense=0, stream_ctas=0, heavy=0,
            res=res.data_ptr() if norm else None, norm_w=norm_weight.data_ptr() if norm else None,
            sum_out=total.data_ptr() if norm else None, eps=pytest.approx(1e-5 if norm else 0.0),
            counters=launch.counters.data_ptr() if norm else None,
            handoff_slots=launch.handoff_slots.data_ptr() if norm else None)
        assert {name: fields[name] for name in expected} == expected
        assert (fields["partials"] is not None, fields["ss_slots"] is not None) == (norm, norm)
        assert not [name for name, pointer in probes if pointer == fields[name]], "a scratch buffer was freed early"
        assert set(fields) == set(expected) | {"partials", "ss_slots"}
        assert y.shape == (1, 64) and y.dtype == x.dtype


def test_sp24_call_struct_offsets_match_the_c_compiler(tmp_path):
    """Where g++ is installed: every field of sp24.cu's `Sp24Call`, compiled for this host (sp24.cu's host code is
    compiled for the same ABI), sits at the offset ctypes gives `sp24.Sp24Call`'s field, and the sizes agree."""
    import ctypes
    import re
    import shutil
    import subprocess

    import sparsedecoding.kernels.sp24 as sp24

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    struct = re.search(r"struct Sp24Call \{.*?\};", sp24.SOURCE.read_text(encoding="utf-8"), re.S).group(0)
    names = [name if name != "in_features" else "in" for name, _ in sp24.Sp24Call._fields_]
    source = tmp_path / "offsets.cpp"
    source.write_text("#include <cstddef>\n#include <cstdio>\n" + struct + "\nint main() {\n"
                      + "".join(f'  std::printf("%zu\\n", offsetof(Sp24Call, {name}));\n' for name in names)
                      + '  std::printf("%zu\\n", sizeof(Sp24Call));\n}\n', encoding="utf-8")
    subprocess.run(["g++", "-o", str(tmp_path / "offsets"), str(source)], check=True)
    printed = subprocess.run([str(tmp_path / "offsets")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in printed] == [getattr(sp24.Sp24Call, name).offset for name, _ in sp24.Sp24Call._fields_] \
        + [ctypes.sizeof(sp24.Sp24Call)]
