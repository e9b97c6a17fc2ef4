"""Generation speed for building decode data: `batchgen.generate_many` (large batches, finished rows refilled) at two
batch sizes against `generation.generate` (HF `model.generate`) at batch 32, on one model in one process. Needs a
CUDA GPU.

Workload: the user turns the data builder sends, alternating HumanEval's calibration half (code answers of a few
hundred tokens) and `selfdata` meta-prompts (short replies), chat-formatted; sampled at temperature 0.7, top-p 0.95
(selfdata's answer defaults) unless --greedy. Each run reports generated tokens per second of wall time, prefill
included, and its peak CUDA memory. A short greedy run of both generators on the same prompts reports how many
continuations agree exactly (bf16 sums in another order at another batch shape, so a few may part late). Example:

    PYTHONPATH=src python benchmarks/gen_bench.py ~/.cache/sparsedecoding/models/qwen2.5-coder-1.5b \\
        --out benchmarks/results/gen_bench_h200.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sparsedecoding.batchgen import generate_many, kv_bytes_per_token
from sparsedecoding.data import chat_format, humaneval_prompts
from sparsedecoding.generation import generate, tokenize_prompts
from sparsedecoding.models import load_model
from sparsedecoding.runenv import environment_markdown, peak_memory_gb
from sparsedecoding.selfdata import meta_prompts


def workload(count: int) -> list[str]:
    code = humaneval_prompts("calib")
    meta = [entry["text"] for entry in meta_prompts(count, seed=0)]
    mixed = [prompt for pair in zip(code * (count // len(code) + 1), meta) for prompt in pair]
    return mixed[:count]


def timed(label: str, batch: int, run) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    generations = run()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = sum(len(gen.new_ids) for gen in generations)
    row = {"generator": label, "batch": batch, "prompts": len(generations), "new_tokens": new,
           "mean_length": new / len(generations), "stopped": sum(gen.stopped for gen in generations) / len(generations),
           "seconds": seconds, "tok_s": new / seconds, "peak_gb": peak_memory_gb(torch.device("cuda"))}
    print(f"{label} batch {batch}: {new} tokens in {seconds:.1f} s = {row['tok_s']:.0f} tok/s, "
          f"peak {row['peak_gb']} GB", flush=True)
    return row


def agreement(model, tokenizer, prompt_ids: list[list[int]], new_tokens: int) -> str:
    ours = generate_many(model, tokenizer, prompt_ids, new_tokens, batch_size=len(prompt_ids), progress=False)
    theirs = generate(model, tokenizer, prompt_ids, new_tokens, batch_size=32, progress=False)
    same = sum(a.new_ids == b.new_ids for a, b in zip(ours, theirs))
    prefixes = []
    for a, b in zip(ours, theirs):
        common = next((pos for pos, (x, y) in enumerate(zip(a.new_ids, b.new_ids)) if x != y),
                      min(len(a.new_ids), len(b.new_ids)))
        prefixes.append(common)
    return (f"greedy, {len(prompt_ids)} prompts, {new_tokens} new tokens: {same}/{len(prompt_ids)} continuations "
            f"identical to generation.generate; mean common prefix {sum(prefixes) / len(prefixes):.0f} tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="HF model folder (dense or pruned)")
    parser.add_argument("--batches", nargs="+", type=int, default=[256, 512], help="batch sizes of generate_many")
    parser.add_argument("--prompts", type=int, default=1024, help="prompts per generate_many run")
    parser.add_argument("--old-batch", type=int, default=32)
    parser.add_argument("--old-prompts", type=int, default=128, help="prompts of the generation.generate run")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--kv-budget-gb", type=float, default=32.0)
    parser.add_argument("--greedy", action="store_true", help="greedy instead of sampling at T=0.7, top-p 0.95")
    parser.add_argument("--out", default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gen_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    model, tokenizer, folder = load_model(args.folder, device)
    sampling = {} if args.greedy else {"do_sample": True, "temperature": 0.7, "top_p": 0.95}
    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, workload(args.prompts)))
    budget = int(args.kv_budget_gb * 2**30)
    generate_many(model, tokenizer, prompt_ids[:8], 8, batch_size=8, progress=False)  # CUDA and kernel warm-up

    rows = [timed("generation.generate (HF generate)", args.old_batch,
                  lambda: generate(model, tokenizer, prompt_ids[:args.old_prompts], args.max_new_tokens,
                                   batch_size=args.old_batch, progress=False, **sampling))]
    for batch in args.batches:
        rows.append(timed("batchgen.generate_many", batch,
                          lambda: generate_many(model, tokenizer, prompt_ids, args.max_new_tokens, batch_size=batch,
                                                kv_budget_bytes=budget, progress=False, **sampling)))
    check = agreement(model, tokenizer, prompt_ids[:32], 128)
    print(check)

    per_token = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
    lengths = sorted(len(ids) for ids in prompt_ids)
    lines = ["# Generation speed for decode data", "",
             environment_markdown(" ".join(["python", *sys.argv]), device),
             f"- model: {folder} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, bf16, "
             f"attention {model.config._attn_implementation})",
             f"- prompts: chat-formatted, {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}); "
             f"max {args.max_new_tokens} new tokens; {'greedy' if args.greedy else 'sampled, T=0.7, top-p 0.95'}",
             f"- KV cache: {per_token / 1024:.0f} KiB per position; budget {args.kv_budget_gb} GiB", "",
             "| generator | batch | prompts | new tokens | mean length | stopped | seconds | tok/s | peak GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['generator']} | {row['batch']} | {row['prompts']} | {row['new_tokens']} | "
                     f"{row['mean_length']:.0f} | {row['stopped']:.2f} | {row['seconds']:.1f} | {row['tok_s']:.0f} | "
                     f"{row['peak_gb']} |")
    lines += ["", f"Speed-up of the best batch over HF generate at batch {args.old_batch}: "
                  f"{max(row['tok_s'] for row in rows[1:]) / rows[0]['tok_s']:.1f}x", "", f"Check: {check}", ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
