"""Which of Qwen2.5-Coder-1.5B's linears do the two rounding options (`--scale-search`, `--rounding-sweeps 3`) help,
and on which tokens? plan-rounding.json found the whole 2:4 + int4 model worse with both options, while on down alone
(`int4_rounding_heldout_cpu.md`) they lowered the layer loss on held-out decode tokens. This script asks the same of
every linear of a block (q, k, v, which share an input; o; gate and up, which share one; down) and on four kinds of
tokens no solve sees. For each block in --layers the Hessians X·Xᵀ of the four inputs come from a teacher-forced pass
over the first --tokens decode positions of the committed calibration set (as `permute_int4_layer_cpu.py` takes
down's); the held-out ones from the next --held-out-tokens decode positions, from the prompt positions of those same
sequences (a decode-calibrated Hessian leaves them out, yet every decode step attends to their keys and values; the
first position, where the largest activations sit, apart), and from --lee-tokens of the Lee test text (its windows'
first positions join the first positions). A fixed random sample of --rows rows of each linear is solved by
`solvers.admm` (100 iterations, 2:4, int4 values, 128 columns a scale) four ways: the plain rounding (`loop`),
`scale_search`, 3 `rounding_sweeps`, and both, each as `prune` runs it; rows are independent under one H, so a sample
estimates the layer. Reported: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) on each Hessian, and each against the plain rounding's.

    PYTHONPATH=src python benchmarks/int4_rounding_linears_cpu.py --out benchmarks/results/int4_rounding_linears_cpu.md
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from permute_int4_layer_cpu import layer_parser  # benchmarks/ is on sys.path when this script runs
from permute_order_bench import save_report
from permute_search_qwen_cpu import CALIBRATION
from sparsedecoding import solvers
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.data import lee_text
from sparsedecoding.models import load_model
from sparsedecoding.pipeline import relative_error

# each linear and the module whose input it reads (q, k and v share one input, gate and up another)
LINEARS = {"q": "self_attn.q_proj", "k": "self_attn.q_proj", "v": "self_attn.q_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.gate_proj", "down": "mlp.down_proj"}
WEIGHTS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
INPUTS = sorted(set(LINEARS.values()))
HELD_OUT = ("decode", "first", "prompt", "lee")  # the Hessians no solve sees
ROUNDINGS = {"loop": {}, "scale search": {"scale_search": True}, "3 sweeps": {"rounding_sweeps": 3},
             "both": {"scale_search": True, "rounding_sweeps": 3}}


def module(model, layer: int, name: str) -> torch.nn.Module:
    found = model.model.layers[layer]
    for part in name.split("."):
        found = getattr(found, part)
    return found


@torch.no_grad()
def input_hessians(model, sequences: list[tuple[torch.Tensor, dict[str, torch.Tensor]]], layers: list[int]) -> dict:
    """X·Xᵀ (float64) at each input of `INPUTS` of `layers`, keyed (layer, input, kind): each sequence's ids [T]
    run alone, and each of its position masks (a dict kind -> bool [T]) sums its own Hessian."""
    sums, hooks, current = {}, [], {}
    for layer in layers:
        for name in INPUTS:
            def hook(_module, args, key=(layer, name)):
                for kind, positions in current.items():
                    x = args[0][0][positions].double()
                    sums[key + (kind,)] = sums.get(key + (kind,), 0) + x.T @ x
            hooks.append(module(model, layer, name).register_forward_pre_hook(hook))
    try:
        for ids, positions in sequences:
            current.clear()
            current.update(positions)
            model(input_ids=ids[None])
    finally:
        for handle in hooks:
            handle.remove()
    return sums


def first(length: int) -> torch.Tensor:
    """A sequence's first position alone, as a bool mask [length]."""
    return torch.arange(length) == 0


def calibration_sequences(calibration: CalibrationSet, start: int, end: int, prompts: bool) -> list:
    """Sequences start to end - 1 of the set, left padding cut off, with their decode positions ("decode") and, with
    `prompts`, their first position ("first": where Qwen's largest activations sit) and their other prompt positions
    ("prompt")."""
    found = []
    for row in range(start, end):
        real = calibration.attention_mask[row].bool()
        keep = calibration.keep[row][real]
        kinds = {"decode": keep}
        if prompts:
            kinds.update(first=first(len(keep)), prompt=~keep & ~first(len(keep)))
        found.append((calibration.input_ids[row][real], kinds))
    return found


def fitted_sequences(calibration: CalibrationSet, tokens: int) -> int:
    """How many of the set's sequences the fitted Hessian reads: whole sequences until they hold `tokens` decode
    positions."""
    kept = calibration.keep.sum(1).cumsum(0)
    return min(int((kept < tokens).sum()) + 1, len(calibration))


