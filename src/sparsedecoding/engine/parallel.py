"""Tensor parallelism for the decode engine (Megatron-style): each of `world` GPUs holds a slice of every block linear
and of lm_head, and the residual stream is replicated.

- Column-parallel (split output rows): the fused q|k|v, whose q, k and v parts are each split so that a rank holds
  whole heads (n_heads/world query heads and the n_kv_heads/world KV heads they read), and the fused gate|up, whose
  gate and up parts are split alike so that a rank's gate row i meets its own up row i. No communication: each rank
  attends with its heads and gates its slice of the intermediate activations.
- Row-parallel (split input columns): attention.out and mlp.down take the rank's slice of heads or intermediate
  activations and produce a partial sum of the full output; one all-reduce after each restores it. Packed weights
  split on whole 32-column mask words, so every shard keeps exactly 32·N/M values per word and stays a valid packed
  weight (`kernels.format`).
- Vocabulary-parallel lm_head: each rank scores a contiguous slice of the vocabulary and an all-gather assembles the
  logits, so every rank samples the same token from the same numbers. Embeddings, norms and the KV cache layout stay
  as they are (the cache holds the rank's KV heads only).

The shard functions are pure (rank and world size in, a slice out); the collectives take a process group, `None`
meaning one GPU. Processes are started by `torchrun --nproc-per-node N`, which sets the environment that
`start_from_env` reads.

All-reduce, two ways (`ALL_REDUCE`; `auto`, the default, is one-shot where it can run, see `one_shot_possible`, and
NCCL's or gloo's otherwise): `nccl` (NCCL's all-reduce, traced as a functional collective) or `one-shot` (CUDA
only): every rank copies its partial sum into a buffer of symmetric memory that all ranks have mapped (PyTorch's
`torch.distributed._symmetric_memory`, peer to peer over NVLink, no multicast), waits at a barrier of signal flags,
reads all ranks' buffers and adds them, then waits at a second barrier before the buffer may be written again: one
kernel of a few microseconds for the small vectors of a decode step. On two H200s the 8B preset's TP=2 step took
3.70 ms with it and 4.20 ms with NCCL, the 70B one's 21.31 and 22.65 ms (benchmarks/results/tp_h200x2_*_one_shot.md
and tp_h200x2_*.md: runs a day apart, not side by side). Tensors larger than the buffer (prefill) and dtypes the kernel
does not add (float16) go to NCCL; which one a call uses depends only on its size and dtype, the same on every
rank."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import EngineError
from ..settings import ALL_REDUCE
from ..kernels.format import PackedNM, values_per_word
from .config import ModelArgs

Weight = Tensor | PackedNM
ProcessGroup = dist.ProcessGroup
_WORD = 32  # columns per packed mask word: the unit a row-parallel split must respect
# one-shot buffer: 16 rows of a 16384-wide residual stream in bfloat16 (decode steps of every preset up to batch 16)
ONE_SHOT_BYTES = 16 * 16384 * 2
_ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)  # what PyTorch's one-shot kernel adds
_one_shot_buffers: dict[str, Tensor] = {}  # group name -> this rank's symmetric buffer (bytes)
_one_shot_capacity: dict[str, int] = {}  # group name -> its size in bytes; kept apart so torch.compile guards an int
log = logging.getLogger(__name__)


def rank_and_world(tp: ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) of the group; (0, 1) without one."""
    return (0, 1) if tp is None else (tp.rank(), tp.size())


def check_world(args: ModelArgs, world: int) -> None:
    """Raise EngineError unless `world` GPUs can split this model: query and KV heads, the vocabulary and the input
    columns of the row-parallel linears (in whole 32-column words) must divide evenly."""
    problems = []
    if args.n_heads % world or args.n_kv_heads % world:
        problems.append(f"{args.n_heads} query and {args.n_kv_heads} KV heads")
    for name, columns in (("attention.out", args.n_heads * args.head_dim), ("mlp.down", args.intermediate_size)):
        if columns % (_WORD * world):
            problems.append(f"the {columns} input columns of {name} (split on whole {_WORD}-column words)")
    if args.vocab_size % world:
        problems.append(f"a vocabulary of {args.vocab_size}")
    if problems:
        raise EngineError(f"tensor parallelism over {world} GPUs cannot split {'; '.join(problems)}; use a number of "
                          f"GPUs that divides them, or 1")


