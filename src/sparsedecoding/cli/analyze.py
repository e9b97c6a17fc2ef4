"""`sparsedecoding analyze discrepancy|drift|plot`: the paper's two analyses, written as markdown + JSON + PNG."""

from __future__ import annotations

from ..settings import CALIBRATION_TOKENS


def fractions(text: str) -> tuple[float, ...]:
    import argparse

    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of fractions like 0.01,0.1") from None


def add_output_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--no-plot", dest="plot", action="store_false",
                        help="skip the PNG (no matplotlib here); draw it later with `analyze plot OUT` "
                             "(default: draw it)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ... (default auto)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (default: off)")


def register(subparsers) -> None:
    parser = subparsers.add_parser("analyze", help="calibration discrepancy and activation drift analyses",
                                   description=__doc__)
    analyses = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    discrepancy = analyses.add_parser(
        "discrepancy", help="ε_text vs ε_decode against held-out decode Hessians, per module and retained fraction",
        description="For every prunable linear and retained fraction ρ: the worst-case relative gap between the "
                    "calibration loss and the held-out decode-time loss over the top ⌈ρ·d_in⌉ eigenvectors of H_dec, "
                    "for text and for decode calibration with equal token counts.")
    discrepancy.add_argument("--model", required=True, help="the dense model (folder, .gguf or offline name)")
    discrepancy.add_argument("--heldout", default="humaneval:eval", help="prompts for H_dec (default humaneval:eval)")
    discrepancy.add_argument("--calib-prompts", default="humaneval:calib",
                             help="prompts for decode calibration (default humaneval:calib)")
    discrepancy.add_argument("--text", default=None,
                             help="natural text file for text calibration (default: Lee background corpus)")
    discrepancy.add_argument("--tokens", type=int, default=CALIBRATION_TOKENS,
                             help=f"calibration tokens of each source (default {CALIBRATION_TOKENS})")
    discrepancy.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per prompt (default 512)")
    discrepancy.add_argument("--rhos", type=fractions, default=(0.01, 0.02, 0.05, 0.10, 0.20, 0.50),
                             help="retained fractions (default 0.01,0.02,0.05,0.1,0.2,0.5)")
    discrepancy.add_argument("--gen-batch-size", type=int, default=32,
                             help="prompts per generation batch (default: 32)")
    discrepancy.add_argument("--batch-size", type=int, default=8,
                             help="sequences per Hessian replay batch (default: 8)")
    discrepancy.add_argument("--hessian-dtype", default="float64", choices=["float32", "float64"],
                             help="Hessian accumulation dtype (default: float64)")
    discrepancy.add_argument("--seed", type=int, default=0, help="text window order (default: 0)")
    add_output_arguments(discrepancy)
    discrepancy.set_defaults(func=run_discrepancy_command)

    drift = analyses.add_parser(
        "drift", help="per-layer drift of a pruned model's layer inputs from the dense model's over decode steps",
        description="Dense and pruned models each decode greedily from the same prompts, reading their own tokens; "
                    "per layer and decode step: mean ‖x_pruned − x_dense‖/‖x_dense‖ of the layer inputs.")
    drift.add_argument("--dense", required=True, help="the dense model")
    drift.add_argument("--pruned", required=True, help="the pruned model folder")
    drift.add_argument("--prompts", default="humaneval:eval", help="prompts (default humaneval:eval)")
    drift.add_argument("--limit", type=int, default=None, help="only the first N prompts (default: all)")
    drift.add_argument("--steps", type=int, default=64, help="decode steps to follow (default 64)")
    drift.add_argument("--batch-size", type=int, default=32, help="prompts per batch (default 32)")
    add_output_arguments(drift)
    drift.set_defaults(func=run_drift_command)

    plot = analyses.add_parser("plot", help="(re)draw the PNGs of an analysis or compare folder from its JSON",
                               description="Redraw the figures of a folder written by `analyze discrepancy`, "
                                           "`analyze drift` or `compare` from the JSON it holds (needs matplotlib).")
    plot.add_argument("folder", help="a folder written by `analyze discrepancy`, `analyze drift` or `compare`")
    plot.set_defaults(func=run_plot_command)


def run_discrepancy_command(args) -> int:
    from ..analysis.discrepancy import run_discrepancy

    out = run_discrepancy(args.model, args.out, heldout=args.heldout, calib_prompts=args.calib_prompts,
                          text=args.text, tokens=args.tokens, max_new_tokens=args.max_new_tokens, rhos=args.rhos,
                          gen_batch_size=args.gen_batch_size, batch_size=args.batch_size,
                          hessian_dtype=args.hessian_dtype, device=args.device, seed=args.seed, plot=args.plot,
                          overwrite=args.overwrite)
    print((out / "discrepancy.md").read_text(encoding="utf-8"))
    return 0


def run_drift_command(args) -> int:
    from ..analysis.drift import run_drift

    out = run_drift(args.dense, args.pruned, args.out, prompts=args.prompts, limit=args.limit, steps=args.steps,
                    batch_size=args.batch_size, device=args.device, plot=args.plot, overwrite=args.overwrite)
    print((out / "drift.md").read_text(encoding="utf-8"))
    return 0


def run_plot_command(args) -> int:
    from ..analysis.plots import redraw

    for path in redraw(args.folder):
        print(path)
    return 0