def by_linear(tensors: dict[str, torch.Tensor], layers: list[int]) -> dict:
    """The cache's tensors as {(layer, linear): (sampled rows, fitted H, the held-out Hs of `HELD_OUT`)}."""
    return {(layer, linear): (tensors[f"W.{layer}.{linear}"],
                              *(tensors[f"{kind}.{layer}.{name}"] for kind in ("fitted", *HELD_OUT)))
            for layer in layers for linear, name in LINEARS.items()}


def sampled_problems(args) -> tuple[dict, str]:
    """{(layer, linear): (sampled rows, fitted H, and the held-out Hs of `HELD_OUT`)} in float32, and where the
    Hessians came from; from --cache when it holds these settings. Linears that share an input share its tensors."""
    settings = (f"tokens {args.tokens}, held-out {args.held_out_tokens}, lee {args.lee_tokens}, rows {args.rows}, "
                f"layers {args.layers}")
    if args.cache and args.cache.exists() and args.cache.with_suffix(".txt").exists():
        source, _, cached = args.cache.with_suffix(".txt").read_text().partition("\n")
        if cached == settings:
            return by_linear(load_file(str(args.cache)), args.layers), source
    model, tokenizer, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    model.eval()
    calibration = CalibrationSet.load(Path(CALIBRATION))
    kept = calibration.keep.sum(1).cumsum(0)
    fitted = fitted_sequences(calibration, args.tokens)
    positions = int(calibration.keep[:fitted].sum())
    end = min(int((kept < positions + args.held_out_tokens).sum()) + 1, len(calibration))
    if end <= fitted:
        raise SystemExit("error: the calibration set holds no sequences beyond the fitted ones")
    lee = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:args.lee_tokens]
    windows = [torch.tensor(lee[start:start + 512]) for start in range(0, len(lee) - 511, 512)]
    weights = {}
    for layer in args.layers:
        for number, linear in enumerate(LINEARS):
            W = module(model, layer, WEIGHTS[linear]).weight.detach()
            sample = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(100 * layer + number))
            weights[f"W.{layer}.{linear}"] = W[sample[:args.rows]].float().contiguous()
    began = time.perf_counter()
    hessians = {}
    fit = input_hessians(model, calibration_sequences(calibration, 0, fitted, False), args.layers)
    for key in list(fit):
        hessians[key[:2] + ("fitted",)] = fit.pop(key).float()  # float32 from here on, as the solves read them
    middle = time.perf_counter()
    test = input_hessians(model, calibration_sequences(calibration, fitted, end, True)
                          + [(ids, {"lee": ~first(len(ids)), "first": first(len(ids))}) for ids in windows],
                          args.layers)
    del model
    for key in list(test):  # one at a time: the float64 sums of four kinds and four layers are most of the memory
        hessians[key] = test.pop(key).float()
    prompt_positions = int((calibration.attention_mask[fitted:end].bool() & ~calibration.keep[fitted:end]).sum())
    source = (f"Hessians X·Xᵀ from the {positions} decode positions of the first {fitted} sequences of "
              f"`{CALIBRATION}`, teacher-forced ({middle - began:.0f} s); held-out Hessians from the next "
              f"{int(calibration.keep[fitted:end].sum())} decode positions (sequences {fitted}-{end - 1}), from "
              f"those sequences' {prompt_positions - (end - fitted)} prompt positions after their first, from "
              f"{512 * len(windows) - len(windows)} tokens of the Lee test text in windows of 512 after their first, "
              f"and from the first positions of those {end - fitted} sequences and {len(windows)} windows "
              f"({time.perf_counter() - middle:.0f} s)")
    tensors = {**weights, **{f"{kind}.{layer}.{name}": hessian for (layer, name, kind), hessian in hessians.items()}}
    if args.cache:
        save_file(tensors, str(args.cache))
        args.cache.with_suffix(".txt").write_text(f"{source}\n{settings}")
    return by_linear(tensors, args.layers), source


