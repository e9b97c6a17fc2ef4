"""`sparsedecoding demo`: the paper's claim in a few minutes on a CPU. Fetch SmolLM2-135M-Instruct, let it answer
HumanEval calibration prompts (the even half), prune it to 16:32 with SparseGPT on Hessians from those decode steps
only, prune it again from the same number of fixed news-text tokens (the baseline), and compare the three models on
held-out prompts (the odd half: how often each picks the dense model's next token along the dense model's answers,
KL(dense ‖ model) there, repetition in its own answers) and on held-out news text (Lee perplexity). The defaults were
chosen by measurement on the calibration half only: benchmarks/results/demo-choice/NOTES.md."""

from __future__ import annotations

import dataclasses
import json

from ..invocation import command
from ..settings import CalibrationSettings, RunSettings, SolverSettings, add_arguments

DEMO_MARK = "demo.json"
PPL_TOKENS = 2048  # of the Lee test text: enough to rank the models, cheap on a CPU
# The demo's own defaults; every other knob is prune's. 4096 tokens: fewer than the 1536 inputs of SmolLM2's down
# projection leave its Hessian rank-deficient, and at 1024 every pruned model loops from its first token; 16:32 is an
# N:M pattern the kernel runs, and there decode calibration wins every task column (demo-choice/NOTES.md). Generation
# stops at the budget; batches of 12 show progress.
DEMO = {"model": "smollm2-135m", "out": "sparsedecoding-demo", "pattern": "16:32", "n_prompts": 48,
        "max_new_tokens": 128, "tokens": 4096, "gen_batch_size": 12, "solver": "sparsegpt"}
# SparseGPT, not prune's default (admm): the demo compares two calibrations under one solver, its settings were chosen
# with SparseGPT, and SparseGPT keeps it within a few minutes on 2 CPU cores; `--solver admm` runs the default.


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="prune the default model on CPU and print a before/after table",
                                   description=__doc__)
    add_arguments(parser, RunSettings, defaults=DEMO, skip=("overwrite", "recipe", "out"))
    parser.add_argument("--out", default=DEMO["out"],
                        help="folder of the two pruned models (decode/, text/); an earlier demo's folder there is "
                             f"replaced, any other folder refused (default: {DEMO['out']})")
    parser.add_argument("--eval-prompts", type=int, default=8, help="held-out HumanEval prompts scored (default: 8)")
    parser.add_argument("--eval-new-tokens", type=int, default=64,
                        help="greedy new tokens per held-out answer (default: 64)")
    add_arguments(parser, SolverSettings, "solver", defaults=DEMO)
    # The demo runs decode and text calibration itself: the choice of source and the other sources' knobs are not
    # offered (argparse refuses them) rather than taken and ignored.
    add_arguments(parser, CalibrationSettings, "calibration", defaults=DEMO,
                  skip=("calibration", "mix_ratio", "self_sources", "self_meta", "self_answers", "self_batch_size",
                        "gen_backend", "calibration_from"))
    parser.set_defaults(func=run)


def dense_answer_scores(dense, model, answers, pad_id: int) -> tuple[float, float]:
    """On the dense model's own greedy answers: KL(dense ‖ model) per token, and the share of tokens where the
    model's top-1 next token is the one the dense model chose. Unlike scores on the model's own answers, a model
    that repeats itself cannot look good here: every model reads the same, coherent tokens."""
    from ..evaluation.metrics import answer_agreement, answer_log_probs

    return answer_agreement(answer_log_probs(dense, answers, pad_id), answer_log_probs(model, answers, pad_id),
                            answers)


def held_out_scores(dense, models: dict, tokenizer, prompts: list[str], new_tokens: int) -> dict:
    """Per model, on held-out prompts: agreement with and KL from the dense model along the dense model's answers,
    distinct 4-grams of its own greedy answers (repetition) and its first answer; and Lee perplexity."""
    from ..data import chat_format, lee_text
    from ..evaluation.metrics import distinct_n, mean, perplexity
    from ..generation import generate, tokenize_prompts

    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    text_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:PPL_TOKENS]
    rows, dense_answers = {}, None
    for name, model in models.items():
        print(f"      {name}: answering {len(prompts)} held-out prompts, then scoring", flush=True)
        answers = generate(model, tokenizer, prompt_ids, new_tokens, batch_size=len(prompt_ids))
        dense_answers = dense_answers or answers  # the dense model comes first: its answers are the reference
        kl, agree = dense_answer_scores(dense, model, dense_answers, tokenizer.pad_token_id)
        rows[name] = {
            "agree": agree, "kl": kl, "distinct_4": mean([distinct_n(gen.new_ids, 4) for gen in answers]),
            "ppl": perplexity(model, text_ids)[0],
            "sample": tokenizer.decode(answers[0].new_ids, skip_special_tokens=True).strip(),
        }
    return rows


