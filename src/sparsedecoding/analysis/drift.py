"""Activation drift: how far a pruned model's layer inputs move from the dense model's as each decodes on its own.

Both models continue the same prompts greedily, each reading its OWN generated tokens (on-policy). Decode step t
reads generated token t (as in decode calibration: the prompt is prefill, not a decode step). For layer l and step t

    drift[l, t] = mean over prompts of ‖x_pruned − x_dense‖ / ‖x_dense‖

where x is the input (residual stream) of decoder layer l at that step, averaged over the prompts where both models
were still decoding at step t. The layer inputs are caught by forward pre-hooks during one teacher-forced replay of
prompt + generated tokens per model; in a causal decoder that equals the KV-cached decode (tested). Each layer's
plateau is the mean of its last quarter of steps; we report the first step at which it reaches 90% of it.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..data import chat_format, prompts_hash, read_prompts
from ..errors import SparseDecodingError
from ..outputs import check_output, markdown_table, output_folder
from ..generation import Generation, generate, left_pad, position_ids_from_mask, tokenize_prompts
from ..models import check_fits_context, load_model, read_config, resolve_model
from ..invocation import command
from ..runenv import environment, environment_lines, pick_device, versions, write_json
from .plots import plot_drift, require_matplotlib


class DriftSettingsError(SparseDecodingError, ValueError):
    """Drift settings that cannot work: fewer than 4 steps, a batch size or prompt limit below 1, or a pruned model
    whose shapes are not the dense model's."""


# What the comparison of layer inputs needs the two models to share (the dense tokenizer serves both).
SHARED_SHAPES = ("hidden_size", "num_hidden_layers", "vocab_size")


def check_same_shapes(dense: Path, pruned: Path) -> None:
    """Refuse, from the config files (before either model loads), a pruned model that cannot have come from the
    dense one: drift compares their layer inputs layer by layer."""
    dense_config, pruned_config = read_config(dense), read_config(pruned)
    differ = [f"{key} {dense_config.get(key)} vs {pruned_config.get(key)}" for key in SHARED_SHAPES
              if dense_config.get(key) != pruned_config.get(key)]
    if differ:
        raise DriftSettingsError(f"--pruned {pruned} is not a pruned copy of --dense {dense} ({', '.join(differ)}); "
                                 f"pass the dense model it was pruned from")


def relative_distance(x_pruned: torch.Tensor, x_dense: torch.Tensor) -> torch.Tensor:
    """‖x_pruned − x_dense‖ / ‖x_dense‖ over the last (hidden) dimension, in float32."""
    x_pruned, x_dense = x_pruned.float(), x_dense.float()
    return (x_pruned - x_dense).norm(dim=-1) / x_dense.norm(dim=-1)


@contextmanager
def catch_layer_inputs(model, columns: slice):
    """While active, each forward fills `caught[l]` with decoder layer l's input hidden states at `columns`."""
    caught: dict[int, torch.Tensor] = {}
    handles = []

    def make_hook(index: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            caught[index] = hidden[:, columns].float()
        return hook

    for index, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_pre_hook(make_hook(index), with_kwargs=True))
    try:
        yield caught
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def layer_inputs_at_steps(model, generations: list[Generation], steps: int, pad_id: int) -> torch.Tensor:
    """[L, B, steps, d] float32: decoder layer inputs at decode steps 1..steps of each generation (zeros where a
    generation stopped earlier). Prompts are left-padded to a common end P and the read-back tokens right-padded,
    so step t sits in column P + t − 1 of every row; right padding never affects earlier positions of a causal
    model."""
    prompts_ids, _ = left_pad([gen.prompt_ids for gen in generations], pad_id)
    width = prompts_ids.shape[1]
    ids = torch.full((len(generations), width + steps), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, gen in enumerate(generations):
        read = gen.consumed_ids[:steps]
        ids[row, width - len(gen.prompt_ids):width + len(read)] = torch.tensor(gen.prompt_ids + read)
        mask[row, width - len(gen.prompt_ids):width + len(read)] = 1
    device = next(model.parameters()).device
    with catch_layer_inputs(model, slice(width, width + steps)) as caught:
        model.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                    position_ids=position_ids_from_mask(mask).to(device), use_cache=False)
    return torch.stack([caught[index] for index in range(len(caught))])


def steps_decoded(generations: list[Generation], steps: int) -> torch.Tensor:
    """[B, steps] bool: whether each generation reached decode step t (read back its t-th token)."""
    counts = torch.tensor([len(gen.consumed_ids) for gen in generations])
    return torch.arange(1, steps + 1)[None, :] <= counts[:, None]


