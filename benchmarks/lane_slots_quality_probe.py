"""What a lane-placed 16:32+2 mask would cost in quality, by the solver's own loss (CPU, no GPU needed).

The idea it tests (CUDA_KERNEL_NOTES.md, thirty-eighth session): the overflow slots could run on the tensor cores with
no gathers, no offset shuffle and no column copy of x if each lane of an mma.sp quad owned exactly one slot a k-tile
in the A fragment it already supplies, so that the slot MMA reuses the 2:4 part's B fragment. Lane t of a quad
supplies groups t and t + 4 (of 8 groups of four columns in a 32-column k-tile) of the quad's two rows g and g + 8, so
that asks the mask for: in row r of a 16-row tile (half h = (r mod 16) >= 8), at most one weight beyond two in a group
of four among groups {h, h + 4}, at most one among {h + 2, h + 6}, none in the other four groups (16 kept a word as
before; at most 3 kept in any group of four). A weaker placement needs one shuffle a k-tile for the metadata
instead: the quad's two rows share four places a word, one a group class (group index mod 4), for either row
(quad-placed). This probe prunes the decoder linears of a few layers of the real Qwen model with SparseGPT under
2:4, 16:32+1, 16:32+2, both placements and plain 16:32, on Hessians from the dense model's own decode steps on
dev-split (even) HumanEval prompts, and reports each pattern's loss tr(ΔW·H·ΔWᵀ) relative to tr(W·H·Wᵀ), and where
each loss falls between 2:4 (0) and 16:32+2 (1) on a log scale.

A layer-loss proxy only: no pass@1 was measured. Masks are chosen by the same greedy as `solvers.capped_keep_mask`
(still optimal under the placement: the allowed sets stay a matroid); the library runs them as the patterns
`16:32+2l` and `16:32+4q` (`solvers.lane_placed_keep_mask`, `quad_placed_keep_mask`).

    python benchmarks/lane_slots_quality_probe.py --layers 3 10 17 24 --out results/lane_slots_quality_cpu.md
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sparsedecoding import solvers
from sparsedecoding.calibration import decode_calibration
from sparsedecoding.data import humaneval_prompts
from sparsedecoding.generation import position_ids_from_mask
from sparsedecoding.hessian import KeepMask, accumulate_inputs, hessians_by_module, prunable_linears
from sparsedecoding.models import load_model, read_config, resolve_model
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown

PATTERNS = ("2:4", "16:32+1", "16:32+2", "16:32+2 lane-placed", "16:32 quad-placed", "16:32")
POSITIONED = ("16:32+1", "16:32+2 lane-placed", "16:32 quad-placed", "16:32")  # placed between 2:4 and 16:32+2
LIBRARY = {"16:32+2 lane-placed": "16:32+2l", "16:32 quad-placed": "16:32+4q"}  # report label: library pattern


def violations(weight: torch.Tensor) -> float:
    """Share of (row, word) pairs of a 16:32+2 weight whose overflow breaks the lane placement."""
    rows, cols = weight.shape
    return solvers.placement_breaks(weight != 0, SparsityPattern.parse("16:32+2l")) / (rows * cols // 32)


def relative_loss(weight: torch.Tensor, pruned: torch.Tensor, hessian: torch.Tensor) -> float:
    h = hessian.double()
    delta = (weight.double() - pruned.double())
    return float(((delta @ h) * delta).sum() / ((weight.double() @ h) * weight.double()).sum())


def layer_hessians(model, calib, layers: list[int], batch_size: int) -> dict[str, torch.Tensor]:
    modules = {f"model.layers.{index}.{name}": module for index in layers
               for name, module in prunable_linears(model.model.layers[index]).items()}
    keep = KeepMask()
    with torch.no_grad(), accumulate_inputs(modules, keep) as accumulators:
        for input_ids, attention_mask, kept in calib.batches(batch_size):
            keep.set(kept)
            model.model(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return hessians_by_module(accumulators, list(modules))


def solve(weights: list[torch.Tensor], hessian: torch.Tensor, pattern: str) -> list[torch.Tensor]:
    """SparseGPT under `pattern` (a report label); a placed result is checked against its placement."""
    library = SparsityPattern.parse(LIBRARY.get(pattern, pattern))
    result = solvers.sparsegpt_shared(weights, hessian, library)
    for w in result:
        if solvers.placement_breaks(w != 0, library):
            raise AssertionError(f"{pattern}: the solver's mask breaks its placement")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--layers", nargs="+", type=int, default=[3, 10, 17, 24])
    parser.add_argument("--prompts", type=int, default=16, help="dev-split prompts the dense model answers")
    parser.add_argument("--new-tokens", type=int, default=128, help="decode steps a prompt")
    parser.add_argument("--hessians", type=Path,
                        help="safetensors file: read the layers' Hessians from it if it exists, else write them there")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.time()
    # checked before any model work: the layers exist, a Hessians file holds them
    layers = int(read_config(resolve_model(args.model))["num_hidden_layers"])
    bad = [index for index in args.layers if not 0 <= index < layers]
    if bad:
        parser.error(f"--layers {bad[0]}: the model has {layers} layers")
    cached = args.hessians is not None and args.hessians.exists()
    if cached:  # safetensors, never a pickle; the token count rides in the metadata
        with safe_open(args.hessians, "pt") as handle:
            keys = set(handle.keys())
            missing = [index for index in args.layers if f"model.layers.{index}.self_attn.q_proj" not in keys]
            if missing:
                parser.error(f"--hessians {args.hessians} has no layer {missing[0]}; delete it or pick its layers")
            tokens = int(handle.metadata()["tokens"])
            hessians = {key: handle.get_tensor(key) for key in keys}
    model, tokenizer, _ = load_model(args.model, "cpu", torch.float32)
    if not cached:
        with torch.no_grad():
            calib = decode_calibration(model, tokenizer, humaneval_prompts("calib"), max_new_tokens=args.new_tokens,
                                       n_prompts=args.prompts, batch_size=args.prompts, progress=False)
        tokens = calib.tokens
        print(f"calibration: {tokens} decode tokens ({time.time() - started:.0f} s)", flush=True)
        hessians = layer_hessians(model, calib, args.layers, args.prompts)
        if args.hessians is not None:
            save_file({k: v.clone() for k, v in hessians.items()}, str(args.hessians),  # q/k/v share one
                      metadata={"tokens": str(tokens)})
    print(f"hessians ({time.time() - started:.0f} s)", flush=True)
    rows, positions = [], {p: [] for p in POSITIONED}
    for index in args.layers:
        layer = model.model.layers[index]
        linears = prunable_linears(layer)
        for group, members in (("qkv", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                               ("o", ["self_attn.o_proj"]), ("gate_up", ["mlp.gate_proj", "mlp.up_proj"]),
                               ("down", ["mlp.down_proj"])):
            weights = [linears[name].weight.data.float() for name in members]
            hessian = hessians[f"model.layers.{index}.{members[0]}"]
            losses, over = {}, 0.0
            for pattern in PATTERNS:
                pruned = solve(weights, hessian, pattern)
                losses[pattern] = sum(relative_loss(w, p, hessian) * float((w @ hessian * w).sum())
                                      for w, p in zip(weights, pruned)) / sum(float((w @ hessian * w).sum())
                                                                               for w in weights)
                if pattern == "16:32+2":
                    over = sum(violations(p) * p.shape[0] for p in pruned) / sum(p.shape[0] for p in pruned)
            placed = {p: math.log(losses[p] / losses["2:4"]) / math.log(losses["16:32+2"] / losses["2:4"])
                      for p in POSITIONED}
            for p in POSITIONED:
                positions[p].append(placed[p])
            rows.append(f"| {index} | {group} | " + " | ".join(f"{losses[p]:.5f}" for p in PATTERNS)
                        + " | " + " | ".join(f"{placed[p]:.2f}" for p in POSITIONED) + f" | {100 * over:.1f}% |")
            print(rows[-1], f"({time.time() - started:.0f} s)", flush=True)
    means = ", ".join(f"{p} **{sum(v) / len(v):.2f}**" for p, v in positions.items())
    text = "\n".join([
        "# A lane-placed 16:32+2 mask against 2:4, 16:32+2 and 16:32: SparseGPT's relative layer loss (CPU)", "",
        environment_markdown("python benchmarks/lane_slots_quality_probe.py "
                             + " ".join(shlex.quote(a) for a in sys.argv[1:])), "",
        f"Model {args.model} (float32 on CPU); Hessians from the dense model's own decode steps ({tokens} "
        f"tokens: {args.prompts} dev-split HumanEval prompts, up to {args.new_tokens} new tokens each, prompt "
        "positions excluded); SparseGPT with the library's defaults. Loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) over the "
        "linears that share the input. Position of a pattern P: log(P / 2:4) / log(16:32+2 / 2:4), 0 = as bad as "
        "2:4, 1 = as good as 16:32+2. Quad-placed: each quad's two rows share four places a word for weights beyond "
        "two in a group of four, one a group class (group % 4). Breaks: the share of (row, word) pairs of the "
        "unconstrained 16:32+2 result whose overflow the lane placement would forbid. A layer-loss proxy; no pass@1 "
        "was measured.", "",
        f"Mean positions over the {len(rows)} linears: {means}. "
        f"Whole run: {time.time() - started:.0f} s.",
        "", "| layer | linears | " + " | ".join(PATTERNS) + " | " + " | ".join(f"position, {p}" for p in POSITIONED)
        + " | breaks |", "|---|---|" + "---|" * (len(PATTERNS) + len(POSITIONED) + 1), *rows, ""])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