def what_it_shows(rows: dict) -> list[str]:
    """One or two sentences read off the numbers (never fixed text: a run where decode loses says so)."""
    text, decode = rows["text"], rows["decode"]
    if decode["agree"] > text["agree"] and decode["kl"] < text["kl"]:
        lines = [f"Decode-time calibration wins on the task: on held-out prompts the decode-calibrated model picks the "
                 f"dense model's next token {decode['agree']:.0%} of the time against {text['agree']:.0%} for text "
                 f"calibration, with {text['kl'] / decode['kl']:.1f}x lower KL, from the same number of calibration "
                 f"tokens."]
    else:
        lines = [f"Here decode-time calibration did not beat text calibration on held-out prompts (agreement "
                 f"{decode['agree']:.0%} vs {text['agree']:.0%}, KL {decode['kl']:.3f} vs {text['kl']:.3f})."]
    if text["ppl"] < decode["ppl"]:
        lines.append(f"Text calibration keeps news-text perplexity lower ({text['ppl']:.0f} vs {decode['ppl']:.0f}): "
                     f"each pruned model is best on the kind of input it was calibrated on.")
    return lines


def run(args) -> int:
    from ..data import humaneval_prompts
    from ..errors import OutputExistsError, SolverSettingsError
    from ..outputs import check_not_source, check_writable, output_folder, output_target
    from ..models import load_model, resolve_model
    from ..pipeline import PRUNED_MANIFEST, PruneConfig, prune, unread_options
    from ..runenv import pick_device
    from .prune import config_from_args

    if not args.tokens:  # 0 means "every decode token" to prune; the demo's text run needs a budget as well
        raise SolverSettingsError(f"--tokens must be at least 1 for the demo: both of its prunes read that many tokens "
                                  f"(default {DEMO['tokens']})")
    for calibration in ("decode", "text"):  # bad settings fail here, before anything is fetched or written
        config_from_args(args, calibration=calibration, out=args.out).check_values()
    for flag, value in (("--eval-prompts", args.eval_prompts), ("--eval-new-tokens", args.eval_new_tokens)):
        if value < 1:
            raise SolverSettingsError(f"{flag} {value}: it must be at least 1")
    pick_device(args.device)
    out = output_target(args.out)
    check_writable(out)
    if out.exists() and not (out / DEMO_MARK).exists():
        raise OutputExistsError(f"{out} exists and is not an earlier demo; pass another --out")
    print(f"[1/4] fetching {args.model}")
    folder = resolve_model(args.model)  # an offline name is fetched; a folder or .gguf is used as given
    check_not_source(out, args.model, folder)  # an earlier demo's model, read from the folder this one replaces
    print(f"      {folder}")
    args.model = str(folder)
    # Both models are built in OUT.partial, which replaces an earlier demo only once they are written.
    with output_folder(out, overwrite=True) as partial:
        print(f"[2/4] pruning to {args.pattern}, Hessians from the model's own decode steps ({args.tokens} tokens)")
        decode_out = prune(config_from_args(args, calibration="decode", out=str(partial / "decode")))
        tokens = json.loads((decode_out / PRUNED_MANIFEST).read_text())["calibration"]["tokens"]
        print(f"[3/4] pruning to {args.pattern}, Hessians from Lee news text (the same {tokens} tokens)")
        text_config = config_from_args(args, calibration="text", tokens=tokens, out=str(partial / "text"))
        defaults = PruneConfig(model=text_config.model, out=text_config.out)  # the decode run's generation settings,
        prune(dataclasses.replace(text_config, **{  # unread here, go back to their defaults: no warning
            name: getattr(defaults, name) for name in unread_options(text_config)}))
        (partial / DEMO_MARK).write_text(json.dumps({"command": command()}))
    decode_out, text_out = out / "decode", out / "text"

    print("[4/4] scoring the three models on held-out prompts and text")
    dense, tokenizer, _ = load_model(folder, "cpu" if args.device == "auto" else args.device)
    device = next(dense.parameters()).device
    models = {"dense": dense, "text": load_model(text_out, device)[0], "decode": load_model(decode_out, device)[0]}
    rows = held_out_scores(dense, models, tokenizer, humaneval_prompts("eval")[:args.eval_prompts],
                           args.eval_new_tokens)
    print()
    print("| model | picks dense's next token ↑ | KL(dense ‖ model) ↓ | distinct 4-grams ↑ | Lee perplexity ↓ |")
    print("|---|---|---|---|---|")
    labels = {"dense": "dense", "text": f"{args.pattern}, text-calibrated", "decode": f"{args.pattern}, decode-calibrated"}
    for name, row in rows.items():
        print(f"| {labels[name]} | {row['agree']:.1%} | {row['kl']:.3f} | {row['distinct_4']:.2f} | {row['ppl']:.1f} |")
    print()
    print("How to read it: the first two columns follow the dense model's own answers to held-out prompts (higher "
          "agreement and lower KL: closer to the dense model); distinct 4-grams is the share of 4-token phrases in a "
          "model's own answers that are not repeats (1 = none repeated); perplexity is on held-out news text.")
    for line in what_it_shows(rows):
        print(line)
    print()
    for name, row in rows.items():
        print(f"first held-out answer, {labels[name]}: {row['sample'][:120]!r}")
    print()
    print(f"calibration: {tokens} tokens per source; held-out: {args.eval_prompts} odd-index HumanEval prompts")
    print(f"pruned models saved to {(out / 'decode').resolve()} and {(out / 'text').resolve()} "
          f"(HF safetensors, zeros kept; details in {PRUNED_MANIFEST})")
    return 0