@torch.no_grad()
def drift_sums(dense, pruned, dense_gens: list[Generation], pruned_gens: list[Generation], steps: int,
               pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For one batch of prompts: Σ over prompts of the relative distance [L, steps] and the prompt count [steps]."""
    x_dense = layer_inputs_at_steps(dense, dense_gens, steps, pad_id)
    x_pruned = layer_inputs_at_steps(pruned, pruned_gens, steps, pad_id).to(x_dense.device)
    both = (steps_decoded(dense_gens, steps) & steps_decoded(pruned_gens, steps)).to(x_dense.device)
    # Steps past a stop are zeros on both sides (0/0); only those are masked, a real NaN would still show.
    distance = torch.where(both, relative_distance(x_pruned, x_dense), 0.0)
    return distance.sum(1).cpu(), both.sum(0).cpu()


def plateau_and_rise(curve: list[float], fraction: float = 0.9) -> tuple[float, int | None]:
    """The mean of the last quarter of the curve and the first (1-based) step reaching `fraction` of it."""
    tail = curve[len(curve) - max(1, len(curve) // 4):]
    plateau = sum(tail) / len(tail)
    reached = next((step for step, value in enumerate(curve, 1) if value >= fraction * plateau), None)
    return plateau, reached


def measure_drift(dense, pruned, tokenizer, prompts: list[str], steps: int = 64, batch_size: int = 32,
                  progress: bool = True) -> dict:
    """Per-layer drift curves over decode steps 1..steps (see the module docstring)."""
    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    # steps + 1 new tokens: the model reads back its first `steps` tokens.
    dense_gens = generate(dense, tokenizer, prompt_ids, steps + 1, batch_size=batch_size, progress=progress)
    pruned_gens = generate(pruned, tokenizer, prompt_ids, steps + 1, batch_size=batch_size, progress=progress)
    parts = [drift_sums(dense, pruned, dense_gens[start:start + batch_size], pruned_gens[start:start + batch_size],
                        steps, tokenizer.pad_token_id) for start in range(0, len(prompts), batch_size)]
    total, count = sum(part[0] for part in parts), sum(part[1] for part in parts)
    if not count.any():
        raise SparseDecodingError("no prompt reached decode step 1 with both models (every continuation stopped "
                                  "at once); use other prompts")
    curves = (total / count.clamp(min=1)).where(count > 0, torch.nan)
    layers = []
    for index, curve in enumerate(curves.tolist()):
        # Prompts only drop out as t grows, so NaN (no prompt left) can only end a curve.
        plateau, rise = plateau_and_rise([value for value in curve if not math.isnan(value)])
        layers.append({"layer": index, "curve": curve, "plateau": plateau, "step_90": rise})
    return {"layers": layers, "prompts_per_step": count.long().tolist(),
            "same_tokens_share": sum(d.new_ids == p.new_ids for d, p in zip(dense_gens, pruned_gens)) / len(prompts)}


def report(payload: dict) -> str:
    rises = sorted(layer["step_90"] for layer in payload["layers"] if layer["step_90"] is not None)
    rows = [[layer["layer"], layer["plateau"], layer["step_90"]] for layer in payload["layers"]]
    settings = payload["settings"]
    return (
        f"# Activation drift: {payload['pruned']} vs {payload['dense']}\n\n"
        f"Both models decode greedily from `{settings['prompts']}` ({len(rows)} layers, "
        f"{payload['prompts_per_step'][0]} prompts at step 1, {payload['prompts_per_step'][-1]} still "
        f"decoding at step {settings['steps']}), each reading its own tokens; drift = mean over prompts of "
        f"‖x_pruned − x_dense‖/‖x_dense‖ at each decoder layer's input. Plateau: mean of the last quarter of steps.\n\n"
        f"Every layer reaches 90% of its plateau by step {rises[-1] if rises else 'n/a'} "
        f"(median layer: step {rises[len(rises) // 2] if rises else 'n/a'}); the paper reports every layer by "
        f"step 12 on Llama-3.1-8B.\n\n"
        + markdown_table(["layer", "plateau", "step reaching 90% of plateau"], rows)
        + "\n" + environment_lines(payload["environment"], " ".join(payload["command"]))
    )


@torch.no_grad()
def run_drift(dense: str, pruned: str, out: str | Path, *, prompts: str = "humaneval:eval", limit: int | None = None,
              steps: int = 64, batch_size: int = 32, device: str = "auto", plot: bool = True, overwrite: bool = False,
              progress: bool = True) -> Path:
    """Measure drift of `pruned` against `dense` on `prompts` and write drift.{json,md,png} to OUT."""
    out = Path(out)
    check_output(out, overwrite, inputs=(dense, pruned, prompts))
    if steps < 4:
        raise DriftSettingsError(f"--steps must be at least 4 (the plateau is the last quarter), got {steps}")
    if batch_size < 1:
        raise DriftSettingsError(f"--batch-size must be at least 1, got {batch_size}")
    if limit is not None and limit < 1:
        raise DriftSettingsError(f"--limit must be at least 1 (or left out for every prompt), got {limit}")
    if plot:
        require_matplotlib()
    chosen = read_prompts(prompts)[:limit]
    started = time.perf_counter()
    torch_device = pick_device(device)
    # Both models are found and checked before either loads (a mistyped --pruned must not wait for the dense one).
    pruned_folder, dense_folder = resolve_model(pruned), resolve_model(dense)
    if pruned_folder.resolve() == dense_folder.resolve():  # every number would be 0, and the plateau read as reached
        raise DriftSettingsError(f"--dense and --pruned are the same model ({dense_folder}); give the pruned one")
    check_same_shapes(dense_folder, pruned_folder)
    check_fits_context(dense_folder, steps, "--steps", DriftSettingsError)
    dense_model, tokenizer, _ = load_model(dense_folder, torch_device)
    pruned_model, _, _ = load_model(pruned_folder, torch_device)
    result = measure_drift(dense_model, pruned_model, tokenizer, chosen, steps, batch_size, progress)
    payload = {
        "dense": str(dense_folder), "pruned": str(pruned_folder), **result,
        "settings": {"prompts": prompts, "prompts_hash": prompts_hash(chosen), "count": len(chosen), "steps": steps},
        "seconds": round(time.perf_counter() - started, 1), "versions": versions(),
        "environment": environment(torch_device), "command": command(),
    }
    with output_folder(out, overwrite) as folder:
        write_json(folder / "drift.json", payload)
        (folder / "drift.md").write_text(report(payload), encoding="utf-8")
        if plot:
            plot_drift(payload["layers"], folder / "drift.png", f"{Path(pruned_folder).name} vs dense")
    return out
