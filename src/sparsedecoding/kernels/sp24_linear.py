"""`Sp24Linear`: a 2:4 linear held in the sparse tensor-core kernel's tiled layout (`sp24.tile`), and
`tile_model`, which swaps a model's 2:4 `PackedLinear` / `QuantizedPackedLinear` modules for it in place. A 16:32
one whose mask fits 16:32+2 (at most two kept weights beyond two in the groups of four of a 32-column word) becomes
one too: its 2:4 part plus two overflow slots a row and word (`sp24.tile_overflow`), 1.31 bytes a weight at bf16
against the packed format's 1.125 (int8 codes: 0.81 against 0.625), saved and loaded as the 16:32 packed format.
Quantized ones take int8 codes, or int4 codes with `sp24.OVER_INT4_GROUP` columns a scale. A 16:32 one of 16-bit values
whose mask is 16:32g (each 16-row tile's words split into groups of four, two kept a row and group: `--pattern
16:32g`) becomes one as well, as 2:4 in each tile's own column order (`sp24.tile_grouped`, 1.19 bytes a weight),
which comes first where a mask fits both.

The tiled layout holds the same bytes as the packed format (kept values or codes, 4 bits of positions per 4
columns, the scales), so the swap costs no memory; `packed` and `state_dict` give back the packed format exactly
(`sp24.untile`), so checkpoints saved from a tiled model are the ones `pack` writes. Up to 16 rows of x run the
kernel (through the custom op `sparsedecoding::sp24_mm` while torch.compile traces); more rows (prefill) multiply
by the weight densified for the call, as `PackedLinear` does."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
import torch.nn.functional as F

from ..errors import EngineError, KernelInputError, PackingError
from .format import PackedNM, apply_keeping_dtypes, pack_nm
from .linear import PackedLinear
from .op import MAX_BATCH
from .overflow import merge_overflow_quantized, split_overflow, split_overflow_quantized, words_over_cap
from .quantized import PackedNMQ
from .quantized_linear import QuantizedPackedLinear
from .reference import rms_norm
from .sp24 import OVER_INT4_GROUP, OVER_SLOTS, Sp24Weight, grouped_split, looks_grouped, sp24_linear, \
    sp24_norm_linear, step_tiles, tile, tile_grouped, tile_overflow, to_dense, untile, untile_slots

log = logging.getLogger(__name__)


class Sp24Linear(torch.nn.Module):
    """y = x·Wᵀ + bias for x [..., in], W [out, in] 2:4, held as the tiled buffers `a`, `meta` (and `scales` for
    int4, `row_scales` for int8) of an `Sp24Weight`; for a 16:32+2 weight (`slotted`), W's 2:4 part plus the
    overflow slots `over_v`, `over_o`; for a 16:32g weight (`grouped`), W as 2:4 in each tile's column order and the
    order's places `over_o`. With `glu` (a gate|up weight tiled for it, no bias), y = silu(gate)·up, `out_features`
    = `rows` / 2 columns."""

    def __init__(self, weight: Sp24Weight, bias: torch.Tensor | None = None):
        super().__init__()
        if weight.glu and bias is not None:
            raise KernelInputError("a GLU-tiled weight takes no bias (the kernel applies the activation to its sums)")
        self.rows, self.in_features = weight.shape
        self.out_features, self.glu = weight.out_features, weight.glu
        self.slotted, self.grouped = weight.over_v is not None, weight.grouped
        self.split_rows = weight.split_rows  # grouped: the rows that share a column order (16:32g 16, 16:32g8 8)
        self.n, self.m = (16, 32) if self.slotted or self.grouped else (2, 4)  # the pattern it is saved in
        self.quantize = {0: None, 8: "int8", 4: "int4"}[weight.code]
        self.group_size = {0: None, 8: self.in_features, 4: 32 << weight.gk_shift}[weight.code]
        self.code, self.value_dtype, self.steps = weight.code, weight.dtype, weight.steps
        self.gk_shift, self.groups = weight.gk_shift, weight.groups
        self.register_buffer("a", weight.a)
        self.register_buffer("meta", weight.meta)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("row_scales", weight.row_scales)
        self.register_buffer("over_v", weight.over_v)
        self.register_buffer("over_o", weight.over_o)
        self.register_buffer("bias", bias)
        self.register_buffer("dense", None, persistent=False)  # keep_dense_copy's W, never saved
        self.dense_from_rows: int | None = None

    def keep_dense_copy(self, from_rows: int) -> None:
        """Hold W dense as well (16-bit values only), and multiply `from_rows` or more rows of x by it with cuBLAS,
        the RMSNorm in front (`normed`) then computed apart; fewer rows stay on the sparse tensor-core kernel."""
        if from_rows < 2:
            raise KernelInputError(f"dense copy from {from_rows} rows of x: the sparse kernel would never run; "
                                   "use 2 or more")
        if self.code != 0:
            raise KernelInputError("dense copies are kept of 16-bit weights only; this one holds "
                                   f"{self.quantize} codes")
        self.dense = self._dense(self.value_dtype)
        self.dense_from_rows = from_rows

    def _apply(self, fn, recurse=True):
        """`.to(device)` moves every buffer; `model.half()` / `.float()` convert the bias and the dense copy, not the
        tiled values, overflow slots and scales, which the kernel reads in the format's dtypes."""
        apply_keeping_dtypes(self, _TILED, fn, lambda: super(Sp24Linear, self)._apply(fn, recurse))
        return self

    def _check_traced_dtype(self, x: torch.Tensor) -> None:
        """Under torch.compile the ops read the tiles in x's dtype (eager, `sp24_linear` checks this itself)."""
        if x.dtype != self.value_dtype:
            raise KernelInputError(f"x is {x.dtype} but this Sp24Linear was tiled for {self.value_dtype}; cast x to "
                                   f"{self.value_dtype}")

    def _on_dense_copy(self, rows: int) -> bool:
        return self._buffers["dense"] is not None and rows >= self.dense_from_rows

    @classmethod
    def from_module(cls, module: PackedLinear | QuantizedPackedLinear, glu: bool = False) -> Sp24Linear:
        """`module`'s weight tiled (a 16:32 one in grouped columns where its mask is 16:32g, else as its 2:4 part plus
        overflow slots: PackingError, in one line, if its mask fits neither); with `glu`, as a gate|up weight whose
        output is silu(gate)·up."""
        return cls(_tiled(module.packed, glu), module.bias)

    @property
    def weight(self) -> Sp24Weight:
        """The buffers as an `Sp24Weight`, rebuilt only when a buffer was replaced (`.to()`, `load_state_dict`)."""
        buffers = self._buffers
        cached = self.__dict__.get("_weight")
        if cached is None or cached.a is not buffers["a"] or cached.meta is not buffers["meta"] \
                or cached.scales is not buffers["scales"] or cached.row_scales is not buffers["row_scales"] \
                or cached.over_v is not buffers["over_v"] or cached.over_o is not buffers["over_o"]:
            cached = Sp24Weight(buffers["a"], buffers["meta"], buffers["scales"], buffers["row_scales"],
                                (self.rows, self.in_features), self.code, self.value_dtype, self.steps,
                                self.gk_shift, self.groups, self.glu, buffers["over_v"], buffers["over_o"],
                                grouped=self.grouped, split_rows=self.split_rows)
            self.__dict__["_weight"] = cached
        return cached

    @property
    def packed(self) -> PackedNM | PackedNMQ:
        """The packed weight (`PackedNM` or `PackedNMQ`) this layer holds, rebuilt exactly from the tiles; for a
        16:32+2 weight, the 16:32 packed weight of its nonzeros (`pack_nm`: a kept weight of value zero, which the
        tiles do not record, may come back in another position of its word)."""
        if not self.slotted and not self.grouped:
            return untile(self.weight)
        if self.code == 0:
            return pack_nm(to_dense(self.weight), 16, 32)
        weight = self.weight
        w24 = untile(replace(weight, over_v=None, over_o=None))
        codes, columns = untile_slots(weight)
        return merge_overflow_quantized(w24, codes, columns)

    def to_packed_module(self) -> PackedLinear | QuantizedPackedLinear:
        """The packed module of the same weight (for a GLU one, the plain gate|up linear)."""
        packed = self.packed
        return (PackedLinear if isinstance(packed, PackedNM) else QuantizedPackedLinear)(packed, self.bias)

    def _dense(self, dtype: torch.dtype) -> torch.Tensor:
        return to_dense(self.weight).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # An eager call is host-bound at decode sizes, so this path is kept lean as PackedLinear's is: buffers read
        # from their dict, a 2-D x to the kernel without a reshape and a view back
        shape = x.shape
        flat = len(shape) == 2 and shape[1] == self.in_features
        if not flat and (len(shape) == 0 or shape[-1] != self.in_features):
            raise KernelInputError(f"x has shape {tuple(shape)}; this Sp24Linear takes [..., {self.in_features}]")
        x2 = x if flat else x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        buffers = self._buffers
        dense = buffers["dense"]
        on_copy = dense is not None and rows >= self.dense_from_rows
        if on_copy or rows > MAX_BATCH or rows == 0 or not x.is_cuda:  # dense copy, prefill, no rows, CPU
            y = F.linear(x2, dense if on_copy else self._dense(x.dtype))
            if self.glu:
                gate, up = y.chunk(2, dim=-1)
                y = F.silu(gate) * up
        elif torch.compiler.is_compiling():
            self._check_traced_dtype(x)
            y = torch.ops.sparsedecoding.sp24_mm(x2.contiguous(), buffers["a"], buffers["meta"], buffers["scales"],
                                                 buffers["row_scales"], self.rows, self.in_features, self.code,
                                                 self.steps, self.gk_shift, self.groups, self.glu, buffers["over_v"],
                                                 buffers["over_o"], False, self.grouped, self.split_rows)
        else:
            y = sp24_linear(x2.contiguous(), self.weight)
        bias = buffers["bias"]
        if bias is not None:
            y = y + bias
        return y if flat else y.view(*shape[:-1], self.out_features)

    def normed(self, x: torch.Tensor, res: torch.Tensor, norm_weight: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(rms_norm(s)), s) for the residual sum s = x + res: in the kernel for up to 16 rows on CUDA (which
        scales its sums by 1/rms instead of the normed x, so the two differ by rounding: see sp24.cu), elsewhere
        exactly as the separate add, RMSNorm and linear compute it."""
        shape = x.shape
        if len(shape) == 0 or shape[-1] != self.in_features or res.shape != shape:
            raise KernelInputError(f"x has shape {tuple(shape)} and res {tuple(res.shape)}; this Sp24Linear takes "
                                   f"both [..., {self.in_features}]")
        x2, res2 = x.reshape(-1, self.in_features), res.reshape(-1, self.in_features)
        if not 0 < x2.shape[0] <= MAX_BATCH or not x.is_cuda or self._on_dense_copy(x2.shape[0]):
            total = x + res
            return self(rms_norm(total, norm_weight, eps)), total
        if torch.compiler.is_compiling():
            self._check_traced_dtype(x)
            y, total = torch.ops.sparsedecoding.sp24_norm_mm(
                x2.contiguous(), res2.contiguous(), norm_weight, eps, self.a, self.meta, self.scales,
                self.row_scales, self.rows, self.in_features, self.code, self.steps, self.gk_shift, self.groups,
                self.glu, self.over_v, self.over_o, self.grouped, self.split_rows)
        else:
            y, total = sp24_norm_linear(x2.contiguous(), self.weight, res2.contiguous(), norm_weight, eps)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features), total.view(shape)

    def _packed_keys(self) -> tuple[str, ...]:
        return ("values", "bitmask") if self.code == 0 else ("codes", "scales", "bitmask")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Saved as the packed format (`PackedLinear` / `QuantizedPackedLinear` keys), never as tiles."""
        packed = self.packed
        for name in self._packed_keys():
            destination[prefix + name] = getattr(packed, name)
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Loads the packed format's keys (what `_save_to_state_dict` writes) and tiles them in place."""
        names = self._packed_keys()
        known = set(names) | ({"bias"} if self.bias is not None else set())
        unexpected_keys += [key for key in state_dict if key.startswith(prefix) and "." not in key[len(prefix):]
                            and key[len(prefix):] not in known]
        absent = [prefix + name for name in names if prefix + name not in state_dict]
        if self.bias is not None and prefix + "bias" not in state_dict:
            absent.append(prefix + "bias")
        if absent:
            missing_keys += absent
            return
        device = self.a.device
        if self.bias is not None and state_dict[prefix + "bias"].shape != self.bias.shape:
            error_msgs.append(f"size mismatch for {prefix}bias: copying a param with shape "
                              f"{tuple(state_dict[prefix + 'bias'].shape)}, the shape in current model is "
                              f"{tuple(self.bias.shape)}")
            return
        parts = [state_dict[prefix + name].to(device) for name in names]
        shape = (self.rows, self.in_features)
        try:
            packed = PackedNM(*parts, self.n, self.m, shape) if self.code == 0 else PackedNMQ(
                *parts, self.n, self.m, shape, self.quantize, self.group_size)
            weight = _tiled(packed, self.glu)
        except (PackingError, KernelInputError) as exc:  # wrong shape, dtype or mask: reported as a load error
            error_msgs.append(f"{prefix}: {exc}")
            return
        for name in _TILED:
            self._buffers[name] = getattr(weight, name)
        self.slotted, self.grouped = weight.over_v is not None, weight.grouped  # the loaded mask's layout
        self.split_rows = weight.split_rows
        if self.bias is not None:
            self.bias.copy_(state_dict[prefix + "bias"])
        if self._buffers["dense"] is not None:  # the copy follows the loaded weight
            self.dense = self._dense(self.value_dtype)

    def extra_repr(self) -> str:
        values = {0: str(self.value_dtype).replace("torch.", ""), 8: "int8",
                  4: f"int4, group_size={32 << self.gk_shift}"}
        glu = f", silu(gate)·up of {self.rows} rows" if self.glu else ""
        pattern = f"16:32+{OVER_SLOTS} (2:4 tiles + {OVER_SLOTS} overflow slots a word)" if self.slotted else \
            ("16:32g (2:4 in each tile's column order)" if self.split_rows == 16 else
             f"16:32g{self.split_rows} (2:4 in the column order of each {self.split_rows} rows)") if self.grouped \
            else "2:4"
        copy = f", dense copy from {self.dense_from_rows} rows" if self._buffers["dense"] is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, pattern={pattern}, "
                f"{values[self.code]}{glu}, tiled for sparse tensor cores{copy}")


