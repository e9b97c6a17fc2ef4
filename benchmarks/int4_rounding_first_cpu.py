"""Does fitting the first position take away the rise `int4_rounding_linears_cpu.md` found there? On Qwen2.5-Coder-
1.5B's linears both rounding options (`--scale-search`, `--rounding-sweeps 3`) lowered the loss on held-out decode
positions but raised it at first positions (1.073x geomean), which a decode-calibrated Hessian never holds. Every
calibration sequence opens with the same chat token, so in a causal model its first position is one vector x0 a layer
input. This script solves the same sampled rows from the same cached Hessians (`int4_rounding_linears_cpu.py --cache`)
with the plain rounding (`loop`) and with both options (`both`), each fitted on the decode Hessian H alone and on
H + n·x0·x0ᵀ, n the number of fitted sequences (what keeping each calibration sequence's first position would add).
x0 and the held-out first positions of the Lee text's windows (other tokens, read as one-token sequences, which in a
causal model is their first position) come from the model. Scored as the linears script scores: tr(ΔW·H·ΔWᵀ) /
tr(W·H·Wᵀ) on the decode Hessian, on x0·x0ᵀ, and on the held-out ones (later decode positions, Lee windows' first
positions, other prompt positions, other Lee positions).

    PYTHONPATH=src python benchmarks/int4_rounding_first_cpu.py --cache /tmp/sd/linears_cache.safetensors \\
        --out benchmarks/results/int4_rounding_first_cpu.md
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from int4_rounding_linears_cpu import (INPUTS, LINEARS, fitted_sequences, module, parsed_arguments,  # on sys.path
                                       sampled_problems)
from permute_order_bench import save_report
from permute_search_qwen_cpu import CALIBRATION
from sparsedecoding import solvers
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.data import lee_text
from sparsedecoding.models import load_model
from sparsedecoding.pipeline import relative_error

SCORED = ("fitted", "chat first", "decode", "lee first", "prompt", "lee")  # the columns, in order
ROUNDINGS = {"loop": {}, "both": {"scale_search": True, "rounding_sweeps": 3}}
FITS = ("decode", "decode + first")


@torch.no_grad()
def first_positions(layers: list[int], lee_tokens: int) -> tuple[dict, dict, int, int]:
    """({(layer, input): x0}, {(layer, input): Σ x·xᵀ over the Lee windows' first positions}, the chat token, how
    many Lee windows): each first token read alone, float64."""
    model, tokenizer, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    model.eval()
    calibration = CalibrationSet.load(Path(CALIBRATION))
    opening = {int(ids[mask.bool()][0]) for ids, mask in zip(calibration.input_ids, calibration.attention_mask)}
    if len(opening) != 1:
        raise SystemExit(f"error: the calibration sequences open with {len(opening)} different tokens, not one")
    chat = opening.pop()
    lee = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:lee_tokens]
    lee_firsts = [lee[start] for start in range(0, len(lee) - 511, 512)]  # the linears script's windows
    seen, hooks = {}, []
    for layer in layers:
        for name in INPUTS:
            def hook(_module, args, key=(layer, name)):
                seen[key] = args[0][0, 0].double()
            hooks.append(module(model, layer, name).register_forward_pre_hook(hook))
    try:
        model(input_ids=torch.tensor([[chat]]))
        x0 = dict(seen)
        lee_first = {}
        for token in lee_firsts:
            model(input_ids=torch.tensor([[token]]))
            for key, x in seen.items():
                lee_first[key] = lee_first.get(key, 0) + torch.outer(x, x)
    finally:
        for handle in hooks:
            handle.remove()
    return x0, lee_first, chat, len(lee_firsts)


def summary_table(results: list[dict], against: tuple[str, str]) -> str:
    """Per (rounding, fit): geometric mean over the linears of each score against `against`'s, and how many it
    lowered."""
    base = {(r["layer"], r["linear"]): r for r in results if (r["rounding"], r["fit"]) == against}
    lines = ["| rounding | fitted on | " + " | ".join(f"{kind}: geomean, lowered" for kind in SCORED) + " |",
             "|---|---|" + "---|" * len(SCORED)]
    for rounding in ROUNDINGS:
        for fit in FITS:
            if (rounding, fit) == against:
                continue
            rows = [r for r in results if (r["rounding"], r["fit"]) == (rounding, fit)]
            cells = []
            for kind in SCORED:
                ratios = torch.tensor([r[kind] / base[r["layer"], r["linear"]][kind] for r in rows],
                                      dtype=torch.float64)
                cells.append(f"{float(ratios.log().mean().exp()):.3f}, {int((ratios < 1).sum())} of {len(rows)}")
            lines.append(f"| {rounding} | {fit} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report_table(results: list[dict]) -> str:
    lines = ["| layer | linear | rounding | fitted on | " + " | ".join(SCORED) + " | seconds |",
             "|---|---|---|---|" + "---|" * len(SCORED) + "---|"]
    for r in results:
        lines.append(f"| {r['layer']} | {r['linear']} | {r['rounding']} | {r['fit']} | "
                     + " | ".join(f"{r[kind]:.4g}" for kind in SCORED) + f" | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parsed_arguments(__doc__.split("\n\n")[0], cache_required=True)
    began = time.perf_counter()
    x0, lee_first, chat, windows = first_positions(args.layers, args.lee_tokens)
    count = fitted_sequences(CalibrationSet.load(Path(CALIBRATION)), args.tokens)
    problems, source = sampled_problems(args)
    results = []
    for (layer, linear), (W, H, decode, _first, prompt, lee) in problems.items():
        x = x0[layer, LINEARS[linear]]
        chat_first = torch.outer(x, x).float()
        held_out = {"chat first": chat_first, "decode": decode, "lee first": lee_first[layer, LINEARS[linear]].float(),
                    "prompt": prompt, "lee": lee}
        for rounding, options in ROUNDINGS.items():
            for fit in FITS:
                fitted = H if fit == "decode" else H + count * chat_first
                started = time.perf_counter()
                pruned = solvers.admm(W, fitted, "2:4", quantize="int4", group_size=128, **options)
                results.append({"layer": layer, "linear": linear, "rows": W.shape[0], "columns": W.shape[1],
                                "rounding": rounding, "fit": fit, "fitted": relative_error(W, pruned, H),
                                **{kind: relative_error(W, pruned, T) for kind, T in held_out.items()},
                                "seconds": time.perf_counter() - started, "x0 share": float(
                                    count * chat_first.trace() / (H.trace() + count * chat_first.trace()))})
                print(results[-1], flush=True)
    shares = torch.tensor([r["x0 share"] for r in results if r["rounding"] == "loop" and r["fit"] == "decode"])
    body = (f"{source}. The first position x0 of every calibration sequence (token {chat}, the chat format's "
            f"opening) and those of the {windows} Lee windows, each read "
            f"alone. {args.rows} rows of each linear (the linears script's sample), solved in float32 by "
            "`solvers.admm` (100 iterations, 1% damping, 2:4, int4 values, 128 columns a scale) with the plain "
            "rounding (`loop`) or both options (`both`: `scale_search=True`, `rounding_sweeps=3`), fitted on the "
            f"decode Hessian H alone or on H + {count}·x0·x0ᵀ ({count} fitted sequences, one first position each; "
            f"x0·x0ᵀ holds {float(shares.min()):.1%}-{float(shares.max()):.1%} of that sum's trace). Loss: "
            "tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) on H (`fitted`), on x0·x0ᵀ (`chat first`, fitted by the `decode + first` "
            "rows), and on held-out Hessians: later sequences' decode positions (`decode`), the Lee windows' first "
            "positions (`lee first`), those sequences' other prompt positions (`prompt`), the Lee text's other "
            "positions (`lee`).\n\n"
            "Against the plain rounding fitted on decode positions alone (today's default; geometric mean over the "
            "linears, and how many of them each lowered):\n\n" + summary_table(results, ("loop", "decode"))
            + "\nAgainst the plain rounding fitted with first positions (the comparison a plan with first positions "
            "would make):\n\n" + summary_table(results, ("loop", "decode + first"))
            + "\nEach linear:\n\n" + report_table(results)
            + f"\nWhole run: {time.perf_counter() - began:.0f} s\n")
    save_report(args.out, "benchmarks/int4_rounding_first_cpu.py", results,
                "Fitting the first position: the rounding options on Qwen2.5-Coder-1.5B's linears (CPU)",
                torch.device("cpu"), body)


if __name__ == "__main__":
    main()
