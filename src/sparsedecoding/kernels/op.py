"""`nm_spmv`: y = x·Wᵀ with W packed N:M, in two entry points that run the same kernels.

- Eagerly (`nm_spmv`, `PackedLinear` outside torch.compile) a call goes straight to a runner cached per problem:
  the first call with a given signature (shapes, dtypes, devices, pattern of x and the packed parts) checks the
  inputs, tunes the Triton kernel and compiles it; later calls with an equal signature only compare that
  signature (a dict lookup) and the memory layout, then launch. The torch custom-op dispatcher and Triton's
  per-launch argument binding cost several times the kernel itself at 4096 rows (benchmarks/KERNEL_NOTES.md).
- Under torch.compile the custom op `sparsedecoding::nm_spmv` is traced instead: its fake implementation gives
  the compiler the output shape, and at run time it calls the same cached runners. The op is opaque to the
  compiler, so it also runs unchanged inside CUDA graphs (a runner is built on the first call, before capture).

On CUDA one of two kernels serves a problem: the Triton kernel (`triton_spmv`) or the tensor-core kernel
(`cuda_mma`, compiled with nvcc at first use), chosen per pattern and batch by `choose_kernel` from the measured
table `CUDA_FROM_BATCH`, or forced with the environment variable SPARSEDECODING_KERNEL=auto|triton|cuda (read when
a problem's runner is built, so set it before the first call); SPARSEDECODING_SPARSE_MMA=1 makes the tensor-core
kernel run 2:4 on sparse tensor cores. CPU runs the torch reference whatever the setting.
`_make_runner` is the one place that builds the chosen kernel's runner.

This op serves the packed format as stored. The engine, under SPARSEDECODING_KERNEL=auto, instead tiles every 2:4
linear for the sparse tensor-core kernel `sp24` when it builds a model (`sp24_linear.tile_for_kernel`; faster in
geomean at every batch 1-16: benchmarks/results/sp24_h200.md); 16:32 and the other patterns stay on this op."""

from __future__ import annotations

import logging
import os
from typing import Callable

import torch

from ..errors import KernelInputError, SparseDecodingError
from .format import PackedNM, kernel_runs, values_per_word
from .reference import spmv_reference

log = logging.getLogger(__name__)

MAX_BATCH = 16
_DTYPES = (torch.bfloat16, torch.float16)

Runner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

KERNEL_SETTING = "SPARSEDECODING_KERNEL"
KERNEL_CHOICES = ("auto", "triton", "cuda")
# 1: where the tensor-core kernel serves a 2:4 problem, it runs on sparse tensor cores (mma.sp) instead of expanding
# the mask (not yet measured, so off by default); 0 or unset: the expansion
SPARSE_MMA_SETTING = "SPARSEDECODING_SPARSE_MMA"
FUSE_GLU_SETTING = "SPARSEDECODING_FUSE_GLU"
FUSE_NORM_SETTING = "SPARSEDECODING_FUSE_NORM"
SP24_PDL_SETTING = "SPARSEDECODING_SP24_PDL"
COMBO_KERNELS_SETTING = "SPARSEDECODING_COMBO_KERNELS"
INDUCTOR_PDL_SETTING = "SPARSEDECODING_INDUCTOR_PDL"
INDUCTOR_ATTENTION_SETTING = "SPARSEDECODING_INDUCTOR_ATTENTION"
FUSED_ATTENTION_SETTING = "SPARSEDECODING_FUSED_ATTENTION"
ATTENTION_MIN_SPAN_SETTING = "SPARSEDECODING_ATTENTION_MIN_SPAN"
ATTENTION_MIN_SPAN_DEFAULT = 64
ATTENTION_EARLY_READS_SETTING = "SPARSEDECODING_ATTENTION_EARLY_READS"
NM_MMA_GEOMETRY_SETTING = "SPARSEDECODING_NM_MMA_GEOMETRY"
NM_MMA_GEOMETRY_CHOICES = {"warps": (4, 8), "chunk_words": (4, 8)}  # warps a CTA (16 rows each), words a stage
SP24_OVER_LOOP_SETTING = "SPARSEDECODING_SP24_OVER_LOOP"
SP24_OVER_LOOP_CHOICES = ("rows", "slots", "auto", "columns", "mma")
SP24_SLOTS_SETTING = "SPARSEDECODING_SP24_SLOTS"
SP24_HALF_META_SETTING = "SPARSEDECODING_SP24_HALF_META"
SP24_EARLY_TRIGGER_SETTING = "SPARSEDECODING_SP24_EARLY_TRIGGER"
SP24_EARLY_TRIGGER_CHOICES = ("auto", "timed", "0", "1")
SP24_MMA_CTAS_SETTING = "SPARSEDECODING_SP24_MMA_CTAS"
SP24_MMA_CTAS_CHOICES = ("2", "1")
SP24_MULTICAST_SETTING = "SPARSEDECODING_SP24_MULTICAST"
SP24_MULTICAST_CHOICES = ("0", "2", "4")
SP24_STREAM_K_SETTING = "SPARSEDECODING_SP24_STREAM_K"
SP24_HALVES_ACC_SETTING = "SPARSEDECODING_SP24_HALVES_ACC"
SP24_HALVES_ACC_CHOICES = ("1", "2")
SP24_GROUPED_CTAS_SETTING = "SPARSEDECODING_SP24_GROUPED_CTAS"
SP24_GROUPED_CTAS_CHOICES = ("timed", "2", "1")
GROUPED_CTAS_DEFAULT = "timed"
SP24_HANDOFF_SETTING = "SPARSEDECODING_SP24_HANDOFF"
SP24_MIXED_SETTING = "SPARSEDECODING_SP24_MIXED"
SP24_MIXED_CHOICES = ("1", "0", "2")
SP24_INT8_STEP_SETTING = "SPARSEDECODING_SP24_INT8_STEP"
SP24_INT4_STEP_SETTING = "SPARSEDECODING_SP24_INT4_STEP"
SP24_STEP_CHOICES = ("auto", "16", "8")
STEP_TUNE_SETTING = "SPARSEDECODING_STEP_TUNE"
STEP_TUNE_PAIRS_SETTING = "SPARSEDECODING_STEP_TUNE_PAIRS"
FUSED_GREEDY_SETTING = "SPARSEDECODING_FUSED_GREEDY"
DENSE_INT4_SETTING = "SPARSEDECODING_DENSE_INT4"
DENSE_INT4_CHOICES = ("auto", "tinygemm", "triton", "sp24")
DENSE_INT8_SETTING = "SPARSEDECODING_DENSE_INT8"
DENSE_INT8_CHOICES = ("auto", "triton", "sp24")

# Under "auto", the batch from which the tensor-core kernel serves a pattern instead of the Triton kernel: the
# smallest batch from which it was the faster of the two at every batch 1-16 (geomean speedup over cuBLAS on the
# Llama-3.1-8B and Qwen3-14B decoder linears, H200, benchmarks/results/cuda_dispatch_h200.md):
#   batch             1      2      3      4      5      8      16
#   2:4   cuda     1.16x  1.15x  1.11x  1.11x  1.09x  1.04x  0.92x   -> from batch 2
#         triton   1.42x  1.10x  0.75x  0.77x  0.66x  0.67x  0.43x
#   16:32 cuda     0.69x  0.68x  0.66x  0.67x  0.66x  0.64x  0.59x   -> from batch 5 (both slower than cuBLAS there)
#         triton   1.44x  1.10x  0.73x  0.76x  0.61x  0.61x  0.33x
# 4:8 and 8:16 were not measured: Triton. The tensor-core kernel runs only 50% patterns, so any other pattern is
# Triton's.
CUDA_FROM_BATCH = {(2, 4): 2, (16, 32): 5}


class KernelChoiceError(SparseDecodingError, ValueError):
    """SPARSEDECODING_KERNEL holds something other than auto, triton or cuda."""


def kernel_setting() -> str:
    """SPARSEDECODING_KERNEL, lower-cased; "auto" when unset or empty."""
    return os.environ.get(KERNEL_SETTING, "").strip().lower() or "auto"


