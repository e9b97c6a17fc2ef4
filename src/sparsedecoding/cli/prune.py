"""`sparsedecoding prune`: calibrate, prune layer by layer, write an HF checkpoint plus sparsedecoding.json."""

from __future__ import annotations

import sys


def add_calibration_arguments(parser) -> None:
    """Calibration options shared by `prune` and `demo`."""
    group = parser.add_argument_group("calibration")
    group.add_argument("--calibration", default="decode", choices=["decode", "text", "mix"],
                       help="decode: the dense model's own decode steps on --prompts (default); text: teacher-forced "
                            "--text; mix: both, --mix-ratio of the tokens from decode")
    group.add_argument("--prompts", default="humaneval:calib",
                       help="task prompts: a .jsonl file (field 'prompt'), a text file (one prompt per line), or "
                            "humaneval:calib (default, the even half of HumanEval)")
    group.add_argument("--text", default=None, help="natural text file for text calibration (default: Lee corpus)")
    group.add_argument("--tokens", type=int, default=16384,
                       help="calibration token budget, equal for every source (default 16384; 0: all decode tokens)")
    group.add_argument("--n-prompts", type=int, default=None, help="use only the first N prompts")
    group.add_argument("--samples-per-prompt", type=int, default=1,
                       help="continuations drawn per prompt (needs --sample; default 1)")
    group.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per prompt (default 512)")
    group.add_argument("--mix-ratio", type=float, default=0.5, help="share of decode tokens in --calibration mix")
    group.add_argument("--sample", action="store_true", help="sample (seeded) instead of greedy decoding")
    group.add_argument("--temperature", type=float, default=1.0)
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--gen-batch-size", type=int, default=32, help="prompts per generation batch")


def register(subparsers) -> None:
    parser = subparsers.add_parser("prune", help="prune a model with decode-time (or text) calibration",
                                   description=__doc__)
    parser.add_argument("--model", required=True,
                        help="HF model folder, .gguf file, or offline model name (smollm2-135m, qwen2.5-coder-1.5b)")
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--pattern", default="2:4", help="2:4, 4:8, 8:16, 16:32, any N:M, or 50%% (default 2:4)")
    parser.add_argument("--solver", default="sparsegpt", choices=["sparsegpt", "wanda", "magnitude"])
    parser.add_argument("--propagation", default="dense", choices=["dense", "sequential"],
                        help="dense: every Hessian from the dense model (paper); sequential: layer l sees pruned "
                             "layers < l")
    add_calibration_arguments(parser)
    solver = parser.add_argument_group("solver")
    solver.add_argument("--blocksize", type=int, default=128, help="SparseGPT block size (default 128)")
    solver.add_argument("--percdamp", type=float, default=0.01, help="SparseGPT relative damping (default 0.01)")
    solver.add_argument("--hessian-dtype", default="float32", choices=["float32", "float64"])
    solver.add_argument("--refine-steps", type=int, default=0,
                        help="experimental: after the solver, Adam steps per layer fitting the pruned layer's output "
                             "to the dense one on every real calibration token, masks fixed (default 0: off)")
    solver.add_argument("--refine-lr", type=float, default=1e-5, help="refinement learning rate (default 1e-5)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per replay batch (default 8)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ... (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.set_defaults(func=run)


def config_from_args(args, **overrides):
    from ..pipeline import PruneConfig

    values = dict(
        model=args.model, out=args.out, calibration=args.calibration, prompts=args.prompts, text=args.text,
        pattern=args.pattern, solver=args.solver, propagation=args.propagation, tokens=args.tokens or None,
        n_prompts=args.n_prompts, samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
        mix_ratio=args.mix_ratio,
        do_sample=args.sample, temperature=args.temperature, top_p=args.top_p, gen_batch_size=args.gen_batch_size,
        batch_size=args.batch_size, blocksize=args.blocksize, percdamp=args.percdamp,
        refine_steps=args.refine_steps, refine_lr=args.refine_lr,
        hessian_dtype=args.hessian_dtype, device=args.device, seed=args.seed, overwrite=args.overwrite,
        command=["sparsedecoding", *sys.argv[1:]],
    )
    values.update(overrides)
    return PruneConfig(**values)


def run(args) -> int:
    from ..pipeline import MANIFEST, prune

    out = prune(config_from_args(args))
    print(f"pruned model written to {out} (details in {out / MANIFEST})")
    return 0