_TILED = ("a", "meta", "scales", "row_scales", "over_v", "over_o")  # an Sp24Weight's tensors, the layer's buffers


def _tiled(packed: PackedNM | PackedNMQ, glu: bool) -> Sp24Weight:
    """`packed` in the kernel's layout: a 2:4 weight by `sp24.tile`, a 16:32 one of 16-bit values whose mask is
    16:32g (or else 16:32g8) in grouped columns (`sp24.tile_grouped`), any other 16:32 one as its 2:4 part plus
    overflow slots (`sp24.tile_overflow`; PackingError if its nonzeros do not fit 16:32+2)."""
    if (packed.n, packed.m) == (16, 32):
        if isinstance(packed, PackedNMQ):
            return tile_overflow(split_overflow_quantized(packed, OVER_SLOTS), glu)
        dense = packed.to_dense()
        for split_rows in (16, 8):
            order = grouped_split(dense, split_rows=split_rows)
            if order is not None:
                return tile_grouped(dense, order, glu=glu, split_rows=split_rows)
        try:
            return tile_overflow(split_overflow(dense, OVER_SLOTS), glu)
        except PackingError as exc:
            raise PackingError(f"its mask is not 16:32g or 16:32g8, and {exc}") from exc
    return tile(packed, glu)


MAX_PADDING = 1 / 16  # tile only where the padded rows and columns add at most this share of bytes