def check_kernel_setting(setting: str) -> None:
    """KernelChoiceError unless `setting` is one of KERNEL_CHOICES."""
    if setting not in KERNEL_CHOICES:
        raise KernelChoiceError(f"{KERNEL_SETTING}={setting!r}; use one of {', '.join(KERNEL_CHOICES)} "
                                "(auto picks the faster kernel per pattern and batch)")


def _switch(name: str, default: str, meaning: str) -> bool:
    """An on/off setting: "1" on, "0" off, unset or empty `default`; anything else is a KernelChoiceError naming
    what "1" means."""
    value = os.environ.get(name, "").strip() or default
    if value not in ("0", "1"):
        raise KernelChoiceError(f"{name}={value!r}; use 1 ({meaning}) or 0")
    return value == "1"


def _choice(name: str, choices: tuple[str, ...], default: str, meaning: str) -> str:
    """A setting of named values (lower-cased; unset or empty `default`); anything else is a KernelChoiceError that
    lists `meaning`, what each value does."""
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise KernelChoiceError(f"{name}={value!r}; use {meaning}")
    return value


def fuse_glu_setting() -> bool:
    """SPARSEDECODING_FUSE_GLU: "1" or unset makes the engine tile 2:4 gate|up linears to apply silu(gate)·up in the
    sparse tensor-core kernel's epilogue (`sp24_linear.tile_model`; measured faster: results/e2e_h200_8b_sp24_glu*.md);
    "0" leaves the activation to the model."""
    return _switch(FUSE_GLU_SETTING, "1", "silu(gate)·up in the 2:4 kernel")


def sp24_slots_setting() -> bool:
    """SPARSEDECODING_SP24_SLOTS: "1" or unset makes the engine run each 16:32 linear whose mask fits 16:32+2 (at
    most two kept weights beyond two in the groups of four of a 32-column word: `--pattern 16:32+2`) on the 2:4
    sparse tensor-core kernel, as its 2:4 part plus two overflow slots a row and word (`sp24.tile_overflow`), with
    the fusions 2:4 gets; other 16:32 linears stay on the packed kernels. In the engine (8B preset, 16:32+2, side
    by side: results/slots_e2e_h200_8b.md) on: 1.41 / 1.26 / 1.13 / 0.92 / 0.52x dense at batch 1 / 2 / 4 / 8 / 16,
    off: 1.34 / 1.05 / 0.78 / 0.72 / 0.70x; at batch 8 the columns order since lifted it to 0.99x
    (results/auto_loop_e2e_h200_8b.md). "0" keeps every 16:32 linear on the packed kernels."""
    return _switch(SP24_SLOTS_SETTING, "1", "16:32+2 linears on the 2:4 kernel with overflow slots")


FUSE_NORM_CHOICES = ("auto", "1", "0")
FUSE_NORM_AUTO_ELEMENTS = 8192  # under auto, the most rows x hidden size of a call whose RMSNorm the 2:4 kernels take
FUSE_NORM_AUTO_MAX_DIM = 4096  # under auto, the widest hidden state fused (the 14B's 5120 ran slower fused at 1-2 rows)


def fuse_norm_setting() -> str:
    """SPARSEDECODING_FUSE_NORM: "auto" or unset makes the engine's blocks hand each residual addition and RMSNorm to
    the 2:4 qkv and gate_up kernels in calls of up to FUSE_NORM_AUTO_ELEMENTS // hidden size rows on models up to
    FUSE_NORM_AUTO_MAX_DIM wide (2 rows for the 8B's 4096, 5 for the 1.5B Qwen's 1536, none for the 14B's 5120) and
    whose tiled linears carry no overflow slots (none for 16:32+2), and leave them to the compiled block beyond; "1"
    fuses them up to 16 rows, "0" never (`engine.model.Block.fuse_norms`,
    `fuse_norm_rows`). Each of the kernel's CTAs norms every row it reads, a cost that grows with rows x hidden size,
    against a few launches saved a layer: side by side on one H100, the 8B preset's 2:4 decode fused against not 1.808 /
    1.729 / 1.677 / 1.600 / 1.337x dense at batch 1 / 2 / 4 / 8 / 16 against 1.741 / 1.732 / 1.714 / 1.713 / 1.542x
    (results/fuse_norm_ab_h100_8b_24*.md), 16:32g 1.461 / 1.122x at batch 8 / 16 against 1.593 / 1.372x
    (results/fuse_norm_ab_h100_8b_16of32g.md); the qwen2.5-coder-1.5b preset's 1.607 / 1.601 / 1.459x at batch 3 / 4 / 8
    against 1.553 / 1.512 / 1.482x (results/fuse_norm_auto_h100_qwen15_24.md, under a row limit of 2 then), 1.635 /
    1.494x at batch 5 / 6 against 1.618 / 1.499x; the qwen3-14b preset's 1.738 / 1.744x at batch 1 / 2 against 1.767 /
    1.773x (results/fuse_norm_edges_h100_*.md, results/fuse_norm_14b_b1_h100_24.md); the 8B preset's 16:32+2 1.441 /
    1.411x at batch 1 / 2 against 1.505 / 1.475x (results/fuse_norm_low_h100_8b_16of32p2.md), with int4 slot codes
    2.555 / 2.406x against 2.582 / 2.462x under auto (results/fuse_norm_slots_h100_8b_16of32p2_int4.md; int8 slot
    codes not measured, left unfused alike), where its 2:4 + int4, 2:4 + int8 and 16:32g gained at batch 1
    (results/fuse_norm_low_h100_8b_*.md)."""
    return _choice(FUSE_NORM_SETTING, FUSE_NORM_CHOICES, "auto",
                   f"auto (the RMSNorm in the 2:4 kernels up to {FUSE_NORM_AUTO_ELEMENTS} rows x hidden size, hidden "
                   f"sizes up to {FUSE_NORM_AUTO_MAX_DIM}, no overflow slots), 1 (up to {MAX_BATCH} rows) or 0 (never)")


