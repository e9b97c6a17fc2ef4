"""Choose the CPU demo's settings by measurement, on the calibration side of HumanEval only.

SmolLM2-135M calibrates on `humaneval:fit` (index % 4 == 0) and is scored on `humaneval:dev` (index % 4 == 2); the
held-out odd half is never read. The dense model generates once; each token budget takes the first tokens of those
generations (decode) or the same number of Lee background tokens (text); every pattern is pruned in memory from both
and scored: on-policy KL(dense ‖ pruned) and dense NLL over the pruned model's own greedy answers, how many answers
end on their own, repetition, Lee perplexity, the demo's agreement with and KL from the dense model along the dense
model's own answers, and the time each step took. One JSON line per configuration (benchmarks/results/demo-choice/).

    python benchmarks/demo_choice.py --patterns 2:4 16:32 50% --tokens 1024 4096 --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from sparsedecoding.calibration import decode_set_from_generations, text_calibration
from sparsedecoding.cli.demo import dense_answer_scores
from sparsedecoding.compare import pruned_copy
from sparsedecoding.data import chat_format, humaneval_prompts, lee_text
from sparsedecoding.evaluation.metrics import on_policy_scores, perplexity, repetition_summary
from sparsedecoding.generation import Generation, generate, tokenize_prompts
from sparsedecoding.models import load_model
from sparsedecoding.settings import PruneConfig


def scores(dense, model, tokenizer, prompt_ids, new_tokens: int, text_ids: list[int],
           reference: list[Generation] | None = None) -> tuple[dict, list[Generation]]:
    started = time.perf_counter()
    generations = generate(model, tokenizer, prompt_ids, new_tokens, batch_size=len(prompt_ids), progress=False)
    generate_seconds = time.perf_counter() - started
    on_policy = on_policy_scores(dense, model, generations, tokenizer.pad_token_id)
    tokens = sum(score.tokens for score in on_policy)
    answers = [gen.new_ids for gen in generations]
    row = {
        "kl": sum(score.kl for score in on_policy) / tokens,
        "dense_nll": sum(score.dense_nll for score in on_policy) / tokens,
        "stopped": sum(gen.stopped for gen in generations) / len(generations),
        **repetition_summary(answers),
        "ppl": perplexity(model, text_ids)[0] if text_ids else None,
        "generate_seconds": round(generate_seconds, 1),
        "score_seconds": round(time.perf_counter() - started - generate_seconds, 1),
        "samples": [tokenizer.decode(ids, skip_special_tokens=True).strip()[:160] for ids in answers[:2]],
    }
    if reference:
        row["kl_dense_answers"], row["top1_agreement"] = dense_answer_scores(dense, model, reference,
                                                                             tokenizer.pad_token_id)
    return row, generations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--patterns", nargs="+", default=["2:4"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1024], help="calibration budgets per source")
    parser.add_argument("--sources", nargs="+", default=["text", "decode"])
    parser.add_argument("--fit-prompts", type=int, default=12, help="fit prompts the dense model answers")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="per calibration answer")
    parser.add_argument("--propagation", default="dense")
    parser.add_argument("--dev-prompts", type=int, default=6)
    parser.add_argument("--dev-new-tokens", type=int, default=64)
    parser.add_argument("--ppl-tokens", type=int, default=4096, help="Lee test tokens for perplexity (0: skip)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dense, tokenizer, folder = load_model(args.model, "cpu")
    fit = humaneval_prompts("fit")[:args.fit_prompts]
    started = time.perf_counter()
    fit_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, fit))
    # Greedy answers depend only on the prompts and the length, so later runs with the same ones reuse them.
    cache = args.out.parent / f"answers-{args.model}-fit{len(fit)}-new{args.max_new_tokens}.json"
    if cache.exists():
        calibration_answers = [Generation(**item) for item in json.loads(cache.read_text())]
    else:
        calibration_answers = generate(dense, tokenizer, fit_ids, args.max_new_tokens, batch_size=len(fit_ids))
        cache.write_text(json.dumps([vars(gen) for gen in calibration_answers]))
    calibration_seconds = time.perf_counter() - started
    dev_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, humaneval_prompts("dev")[:args.dev_prompts]))
    text_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:args.ppl_tokens]
    common = {"model": args.model, "fit_prompts": len(fit), "max_new_tokens": args.max_new_tokens,
              "dev_prompts": len(dev_ids), "dev_new_tokens": args.dev_new_tokens, "ppl_tokens": len(text_ids),
              "propagation": args.propagation, "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M UTC",
              time.gmtime()), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "calibration_generate_seconds": round(calibration_seconds, 1)}

    def record(row: dict) -> None:
        row = {**common, **row}
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")
        print(json.dumps({key: value for key, value in row.items() if key not in common}), flush=True)

    dense_row, reference = scores(dense, dense, tokenizer, dev_ids, args.dev_new_tokens, text_ids)
    record({"config": "dense", **dense_row})
    for budget in args.tokens:
        decode_set = decode_set_from_generations(calibration_answers, tokenizer.pad_token_id, budget)
        sets = {"decode": decode_set,
                "text": text_calibration(tokenizer, lee_text("background"), token_budget=decode_set.tokens)}
        for pattern in args.patterns:
            for source in args.sources:
                config = PruneConfig(model=str(folder), out="", calibration=source, pattern=pattern,
                                     propagation=args.propagation, tokens=sets[source].tokens, device="cpu",
                                     solver="sparsegpt")  # the demo's solver (cli/demo.py)
                started = time.perf_counter()
                pruned, _ = pruned_copy(dense, sets[source], config)
                prune_seconds = time.perf_counter() - started
                row, _ = scores(dense, pruned, tokenizer, dev_ids, args.dev_new_tokens, text_ids, reference)
                record({"config": f"{source} {pattern}", "source": source, "pattern": pattern,
                        "tokens": sets[source].tokens, "prune_seconds": round(prune_seconds, 1), **row})
                del pruned
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
