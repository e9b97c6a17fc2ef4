"""Tensor parallelism (engine/parallel.py): shards recombine exactly into the weights they came from, dense and
packed; world sizes that cannot split a model fail with one error; and a model split over 2 gloo processes on the
CPU computes the logits and greedy tokens of the unsplit model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from helpers import char_tokenizer, make_tiny_model, prune_in_place, random_hf_model, random_nm_weight, saved
from safetensors.torch import load_file, save_file

from sparsedecoding.engine import Engine, build_model, random_state
from sparsedecoding.engine.bench import NotRun, SpeedResult, format_table, model_bytes, results_records
from sparsedecoding.engine.config import ModelArgs
from sparsedecoding.engine import parallel
from sparsedecoding.engine.parallel import (all_reduce, check_world, enable_one_shot, local_args, rank_and_world,
                                            shard_state, split_columns, split_rows, start_from_env, takes_one_shot)
from sparsedecoding.errors import EngineError
from sparsedecoding.kernels import PackedLinear, PackedNM, pack_nm
from sparsedecoding.patterns import SparsityPattern

# Every optional feature on (q/k/v bias, q/k norm, tied lm_head), so that every shard rule is exercised.
ARGS = ModelArgs(architecture="qwen2", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                 intermediate_size=128, norm_eps=1e-6, rope_theta=10000.0, qkv_bias=True, qk_norm=True,
                 tie_embeddings=True)
PACKED_ARGS = replace(ARGS, architecture="llama", qkv_bias=False, qk_norm=False, tie_embeddings=False)
TWO_FOUR = SparsityPattern.parse("2:4")
NEW_TOKENS = 8


def dense(weight):
    return weight.to_dense() if isinstance(weight, PackedNM) else weight


def unsplit_rows(shards, segments):
    """Inverse of split_rows: every segment's slices in rank order, segments in order."""
    world = len(shards)
    pieces = [torch.split(dense(shard), [size // world for size in segments]) for shard in shards]
    return torch.cat([torch.cat([rank_pieces[i] for rank_pieces in pieces]) for i in range(len(segments))])


def row_segments(key, args):
    if ".qkv." in key:
        return [args.n_heads * args.head_dim] + [args.n_kv_heads * args.head_dim] * 2
    if ".gate_up." in key:
        return [args.intermediate_size] * 2
    return [args.vocab_size] if key == "output.weight" else None


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("args, pattern, dtype", [(ARGS, None, torch.float32),
                                                  (PACKED_ARGS, TWO_FOUR, torch.bfloat16)])
def test_shards_recombine_into_the_model(args, pattern, dtype, world):
    state = random_state(args, pattern, dtype, "cpu", seed=3)
    shards = [shard_state(args, state, rank, world) for rank in range(world)]
    split_keys = set()
    for key, weight in state.items():
        parts = [shard[key] for shard in shards]
        segments = row_segments(key, args)
        if segments is not None:
            assert all(part.shape[0] == weight.shape[0] // world for part in parts)
            whole = unsplit_rows(parts, segments)
            split_keys.add(key)
        elif key.endswith(("out.weight", "down.weight")):
            whole = torch.cat([dense(part) for part in parts], dim=1)
            split_keys.add(key)
        else:
            assert all(part is weight for part in parts), f"{key} should be replicated"
            whole = dense(weight)
        torch.testing.assert_close(whole, dense(weight), rtol=0, atol=0)
        for part in parts:
            if isinstance(part, PackedNM):
                part.check_popcounts()  # a shard is a valid packed weight, not just the right numbers
    # q/k/v, o, gate/up and down in both layers, the qkv biases of the dense case, and lm_head
    assert len(split_keys) == 4 * args.n_layers + (args.n_layers if args.qkv_bias else 0) + 1


def test_qkv_rank_holds_whole_heads_of_q_k_and_v():
    rows = ARGS.qkv_size
    weight = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, 32)
    q, kv = ARGS.n_heads * ARGS.head_dim, ARGS.n_kv_heads * ARGS.head_dim
    shard = split_rows(weight, [q, kv, kv], rank=1, world=2)[:, 0].long().tolist()
    # rank 1 of 2: the second half of the query heads, and the second half of the KV heads of k and of v
    assert shard == list(range(q // 2, q)) + list(range(q + kv // 2, q + kv)) + list(range(q + kv + kv // 2, rows))


def test_packed_column_split_is_on_whole_mask_words():
    packed = pack_nm(random_nm_weight(8, 128, 2, 4, dtype=torch.bfloat16), 2, 4)
    halves = [split_columns(packed, rank, 2) for rank in range(2)]
    assert [h.shape for h in halves] == [(8, 64), (8, 64)]
    assert [tuple(h.values.shape) for h in halves] == [(8, 32), (8, 32)]
    torch.testing.assert_close(halves[1].bitmask, packed.bitmask[:, 2:], rtol=0, atol=0)


def test_tied_lm_head_shard_is_a_view_of_the_embedding():
    state = random_state(ARGS, None, torch.float32, "cpu")
    shard = shard_state(ARGS, state, 1, 2)
    assert shard["output.weight"].data_ptr() == state["embed.weight"][ARGS.vocab_size // 2:].data_ptr()


@pytest.mark.parametrize("changes, world, what", [
    (dict(n_heads=6, n_kv_heads=3), 2, "6 query and 3 KV heads"),
    (dict(intermediate_size=96), 2, "96 input columns of mlp.down"),
    (dict(n_heads=2, n_kv_heads=2, head_dim=48), 2, "96 input columns of attention.out"),
    (dict(vocab_size=129), 2, "a vocabulary of 129"),
    ({}, 8, "8 query and 4 KV heads"),
])
def test_world_sizes_that_cannot_split_the_model_fail_with_one_error(changes, world, what):
    args = replace(ARGS, **changes)
    with pytest.raises(EngineError, match=f"tensor parallelism over {world} GPUs cannot split .*{what}"):
        check_world(args, world)
    with pytest.raises(EngineError, match="cannot split"):
        shard_state(args, random_state(args, None, torch.float32, "cpu"), 0, world)


def test_one_rank_holds_any_model():
    args = replace(ARGS, intermediate_size=100, n_heads=3, n_kv_heads=3, vocab_size=127)
    assert local_args(args, 1) is args
    assert build_model(args, random_state(args, None, torch.float32, "cpu")).output.weight.shape == (127, 64)


def test_packed_weight_with_words_not_divisible_by_world_is_refused():
    packed = pack_nm(random_nm_weight(4, 96, 2, 4, dtype=torch.bfloat16), 2, 4)
    with pytest.raises(EngineError, match="96 input columns into 2 slices of whole 32-column words"):
        split_columns(packed, 0, 2)


class _Group:
    """Stands in for a process group where only rank and size are read (shapes, byte counts)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("pattern", [None, TWO_FOUR])
def test_a_rank_holds_its_share_of_the_weight_bytes(pattern):
    args = PACKED_ARGS
    whole, share = model_bytes(args, pattern), model_bytes(args, pattern, tp=_Group(0, 2))
    replicated = (args.vocab_size + 2 * args.n_layers + 1) * args.dim * 2  # the embedding table and the norms
    assert share == replicated + (whole - replicated) // 2


def test_bench_table_marks_tensor_parallel_rows_and_compares_like_with_like():
    rows = [SpeedResult("m", weights, 1, 10, seconds, 1000, 1.0, gpus=gpus)
            for weights, seconds, gpus in [("dense", 1.0, 1), ("2:4", 0.5, 1), ("dense", 0.8, 2), ("2:4", 0.5, 2)]]
    table = format_table(rows, 1e12)
    assert "per GPU" in table
    assert "| m | 2:4 | 1 |" in table and "| 2.000x |" in table  # 2:4 vs dense on one GPU
    assert "| m TP=2 | 2:4 | 1 |" in table and "| 1.600x |" in table  # 2:4 vs dense on two
    records = results_records([*rows, NotRun("m", "8:16", "too large")], 1e12)
    assert [(r["gpus"], r["vs_dense"]) for r in records[:4]] == [(1, 1.0), (1, 2.0), (2, 1.0), (2, 1.6)]
    assert records[1]["tokens_per_second_per_sequence"] == 20 and records[1]["ms_per_step"] == 50
    assert records[1]["fraction_of_copy"] == 1000 * 10 / 0.5 / 1e12
    assert records[4] == {"model": "m", "weights": "8:16", "not_run": "too large"}


# --- two gloo processes on the CPU ----------------------------------------------------------------------------------

CASES = {"dense": (ARGS, None, torch.float32), "packed": (PACKED_ARGS, TWO_FOUR, torch.bfloat16)}


def _as_torchrun_rank(rank: int, port: int) -> None:
    """The environment torchrun gives rank `rank` of 2, so that the workers start through `start_from_env`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, port: int, folder: str) -> None:
    """One rank: the unsplit model and this rank's shards of the same weights, both on one prompt batch; saves
    logits, greedy tokens, and the unsplit model's logits along its own continuation (for the tie rule)."""
    _as_torchrun_rank(rank, port)
    with start_from_env(torch.device("cpu")) as (tp, device):
        assert tp is not None and device.type == "cpu"
        for name, (args, pattern, dtype) in CASES.items():
            state = random_state(args, pattern, dtype, device, seed=1)
            # A unit-scale tied embedding makes every token predict itself; smaller, the blocks decide the tokens.
            state["embed.weight"].mul_(0.1)
            single = build_model(args, state)
            split = build_model(args, shard_state(args, state, *rank_and_world(tp)), tp)
            assert isinstance(split.layers[0].mlp.down, PackedLinear) == (pattern is not None)
            prompt = torch.randint(args.vocab_size, (2, 6), generator=torch.Generator().manual_seed(5))
            out = {}
            for label, model in (("tp1", single), ("tp2", split)):
                out[f"{label}_tokens"] = Engine(model, 2, 6 + NEW_TOKENS).generate(prompt, NEW_TOKENS).tokens
                model.setup_caches(2, 16)
                out[f"{label}_logits"] = model(prompt, torch.arange(6))
            sequence = torch.cat([prompt, out["tp1_tokens"][:, :-1]], dim=1)
            single.setup_caches(2, 16)
            out["tp1_replay"] = single(sequence, torch.arange(sequence.shape[1]))[:, 5:]
            save_file({k: v.contiguous() for k, v in out.items()}, f"{folder}/{name}_rank{rank}.safetensors")


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp")
    mp.spawn(_tp_worker, args=(free_port(), str(folder)), nprocs=2)
    return {name: [load_file(folder / f"{name}_rank{rank}.safetensors") for rank in range(2)] for name in CASES}


def assert_same_up_to_ties(tokens, reference_tokens, reference_logits, tolerance):
    """Greedy tokens [B, n] equal the reference's, except from a position where the reference's logits [B, n, V]
    of the two tokens are within `tolerance` (after which the sequences continue from different prefixes)."""
    for row in range(tokens.shape[0]):
        differ = (tokens[row] != reference_tokens[row]).nonzero()
        if len(differ):
            p = int(differ[0])
            logits = reference_logits[row, p].float()
            gap = logits[reference_tokens[row, p]] - logits[tokens[row, p]]
            assert gap <= tolerance, f"row {row} diverges at token {p} without a tie (gap {gap:.4g})"


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_compute_the_logits_of_one(tp_runs, case):
    first, second = tp_runs[case]
    tp1, tp2 = first["tp1_logits"].float(), first["tp2_logits"].float()
    scale = tp1.abs().max()
    # float32: only the order of the o and down sums differs (ranks' partial sums, then the all-reduce);
    # bfloat16: each rank rounds its partial output before the all-reduce adds them, a few units in the last place
    eps = torch.finfo(CASES[case][2]).eps
    limit = (16 if case == "dense" else 4) * eps * scale
    assert (tp2 - tp1).abs().max() <= limit
    torch.testing.assert_close(second["tp2_logits"], first["tp2_logits"], rtol=0, atol=0)  # every rank agrees


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_decode_the_greedy_tokens_of_one(tp_runs, case):
    first, second = tp_runs[case]
    eps = torch.finfo(CASES[case][2]).eps
    tolerance = 8 * eps * first["tp1_replay"].float().abs().max()
    assert_same_up_to_ties(first["tp2_tokens"], first["tp1_tokens"], first["tp1_replay"], tolerance)
    assert torch.equal(second["tp2_tokens"], first["tp2_tokens"])


def _compiled_worker(rank: int, port: int, folder: str) -> None:
    _as_torchrun_rank(rank, port)
    with start_from_env(torch.device("cpu")) as (tp, _):
        state = random_state(ARGS, None, torch.float32, "cpu", seed=1)
        model = build_model(ARGS, shard_state(ARGS, state, rank, 2), tp)
        model.setup_caches(2, 16)
        prompt = torch.randint(ARGS.vocab_size, (2, 6), generator=torch.Generator().manual_seed(5))
        eager = model(prompt, torch.arange(6))
        model.compile_regions()
        compiled = model(prompt, torch.arange(6), compiled=True)
        save_file({"eager": eager, "compiled": compiled}, f"{folder}/rank{rank}.safetensors")


@pytest.mark.slow
def test_compiled_blocks_trace_the_collectives(tmp_path):
    """torch.compile (Inductor, fullgraph) of a split block keeps its all-reduces: compiled logits match eager."""
    mp.spawn(_compiled_worker, args=(free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        run = load_file(tmp_path / f"rank{rank}.safetensors")
        torch.testing.assert_close(run["compiled"], run["eager"], rtol=1e-4, atol=1e-4)


# --- torchrun, as the two-GPU commands run (gloo on the CPU here) ----------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def torchrun(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *command], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_generate_under_torchrun_prints_the_text_of_one_process(tmp_path):
    folder = make_tiny_model(tmp_path / "tiny")
    command = ["generate", "--model", str(folder), "--prompt", "hello", "--new-tokens", "12", "--device", "cpu",
               "--dtype", "float32"]
    single = subprocess.run([sys.executable, "-m", "sparsedecoding", *command], capture_output=True, text=True,
                            check=True)
    split = torchrun("-m", "sparsedecoding", *command)
    assert split.returncode == 0, split.stderr
    assert split.stdout == single.stdout and len(single.stdout.strip()) > 0


@pytest.mark.slow
def test_tp_check_passes_on_a_packed_model_and_refuses_heads_that_do_not_split(tmp_path):
    model = random_hf_model("qwen2")
    prune_in_place(model, TWO_FOUR)
    folder = saved(model, tmp_path / "pruned")
    char_tokenizer().save_pretrained(folder)
    result = torchrun("benchmarks/tp_check.py", "--model", str(folder), "--device", "cpu", "--sparse", "auto",
                      "--new-tokens", "8", "--out", str(tmp_path / "report.md"))
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "report.md").read_text()
    assert "**PASS**" in report and "8 packed block linears per rank" in report
    odd = saved(random_hf_model("llama", num_attention_heads=3, num_key_value_heads=3, hidden_size=48),
                tmp_path / "odd")
    char_tokenizer().save_pretrained(odd)
    result = torchrun("benchmarks/tp_check.py", "--model", str(odd), "--device", "cpu")
    assert result.returncode != 0
    assert "error: EngineError: tensor parallelism over 2 GPUs cannot split 3 query and 3 KV heads" in result.stderr


# --- one-shot all-reduce (symmetric memory; the kernel itself needs two CUDA GPUs) -----------------------------------

def test_one_shot_is_taken_by_size_and_dtype_only_once_enabled(monkeypatch):
    monkeypatch.setitem(parallel._one_shot_capacity, "g", 1024)
    assert takes_one_shot(torch.zeros(512, dtype=torch.bfloat16), "g")
    assert takes_one_shot(torch.zeros(2, 128, dtype=torch.float32), "g")
    assert not takes_one_shot(torch.zeros(513, dtype=torch.bfloat16), "g")  # prefill-sized: NCCL
    assert not takes_one_shot(torch.zeros(16, dtype=torch.float16), "g")  # the kernel adds bf16 and fp32 only
    assert not takes_one_shot(torch.zeros(16, dtype=torch.bfloat16), "other group")


def test_unknown_all_reduce_and_one_shot_on_the_cpu_fail_with_one_error():
    with pytest.raises(EngineError, match="not one of auto, nccl, one-shot"):
        with start_from_env(torch.device("cpu"), "ring"):
            pass
    with pytest.raises(EngineError, match="needs CUDA GPUs"):
        enable_one_shot(None, torch.device("cpu"))


def _one_shot_worker(rank: int, port: int, folder: str) -> None:
    """One GPU rank: the same partial sums reduced by NCCL and by the one-shot kernel, eagerly (including a view
    that starts off the 16-byte grid and a prefill-sized tensor, which goes to NCCL) and replayed from a CUDA graph
    with new inputs."""
    _as_torchrun_rank(rank, port)
    with start_from_env(torch.device("cuda"), "one-shot") as (tp, device):
        out = {}
        for dtype in (torch.bfloat16, torch.float32):
            for shape in ((1, 8192), (4, 5120), (16, 3)):
                x = torch.randn(shape, dtype=dtype, device=device, generator=torch.Generator(device).manual_seed(rank))
                assert takes_one_shot(x, tp.group_name)
                key = f"{dtype}_{shape[0]}x{shape[1]}"
                out[f"one_shot_{key}"] = all_reduce(x, tp)
                reference = x.clone()
                torch.distributed.all_reduce(reference, group=tp)
                out[f"nccl_{key}"] = reference
        wide = torch.randn(1, 8200, dtype=torch.bfloat16, device=device)
        shifted = wide[:, 8:]  # storage offset of 16 bytes: copied in by the kernel; 4: copied before it
        odd = wide[:, 2:8194]
        for name, x in (("shifted", shifted), ("odd", odd)):
            reference = x.clone()
            torch.distributed.all_reduce(reference, group=tp)
            out[f"one_shot_{name}"], out[f"nccl_{name}"] = all_reduce(x, tp), reference
        big = torch.randn(64, 8192, dtype=torch.bfloat16, device=device)
        assert not takes_one_shot(big, tp.group_name)
        static = torch.zeros(2, 4096, dtype=torch.bfloat16, device=device)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            all_reduce(static, tp)  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            summed = all_reduce(static * 1.0, tp)
        for step in range(3):
            static.copy_(torch.full_like(static, float(rank + 1 + step)))
            graph.replay()
            out[f"graph_{step}"] = summed.clone()
        torch.cuda.synchronize()
        save_file({key: value.float().cpu() for key, value in out.items()}, f"{folder}/rank{rank}.safetensors")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_one_shot_all_reduce_equals_nccl_eagerly_and_in_a_cuda_graph(tmp_path):
    mp.spawn(_one_shot_worker, args=(free_port(), str(tmp_path)), nprocs=2)
    runs = [load_file(tmp_path / f"rank{rank}.safetensors") for rank in range(2)]
    for key in runs[0]:
        if key.startswith("one_shot_"):
            torch.testing.assert_close(runs[0][key], runs[0]["nccl_" + key[len("one_shot_"):]], rtol=8e-3, atol=0)
        torch.testing.assert_close(runs[0][key], runs[1][key], rtol=0, atol=0)  # every rank holds the same sum
    for step in range(3):  # ranks hold rank + 1 + step: the sum is 3 + 2·step everywhere
        assert torch.equal(runs[0][f"graph_{step}"], torch.full((2, 4096), 3.0 + 2 * step))


def test_auto_takes_one_shot_only_on_one_host_of_peer_gpus(monkeypatch):
    assert not parallel.one_shot_possible(torch.device("cpu"), 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert parallel.one_shot_possible(torch.device("cuda", 0), 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two hosts of one GPU each
    assert not parallel.one_shot_possible(torch.device("cuda", 0), 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: False)
    assert not parallel.one_shot_possible(torch.device("cuda", 0), 2)