def fuse_norm_rows(value: str, dim: int, slotted: bool = False) -> int:
    """The most rows a call of a block's qkv and gate_up may have for them to take its RMSNorm, under a
    SPARSEDECODING_FUSE_NORM `value` (`fuse_norm_setting`), a hidden size `dim` and whether the model's tiled
    linears carry overflow slots (`slotted`: 16:32+2, which auto leaves unfused): 0 never."""
    if value == "auto":
        fits = dim <= FUSE_NORM_AUTO_MAX_DIM and not slotted
        return min(MAX_BATCH, FUSE_NORM_AUTO_ELEMENTS // dim) if fits else 0
    return {"1": MAX_BATCH, "0": 0}[value]


def sp24_pdl_setting() -> bool:
    """SPARSEDECODING_SP24_PDL: "1" or unset launches the 2:4 sparse tensor-core kernel programmatically on compute
    capability 9.0, so that its CTAs load their first weights while the kernel before it finishes (an sp24 kernel
    lets its dependents start once its weight stream is done; measured faster at every batch and kind tried:
    results/sp24_pdl_h200_*.md); "0": plain launches."""
    return _switch(SP24_PDL_SETTING, "1", "programmatic launches of the 2:4 kernel")


def combo_kernels_setting() -> bool:
    """SPARSEDECODING_COMBO_KERNELS: "1" or unset compiles the engine's blocks with Inductor's combo kernels
    (independent small kernels, such as RoPE on q and the two cache writes, launched as one; measured faster at batch
    1 and 4: results/combo_kernels_h200_8b.md); "0": Inductor's defaults."""
    return _switch(COMBO_KERNELS_SETTING, "1", "Inductor's combo kernels in the compiled blocks")


def _inductor_has_pdl() -> bool:
    import torch._inductor.config as inductor

    return hasattr(inductor.triton, "enable_pdl")


def inductor_pdl_setting() -> bool:
    """SPARSEDECODING_INDUCTOR_PDL: "1" compiles the engine's blocks with Inductor's programmatic dependent launches
    (its Triton kernels wait for their inputs inside the kernel and let the next kernel start early, as sp24 does;
    Inductor emits them on compute capability 9.0 and up), so that, for one, RoPE and the cache writes can start
    during the qkv kernel's tail (measured faster at batch 1 and 4: results/inductor_pdl_h200_8b.md); "0":
    Inductor's defaults. Unset: "1" where this PyTorch's Inductor has the option (triton.enable_pdl), else "0"."""
    return _switch(INDUCTOR_PDL_SETTING, "1" if _inductor_has_pdl() else "0",
                   "programmatic launches of Inductor's kernels")


INDUCTOR_ATTENTION_CHOICES = ("auto", "0", "1")


def inductor_attention_setting() -> str:
    """SPARSEDECODING_INDUCTOR_ATTENTION: whether a decode step's attention (one new position per sequence) runs as
    plain reductions that Inductor compiles into its own kernels (`engine.model.decode_attention`), instead of
    PyTorch's fused attention, so that with SPARSEDECODING_INDUCTOR_PDL the kernels between qkv and o all take part
    in programmatic launches. "auto" or unset: at batch 1 on CUDA only, with a KV cache of at most
    `engine.model.AUTO_ATTENTION_MAX_CACHE` positions (1024; at batch 1 measured faster with 272- and 1024-position
    caches, slower with 4096, and slower at batch 4 and 8: results/inductor_attention_h200_8b_*.md); "1": at every
    batch; "0": never. Decode steps that SPARSEDECODING_FUSED_ATTENTION's kernel takes do not come here. Read when a
    model is built; KernelChoiceError for anything else."""
    return _choice(INDUCTOR_ATTENTION_SETTING, INDUCTOR_ATTENTION_CHOICES, "auto",
                   "auto (decode attention as Inductor-compiled reductions at batch 1), 1 (at every batch) or 0")


def fused_attention_setting() -> bool:
    """SPARSEDECODING_FUSED_ATTENTION: "1" or unset runs a decode step's attention (RoPE, the KV-cache write and
    the attention over the cache) as one Triton kernel, `kernels.triton_attention`, wherever it applies: one new
    position per sequence, batch 1-16, bf16 or fp16, a power-of-two head size of at least 16 (Qwen3's per-head q/k
    norms run inside it), on CUDA (or under the Triton interpreter). Elsewhere SPARSEDECODING_INDUCTOR_ATTENTION
    decides. "0": never. Measured faster side by side at every batch (1, 4, 8, 16) and cache length (272-4096
    positions) tried, bf16, int8 and int4 values: results/fused_attention_h200_8b*.md. Read when a model is built."""
    return _switch(FUSED_ATTENTION_SETTING, "1", "the fused decode-attention kernel")


def fused_greedy_setting() -> bool:
    """SPARSEDECODING_FUSED_GREEDY: "1" ends a greedy decode step with one kernel (`kernels.triton_greedy`: each
    sequence's argmax into the token buffer, the position advanced) instead of the two-stage argmax, a copy and an
    add, on CUDA (or under the Triton interpreter); "0": those. Default "1": side by side on the 8B preset's 2:4
    models 0.99x the step time at batch 1 and 4, bf16 and int4 values (results/fused_greedy_h200_8b*.md). Read when
    an Engine is built."""
    return _switch(FUSED_GREEDY_SETTING, "1", "the greedy step's argmax, token write and position in one kernel")


def step_tune_setting() -> bool:
    """SPARSEDECODING_STEP_TUNE: "1" or unset has a compiled engine choose each 2:4 problem's launch (split-K count,
    slices) among the kernel tuner's fastest few by timing whole decode steps (`engine.step_tune`), once per problem
    and process, when the engine is built (a few seconds); "0" keeps the tuner's pick, timed with each launch alone.
    Measured side by side on the 8B preset: 1.000 / 1.018 / 1.011 / 1.028x at batch 1 / 4 / 8 / 16 (bf16 values),
    1.073x (int8) and 1.009x (int4) at batch 1 (results/step_tune_h200_8b.md). A tensor-parallel engine keeps the
    tuner's picks (its ranks would time, and might choose, apart)."""
    return _switch(STEP_TUNE_SETTING, "1", "2:4 launches chosen by decode-step time")


def step_tune_pairs_setting() -> bool:
    """SPARSEDECODING_STEP_TUNE_PAIRS: "1" has the step tuning (SPARSEDECODING_STEP_TUNE) end with a pass over
    neighbouring 2:4 problems two at a time (each one's launch and the next one's, in launch order, every pairing of
    a few candidates each: `engine.step_tune`), for the moves one problem at a time cannot make: which launch of the
    gate_up is fastest in a step depends on the build of the o before it. "0" or unset: problems one at a time
    only. Read when an Engine is built."""
    return _switch(STEP_TUNE_PAIRS_SETTING, "0", "neighbouring 2:4 problems also tuned two at a time")


def dense_int4_setting() -> str:
    """SPARSEDECODING_DENSE_INT4: which kernel serves a dense int4 weight (the dense-quantized baseline and an int4
    lm_head), and so its layout, chosen when the weight is built. "sp24": the sparse tensor-core kernel's dense mode
    (`sp24.tile_dense`: the weight as the kept values of a 2:4 weight of twice the columns whose metadata is one
    constant, not loaded), the same layout on every device, up to 16 rows of bf16 x on CUDA, the dequantized weight
    elsewhere; needs rows and columns in multiples of 16. "tinygemm": PyTorch's `_weight_int4pack_mm` (`_for_cpu` on
    CPU) and its device's layout. "triton": our `triton_w4` kernel (bytes [out, in/2] and scales [out, groups], the
    same on every device) up to 16 rows of x on CUDA, the dequantized weight above 16 rows and on CPU. "auto" or
    unset: sp24 for a bf16 weight built on a CUDA device where that kernel loads and whose shape and group size it
    takes, tinygemm otherwise (`quantized.dense_kernel` says which). Against tinygemm on the 8B and 14B shapes
    and lm_heads (results/w4_h200.md, geomean of time ratios at batch 1 / 4 / 16): sp24 1.49x / 1.85x / 2.50x (every
    shape faster, 1.22x at least), triton_w4 0.74x / 0.82x / 2.31x. KernelChoiceError for anything else."""
    return _choice(DENSE_INT4_SETTING, DENSE_INT4_CHOICES, "auto", "auto, sp24 (our sparse tensor-core kernel's "
                   "dense mode), tinygemm (PyTorch's int4 kernel) or triton (ours)")


def dense_int8_setting() -> str:
    """SPARSEDECODING_DENSE_INT8: which kernel serves a dense int8 weight (the dense-quantized baseline and an int8
    lm_head), chosen when the weight is built. "sp24": the sparse tensor-core kernel's dense mode (`sp24.tile_dense`;
    the tiled codes flat, the row scales [out]) up to 16 rows of bf16 x on CUDA; needs rows and columns in multiples
    of 16. "triton": our `triton_w8` kernel (int8 [out, in] and a scale a row) up to 16 rows of x on CUDA. Elsewhere
    both multiply by the dequantized weight (PyTorch's `_weight_int8pack_mm` on CPU for triton's). "auto" or unset:
    sp24 for a bf16 weight built on a CUDA device where that kernel loads and whose shape it takes, triton otherwise.
    Against triton_w8 on the 8B and 14B shapes and lm_heads (results/w8_h200.md, geomean of time ratios): 1.12x at
    batch 1, 1.42x at 4, 0.89x at 16 (slower there); in the engine (results/dense_int8_ab_h200_8b.md, dense int8 with
    an int8 lm_head) 1.15x at batch 1 and 1.70x at 4. KernelChoiceError for anything else."""
    return _choice(DENSE_INT8_SETTING, DENSE_INT8_CHOICES, "auto", "auto, sp24 (our sparse tensor-core kernel's "
                   "dense mode) or triton (our int8 kernel)")


def attention_early_reads_setting() -> bool:
    """SPARSEDECODING_ATTENTION_EARLY_READS: "1" or unset lets the fused decode attention, where it is launched
    programmatically, read the position, the rotary rows and the first cached tile of each range before it waits
    for the qkv kernel (`kernels.triton_attention.launch`, `early`); "0": every read after the wait. Measured side
    by side on the 8B preset's 2:4 model: 1.009x / 1.022x at batch 1 / 4 with bf16 values, 1.022x / 1.040x with
    int4, 0.996x with int8 at batch 1 (results/early_reads_h200_8b*.md). Read when a model's caches are set up."""
    return _switch(ATTENTION_EARLY_READS_SETTING, "1", "reads ahead of the wait in the fused decode attention")


def attention_min_span_setting() -> int:
    """SPARSEDECODING_ATTENTION_MIN_SPAN: the fewest cached positions one program of the fused decode attention
    walks, a positive multiple of 64 (unset: ATTENTION_MIN_SPAN_DEFAULT). While a step's position is at most this,
    one program per sequence and KV head does the whole attention; past it the positions are split into ranges of
    at least this many, which the last program to finish combines (a round trip through memory more). Read when a
    model's caches are set up; KernelChoiceError for anything else."""
    text = os.environ.get(ATTENTION_MIN_SPAN_SETTING, "").strip() or str(ATTENTION_MIN_SPAN_DEFAULT)
    if not text.isdigit() or int(text) < 64 or int(text) % 64:
        raise KernelChoiceError(f"{ATTENTION_MIN_SPAN_SETTING}={text!r}; use a positive multiple of 64 (the fewest "
                                "cached positions a program of the fused decode attention walks)")
    return int(text)


def compile_options() -> dict | None:
    """torch.compile's Inductor options for the engine's blocks under SPARSEDECODING_COMBO_KERNELS and
    SPARSEDECODING_INDUCTOR_PDL (None: Inductor's defaults). KernelChoiceError if this PyTorch lacks an option a
    setting asks for."""
    options = {}
    if combo_kernels_setting():
        options["combo_kernels"] = True
    if inductor_pdl_setting():
        if not _inductor_has_pdl():
            raise KernelChoiceError(f"{INDUCTOR_PDL_SETTING}=1: this PyTorch's Inductor has no programmatic launches "
                                    "(triton.enable_pdl); set it to 0")
        options["triton.enable_pdl"] = True
    return options or None


def sparse_mma_setting() -> bool:
    """SPARSEDECODING_SPARSE_MMA: "1" on, "0" or unset off."""
    return _switch(SPARSE_MMA_SETTING, "0", "2:4 on sparse tensor cores")


def sp24_over_loop_setting() -> str:
    """SPARSEDECODING_SP24_OVER_LOOP: the loop order in which the sp24 kernel adds a 16:32+K weight's overflow slots
    (sp24.cu's over_step; read when a launch is built). "rows": rows of x outer; "slots": slots outer; "columns": slots
    outer, each slot's x read for 8 rows of x at once from a column-major copy of the staged x (one 16-byte shared load
    instead of eight), at the price of that copy's shared memory and a second library build (sp24.cu with SP24_COLUMNS);
    "mma": the slots on the tensor cores, one more mma.sp a k-tile whose B rows ldmatrix gathers from that column copy
    (the same build; 16-bit values only: codes take auto's order under it). "auto" or unset: per batch, the order that
    was fastest there (sp24.over_loop: rows for batch 1-4 and 9-12, for 5-8 and 13-16 mma with 16-bit values, 1.03-1.13x
    columns there side by side in results/overflow_h200_mma.md, and columns with codes). Geomean vs cuBLAS over
    the 8B + 14B shapes at batch 1 / 2 / 4 / 5 / 6 / 8, side by side in one run (results/overflow_h200_auto.md): rows
    1.38 / 1.25 / 1.10 / 1.03 / 0.97 / 0.86x, slots 1.20 / 1.14 / 1.07 / 1.02 / 0.98 / 0.90x, columns 1.18 / 1.14 / 1.09
    / 1.05 / 1.04 / 1.00x; at batch 9 / 12 / 16 with one CTA a multiprocessor (results/overflow_h200_one_cta.md): rows
    0.78 / 0.65 / 0.54x, slots 0.71 / 0.62 / 0.54x, columns 0.67 / 0.61 / 0.58x. KernelChoiceError for anything else."""
    return _choice(SP24_OVER_LOOP_SETTING, SP24_OVER_LOOP_CHOICES, "auto", "rows (rows of x outer), slots (slots "
                   "outer), auto (the fastest of these at each batch), columns (slots outer on a column-major copy "
                   "of x) or mma (the slots on the tensor cores)")


def sp24_half_meta_setting() -> bool:
    """SPARSEDECODING_SP24_HALF_META: "1" or unset builds the sp24 kernel so that each lane holds the metadata of
    half a step's k-tiles, the other half of its quad's row pair taking theirs with mma.sp's sparsity selector 1
    (half the metadata registers and loads; sp24.cu's SP24_HALF_META; bit for bit the same products, measured
    faster with codes: int8 1.054x and int4 1.030x at batch 1, results/sp24_h200.md; the 8B preset's 2:4 + int8
    2.034x against 1.987x dense, results/half_meta_h200_8b_int8.md); "0": every lane loads all of its row pair's
    words and every MMA uses selector 0 (the kernel every report before 2026-12-01's nineteenth session measured).
    Read when a launch is built; the two builds are separate libraries."""
    return _switch(SP24_HALF_META_SETTING, "1", "sp24 with each lane's metadata halved")


def sp24_early_trigger_value() -> str:
    """SPARSEDECODING_SP24_EARLY_TRIGGER as it stands: "timed" (the default), "auto", "0" or "1"
    (`sp24_early_trigger_setting` says what each does)."""
    return _choice(SP24_EARLY_TRIGGER_SETTING, SP24_EARLY_TRIGGER_CHOICES, "timed",
                   "1 (sp24 lets the next launch start after a CTA's first requests), 0 (after its main loop), auto "
                   "(per kind of weight, the faster of the two in the engine) or timed (the tuners time both; the "
                   "default)")


def sp24_early_trigger_setting() -> bool | None:
    """SPARSEDECODING_SP24_EARLY_TRIGGER: which build of the sp24 kernel a launch uses. "1": each CTA lets the next
    programmatic launch start as soon as it has requested its first weight steps (sp24.cu's SP24_EARLY_TRIGGER; the
    next launch's CTAs then take free room on the multiprocessors and stream their weights under this grid's run,
    their own wait still holding their reads of x and writes back until it has finished: bit for bit the same
    products). "0": the trigger after the main loop (every report before the thirty-third session). "auto" (None):
    per launch, the early build only where the engine measured it faster side by side (`sp24.early_trigger`: 2:4
    bf16 and 2:4 + int8 at every batch, 16:32+K bf16 at batch 1-4), the default build elsewhere. 8B preset, early
    against default (results/early_trigger_h200_8b*.md): 2:4 bf16 1.022 / 1.001 / 1.027x at batch 1 / 4 / 8, 2:4 +
    int8 1.028 / 1.010x at 1 / 4, 16:32+2 bf16 1.019 / 1.012x at 1 / 4 and 0.949x at 8, 2:4 + int4 0.978 / 0.976x at
    batch 1 in two runs. "timed" or unset (None too; the default since the thirty-fifth session): auto's choice
    first, and the tuners time the other build as well (`sp24.tuned_launch` every candidate alone, in both builds,
    `engine.step_tune` in whole decode steps) and keep the faster (`sp24_early_trigger_timed`), except for slotted
    weights from batch 5 on, which stay in the default build (`sp24.times_both_builds`). 8B preset, timed against
    auto side by side (results/timed_trigger_h200_8b*_builds*.md): 2:4 bf16 1.016 / 1.005 / 1.020x at batch 1 / 4 /
    8, 2:4 + int4 1.028 / 1.021x and 1.042 / 1.014x at 1 / 4 (both orders), 2:4 + int8 1.000 / 0.999x, 16:32+2 bf16
    1.020 / 1.004x at 1 / 4 and 1.016x at 1 again; at 16:32+2 batch 8 timing both builds lost 1.6% and 1.4% (both
    orders), hence the exception. Read when a launch is built; the builds are separate libraries."""
    value = sp24_early_trigger_value()
    return None if value in ("auto", "timed") else value == "1"


def sp24_mma_ctas_setting() -> int:
    """SPARSEDECODING_SP24_MMA_CTAS: the CTAs a multiprocessor the sp24 kernel's launch bound asks for when the
    overflow slots run on the tensor cores (SPARSEDECODING_SP24_OVER_LOOP's mma, sp24.cu's SP24_OVER_MMA_CTAS). "2" or
    unset: 128 registers a thread, two CTAs resident (ptxas spills 20-76 bytes a thread there; Nsight Compute counted
    123,648 local-memory requests in one 8B gate_up launch at batch 16, results/ncu_h200/ncu_mma_gate_up_b16.txt);
    "1": up to 255 registers (154-168 used, no spills) and one CTA. Measured slower side by side, so two stays: the
    kernel under one CTA 0.945 / 0.927 / 0.963 / 0.976x the default's speed at batch 5 / 8 / 12 / 16
    (results/overflow_h200_mma_one_cta.md), the 8B preset's 16:32+2 step 0.914x at batch 8 and 0.880x at 16
    (results/over_loop_h200_8b_16of32p2_mma_ctas.md). Read when a launch is built; the builds are separate
    libraries."""
    return int(_choice(SP24_MMA_CTAS_SETTING, SP24_MMA_CTAS_CHOICES, "2",
                       "2 (two CTAs a multiprocessor, the default) or 1 (one, no register spills)"))


def sp24_multicast_setting() -> int:
    """SPARSEDECODING_SP24_MULTICAST: "2" or unset (the default) or "4": on compute capability 9.0 or newer, the sp24
    launches without the RMSNorm in front, slots or a dense weight run in clusters of that many CTAs, which stage x once
    a cluster by multicast bulk copies (sp24.cu's SP24_MULTICAST, a build of its own; the products are bit for bit the
    default build's); "0": every CTA stages its columns of x itself, from the L2. Measured side by side: the kernel
    bench's int4 3.70x cuBLAS at batch 1 against 3.55x, 1.03-1.10x faster at 2-16 (results/sp24_h200_multicast2.md;
    clusters of four 0.97-0.99x of two, sp24_h200_multicast4.md); the 8B preset's 2:4 bf16 step 1.028 / 1.018 / 1.057x
    at batch 1 / 4 / 8 and its 2:4 + int4 step 1.000 / 0.999 / 1.031x (results/multicast_h200_8b.md,
    multicast_h200_8b_int4.md)."""
    return int(_choice(SP24_MULTICAST_SETTING, SP24_MULTICAST_CHOICES, "2",
                       "2 (clusters of two that stage x once by multicast, the default), 4 or 0 (every CTA stages x)"))


def sp24_halves_acc_setting() -> int:
    """SPARSEDECODING_SP24_HALVES_ACC: the accumulators of 16:32g8 launches (grouped columns with an order for each 8
    rows, sp24.cu's SP24_GROUPED_HALVES, a build of its own for each value): "1" or unset (the default, measured in
    results/grouped_halves_h100.md), both halves' products into one accumulator, so each k-tile's second mma.sp waits
    for its first; "2", the second half's into an accumulator of its own, added in after the loop (no faster:
    results/grouped_variants_h100.md)."""
    return int(_choice(SP24_HALVES_ACC_SETTING, SP24_HALVES_ACC_CHOICES, "1",
                       "1 (one accumulator for both halves' products, the default) or 2 (one for each half)"))


def sp24_grouped_ctas_value() -> str:
    """SPARSEDECODING_SP24_GROUPED_CTAS: the CTAs a multiprocessor the launch bound of grouped-columns launches (16:32g,
    16:32g8; sp24.cu's SP24_GROUPED_CTAS, a build of its own for each bound) asks for: "timed" or unset (the
    default), the tuner times every candidate launch under both bounds and keeps the fastest for each problem
    (`sp24.tuned_launch`; both builds are loaded); "2", two CTAs and 128 registers a thread, under which the kernels
    without the RMSNorm in front spill (results/ptxas_grouped_halves_sm90.md); "1", one CTA and up to 255 registers:
    faster on the kernel bench's geomean at every batch, slower on the 14B gate_up and at batch 16 on its least shape
    (results/grouped_variants_h100.md). Side by side on an H100 (results/grouped_bounds_h100.md), timed 1.676 / 1.361x
    cuBLAS at batch 1 / 16 for 16:32g against 1.646 / 1.296x under 2 and 1.669 / 1.323x under 1; the 8B preset's
    16:32g decode 1.560 / 1.444 / 1.081x dense at batch 1 / 8 / 16 against 1.546 / 1.424 / 1.057x under 2
    (results/grouped_ctas_ab_h100_8b.md)."""
    return _choice(SP24_GROUPED_CTAS_SETTING, SP24_GROUPED_CTAS_CHOICES, GROUPED_CTAS_DEFAULT,
                   "timed (the tuner times both bounds for each problem, the default), 2 (two CTAs a "
                   "multiprocessor) or 1 (one, up to 255 registers)")


def sp24_grouped_ctas_setting() -> int:
    """The launch bound (CTAs a multiprocessor) of grouped-columns launches that are not timed under both: 1 under
    SPARSEDECODING_SP24_GROUPED_CTAS=1, else 2 (under timed, the first bound the tuner tries; `sp24_grouped_ctas_value`
    says what each value does)."""
    return 1 if sp24_grouped_ctas_value() == "1" else 2


def sp24_grouped_ctas_timed() -> bool:
    """Whether SPARSEDECODING_SP24_GROUPED_CTAS=timed: the tuner times grouped-columns launches under both bounds."""
    return sp24_grouped_ctas_value() == "timed"


def sp24_stream_k_setting() -> bool:
    """SPARSEDECODING_SP24_STREAM_K: "1" or unset makes the sp24 tuner also try stream-K launches (a grid of one or
    two CTAs a multiprocessor sharing the row blocks' steps evenly, sp24.cu's StreamUnits) for the problems they can
    run (no RMSNorm in front, slots, dense weight or GLU), beside its split-K ones, and keep the fastest; "0" tries
    split-K launches only. In the kernel bench beside the same bench without them (results/sp24_h200_stream_k.md) the
    tuner kept them only for the Qwen3-14B gate_up at batch 1-2 (int4 25.4 -> 24.2 us, int8 32.3 -> 31.6 us at batch
    1), whose 272 row blocks leave split-K a last partial wave on 132 multiprocessors."""
    return _switch(SP24_STREAM_K_SETTING, "1", "the tuner also tries stream-K launches")


def sp24_mixed_value() -> str:
    """SPARSEDECODING_SP24_MIXED: "1" or unset makes the sp24 tuner also try mixed grids (the first CTAs at 2 or 4
    slices, every later CTA one row tile at 8, sp24.cu's `heavy`) for the problems whose grid passes one wave by less
    than it could hold (`sp24.mixed_heavy`), with one split, no GLU, slots or dense weight, at batch 1-8; "0" does not.
    The tuner A/B beside the same tuner without them (results/tuner_ab_h200_mixed_b1.md): the Qwen3-14B o in bf16 8.42
    against 9.00 us at batch 1, bf16's geomean 1.96x against 1.94x cuBLAS, int8 and int4 unchanged. "2" (a probe,
    sixtieth session) also tries the grid of one heavy CTA on every multiprocessor and the rest one row tile a CTA
    (`sp24.spread_heavy`), which leaves the next programmatic launch's CTAs more room; int4 at batch 1 on an H100,
    4.28x against 4.27x cuBLAS (results/tuner_ab_h100_spread_b1.md), so not the default."""
    return _choice(SP24_MIXED_SETTING, SP24_MIXED_CHOICES, "1",
                   "1 (the tuner also tries mixed grids), 2 (those and one heavy CTA a multiprocessor) or 0")


def sp24_mixed_setting() -> bool:
    """Whether the sp24 tuner tries mixed grids at all (SPARSEDECODING_SP24_MIXED 1 or 2, `sp24_mixed_value`)."""
    return sp24_mixed_value() != "0"


def sp24_handoff_setting() -> bool:
    """SPARSEDECODING_SP24_HANDOFF: "1" or unset lets sp24's split-K and stream-K launches whose grid the GPU holds at
    once add their CTAs' partial sums by handoff: every CTA but one a row block stores its sums and leaves, and that
    one adds them as they land (each slot entry is its own flag, sp24.cu's kEmpty), with no fence or atomic; "0" adds
    them by counting (each CTA counts itself on the row block's counter and the last adds), as launches too large to
    be resident at once always do. Both give the same sums bit for bit."""
    return _switch(SP24_HANDOFF_SETTING, "1", "split-K and stream-K sums added by handoff")


def sp24_early_trigger_timed() -> bool:
    """Whether SPARSEDECODING_SP24_EARLY_TRIGGER is "timed" (or unset): the tuners time both builds of sp24 and keep
    the faster (`sp24_early_trigger_setting`; `sp24.times_both_builds` says where)."""
    return sp24_early_trigger_value() == "timed"


def sp24_int8_step_setting() -> int | None:
    """SPARSEDECODING_SP24_INT8_STEP: k-tiles (32 columns each) a step of int8 codes when a 2:4 + int8 weight is
    tiled for the sparse tensor-core kernel. "auto" or unset (None): 8 for a 16:32+K weight with overflow slots and
    16 for a plain 2:4 one, the faster of the two for each side by side in the engine (thirtieth session:
    16:32+2 + int8 on the 8B preset 1.895x / 1.515x / 1.314x dense bf16 at batch 1 / 4 / 8 with 8 against 1.671x /
    1.258x / 1.021x with 16, results/int8_step_h200_8b_16of32p2.md; 2:4 + int8 on the Qwen preset 1.793x with 16
    against 1.734x with 8, results/int8_step_h200_qwen.md). "16": eight 16-byte loads a lane and step (every int8
    weight before the thirtieth session); "8": four, twice the steps a row tile (a build of the kernel with
    SP24_INT8_KS=8). Read when a weight is tiled (model load); dense int8 weights keep 16. KernelChoiceError for
    anything else."""
    value = _choice(SP24_INT8_STEP_SETTING, SP24_STEP_CHOICES, "auto",
                    "auto (k-tiles a step of int8 codes: 8 with overflow slots, 16 without; the default), 16 or 8")
    return None if value == "auto" else int(value)


def _checked_kernel_setting() -> str:
    setting = kernel_setting()
    check_kernel_setting(setting)
    return setting


def nm_mma_geometry_setting() -> dict[str, int]:
    """SPARSEDECODING_NM_MMA_GEOMETRY, the tensor-core kernel's CTA geometry (`cuda_mma` builds its library with it),
    as {name: value}: comma-separated `name=value` pairs from NM_MMA_GEOMETRY_CHOICES, e.g. `warps=4,chunk_words=4`;
    unset or empty: {} (8 warps, 8 mask words a stage: the geometry every report before 2026-12-01's fourteenth
    session measured). Smaller CTAs use less shared memory, so more of them fit on a multiprocessor. Anything else
    is a KernelChoiceError naming the choices."""
    text = os.environ.get(NM_MMA_GEOMETRY_SETTING, "").strip()
    choices = "; ".join(f"{name}: {' or '.join(map(str, values))}"
                        for name, values in NM_MMA_GEOMETRY_CHOICES.items())
    geometry: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip().lower()
        if name not in NM_MMA_GEOMETRY_CHOICES or name in geometry or not value.strip().isdigit() \
                or int(value) not in NM_MMA_GEOMETRY_CHOICES[name]:
            raise KernelChoiceError(f"{NM_MMA_GEOMETRY_SETTING}={text!r}: {item!r} is not a choice; use "
                                    f"comma-separated name=value pairs, each name once ({choices})")
        geometry[name] = int(value)
    return geometry


def _nm_mma_geometry_text() -> str:
    """`nm_mma_geometry_setting` as a report shows it: `warps=4,chunk_words=4`, or `default`."""
    return ",".join(f"{name}={value}" for name, value in nm_mma_geometry_setting().items()) or "default"


def sp24_int4_step_setting() -> int | None:
    """SPARSEDECODING_SP24_INT4_STEP: k-tiles a step of int4 codes when a 2:4 + int4 weight is tiled for the sparse
    tensor-core kernel. "auto" or unset (None): 8 for a 16:32+K weight with overflow slots and 16 for a plain 2:4
    one (thirtieth session, side by side in the engine: 16:32+2 + int4 on the 8B preset 2.281x / 1.642x / 1.404x
    dense bf16 at batch 1 / 4 / 8 with 8 against 2.125x / 1.510x / 1.295x with 16,
    results/int4_step_h200_8b_16of32p2.md; on the Qwen preset 1.817x against 1.583x at batch 1; the kernel on the
    8B + 14B 2:4 shapes 3.30x cuBLAS against 3.33x at batch 1, results/sp24_h200_int4_step8.md). "16": four 16-byte
    loads a lane and step; "8": two, twice the steps a row tile (a build of the kernel with SP24_INT4_KS=8). Read
    when a weight is tiled; dense int4 weights keep 16. KernelChoiceError for anything else."""
    value = _choice(SP24_INT4_STEP_SETTING, SP24_STEP_CHOICES, "auto",
                    "auto (k-tiles a step of int4 codes: 8 with overflow slots, 16 without; the default), 16 or 8")
    return None if value == "auto" else int(value)


def _int4_step_text() -> str:
    """`sp24_int4_step_setting` as a report shows it: `auto`, `16` or `8`."""
    step = sp24_int4_step_setting()
    return "auto" if step is None else str(step)


def _int8_step_text() -> str:
    """`sp24_int8_step_setting` as a report shows it: `auto`, `16` or `8`."""
    step = sp24_int8_step_setting()
    return "auto" if step is None else str(step)


def settings() -> dict[str, object]:
    """Every environment setting the engine reads, by name, with its value as it stands now (each read through its
    own reader, so a bad value raises its KernelChoiceError here); the Inductor settings are also checked against
    this PyTorch (`compile_options`). The one place that lists them: the CLI checks them all before loading a
    model, reports name them (`settings_line`), and `benchmarks/setting_ab_bench.py` takes any of them."""
    values = {name: read() for name, read in _READERS.items()}
    compile_options()
    return values


_READERS = {KERNEL_SETTING: _checked_kernel_setting, SPARSE_MMA_SETTING: sparse_mma_setting,
            FUSE_GLU_SETTING: fuse_glu_setting, FUSE_NORM_SETTING: fuse_norm_setting,
            SP24_PDL_SETTING: sp24_pdl_setting,
            COMBO_KERNELS_SETTING: combo_kernels_setting, INDUCTOR_PDL_SETTING: inductor_pdl_setting,
            INDUCTOR_ATTENTION_SETTING: inductor_attention_setting, FUSED_ATTENTION_SETTING: fused_attention_setting,
            ATTENTION_MIN_SPAN_SETTING: attention_min_span_setting,
            ATTENTION_EARLY_READS_SETTING: attention_early_reads_setting,
            NM_MMA_GEOMETRY_SETTING: _nm_mma_geometry_text, SP24_OVER_LOOP_SETTING: sp24_over_loop_setting,
            SP24_SLOTS_SETTING: sp24_slots_setting, SP24_HALF_META_SETTING: sp24_half_meta_setting,
            SP24_EARLY_TRIGGER_SETTING: sp24_early_trigger_value, SP24_MMA_CTAS_SETTING: sp24_mma_ctas_setting,
            SP24_MULTICAST_SETTING: sp24_multicast_setting, SP24_STREAM_K_SETTING: sp24_stream_k_setting,
            SP24_HALVES_ACC_SETTING: sp24_halves_acc_setting, SP24_GROUPED_CTAS_SETTING: sp24_grouped_ctas_value,
            SP24_HANDOFF_SETTING: sp24_handoff_setting, SP24_MIXED_SETTING: sp24_mixed_value,
            SP24_INT8_STEP_SETTING: _int8_step_text, SP24_INT4_STEP_SETTING: _int4_step_text,
            STEP_TUNE_SETTING: step_tune_setting, STEP_TUNE_PAIRS_SETTING: step_tune_pairs_setting,
            DENSE_INT4_SETTING: dense_int4_setting,
            DENSE_INT8_SETTING: dense_int8_setting, FUSED_GREEDY_SETTING: fused_greedy_setting}
SETTINGS = tuple(_READERS)  # their names, in the order reports list them
_ENCODED_SETTINGS = tuple(os.fsencode(name) for name in SETTINGS)


def settings_fingerprint() -> tuple:
    """Every setting's raw value as the environment holds it now (None where unset), unparsed and unchecked: a key
    for caching what the readers make of them (equal fingerprints read alike). `os.environ.get` of an unset name
    raises and catches a KeyError inside, about 1 us each on this project's CPU host, so this reads CPython's
    encoded mapping behind `os.environ` (kept in step by every `os.environ` assignment and deletion) where there is
    one, and `os.environ` itself elsewhere; sp24's `problem_key`, memoised on it, fell from 10.0 to 2.4 us a call
    there (benchmarks/results/eager_overhead_cpu_sp24.md)."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        return tuple(map(data.get, _ENCODED_SETTINGS))
    return tuple(map(os.environ.get, SETTINGS))


def settings_line() -> str:
    """Every kernel setting the engine reads, as they stand, for the head of a report (switches as 0 / 1)."""
    return "Kernel settings: " + ", ".join(f"{name}={int(value) if isinstance(value, bool) else value}"
                                           for name, value in settings().items()) + "."


def choose_kernel(n: int, m: int, batch: int, setting: str,
                  cuda_problem: Callable[[], str | None]) -> tuple[str, str | None]:
    """Which kernel serves an N:M problem of `batch` rows on CUDA: ("cuda" | "triton", fallback), where fallback
    says why "auto" took Triton although CUDA_FROM_BATCH prefers the tensor-core kernel (None otherwise).

    setting: "auto" follows CUDA_FROM_BATCH; "triton" always the Triton kernel; "cuda" always the tensor-core
    kernel, raising KernelInputError for a pattern it does not run and CudaKernelUnavailableError when it cannot
    run here. Anything else raises KernelChoiceError.
    cuda_problem: asked only when the tensor-core kernel would be chosen; returns None when it can run here, else
    the reason it cannot (it may build the kernel, which takes seconds the first time)."""
    check_kernel_setting(setting)
    if setting == "triton":
        return "triton", None
    if setting == "cuda":
        if values_per_word(n, m) != 16:
            raise KernelInputError(f"{KERNEL_SETTING}=cuda, but the tensor-core kernel runs only 50% patterns "
                                   f"(1:2, 2:4, 4:8, 8:16, 16:32); got {n}:{m}: set {KERNEL_SETTING}=auto or triton")
        problem = cuda_problem()
        if problem is not None:
            from .cuda_mma import CudaKernelUnavailableError

            raise CudaKernelUnavailableError(f"{KERNEL_SETTING}=cuda, but the tensor-core kernel cannot run: "
                                             f"{problem}")
        return "cuda", None
    if batch < CUDA_FROM_BATCH.get((n, m), MAX_BATCH + 1):
        return "triton", None
    problem = cuda_problem()
    return ("triton", problem) if problem is not None else ("cuda", None)


_cuda_checked = False  # whether this process has tried to build and load the tensor-core kernel
_cuda_reason: str | None = None  # why that failed
_fallback_logged = False


def _cuda_problem() -> str | None:
    """Why the tensor-core kernel cannot run in this process, or None; builds and loads it on the first call."""
    global _cuda_checked, _cuda_reason
    if not _cuda_checked:
        from .cuda_mma import CudaKernelUnavailableError, load

        try:
            load()
        except CudaKernelUnavailableError as exc:
            _cuda_reason = str(exc)
        _cuda_checked = True
    return _cuda_reason


def check_spmv_inputs(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> None:
    """Raise KernelInputError for anything the kernel would compute wrongly: pattern, dtype, device, layout,
    shape and batch size."""
    if not kernel_runs(n, m):
        raise KernelInputError(f"nm_spmv supports N:M patterns with M dividing 32 and 32·N/M a multiple of 8 "
                               f"(2:4, 4:8, 8:16, 16:32, 1:4, ...); got {n}:{m}")
    if x.dtype not in _DTYPES:
        raise KernelInputError(f"x is {x.dtype}; nm_spmv takes bfloat16 or float16 activations")
    if values.dtype not in _DTYPES:
        raise KernelInputError(f"the packed values are {values.dtype}; nm_spmv runs bfloat16 or float16 weights: "
                               "pack the weight in one of those")
    if values.dtype != x.dtype:
        raise KernelInputError(f"x is {x.dtype} but the packed values are {values.dtype}; cast x to {values.dtype}")
    if bitmask.dtype != torch.int32:
        raise KernelInputError(f"bitmask is {bitmask.dtype}; it must be int32 (pack the weight with pack_nm)")
    if not (x.device == values.device == bitmask.device):
        raise KernelInputError(f"x on {x.device}, values on {values.device}, bitmask on {bitmask.device}; "
                               "move them to one device")
    for name, t in (("x", x), ("values", values), ("bitmask", bitmask)):
        if not t.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous; call .contiguous() first")
    if values.dim() != 2 or bitmask.dim() != 2 or values.shape[0] != bitmask.shape[0] \
            or values.shape[1] != bitmask.shape[1] * values_per_word(n, m):
        raise KernelInputError(f"values {tuple(values.shape)} and bitmask {tuple(bitmask.shape)} do not form a "
                               f"packed {n}:{m} weight")
    if bitmask.shape[0] == 0 or bitmask.shape[1] == 0:
        raise KernelInputError(f"empty packed weight of {bitmask.shape[0]} rows and {bitmask.shape[1]} words")
    in_features = bitmask.shape[1] * 32
    if x.dim() not in (1, 2) or x.shape[-1] != in_features:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{in_features}] or [batch, {in_features}]")
    batch = x.shape[0] if x.dim() == 2 else 1
    if not 1 <= batch <= MAX_BATCH:
        raise KernelInputError(f"batch {batch} is outside 1..{MAX_BATCH}; for more rows multiply by "
                               "packed.to_dense() (PackedLinear does this)")


class _TritonRunner:
    """One problem's tuned Triton kernel, launched through the compiled kernel's own launcher. Binding and
    specializing the arguments, building the cache key and looking the kernel up happen once, here; a call only
    allocates y (and x transposed, partial sums) the way `triton_spmv.launch` does, and launches. Triton's launch
    hooks (instrumentation callbacks such as proton's) are not called for these launches: building their
    metadata costs a few microseconds a call.

    The compiled kernel was specialized on the arguments of the first call; of those that can change between
    calls with an equal signature, only the 16-byte alignment of the caller's pointers matters, so a call with a
    pointer off that alignment (a view at an odd offset) goes through `launch`, which compiles for it."""

    def __init__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int):
        from .autotune import tuned_config  # imports triton
        from .triton_spmv import _kernel_call, launch, nm_spmv_kernel

        self.vector = x.dim() == 1
        x2 = x.view(1, -1) if self.vector else x
        self.n, self.m = n, m
        self.config = tuned_config(x2, values, bitmask, n, m)
        self.batch, self.in_features = x2.shape
        self.out_features, self.words = bitmask.shape
        grid, arguments, constants, _ = _kernel_call(x2, values, bitmask, n, m, self.config)
        self.batch_block, self.split_k = constants["BATCH_BLOCK"], self.config.split_k
        self.x_dtype = torch.float32 if self.config.x_float32 else x.dtype
        self.arrivals = arguments[5]  # split-K counters: one fixed tensor per device, never replaced
        options = {name: constants.pop(name) for name in ("num_warps", "num_stages")}
        # The launcher takes every kernel parameter in signature order, constexprs included.
        self.constants = tuple(constants[name] for name in nm_spmv_kernel.arg_names[len(arguments):])
        with torch.cuda.device(x.device):
            compiled = nm_spmv_kernel.warmup(*arguments, grid=grid, **constants, **options)
            if hasattr(compiled, "result"):  # a future where Triton compiles asynchronously
                compiled = compiled.result()
            self.launcher = compiled.run  # loads the binary on this device
        self.grid, self.device_index = grid, x.device.index
        self.current_stream = torch._C._cuda_getCurrentRawStream  # what Triton's launch asks for the stream
        self.function, self.packed_metadata = compiled.function, compiled.packed_metadata
        expected = launch(x2, values, bitmask, n, m, self.config)
        if not torch.equal(self(x, values, bitmask).view_as(expected), expected):
            raise RuntimeError(f"nm_spmv: the cached launch of {self.config} differs from Triton's own launch for "
                               f"x {tuple(x.shape)} and a {n}:{m} weight of {tuple(bitmask.shape)} words; "
                               "this Triton version's kernel launcher is not what this module expects")

    def __call__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        if (x.data_ptr() | values.data_ptr() | bitmask.data_ptr()) % 16:
            from .triton_spmv import launch

            y = launch(x.view(1, -1) if self.vector else x, values, bitmask, self.n, self.m, self.config)
            return y.view(-1) if self.vector else y
        batch = self.batch
        # sizes as separate ints: the argument parser takes them 0.5 us faster than a tuple
        y = x.new_empty(self.out_features) if self.vector else x.new_empty(batch, self.out_features)
        if batch == 1:
            x_arg = x
        else:  # [in, batch]: one vector load per decoded column serves several batch rows (see triton_spmv)
            shape = (self.in_features, self.batch_block)
            if batch == self.batch_block:
                x_arg = x.new_empty(shape, dtype=self.x_dtype).copy_(x.t())
            else:
                x_arg = x.new_zeros(shape, dtype=self.x_dtype)
                x_arg[:, :batch].copy_(x.t())
        if self.split_k > 1:
            partial = x.new_empty((self.split_k, self.batch_block, self.out_features), dtype=torch.float32)
            arrivals = self.arrivals
        else:  # never read by the kernel when split_k == 1
            partial, arrivals = y, bitmask
        # What Triton's JITFunction.run passes: grid, stream, kernel, metadata, (launch metadata, enter and exit
        # hooks), then every parameter. values go in as they are: the launcher reads only data_ptr(), and the
        # kernel reads them as int32 pairs.
        self.launcher(self.grid[0], self.grid[1], 1, self.current_stream(self.device_index), self.function,
                      self.packed_metadata, None, None, None, x_arg, values, bitmask, y, partial, arrivals,
                      self.out_features, self.words, batch, *self.constants)
        return y


def _reference_runner(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    return spmv_reference(x, values, bitmask)


class _CudaRunner:
    """One problem's tensor-core kernel launch (`cuda_mma.Launch`), checked once against float64 when built. An x
    that does not start on a 16-byte boundary (a view at an odd offset) is copied first: the kernel's bulk copies
    need the alignment, and x is at most 16 rows."""

    def __init__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int):
        from .autotune import output_error
        from .cuda_mma import Launch

        out_features, words = bitmask.shape
        x = x if x.data_ptr() % 16 == 0 else x.clone()
        self.launch = Launch(x, PackedNM(values, bitmask, n, m, (out_features, words * 32)),
                             sparse_mma=(n, m) == (2, 4) and sparse_mma_setting())
        error = output_error(self(x, values, bitmask).view(-1, out_features), x.view(-1, words * 32), values, bitmask)
        if not error <= 1:  # NaN fails too
            raise RuntimeError(f"nm_spmv: the tensor-core kernel is off by {error:.3g} x the float64 bound for x "
                               f"{tuple(x.shape)} and a {n}:{m} weight of {tuple(bitmask.shape)} words; set "
                               f"{KERNEL_SETTING}=triton and report this")

    def __call__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        return self.launch(x if x.data_ptr() % 16 == 0 else x.clone(), values, bitmask)


def _make_runner(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> Runner:
    """The kernel that serves this (checked) problem from now on: the torch reference on CPU, else `_gpu_runner`."""
    if x.device.type != "cuda":
        return _reference_runner
    return _gpu_runner(x, values, bitmask, n, m)


def _gpu_runner(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> Runner:
    """The runner of the kernel `choose_kernel` picks. When the table prefers the tensor-core kernel but it
    cannot be built here, the Triton kernel runs and the reason is logged once, as a warning."""
    global _fallback_logged
    batch = 1 if x.dim() == 1 else x.shape[0]
    kernel, fallback = choose_kernel(n, m, batch, kernel_setting(), _cuda_problem)
    if fallback is not None and not _fallback_logged:
        _fallback_logged = True
        log.warning("nm_spmv: the tensor-core kernel, measured faster than Triton for %d:%d at batch %d, cannot run "
                    "here; the Triton kernel serves this and every such problem instead. Reason: %s. Set %s=triton "
                    "to choose Triton explicitly and silence this.", n, m, batch, fallback, KERNEL_SETTING)
    if kernel == "cuda":
        return _CudaRunner(x, values, bitmask, n, m)
    return _TritonRunner(x, values, bitmask, n, m)


_runners: dict[tuple, Runner] = {}


def clear_runners() -> None:
    """Forget every cached runner, so that the next call of each problem builds one under the settings as they
    stand (SPARSEDECODING_KERNEL, SPARSEDECODING_NM_MMA_GEOMETRY are read when a runner is built); the quantized
    weights' tensor-core launches too."""
    from .quantized import _cuda_launches

    _runners.clear()
    _cuda_launches.clear()


def _run(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """y = x·Wᵀ through the problem's cached runner. Two calls whose signatures are equal pass or fail
    `check_spmv_inputs` alike, except for memory layout, which is compared on every call."""
    signature = (x.shape, x.dtype, x.device, values.shape, values.dtype, values.device, bitmask.shape, bitmask.dtype,
                 bitmask.device, n, m)
    runner = _runners.get(signature)
    if runner is None or not (x.is_contiguous() and values.is_contiguous() and bitmask.is_contiguous()):
        check_spmv_inputs(x, values, bitmask, n, m)
        if runner is None:
            if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                # building a runner tunes or builds and checks its output (host syncs); Triton's own launch of a
                # problem tuned earlier can be captured, whichever kernel `choose_kernel` would pick
                from .autotune import tuned_config
                from .triton_spmv import launch

                x2 = x.view(1, -1) if x.dim() == 1 else x
                return launch(x2, values, bitmask, n, m, tuned_config(x2, values, bitmask, n, m)).view(
                    *x.shape[:-1], bitmask.shape[0])
            runner = _runners[signature] = _make_runner(x, values, bitmask, n, m)
    return runner(x, values, bitmask)


@torch.library.custom_op("sparsedecoding::nm_spmv", mutates_args=())
def _nm_spmv_op(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    return _run(x, values, bitmask, n, m)


@_nm_spmv_op.register_fake
def _nm_spmv_fake(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    check_spmv_inputs(x, values, bitmask, n, m)
    return x.new_empty((*x.shape[:-1], bitmask.shape[0]))


def spmv(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """`nm_spmv` on the packed parts: the custom op while torch.compile traces, the cached runner otherwise."""
    if torch.compiler.is_compiling():
        return torch.ops.sparsedecoding.nm_spmv(x, values, bitmask, n, m)
    return _run(x, values, bitmask, n, m)


def nm_spmv(x: torch.Tensor, packed: PackedNM) -> torch.Tensor:
    """y[b, o] = Σ_i W[o, i]·x[b, i] for x [in] or [b, in] with b ≤ 16, bf16/fp16, fp32 accumulation, output in
    x's dtype, W given packed. On CUDA the Triton or the tensor-core kernel runs (`choose_kernel`); on CPU the torch
    reference."""
    if not isinstance(packed, PackedNM):
        raise KernelInputError(f"nm_spmv takes the weight as a PackedNM (kernels.pack_nm(weight, n, m)); got "
                               f"{type(packed).__name__}")
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x must be a torch.Tensor [in] or [b, in]; got {type(x).__name__}")
    return spmv(x, packed.values, packed.bitmask, packed.n, packed.m)
