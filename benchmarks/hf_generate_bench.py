"""transformers `generate` on a pruned model: dense vs `sparsedecoding.sparsify`, static cache and torch.compile
(transformers compiles the decode step itself: inductor, CUDA graphs, fullgraph), greedy, batch 1 and 4 (--batches),
every model in one process, measured alternately. Needs a CUDA GPU.

The pruned folder (N:M zeros kept, e.g. written by `sparsedecoding prune`) is loaded once in bfloat16; a copy is
sparsified for each of --sides: `packed` (`sparsify(tile=False)`, the default side) and `tiled` (`tile=True`, what
`sparsify`'s default gives on CUDA: the 2:4 linears on the sparse tensor-core kernel), both beside dense in one run. A
folder written by `random_hf_model.py` (random weights of a preset's shapes) is named so in the report. Each batch row
decodes the same coding prompt; `min_new_tokens` keeps every run the same length. Per run: end-to-end tok/s (batch x new
tokens / seconds, prefill included), and the decode step time from the difference of a long and a short run ((t_long -
t_short) / (long - short) steps), which leaves prefill and compilation out. Medians over `--rounds`. `--eager` adds rows
with the decode step uncompiled (every PackedLinear call eager, through the cached kernel runner). `--quantized` reads
the folder's `prune --quantize` / `--quantize-head` record and sparsifies with it (codes in the packed linears, lm_head
dense int8 / int4); the dense model is then the same grid values in bfloat16. Before timing, every sparse model's
next-token logits after the prompt's first 16 tokens are compared with dense (report only: the sparse kernels sum in
another order than cuBLAS). Example:

    PYTHONPATH=src python benchmarks/hf_generate_bench.py /path/to/pruned-qwen2.5-coder-1.5b \
        --out benchmarks/results/hf_generate_h200.md
    PYTHONPATH=src python benchmarks/hf_generate_bench.py /path/to/pruned --sides packed tiled --batches 1 4 8
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from eager_bench import report_head
from random_hf_model import RANDOM_RECORD

SIDES = {"packed": "sparsify(tile=False): PackedLinear / QuantizedPackedLinear on the packed kernels",
         "tiled": "sparsify(tile=True), what the default tile='auto' gives on CUDA: the linears the sparse "
                  "tensor-core kernel runs as Sp24Linear"}
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.\n"


def random_note(folder: Path) -> str:
    """', random weights ...' when `random_hf_model.py` wrote the folder (its record), else ''."""
    record = folder / RANDOM_RECORD
    if not record.is_file():
        return ""
    facts = json.loads(record.read_text(encoding="utf-8"))
    return (f", **random weights** in the shapes of the {facts['preset']} preset"
            + (f", magnitude-pruned {facts['prune']}" if facts.get("prune") else "")
            + " (random_hf_model.py; speed does not depend on the values)")


def timed_generate(model, ids: torch.Tensor, new_tokens: int, compile_config) -> float:
    """Seconds for one greedy `generate` of exactly `new_tokens` tokens per row with a static cache; the decode step
    compiled with `compile_config`, or eager when it is None."""
    compiling = dict(compile_config=compile_config) if compile_config is not None else dict(disable_compile=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, cache_implementation="static", **compiling)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise SystemExit(f"generate returned {out.shape[1] - ids.shape[1]} tokens, expected {new_tokens}")
    return seconds


def measure(models: dict, ids: torch.Tensor, lengths: tuple[int, int], rounds: int, compile_config) -> dict:
    """tok/s of the long runs and ms per decode step ((t_long - t_short) / (long - short)) of each model, medians
    over `rounds` alternating runs after one warm-up run of each (compiles, records CUDA graphs, tunes the kernel).
    Long runs go first: transformers then sizes every later static cache for them, so the short runs reuse the
    compiled step (same shapes) and a step costs the same in both."""
    long_tokens, short_tokens = lengths
    for name, model in models.items():
        for tokens in lengths:
            timed_generate(model, ids, tokens, compile_config)
        if compile_config is not None and not hasattr(model, "_compiled_call"):  # transformers only logs a skip
            raise SystemExit(f"transformers did not compile the {name} model's decode step; see its log above")
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, model in models.items():
            for tokens in lengths:
                times.setdefault((name, tokens), []).append(timed_generate(model, ids, tokens, compile_config))
    row = {"batch": ids.shape[0], "decode step": "eager" if compile_config is None else "compiled"}
    for name in models:
        long, short = (statistics.median(times[(name, t)]) for t in lengths)
        row[f"{name} tok/s"] = ids.shape[0] * long_tokens / long
        row[f"{name} step ms"] = (long - short) / (long_tokens - short_tokens) * 1e3
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="pruned HF model folder (N:M zeros kept)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens per long run")
    parser.add_argument("--short-tokens", type=int, default=32, help="tokens per short run (step time baseline)")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each model and length (median)")
    parser.add_argument("--eager", action="store_true",
                        help="also time generate with an uncompiled decode step (PackedLinear's eager calls)")
    parser.add_argument("--tile", action="store_true", help="the same as --sides tiled")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=None,
                        help="sparse models to time beside the dense one, in one process: packed (sparsify with "
                             "tile=False) and / or tiled (tile=True, the linears on the sparse tensor-core kernel); "
                             "default: packed")
    parser.add_argument("--quantized", action="store_true",
                        help="sparsify with the quantization the folder's pruning record holds (prune --quantize, "
                             "--quantize-head)")
    parser.add_argument("--out", default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    if args.tile and args.sides not in (None, ["tiled"]):
        parser.error("--tile is --sides tiled; give one of them")
    sides = list(dict.fromkeys(["tiled"] if args.tile else args.sides or ["packed"]))
    quantization = dict(quantize=None, head=None)  # bf16 unless --quantized (sparsify's default reads the record)
    if args.quantized:
        from sparsedecoding.packed import recorded_head_quantization, recorded_quantization

        (quantize, group_size), (head, head_group) = (recorded_quantization(args.folder),
                                                      recorded_head_quantization(args.folder))
        if quantize is None and head is None:
            print(f"error: {args.folder} records no quantization (prune --quantize / --quantize-head)", file=sys.stderr)
            return 2
        quantization = dict(quantize=quantize, head=head, group_size=group_size if quantize else head_group)
    if not torch.cuda.is_available():
        print("hf_generate_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation import CompileConfig

    from sparsedecoding import sparsify

    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    dense = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.bfloat16).cuda().eval()
    models = {"dense": dense}
    summaries = {}
    for side in sides:
        models[side], summaries[side] = sparsify(copy.deepcopy(dense), **quantization, tile=side == "tiled")
    compile_config = CompileConfig(fullgraph=True, dynamic=False)  # inductor, mode reduce-overhead (CUDA graphs)
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids.cuda()

    with torch.no_grad():  # at most 16 rows, so the packed layers run the sparse kernel
        logits = {name: model(prompt[:, :16]).logits[0, -1].float() for name, model in models.items()}
    agreement = "; ".join(f"{side}: max |difference| {float((logits['dense'] - logits[side]).abs().max()):.3g}, "
                          f"same argmax: {bool(logits['dense'].argmax() == logits[side].argmax())}"
                          for side in sides)

    rows = []
    for batch in args.batches:
        ids = prompt.expand(batch, -1).contiguous()
        for config in [compile_config] + ([None] if args.eager else []):
            rows.append(measure(models, ids, (args.new_tokens, args.short_tokens), args.rounds, config))

    header = ["batch", "decode step", "dense tok/s"]
    for side in sides:
        header += [f"{side} tok/s", f"{side} speedup"]
    header.append("dense ms/step")
    for side in sides:
        header += [f"{side} ms/step", f"{side} step speedup"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [str(r["batch"]), r["decode step"], f"{r['dense tok/s']:.1f}"]
        for side in sides:
            cells += [f"{r[side + ' tok/s']:.1f}", f"{r[side + ' tok/s'] / r['dense tok/s']:.2f}x"]
        cells.append(f"{r['dense step ms']:.3f}")
        for side in sides:
            cells += [f"{r[side + ' step ms']:.3f}", f"{r['dense step ms'] / r[side + ' step ms']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    report = "\n".join([
        report_head("transformers generate: dense vs sparsify(model), static cache + torch.compile"),
        f"- model: {args.folder} ({type(dense).__name__}, bfloat16)" + random_note(args.folder),
        *(f"- sparsify ({side}): {summary}" for side, summary in summaries.items()),
        "- sides, each its own copy of the model in this process: dense, " + ", ".join(
            f"{side} ({SIDES[side]})" for side in sides),
        f"- generate: greedy, static cache, CompileConfig(fullgraph=True, dynamic=False) (inductor, reduce-overhead); "
        f"prompt {prompt.shape[1]} tokens; {args.new_tokens} and {args.short_tokens} new tokens; median of "
        f"{args.rounds} alternating runs",
        f"- next-token logits after 16 prompt tokens against dense: {agreement}", "",
        "tok/s: batch x new tokens / seconds of a long run (prefill included). ms/step: decode step from the "
        "difference of the long and short runs.", "",
        "\n".join(lines), ""])
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
