"""Generation speed for building decode data: `batchgen.generate_many` on its backends (`hf`: the transformers model,
eager, with a growing cache; `engine`: the engine's transformer over a static cache of slots, the decode step in CUDA
graphs) at one or more batch sizes, optionally against `generation.generate` (HF `model.generate`) at batch 32, on one
model in one process. Needs a CUDA GPU.

Workload: the user turns the data builder sends, alternating HumanEval's calibration half (code answers of a few
hundred tokens) and `selfdata` meta-prompts (short replies), chat-formatted; sampled at temperature 0.7, top-p 0.95
(selfdata's answer defaults) unless --greedy. Each run reports generated tokens per second of wall time (prefill,
and for the engine building its model and capturing its graphs, included) and its peak CUDA memory.

Check (first, it is short): greedy on the first --check-prompts prompts, the engine backend's continuations against
the hf backend's, token for token. bf16 sums run in another order at another batch shape, so a few may part at a
near-tie; the report gives how many are identical and where each other one first differs.

--time-limit SECONDS (whole run, model loading included): a configuration still running then is cut, its row says
so, later ones do not start, and the report is written; it is also rewritten after every configuration. Example:

    PYTHONPATH=src python benchmarks/gen_bench.py /root/cache/models/qwen2.5-coder-1.5b \\
        --backends engine hf --batches 256 --prompts 512 --max-new-tokens 256 \\
        --time-limit 140 --out benchmarks/results/gen_bench_h200.md
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import torch

from sparsedecoding.batchgen import BACKENDS, generate_many, kv_bytes_per_token
from sparsedecoding.data import chat_format, humaneval_prompts
from sparsedecoding.generation import generate, tokenize_prompts
from sparsedecoding.models import load_model
from sparsedecoding.runenv import environment_markdown, peak_memory_gb
from sparsedecoding.selfdata import meta_prompts


class TimeLimit(Exception):
    """--time-limit ran out (raised in the main thread by SIGALRM)."""


def out_of_time(signum, frame):
    raise TimeLimit


def workload(count: int) -> list[str]:
    code = humaneval_prompts("calib")
    meta = [entry["text"] for entry in meta_prompts(count, seed=0)]
    mixed = [prompt for pair in zip(code * (count // len(code) + 1), meta) for prompt in pair]
    return mixed[:count]


def timed(rows: list[dict], label: str, backend: str, batch: int, run) -> None:
    """Appends the row of one configuration to `rows` as it starts, and fills it in when it ends."""
    row = {"generator": label, "backend": backend, "batch": batch, "status": "running"}
    rows.append(row)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        generations = run()
        torch.cuda.synchronize()
    except TimeLimit:
        row.update(status=f"cut by the time limit after {time.perf_counter() - start:.0f} s",
                   peak_gb=peak_memory_gb(torch.device("cuda")))
        raise
    seconds = time.perf_counter() - start
    new = sum(len(gen.new_ids) for gen in generations)
    row.update(prompts=len(generations), new_tokens=new, mean_length=new / len(generations),
               stopped=sum(gen.stopped for gen in generations) / len(generations), seconds=seconds,
               tok_s=new / seconds, peak_gb=peak_memory_gb(torch.device("cuda")), status="done")
    print(f"{label} ({backend}) batch {batch}: {new} tokens in {seconds:.1f} s = {row['tok_s']:.0f} tok/s, "
          f"peak {row['peak_gb']} GB", flush=True)


def agreement(model, tokenizer, prompt_ids: list[list[int]], new_tokens: int) -> str:
    """The engine backend's greedy continuations against the hf backend's, token for token."""
    runs = {backend: generate_many(model, tokenizer, prompt_ids, new_tokens, batch_size=len(prompt_ids),
                                   progress=False, backend=backend) for backend in ("hf", "engine")}
    differences = []
    for index, (ours, theirs) in enumerate(zip(runs["engine"], runs["hf"])):
        if ours.new_ids != theirs.new_ids:
            first = next((pos for pos, (a, b) in enumerate(zip(ours.new_ids, theirs.new_ids)) if a != b),
                         min(len(ours.new_ids), len(theirs.new_ids)))
            differences.append(f"prompt {index} at token {first}")
    same = len(prompt_ids) - len(differences)
    parted = f"; the others first differ: {', '.join(differences)}" if differences else ""
    return (f"greedy, {len(prompt_ids)} prompts, up to {new_tokens} new tokens: {same}/{len(prompt_ids)} engine "
            f"continuations identical to the hf backend's{parted}")


def report(head: list[str], rows: list[dict], planned: list[tuple[str, str, int]], check: str,
           notes: list[str]) -> str:
    """The markdown report: environment, setup, one table row per planned configuration, the check and notes."""
    lines = ["# Generation speed for decode data", "",
             environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda")), *head, "",
             "| generator | backend | batch | prompts | new tokens | mean length | stopped | seconds | tok/s | "
             "peak GB | status |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row["status"] == "done":
            lines.append(f"| {row['generator']} | {row['backend']} | {row['batch']} | {row['prompts']} | "
                         f"{row['new_tokens']} | {row['mean_length']:.0f} | {row['stopped']:.2f} | "
                         f"{row['seconds']:.1f} | {row['tok_s']:.0f} | {row['peak_gb']} | done |")
        else:
            lines.append(f"| {row['generator']} | {row['backend']} | {row['batch']} | | | | | | | "
                         f"{row.get('peak_gb', '')} | {row['status']} |")
    for label, backend, batch in planned[len(rows):]:
        lines.append(f"| {label} | {backend} | {batch} | | | | | | | | not run |")
    best: dict[str, float] = {}
    for row in rows:
        if row["status"] == "done" and row["generator"].startswith("batchgen"):
            best[row["backend"]] = max(best.get(row["backend"], 0.0), row["tok_s"])
    if "engine" in best and "hf" in best:
        notes = [f"Best engine backend over best hf backend: {best['engine'] / best['hf']:.1f}x", *notes]
    return "\n".join([*lines, "", f"Check: {check}", "", *notes, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="HF model folder (dense or pruned)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=["engine", "hf"],
                        help="generate_many backends, run in this order")
    parser.add_argument("--batches", nargs="+", type=int, default=[256, 512], help="batch sizes of generate_many")
    parser.add_argument("--prompts", type=int, default=1024, help="prompts per generate_many run")
    parser.add_argument("--old-batch", type=int, default=32)
    parser.add_argument("--old-prompts", type=int, default=128,
                        help="prompts of the generation.generate (HF generate) run, the last one; 0 skips it")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--kv-budget-gb", type=float, default=32.0)
    parser.add_argument("--greedy", action="store_true", help="greedy instead of sampling at T=0.7, top-p 0.95")
    parser.add_argument("--check-prompts", type=int, default=32, help="prompts of the engine-vs-hf check; 0 skips")
    parser.add_argument("--check-tokens", type=int, default=128)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--out", default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gen_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.time_limit:
        signal.signal(signal.SIGALRM, out_of_time)
        signal.setitimer(signal.ITIMER_REAL, args.time_limit)
    checked = args.check_prompts > 0 and {"hf", "engine"} <= set(args.backends)
    check = "not reached" if checked else "skipped (it needs --backends hf engine and --check-prompts > 0)"
    head: list[str] = []
    rows: list[dict] = []
    notes: list[str] = []
    planned = [("batchgen.generate_many", backend, batch) for backend in args.backends for batch in args.batches]
    if args.old_prompts:
        planned.append(("generation.generate (HF generate)", "hf", args.old_batch))

    def write() -> str:
        text = report(head, rows, planned, check, notes)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
        return text

    stage = "loading the model"
    try:
        model, tokenizer, folder = load_model(args.folder, torch.device("cuda"))
        sampling = {} if args.greedy else {"do_sample": True, "temperature": 0.7, "top_p": 0.95}
        prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, workload(args.prompts)))
        budget = int(args.kv_budget_gb * 2**30)
        per_token = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
        lengths = sorted(len(ids) for ids in prompt_ids)
        head += [f"- model: {folder} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, "
                 f"{next(model.parameters()).dtype})",
                 f"- prompts: chat-formatted, {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}); "
                 f"max {args.max_new_tokens} new tokens; "
                 f"{'greedy' if args.greedy else 'sampled, T=0.7, top-p 0.95'}",
                 f"- KV cache: {per_token / 1024:.0f} KiB per position; budget {args.kv_budget_gb} GiB; "
                 f"check_every 16, prefill_rows 64 (generate_many's defaults)"]
        for backend in args.backends:  # CUDA and kernel warm-up
            stage = f"the {backend} warm-up"
            generate_many(model, tokenizer, prompt_ids[:8], 8, batch_size=8, progress=False, backend=backend)
        if checked:
            stage = "the check"
            check = agreement(model, tokenizer, prompt_ids[:args.check_prompts], args.check_tokens)
            print(check, flush=True)
            write()
        for label, backend, batch in planned:
            stage = f"{label} ({backend}) at batch {batch}"
            if label.startswith("batchgen"):
                timed(rows, label, backend, batch,
                      lambda: generate_many(model, tokenizer, prompt_ids, args.max_new_tokens, batch_size=batch,
                                            kv_budget_bytes=budget, progress=False, backend=backend, **sampling))
            else:
                timed(rows, label, backend, batch,
                      lambda: generate(model, tokenizer, prompt_ids[:args.old_prompts], args.max_new_tokens,
                                       batch_size=batch, progress=False, **sampling))
            write()
    except TimeLimit:
        notes.append(f"The time limit of {args.time_limit:.0f} s ran out during {stage}; later configurations did "
                     f"not run.")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