def padding_overhead(out: int, in_features: int, quantize: str | None) -> float:
    """Share of extra bytes the tiled layout's padding (rows to 16, columns to whole steps) adds."""
    columns = 32 * step_tiles({None: 0, "int8": 8, "int4": 4}[quantize])
    return (-(-out // 16) * 16 * -(-in_features // columns) * columns) / (out * in_features) - 1


def tileable(module: torch.nn.Module, require_cuda: bool = True, slots: bool = False) -> str | None:
    """None when `module` can become an `Sp24Linear`, else why not (`require_cuda`: only on a CUDA device, where
    the kernel runs; `slots`: a 16:32 linear whose mask fits 16:32+2 may, as its 2:4 part plus overflow slots). A
    16:32 mask beyond 16:32+2 is taken here on `sp24.looks_grouped`, its first words only: the whole split is read
    once, when it is tiled (`tile_model` leaves it packed, with a warning, if some later word has none)."""
    if not isinstance(module, (PackedLinear, QuantizedPackedLinear)):
        return "not a packed linear"
    if isinstance(module, PackedLinear) and module.dense is not None:
        return "it keeps a dense copy"
    if (module.n, module.m) == (16, 32):
        if not slots:
            return "pattern 16:32 (on sparse tensor cores only as 16:32+2 with overflow slots, not asked for here)"
        if isinstance(module, QuantizedPackedLinear) and module.quantize == "int4" \
                and module.group_size != OVER_INT4_GROUP:
            return (f"pattern 16:32 with int4 group size {module.group_size} (overflow slots with int4 codes run "
                    f"{OVER_INT4_GROUP} columns a scale)")
        dense = module.packed.to_dense()
        over = words_over_cap(dense, OVER_SLOTS)
        if over and not (isinstance(module, PackedLinear) and any(looks_grouped(dense, split_rows=rows)
                                                                  for rows in (16, 8))):
            return (f"pattern 16:32 with {over} mask words beyond 16:32+{OVER_SLOTS} (prune with --pattern "
                    f"16:32+{OVER_SLOTS}, 16:32g or 16:32g8 to run it on sparse tensor cores)")
    elif (module.n, module.m) != (2, 4):
        return f"pattern {module.n}:{module.m} (sparse tensor cores run 2:4, and 16:32 masks that fit 16:32+2)"
    if isinstance(module, QuantizedPackedLinear) and module.quantize == "int4":
        group_tiles = module.group_size // 32
        if group_tiles & (group_tiles - 1):
            return f"int4 group size {module.group_size} (needs a power-of-two multiple of 32)"
    padded = padding_overhead(module.out_features, module.in_features, module.quantize if isinstance(
        module, QuantizedPackedLinear) else None)
    if padded > MAX_PADDING:
        return (f"shape {module.out_features}x{module.in_features} pads to the kernel's tiles with {padded:.0%} more "
                "bytes")
    device = module.bitmask.device
    if require_cuda and device.type != "cuda":
        return f"on {device} (the kernel runs on CUDA)"
    return None


GLU_NAME = "gate_up"  # the engine's fused gate|up linear (engine.model.MLP), whose caller applies silu(gate)·up


def tile_model(model: torch.nn.Module, require_cuda: bool = True, glu: bool = False, slots: bool = False) -> int:
    """Swap, in place, every 2:4 `PackedLinear` / `QuantizedPackedLinear` on CUDA that `tileable` takes (padding to
    the kernel's tiles adds at most MAX_PADDING, so not those of tiny models) for an `Sp24Linear` holding the same
    weight tiled (the packed tensors are released as each is replaced, so peak memory grows by one layer); with
    `slots`, also every 16:32 `PackedLinear` whose mask is 16:32g or 16:32g8 (in grouped columns) or fits 16:32+2
    (as its 2:4 part plus overflow slots). With `glu`, each linear named GLU_NAME without a bias (rows a multiple of
    32) is tiled to give silu(gate)·up itself, which the engine's MLP then skips. A 16:32 linear whose mask
    `tileable` took on its first words but whose split breaks later stays packed, named in a warning. Progress shows
    as a bar on a terminal. Returns how many were swapped."""
    from tqdm.auto import tqdm

    names = [name for name, module in model.named_modules() if tileable(module, require_cuda, slots) is None]
    tiled = 0
    # a bar where it may take a while: reading 16:32g8 splits back took 133 s for an 8B model on an H100
    for name in tqdm(names, desc="tiling", unit="linear", disable=None, leave=False):
        module = model.get_submodule(name)
        fuse = glu and name.rsplit(".", 1)[-1] == GLU_NAME and module.bias is None and module.out_features % 32 == 0
        try:
            model.set_submodule(name, Sp24Linear.from_module(module, fuse))
        except PackingError as exc:
            if (module.n, module.m) != (16, 32):
                raise
            # a 16:32 mask whose first words looked grouped (`tileable`) and a later one not
            log.warning("%s stays on the packed kernels: %s", name, exc)
            continue
        tiled += 1
    return tiled


_unavailable: str | None = None  # why the kernel cannot run in this process, once known
_checked = False
_warned = False


def sp24_problem() -> str | None:
    """None when the sparse tensor-core kernel can run here (it is built and loaded on the first call), else why
    not."""
    global _checked, _unavailable
    if not _checked:
        from . import cuda_mma
        from .sp24 import load

        try:
            load()
        except cuda_mma.CudaKernelUnavailableError as exc:
            _unavailable = str(exc)
        _checked = True
    return _unavailable


def tile_where_kernel_runs(model: torch.nn.Module, slots: bool, glu: bool = False) -> int:
    """`tile_model(model, glu=glu, slots=slots)` where some linear is tileable on CUDA and the sparse tensor-core
    kernel runs here; where it cannot, the packed modules stay and the reason is logged once as a warning. Returns
    how many linears were tiled. What the engine (`tile_for_kernel`) and `sparsify` (`swap.tile_packed`) share."""
    if not any(tileable(module, slots=slots) is None for module in model.modules()):
        return 0
    problem = sp24_problem()
    if problem is not None:
        global _warned
        if not _warned:
            _warned = True
            log.warning("2:4 linears stay on the packed kernels: the sparse tensor-core kernel cannot run here "
                        "(%s). Set SPARSEDECODING_KERNEL=triton to choose them explicitly and silence this.", problem)
        return 0
    return tile_model(model, glu=glu, slots=slots)


def tile_for_kernel(model: torch.nn.Module) -> int:
    """What the engine does with a freshly built model: under SPARSEDECODING_KERNEL=auto (the default) every 2:4
    packed linear on CUDA becomes an `Sp24Linear` when the kernel can run here (if it cannot, the packed modules stay,
    and the reason is logged once as a warning); `triton` and `cuda` keep the packed modules and their kernels.
    SPARSEDECODING_SP24_SLOTS (1, the default) tiles the 16:32 linears whose masks fit 16:32+2 as well (`tile_model`'s
    `slots`). SPARSEDECODING_FUSE_GLU (1, the default) tiles the MLPs' gate|up linears to apply silu(gate)·up in the
    kernel; SPARSEDECODING_FUSE_NORM (auto, the default: in calls of up to 8192 // hidden size rows, none beyond 4096
    wide, `op.fuse_norm_rows`) lets each block's qkv and gate_up kernels take its residual additions and RMSNorms
    (`fuse_norms`). Quantized 16:32 linears left on the packed scan kernel (masks beyond 16:32+2, or slots off) are
    named in one warning: that kernel is slower than dense from batch 4.
    Returns how many linears were tiled."""
    tiled = _tile_for_kernel(model)
    _warn_packed_16of32_codes(model)
    return tiled


def _tile_for_kernel(model: torch.nn.Module) -> int:
    from .op import (FUSE_GLU_SETTING, FUSE_NORM_AUTO_MAX_DIM, FUSE_NORM_SETTING, KERNEL_SETTING, SP24_SLOTS_SETTING,
                     fuse_norm_rows, settings)

    values = settings()  # all of them, so that a bad one fails here, before any launch reads it
    setting, glu, norm = values[KERNEL_SETTING], values[FUSE_GLU_SETTING], values[FUSE_NORM_SETTING]
    slots = values[SP24_SLOTS_SETTING]
    tiled = tile_where_kernel_runs(model, slots, glu) if setting == "auto" else 0
    if not tiled:
        return 0
    slotted = sum(isinstance(module, Sp24Linear) and module.slotted for module in model.modules())
    if slotted:
        log.info("%d of the %d linears on sparse tensor cores are 16:32+%d (2:4 tiles plus overflow slots)", slotted,
                 tiled, OVER_SLOTS)
        _load_columns_build({(module.weight.build_ks, module.weight.build_int4_ks) for module in model.modules()
                             if isinstance(module, Sp24Linear) and module.slotted})
    grouped = [module.split_rows for module in model.modules() if isinstance(module, Sp24Linear) and module.grouped]
    if grouped:
        log.info("%d of the %d linears on sparse tensor cores are 16:32g (2:4 in each tile's column order; %d of them "
                 "16:32g8, in each 8 rows' order)", len(grouped), tiled, grouped.count(8))
        _load_grouped_build(tuple(sorted(set(grouped))))
    blocks = [module for module in model.modules() if hasattr(module, "fuse_norms")]
    dim = blocks[0].attention_norm.weight.numel() if blocks else 0
    rows = fuse_norm_rows(norm, dim, bool(slotted)) if blocks else 0
    if rows:
        fused = fuse_norms(model, rows)
        log.info("%d blocks hand their residual additions and RMSNorms to the 2:4 qkv and gate_up kernels in calls of "
                 "up to %d rows (SPARSEDECODING_FUSE_NORM=%s, hidden size %d)", fused, rows, norm, dim)
    elif blocks and norm == "auto" and slotted:
        log.info("the RMSNorms stay in the compiled blocks: SPARSEDECODING_FUSE_NORM=auto does not fuse them in front "
                 "of linears with overflow slots (16:32+2 ran slower fused at batch 1 and 2)")
    elif blocks and norm == "auto":
        log.info("the RMSNorms stay in the compiled blocks: SPARSEDECODING_FUSE_NORM=auto fuses them for hidden sizes "
                 "up to %d only (this model's: %d; the 14B's 5120 ran slower fused)", FUSE_NORM_AUTO_MAX_DIM, dim)
    return tiled


def _load_grouped_build(split_rows: tuple[int, ...] = (16,)) -> None:
    """Build (or load) now, not at the first launch of a decode, the kernel library with grouped columns (OVER 6),
    for each of the orders' row counts in use (8: the build with SP24_GROUPED_HALVES too) and each launch bound the
    tuner will try (SPARSEDECODING_SP24_GROUPED_CTAS; both under timed); EngineError, in one line, if one cannot be
    built."""
    from . import cuda_mma
    from .op import sp24_grouped_ctas_setting, sp24_grouped_ctas_timed, sp24_halves_acc_setting
    from .sp24 import _load

    bounds = (2, 1) if sp24_grouped_ctas_timed() else (sp24_grouped_ctas_setting(),)  # timed: the tuner tries both
    try:
        for rows in split_rows:
            for bound in bounds:
                _load(grouped=True, halves=sp24_halves_acc_setting() if rows != 16 else 0, grouped_ctas=bound)
    except cuda_mma.CudaKernelUnavailableError as exc:
        raise EngineError(f"the sparse tensor-core kernel's build with grouped columns failed ({exc}); set "
                          "SPARSEDECODING_SP24_SLOTS=0 to keep 16:32 linears on the packed kernels") from exc


def _on_cuda(module: QuantizedPackedLinear) -> bool:
    return module.bitmask.device.type == "cuda"


def _warn_packed_16of32_codes(model: torch.nn.Module) -> None:
    """One warning when quantized 16:32 linears on CUDA stay on the packed scan kernel (masks beyond 16:32+2, or slots
    switched off): it decodes slower than dense bf16 from batch 4 (0.76x / 0.36x at batch 4 / 8 on the 8B preset,
    benchmarks/results/quant_e2e_h200_8b_slots.md)."""
    left = [module for module in model.modules() if isinstance(module, QuantizedPackedLinear)
            and (module.n, module.m) == (16, 32) and _on_cuda(module)]
    if left:
        log.warning("%d quantized 16:32 linears stay on the packed scan kernel, which decodes slower than dense bf16 "
                    "from batch 4; pruned with --pattern 16:32+2 (and SPARSEDECODING_SP24_SLOTS=1) they run on the "
                    "2:4 sparse tensor-core kernel", len(left))


def _load_columns_build(builds: set[tuple[int, int]]) -> None:
    """Build (or load) now, not at the first launch of a decode, the kernel libraries with the slots' columns order
    for `builds`, the (SP24_INT8_KS, SP24_INT4_KS) pairs that a model's slotted linears name (`Sp24Weight.build_ks`,
    `build_int4_ks`), which SPARSEDECODING_SP24_OVER_LOOP=auto runs at some batches (`sp24.over_loop`), as do
    columns and mma (the tensor-core loop lives in the same build); EngineError,
    in one line, if one cannot be built."""
    from . import cuda_mma
    from .op import sp24_over_loop_setting
    from .sp24 import _load

    if sp24_over_loop_setting() not in ("auto", "columns", "mma"):
        return
    try:
        for int8_ks, int4_ks in sorted(builds):
            _load(columns=True, int8_ks=int8_ks, int4_ks=int4_ks)
    except cuda_mma.CudaKernelUnavailableError as exc:
        raise EngineError(f"the sparse tensor-core kernel's build with the slots' columns order failed ({exc}); "
                          "set SPARSEDECODING_SP24_OVER_LOOP=rows or SPARSEDECODING_SP24_SLOTS=0") from exc


def fuse_norms(model: torch.nn.Module, rows: int = MAX_BATCH) -> int:
    """Set `fuse_norms` to `rows` on every engine block (`engine.model.Block`) whose qkv and gate_up are `Sp24Linear`,
    so that their kernels take the block's residual additions and RMSNorms in calls of up to `rows` rows (tokens).
    Returns how many blocks."""
    if not 0 < rows <= MAX_BATCH:
        raise ValueError(f"rows {rows}: the 2:4 kernels take the RMSNorm of 1..{MAX_BATCH} rows")
    count = 0
    for module in model.modules():
        if hasattr(module, "fuse_norms") and isinstance(module.attention.qkv, Sp24Linear) \
                and isinstance(module.mlp.gate_up, Sp24Linear):
            module.fuse_norms = rows
            count += 1
    return count


def untile_model(model: torch.nn.Module) -> int:
    """Inverse of `tile_model` (and `fuse_norms`): every `Sp24Linear` back to its packed module (without a dense
    copy it kept: `keep_dense_copies` again if wanted). Returns how many."""
    for module in model.modules():
        if hasattr(module, "fuse_norms"):
            module.fuse_norms = 0
    names = [name for name, module in model.named_modules() if isinstance(module, Sp24Linear)]
    for name in names:
        model.set_submodule(name, model.get_submodule(name).to_packed_module())
    return len(names)