def report_table(results: list[dict]) -> str:
    lines = ["| layer | linear | rows x columns | rounding | fitted | / loop | " + " | ".join(
        f"held-out {kind} | / loop" for kind in HELD_OUT) + " | seconds |", "|---|---|---|---|---|---|"
        + "---|---|" * len(HELD_OUT) + "---|"]
    plain = {(r["layer"], r["linear"]): r for r in results if r["rounding"] == "loop"}
    for r in results:
        base = plain[r["layer"], r["linear"]]
        cells = [f"{r[key]:.4g} | {r[key] / base[key]:.3f}" for key in ("fitted", *HELD_OUT)]
        lines.append(f"| {r['layer']} | {r['linear']} | {r['rows']} x {r['columns']} | {r['rounding']} | "
                     + " | ".join(cells) + f" | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def summary_table(results: list[dict]) -> str:
    """Per rounding and kind of Hessian: the geometric mean over the linears of the loss against the loop's, and how
    many linears it lowered."""
    plain = {(r["layer"], r["linear"]): r for r in results if r["rounding"] == "loop"}
    lines = ["| rounding | " + " | ".join(f"{kind}: geomean / loop, lowered" for kind in ("fitted", *HELD_OUT)) + " |",
             "|---|" + "---|" * (1 + len(HELD_OUT))]
    for rounding in list(ROUNDINGS)[1:]:
        rows = [r for r in results if r["rounding"] == rounding]
        cells = []
        for key in ("fitted", *HELD_OUT):
            ratios = torch.tensor([r[key] / plain[r["layer"], r["linear"]][key] for r in rows], dtype=torch.float64)
            cells.append(f"{float(ratios.log().mean().exp()):.3f}, {int((ratios < 1).sum())} of {len(rows)}")
        lines.append(f"| {rounding} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parsed_arguments(description: str, cache_required: bool = False, extra=None):
    """The arguments of this script (and of int4_rounding_first_cpu.py and grouped_quality_cpu.py, which read its
    cache), checked; `extra(parser)` adds a caller's own before parsing."""
    parser = layer_parser(description, 64)
    if extra is not None:
        extra(parser)
    parser.set_defaults(layers=[1, 3, 14, 27], tokens=8192)
    parser.add_argument("--held-out-tokens", type=int, default=4096,
                        help="decode positions after the fitted ones whose Hessians score every solve (default: 4096)")
    parser.add_argument("--lee-tokens", type=int, default=4096,
                        help="tokens of the Lee test text for a held-out Hessian of another kind (default: 4096)")
    parser.add_argument("--cache", type=Path, required=cache_required,
                        help="safetensors file for the sampled rows and Hessians (written when missing)")
    args = parser.parse_args()
    if args.rows < 1 or args.tokens < 1 or args.held_out_tokens < 1 or args.lee_tokens < 512:
        parser.error("--rows, --tokens and --held-out-tokens must be positive, --lee-tokens at least 512")
    if any(not 0 <= layer < 28 for layer in args.layers):
        parser.error("--layers must lie in 0-27 (Qwen2.5-Coder-1.5B's 28 layers)")
    return args


def main() -> None:
    args = parsed_arguments(__doc__.split("\n\n")[0])
    began = time.perf_counter()
    problems, source = sampled_problems(args)
    results = []
    for (layer, linear), (W, H, *held_out) in problems.items():
        for rounding, options in ROUNDINGS.items():
            started = time.perf_counter()
            pruned = solvers.admm(W, H, "2:4", quantize="int4", group_size=128, **options)
            results.append({"layer": layer, "linear": linear, "rows": W.shape[0], "columns": W.shape[1],
                            "rounding": rounding, "fitted": relative_error(W, pruned, H),
                            **{kind: relative_error(W, pruned, T) for kind, T in zip(HELD_OUT, held_out)},
                            "seconds": time.perf_counter() - started})
            print(results[-1], flush=True)
    body = (f"{source}. {args.rows} rows of each linear (a fixed random sample), solved in float32 by "
            "`solvers.admm` (100 iterations, 1% damping, 2:4, int4 values, 128 columns a scale) with each rounding: "
            "`loop` (today's default), `scale search` (`scale_search=True`), `3 sweeps` (`rounding_sweeps=3`) and "
            "`both`. Loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) on the Hessian the solve fitted (decode positions) and on four "
            "that no solve saw: later sequences' decode positions; the first positions of those sequences and of the "
            "Lee windows (a decode-calibrated Hessian never holds a first position, where Qwen's largest activations "
            "sit); their other prompt positions (whose keys and values the decode steps attend to); the Lee text's "
            "other positions. / loop: against the plain rounding of the same rows.\n\n"
            "Over all linears (geometric mean of / loop, and how many of them the rounding lowered):\n\n"
            + summary_table(results) + "\nEach linear:\n\n" + report_table(results)
            + f"\nWhole run: {time.perf_counter() - began:.0f} s\n")
    save_report(args.out, "benchmarks/int4_rounding_linears_cpu.py", results,
                "The rounding options on every linear of Qwen2.5-Coder-1.5B's layers, fitted and held-out (CPU)",
                torch.device("cpu"), body)


if __name__ == "__main__":
    main()