def local_args(args: ModelArgs, world: int) -> ModelArgs:
    """The block shapes one rank holds: its heads and its slice of the intermediate size (vocabulary and width are
    the model's: embeddings are replicated, lm_head's slice is sized by the Transformer). One rank holds `args`
    whatever its shapes."""
    if world == 1:
        return args
    check_world(args, world)
    return dataclasses.replace(args, n_heads=args.n_heads // world, n_kv_heads=args.n_kv_heads // world,
                               intermediate_size=args.intermediate_size // world)


def split_rows(weight: Weight, segments: list[int], rank: int, world: int) -> Weight:
    """Rank `rank`'s rows of a weight made of consecutive row `segments` (q|k|v, gate|up, or one segment for
    lm_head): the rank-th 1/world of every segment, concatenated in segment order. Works for a bias too (1-D)."""
    rows = weight.shape[0]
    if sum(segments) != rows or any(size % world for size in segments):
        raise EngineError(f"cannot split rows {segments} of a weight with {rows} rows evenly over {world} GPUs")
    starts = [sum(segments[:i]) + rank * size // world for i, size in enumerate(segments)]
    pieces = [(start, size // world) for start, size in zip(starts, segments)]
    if isinstance(weight, PackedNM):
        values = torch.cat([weight.values.narrow(0, start, length) for start, length in pieces])
        bitmask = torch.cat([weight.bitmask.narrow(0, start, length) for start, length in pieces])
        return PackedNM(values, bitmask, weight.n, weight.m, (rows // world, weight.shape[1]))
    if len(pieces) == 1:  # a view: a tied lm_head shard shares the embedding's memory
        return weight.narrow(0, *pieces[0])
    return torch.cat([weight.narrow(0, start, length) for start, length in pieces])


def split_columns(weight: Weight, rank: int, world: int) -> Weight:
    """Rank `rank`'s contiguous 1/world of the input columns, cut on whole 32-column words (for a packed weight
    these are its mask words and the 32·N/M values of each)."""
    rows, columns = weight.shape
    if columns % (_WORD * world):
        raise EngineError(f"cannot split {columns} input columns into {world} slices of whole {_WORD}-column words")
    width = columns // world
    if isinstance(weight, PackedNM):
        words, k = width // _WORD, values_per_word(weight.n, weight.m)
        return PackedNM(weight.values[:, rank * words * k:(rank + 1) * words * k].contiguous(),
                        weight.bitmask[:, rank * words:(rank + 1) * words].contiguous(),
                        weight.n, weight.m, (rows, width))
    return weight[:, rank * width:(rank + 1) * width].contiguous()


def shard_weight(key: str, weight: Weight, args: ModelArgs, rank: int, world: int) -> Weight:
    """Rank `rank`'s part of engine tensor `key` (weight or bias) of a model with `args`; replicated tensors
    (embeddings, norms) are returned as they are."""
    if world == 1:
        return weight
    module = key.rsplit(".", 1)[0]
    if module.endswith("attention.qkv"):
        kv = args.n_kv_heads * args.head_dim
        return split_rows(weight, [args.n_heads * args.head_dim, kv, kv], rank, world)
    if module.endswith("mlp.gate_up"):
        return split_rows(weight, [args.intermediate_size] * 2, rank, world)
    if module.endswith(("attention.out", "mlp.down")):
        return split_columns(weight, rank, world)
    if module == "output":
        return split_rows(weight, [args.vocab_size], rank, world)
    return weight


def shard_state(args: ModelArgs, state: dict[str, Weight], rank: int, world: int) -> dict[str, Weight]:
    """Rank `rank`'s engine state dict of a full one (see `shard_weight`); a tied lm_head becomes a slice of the
    embedding."""
    check_world(args, world)
    return {key: shard_weight(key, weight, args, rank, world) for key, weight in state.items()}


def all_reduce(x: Tensor, tp: ProcessGroup | None) -> Tensor:
    """Sum of x over the ranks (a row-parallel linear's partial outputs); x itself without a group. With one-shot
    enabled for the group (`enable_one_shot`) and x small enough, the one-shot kernel; otherwise NCCL through the
    functional collectives. Both are traced by torch.compile and captured with the step in a CUDA graph."""
    if tp is None:
        return x
    if takes_one_shot(x, tp.group_name):
        return torch.ops.sparsedecoding.one_shot_all_reduce(x, tp.group_name)
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.all_reduce(x, "sum", tp.group_name))


def takes_one_shot(x: Tensor, group_name: str) -> bool:
    """Whether `all_reduce` sums x with the one-shot kernel: enabled for the group, x fits its buffer, and the kernel
    adds x's dtype. Decided from shapes and dtypes only, so every rank decides alike."""
    return x.numel() * x.element_size() <= _one_shot_capacity.get(group_name, 0) and x.dtype in _ONE_SHOT_DTYPES


@torch.library.custom_op("sparsedecoding::one_shot_all_reduce", mutates_args=())
def one_shot_all_reduce(x: Tensor, group_name: str) -> Tensor:
    """PyTorch's one-shot all-reduce on the group's symmetric buffer (see the module docstring). The buffer view must
    have x's shape and the same alignment: x is copied in by the kernel itself when it starts on a 16-byte boundary,
    by a separate copy otherwise (the sum is the same)."""
    buffer = _one_shot_buffers[group_name][:x.numel() * x.element_size()].view(x.dtype).view(x.shape)
    x = x.contiguous()
    if x.storage_offset() * x.element_size() % 16 == 0:
        return torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, x, "sum", group_name)
    buffer.copy_(x)
    return torch.ops.symm_mem.one_shot_all_reduce(buffer, "sum", group_name)


@one_shot_all_reduce.register_fake
def _(x: Tensor, group_name: str) -> Tensor:
    return torch.empty_like(x)


def enable_one_shot(tp: ProcessGroup, device: torch.device, nbytes: int = ONE_SHOT_BYTES) -> None:
    """Allocate this rank's symmetric buffer of `nbytes` on `device` and map every rank's (a collective: all ranks
    call it); from then on `all_reduce` over `tp` uses the one-shot kernel for tensors of up to `nbytes`."""
    if device.type != "cuda":
        raise EngineError("the one-shot all-reduce needs CUDA GPUs that can read each other's memory; use "
                          "--all-reduce nccl")
    from torch.distributed import _symmetric_memory as symm_mem

    name = tp.group_name
    if name in _one_shot_buffers:
        return
    if hasattr(symm_mem, "enable_symm_mem_for_group") and name not in symm_mem._group_name_to_store:
        symm_mem.enable_symm_mem_for_group(name)  # needed by older PyTorch; later versions deprecate it
    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    symm_mem.rendezvous(buffer, name)
    _one_shot_buffers[name], _one_shot_capacity[name] = buffer, nbytes
    log.info("all-reduce: one-shot over symmetric memory for tensors up to %d bytes, NCCL above", nbytes)


def one_shot_possible(device: torch.device, world: int) -> bool:
    """Whether `auto` picks the one-shot all-reduce: CUDA, every rank on this host (symmetric memory maps peers'
    memory, which needs one host), and every pair of its GPUs able to read each other's memory (NVLink or PCIe peer
    access). Otherwise `auto` means NCCL, and says so once."""
    if device.type != "cuda":
        return False
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    gpus = range(min(world, torch.cuda.device_count()))
    peers = all(torch.cuda.can_device_access_peer(a, b) for a in gpus for b in gpus if a != b)
    if local != world or not peers:
        log.info("all-reduce: NCCL (%s)", "ranks on several hosts" if local != world else "GPUs without peer access")
        return False
    return True


def disable_one_shot(tp: ProcessGroup) -> None:
    """Back to NCCL for every all-reduce over `tp` (the buffer is released with the group)."""
    _one_shot_buffers.pop(tp.group_name, None)
    _one_shot_capacity.pop(tp.group_name, None)


def gather_vocab(logits: Tensor, tp: ProcessGroup | None) -> Tensor:
    """Full logits [..., vocab] from every rank's slice [..., vocab/world], in rank order."""
    if tp is None:
        return logits
    world = tp.size()
    c10d = torch.ops._c10d_functional
    # The collective stacks the ranks' tensors along dim 0; the slices then move to the last dim.
    stacked = c10d.wait_tensor(c10d.all_gather_into_tensor(logits.contiguous(), world, tp.group_name))
    stacked = stacked.view(world, *logits.shape)
    return stacked.movedim(0, -2).reshape(*logits.shape[:-1], world * logits.shape[-1])


def smallest(value: int, tp: ProcessGroup | None, device: torch.device) -> int:
    """The minimum of `value` over the ranks, so that every rank takes the same decision (for example whether a
    model fits the free memory) and none waits forever in a collective the others skipped."""
    if tp is None:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, dist.ReduceOp.MIN, group=tp)
    return int(tensor.item())


def _launcher_int(name: str, default: str | None = None) -> int:
    """A whole number torchrun sets in the environment; EngineError where it is missing or not one."""
    value = os.environ.get(name, default)
    if value is None or not value.strip().lstrip("-").isdigit():
        what = f"{name} is unset" if value is None else f"{name}={value!r} is not a whole number"
        raise EngineError(f"{what}; start tensor-parallel runs with torchrun --nproc-per-node N (or unset "
                          "WORLD_SIZE)")
    return int(value)


@contextmanager
def start_from_env(device: torch.device, all_reduce: str = "auto") -> Iterator[tuple[ProcessGroup | None,
                                                                                     torch.device]]:
    """(process group, this rank's device) for a process started by `torchrun --nproc-per-node N` (N > 1): NCCL on
    GPU `LOCAL_RANK` when `device` is CUDA, gloo on the CPU otherwise; (None, device) outside torchrun. `all_reduce`
    (`ALL_REDUCE`): `one-shot` enables the symmetric-memory kernel for the group (CUDA only); `auto` does so where it
    can run (`one_shot_possible`; the module docstring quotes what it saved). Ranks other than 0 log warnings only,
    so that progress is logged once. The group is destroyed on exit. NCCL's environment (NCCL_NVLS_ENABLE and
    friends) is left as the machine sets it."""
    if all_reduce not in ALL_REDUCE:
        raise EngineError(f"all-reduce {all_reduce!r} is not one of {', '.join(ALL_REDUCE)}")
    world = _launcher_int("WORLD_SIZE", "1")
    if world == 1:
        if all_reduce != "auto":
            log.warning("--all-reduce %s is not read: this is one process (start tensor-parallel runs with torchrun "
                        "--nproc-per-node N)", all_reduce)
        yield None, device
        return
    if world < 1:
        raise EngineError(f"WORLD_SIZE={world}: a group has at least one process; start tensor-parallel runs with "
                          "torchrun --nproc-per-node N (or unset WORLD_SIZE)")
    rank, local_rank = _launcher_int("RANK"), _launcher_int("LOCAL_RANK")
    if not 0 <= rank < world or not 0 <= local_rank < world:
        raise EngineError(f"WORLD_SIZE={world}, RANK={rank}, LOCAL_RANK={local_rank} is not a process of a group; "
                          "start tensor-parallel runs with torchrun --nproc-per-node N (or unset WORLD_SIZE)")
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # device_id connects NCCL at once instead of at the first collective, which may be inside graph capture
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    if dist.get_rank() != 0:
        logging.getLogger("sparsedecoding").setLevel(logging.WARNING)
    try:
        if all_reduce == "one-shot" or (all_reduce == "auto" and one_shot_possible(device, world)):
            enable_one_shot(dist.group.WORLD, device)
        yield dist.group.WORLD, device
    finally:
        disable_one_shot(dist.group.WORLD)
        dist.destroy_process_group()
        # Frees the group's last references while the interpreter is whole: a gloo group left to interpreter
        # shutdown destroys its worker threads there and aborts the process (about half the runs with torch 2.13).
        gc.collect()
