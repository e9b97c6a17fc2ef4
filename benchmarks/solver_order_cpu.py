"""The solver's column order on a real model, dev side only: SparseGPT visiting columns left to right (`columns`)
against whole N:M groups in falling Hessian-diagonal order (`hessian`), from the same decode-time Hessians; with
--refit-steps, each order also with its kept weights re-solved for its mask (`--refit-steps`, `solvers.refit_kept`);
with --solvers admm, also ADMM on the whole layer loss (`--solver admm`, `solvers.admm`; one variant a pattern and
refit setting unless --quantize, since only the rounding loop after ADMM reads the order).

One calibration set (the dense model's sampled answers to the HumanEval fit quarter, as the recommended recipe, at
a smaller token budget), dense propagation, so every variant solves exactly the same Hessians; per variant the
relative reconstruction error of every linear, then the pruned model against the dense one along the dense
model's greedy answers to the dev quarter (KL per token, top-1 agreement) and news-text perplexity. Nothing here
reads the held-out half. Runs on the CPU: about 16 minutes for SmolLM2-135M on 2 cores at the defaults; for
Qwen2.5-Coder-1.5B the calibration's generation alone (mostly the prompts' prefill) took over 25 minutes there.

    python benchmarks/solver_order_cpu.py --out benchmarks/results/solver_order_smollm2_cpu.md
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsedecoding import pipeline  # noqa: E402
from sparsedecoding.data import chat_format, humaneval_prompts, lee_text  # noqa: E402
from sparsedecoding.evaluation.metrics import answer_agreement, answer_log_probs, perplexity  # noqa: E402
from sparsedecoding.generation import generate, tokenize_prompts  # noqa: E402
from sparsedecoding.hessian import prunable_linears  # noqa: E402
from sparsedecoding.models import load_model, resolve_model  # noqa: E402
from sparsedecoding.settings import PruneConfig  # noqa: E402

KINDS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up",
         "up_proj": "gate_up", "down_proj": "down"}


class Held:
    """A stand-in linear for `pipeline.solve_layer`: only its weight is read and written."""

    def __init__(self, weight: torch.Tensor):
        self.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)


@torch.no_grad()
def solve_variants(model, calib, variants: dict[str, PruneConfig], batch_size: int) -> tuple[dict, dict]:
    """Per variant: {linear name: pruned weight (bfloat16, CPU)} and {linear name: stats}, every layer's Hessians
    taken once from the dense model (dense propagation) and solved by each variant."""
    batches = pipeline.first_layer_inputs(model, calib, batch_size, torch.device("cpu"))
    weights = {name: {} for name in variants}
    stats = {name: {} for name in variants}
    layers = model.model.layers
    for index, layer in enumerate(layers):
        started = time.perf_counter()
        linears = prunable_linears(layer)
        hessians, outputs = pipeline.layer_hessians(layer, linears, batches, torch.float32, f"layer {index} ")
        for name, config in variants.items():
            held = {key: Held(linear.weight) for key, linear in linears.items()}
            found = pipeline.solve_layer(config, config.sparsity_pattern(), held, hessians)
            for key, item in found.items():
                full = f"model.layers.{index}.{key}"
                stats[name][full] = item
                weights[name][full + ".weight"] = held[key].weight.data.to(torch.bfloat16)
        del hessians
        batches = [(output, kwargs, kept) for output, (_, kwargs, kept) in zip(outputs, batches)]
        line = "  ".join(f"{name} {max(v['relative_error'] for k, v in stats[name].items() if f'.{index}.' in k):.4f}"
                         for name in variants)
        print(f"layer {index}: {time.perf_counter() - started:.0f} s; worst relative error {line}", flush=True)
    return weights, stats


def error_table(stats: dict) -> list[str]:
    """Per pattern, variant and linear kind: the mean relative error, and the geometric mean over linears of the
    variant's error over the pattern's first variant's (`columns`; in brackets, the largest such ratio of any one
    linear)."""
    lines = ["| pattern | variant | linear | mean error | / first variant: geomean (largest) |", "|---|---|---|---|---|"]
    for pattern in dict.fromkeys(name.split(" ", 1)[0] for name in stats):
        names = [name for name in stats if name.split(" ", 1)[0] == pattern]
        base = stats[names[0]]
        for name in names:
            other = stats[name]
            for kind in ("qkv", "o", "gate_up", "down", "all"):
                keys = [key for key in base if kind == "all" or KINDS[key.rsplit(".", 1)[1]] == kind]
                logs = [math.log(other[key]["relative_error"] / base[key]["relative_error"]) for key in keys
                        if base[key]["relative_error"] > 0 and other[key]["relative_error"] > 0]
                mean = sum(other[key]["relative_error"] for key in keys) / len(keys)
                lines.append(f"| {pattern} | {name.split(' ', 1)[1]} | {kind} | {mean:.5f} | "
                             f"{math.exp(sum(logs) / len(logs)):.3f} ({math.exp(max(logs)):.3f}) |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--patterns", nargs="+", default=["2:4", "16:32"],
                        help="sparsity patterns; dense: no pruning, GPTQ alone (needs --quantize)")
    parser.add_argument("--tokens", type=int, default=8192, help="calibration decode tokens")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="calibration answers' length limit")
    parser.add_argument("--gen-batch-size", type=int, default=32, help="calibration answers generated at once")
    parser.add_argument("--dev-tokens", type=int, default=128, help="dense dev answers' length limit")
    parser.add_argument("--dev-limit", type=int, default=0, help="only the first N dev prompts (0: all 41)")
    parser.add_argument("--ppl-tokens", type=int, default=4096)
    parser.add_argument("--quantize", default="none", choices=("none", "int8", "int4"),
                        help="every variant also rounds its kept weights (the joint solve); under the hessian order "
                             "int4 scales are fixed before the loop from the unrounded solve")
    parser.add_argument("--group-size", type=int, default=128, help="int4: input columns a scale")
    parser.add_argument("--orders", nargs="+", default=["columns", "hessian"], choices=("columns", "hessian"))
    parser.add_argument("--refit-steps", type=int, nargs="+", default=[0],
                        help="refit settings to try with every order (0: none; 40: 40 conjugate-gradient steps)")
    parser.add_argument("--solvers", nargs="+", default=["sparsegpt"], choices=("sparsegpt", "admm"))
    parser.add_argument("--admm-iterations", type=int, default=100, help="--solvers admm: ADMM steps")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if "dense" in args.patterns and args.quantize == "none":
        parser.error("--patterns dense (GPTQ alone) needs --quantize int8 or int4")
    torch.manual_seed(0)
    folder = resolve_model(args.model)
    model, tokenizer, _ = load_model(folder, "cpu", torch.float32)
    model.eval()
    started = time.perf_counter()
    base = PruneConfig(model=str(folder), out="unused", recipe="recommended", tokens=args.tokens,
                       max_new_tokens=args.max_new_tokens, gen_batch_size=args.gen_batch_size,
                       quantize=args.quantize, group_size=args.group_size)
    calib, calib_stats = pipeline.build_calibration(base, model, tokenizer)
    print(f"calibration: {calib.tokens} tokens in {time.perf_counter() - started:.0f} s", flush=True)
    variants = {}
    for pattern in args.patterns:
        for solver in args.solvers:
            # unquantized, ADMM's result does not depend on the order: one variant
            orders = args.orders if solver == "sparsegpt" or args.quantize != "none" else args.orders[:1]
            for order in orders:
                for steps in args.refit_steps:
                    name = (f"{pattern} {order}" if solver == "sparsegpt" else
                            f"{pattern} admm{args.admm_iterations}" + (f" {order}" if len(orders) > 1 else ""))
                    variants[name + (f"+refit{steps}" if steps else "")] = dataclasses.replace(
                        base, pattern=pattern, solver=solver, solver_order=order, refit_steps=steps,
                        admm_iterations=args.admm_iterations)
    weights, stats = solve_variants(model, calib, variants, base.batch_size)

    dev = humaneval_prompts("dev", "fenced")
    dev = dev[:args.dev_limit] if args.dev_limit else dev
    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, dev))
    answers = generate(model, tokenizer, prompt_ids, args.dev_tokens, batch_size=len(prompt_ids))
    text_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:args.ppl_tokens]
    rows = {"dense": {"kl": 0.0, "agree": 1.0, "ppl": perplexity(model, text_ids)[0]}}
    dense_log_p = answer_log_probs(model, answers, tokenizer.pad_token_id)  # once: the dense passes dominate on a CPU
    for name, pruned_weights in weights.items():
        pruned = copy.deepcopy(model)
        missing = set(pruned_weights) - set(pruned.state_dict())
        assert not missing, missing
        pruned.load_state_dict({key: value.float() for key, value in pruned_weights.items()}, strict=False)
        kl, agree = answer_agreement(dense_log_p, answer_log_probs(pruned, answers, tokenizer.pad_token_id), answers)
        rows[name] = {"kl": kl, "agree": agree, "ppl": perplexity(pruned, text_ids)[0]}
        print(f"{name}: KL {kl:.4f}, agreement {agree:.4f}, ppl {rows[name]['ppl']:.2f}", flush=True)
        del pruned

    answer_tokens = sum(len(gen.new_ids) for gen in answers)
    lines = [
        ("# SparseGPT's column order: left to right vs whole groups by Hessian diagonal"
         if args.solvers == ["sparsegpt"] else f"# ADMM ({args.admm_iterations} iterations) against SparseGPT")
        + (" (CPU, dev side only)" if args.refit_steps == [0] else ", each with and without the kept weights' refit "
           "(CPU, dev side only)"), "",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: CPU only ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
        f"- model: {folder.name} (float32 on the CPU)",
        f"- calibration: the recommended recipe's decode calibration (HumanEval fit quarter, 4 sampled answers a "
        f"prompt, temperature 0.7, top-p 0.95) at {calib.tokens} tokens (answers cut at {args.max_new_tokens} new "
        f"tokens); dense propagation, so every variant solves the same Hessians; SparseGPT, damping "
        f"{base.percdamp}, blocks of {base.blocksize}"
        + ("" if "admm" not in args.solvers else "; `admmN`: `--solver admm` with N iterations (same damping)")
        + ("" if args.refit_steps == [0] else "; `+refitN`: the kept weights then re-solved for the mask by N "
           "conjugate-gradient steps on the same damped Hessian"
           + ("" if args.quantize == "none" else f" (the mask from the unrounded solve, the refit weights then "
              f"rounded to {args.quantize} with it fixed)"))
        + ("" if args.quantize == "none" else f"; kept values rounded to {args.quantize} in the same pass"
           + (f" ({args.group_size} columns a scale; left to right sets each group's scale as its block starts, the "
              f"hessian order fixes every scale before the loop from the same problem solved unrounded)"
              if args.quantize == "int4" else "")),
        f"- dev scores: along the dense model's greedy answers to {len(dev)} dev-quarter prompts (fenced wording, at "
        f"most {args.dev_tokens} new tokens, {answer_tokens} tokens in all): KL(dense ‖ pruned) per token and the "
        f"share of tokens where the pruned model's top-1 is the dense model's token; perplexity on the first "
        f"{len(text_ids)} tokens of the Lee test text. The held-out half is not read.",
        f"- wall time: {time.perf_counter() - started:.0f} s", "",
        "## Relative reconstruction error tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ), per linear kind", "",
        *error_table(stats), "",
        "## The pruned models against the dense one (dev side)", "",
        "| model | KL per token | top-1 agreement | Lee perplexity |", "|---|---|---|---|",
        *[f"| {name} | {row['kl']:.4f} | {row['agree']:.4f} | {row['ppl']:.2f} |" for name, row in rows.items()],
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(
        {"rows": rows, "relative_error": stats, "calibration": calib_stats, "argv": sys.argv}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
