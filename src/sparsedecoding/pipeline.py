"""Prune a causal LM layer by layer from a calibration set.

The calibration sequences are replayed once up to the first decoder layer; then for each layer: hooks accumulate the
Hessians of its linears over the kept positions, the solver prunes each linear, and the layer's outputs become the next
layer's inputs. `dense` propagation (the paper) feeds every layer the dense model's activations; `sequential` feeds
layer l the outputs of the already-pruned layers < l (as SparseGPT does). Only one layer's Hessians exist at a time.
`--pattern dense` with `--quantize` prunes nothing: GPTQ rounds every weight to the grid on the same Hessians (the
dense-quantized baseline of N:M + quantized values, calibrated on decode steps or text alike). `--quantize-head`
rounds lm_head after the last layer, by GPTQ on the Hessian of the final normed hidden states at the same kept
positions (a tied lm_head becomes a weight of its own; the embedding stays as it was).

`--calibration self` takes its sequences from `selfdata`: the dense model writes task prompts and answers them; the
train side (cut to `tokens`) calibrates, the dev side is kept for repair. With `repair_steps`, the pruned model is then
distilled from a second copy of the dense model with its masks fixed (`repair`), on its own sampled answers to the
train prompts (on-policy) or on the calibration sequences, stopping early on the dev prompts. Those self-written
data and on-policy samples come from `batchgen.generate_many` on the `--gen-backend` (default engine, hf on request);
`--calibration decode` generates with `generation.generate` (HF's own `generate`).

Work happens in `OUT.partial/`: each finished generation batch, the calibration set, each finished layer's pruned
weights, the selfdata shards, the repair data and repair's checkpoints are saved there, so an interrupted run resumes
at the first unfinished generation batch, layer or repair checkpoint (finished layers are restored, not solved again;
a finished repair is restored from its best state); the finished checkpoint is renamed to OUT at the very end.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from . import repair, selfdata, settings, solvers
from .calibration import CalibrationSet, concat, decode_calibration, describe, text_calibration, text_windows
from .data import chat_format, lee_text, prompts_hash, read_prompts, read_text_file, shares_problems
from .errors import CalibrationError, RepairError, SparseDecodingError, UnsupportedArchitectureError
from .generation import BatchStore, position_ids_from_mask, tokenize_prompts
from .hessian import (HessianAccumulator, KeepMask, accumulate_inputs, accumulate_paired_inputs, dense_target,
                      hessians_by_module, input_groups, kept_rows, paired_by_module, prunable_linears)
from .kernels.quantized import check_dense_quantization, check_packed_quantization
from .models import (check_fits_context, check_pattern_fits, decoder_linear_names, linear_input_sizes, load_model,
                     read_config, resolve_model, sha256_file, source_dtype)
from .outputs import (PRUNED_MANIFEST, check_not_source, is_tokenizer_file, output_target, partial_path,
                      remove_partial)
from .patterns import SparsityPattern
from .invocation import command
from .runenv import peak_memory_gb, pick_device, versions, write_json
from .settings import PruneConfig

log = logging.getLogger(__name__)

SOLVERS = {name: getattr(solvers, name) for name in settings.SOLVERS}


def selfdata_config(config: PruneConfig) -> selfdata.SelfDataConfig:
    temperature, top_p = config.answer_sampling()
    return selfdata.SelfDataConfig(sources=config.self_sources, n_meta=config.self_meta, n_answers=config.self_answers,
                                   answer_max_new_tokens=config.max_new_tokens, answer_temperature=temperature,
                                   answer_top_p=top_p, batch_size=config.self_batch_size,
                                   backend=config.gen_backend, seed=config.seed)


def check_gen_backend(config: PruneConfig, model_config: dict) -> None:
    """With --gen-backend engine, the model must be one the engine runs, where the large-batch generator is used
    (--calibration self, on-policy repair): checked from its config.json before any work, so that a refusal does not
    come after the layers are solved, and it names the way out instead of falling back to hf unasked. So are the
    engine's environment settings (`kernels.op.settings`), which it would otherwise read only when it is built."""
    uses_generator = config.calibration == "self" or (config.repair_steps and config.repair_on_policy)
    if config.gen_backend != "engine" or not uses_generator:
        return
    from .engine.config import from_hf_config
    from .kernels.op import settings as kernel_settings

    kernel_settings()

    try:
        from_hf_config(model_config)
    except UnsupportedArchitectureError as error:
        raise UnsupportedArchitectureError(f"{error}; pass --gen-backend hf to generate with the model's own "
                                           f"forward") from None


def check_context(config: PruneConfig, folder: Path) -> None:
    """--max-new-tokens (decode steps of calibration or of on-policy repair's samples) and --text-seq-len (text
    windows), where this run reads them, within the model's context: refused before the model loads, as eval and
    generate refuse theirs, instead of calibrating on positions the model was never trained for."""
    on_policy_repair = bool(config.repair_steps) and config.repair_on_policy
    drawing = config.calibration_from is None  # a reused set draws nothing
    if on_policy_repair or (drawing and config.calibration != "text"):
        check_fits_context(folder, config.max_new_tokens, "--max-new-tokens")
    if drawing and config.calibration in ("text", "mix"):
        check_fits_context(folder, config.text_seq_len, "--text-seq-len")


def build_calibration(config: PruneConfig, model, tokenizer, store: BatchStore | None = None,
                      selfdata_folder: Path | None = None, progress: bool = True) -> tuple[CalibrationSet, dict]:
    """The calibration set for `config.calibration`, plus generation statistics for the manifest. `store` keeps the
    finished generation batches (see `generation.BatchStore`); `selfdata_folder` the shards of `--calibration self`."""
    stats: dict = {}
    if config.calibration == "self":
        if selfdata_folder is None:
            raise ValueError("--calibration self needs a folder for its shards")
        started = time.perf_counter()
        data = selfdata.build(model, tokenizer, selfdata_folder, selfdata_config(config), progress)
        calib, _ = selfdata.calibration_sets(data, tokenizer.pad_token_id, config.tokens)
        temperature, top_p = config.answer_sampling()
        stats["selfdata"] = {**data.stats, "answer_temperature": temperature, "answer_top_p": top_p,
                             "seconds_this_run": round(time.perf_counter() - started, 2)}
        stats.update(describe(calib))
        stats["tokens_by_source"] = {calib.source: calib.tokens}
        return calib, stats
    decode_budget = config.tokens
    if config.calibration == "mix":
        decode_budget = round(config.tokens * config.mix_ratio)
    sets = []
    if config.calibration in ("text", "mix"):  # a text too short for its share fails now, not after the generation
        text = read_text_file(config.text) if config.text else lee_text("background")
        share = config.tokens - (decode_budget if config.calibration == "mix" else 0)
        windows = text_windows(tokenizer, text, share, config.text_seq_len)
    if config.calibration in ("decode", "mix"):
        prompts = read_prompts(config.prompts)
        stats["prompts_hash"] = prompts_hash(prompts[:config.n_prompts] if config.n_prompts else prompts)
        stats["samples_per_prompt"] = config.samples_per_prompt
        started = time.perf_counter()
        decode_set = decode_calibration(
            model, tokenizer, prompts, max_new_tokens=config.max_new_tokens, n_prompts=config.n_prompts,
            token_budget=decode_budget, batch_size=config.gen_batch_size, do_sample=config.do_sample,
            temperature=config.temperature, top_p=config.top_p, seed=config.seed,
            samples_per_prompt=config.samples_per_prompt, store=store, progress=progress)
        seconds = time.perf_counter() - started
        stats["generation_seconds"] = round(seconds, 2)
        stats["generated_tokens_per_second"] = round(decode_set.tokens / seconds, 1)
        sets.append(decode_set)
    if config.calibration in ("text", "mix"):
        text_budget = config.tokens - (sets[0].tokens if sets else 0)
        if sets and sets[0].tokens < decode_budget:  # decode fell short: text keeps --mix-ratio, not the total
            text_budget = round(sets[0].tokens * (1 - config.mix_ratio) / config.mix_ratio)
            log.warning("mix: decode gave %d of its %d tokens, so text gets %d to keep --mix-ratio %g (%d tokens in "
                        "all, below --tokens %d)", sets[0].tokens, decode_budget, text_budget, config.mix_ratio,
                        sets[0].tokens + text_budget, config.tokens)
        sets.append(text_calibration(tokenizer, windows, token_budget=text_budget, seq_len=config.text_seq_len,
                                     seed=config.seed))
    calib = sets[0] if len(sets) == 1 else concat(sets, tokenizer.pad_token_id, "mix")
    stats.update(describe(calib))
    stats["tokens_by_source"] = {calib_set.source: calib_set.tokens for calib_set in sets}
    return calib, stats


def repair_config(config: PruneConfig) -> repair.RepairConfig:
    """The prune settings as repair's: warm-up is a tenth of the steps up to 20; a checkpoint (masters, Adam state
    and best state: about 18 GB for a 1.5B model) is written every ~200 steps, at an evaluation, and at the end."""
    return repair.RepairConfig(lr=config.repair_lr, batch_size=config.repair_batch,
                               micro_batch_size=config.repair_micro_batch, max_steps=config.repair_steps,
                               warmup_steps=min(20, config.repair_steps // 10), time_budget_s=config.repair_time_budget,
                               eval_every=config.repair_eval_every, patience=config.repair_patience,
                               checkpoint_every=config.repair_eval_every * max(1, 200 // config.repair_eval_every),
                               seed=config.seed)


def split_by_hash(calib: CalibrationSet, dev_share: float = 0.1) -> tuple[CalibrationSet, CalibrationSet]:
    """(train, dev) rows of `calib`, each row's side fixed by a hash of its prompt, the real tokens before its first
    kept position (as selfdata splits prompts), so that every sample of one prompt lands on the same side; a row
    kept from its first token (a text window) by a hash of all its tokens."""
    dev_rows = []
    for ids, mask, keep in zip(calib.input_ids, calib.attention_mask, calib.keep):
        real = mask.bool()
        kept = keep & real
        first = int(kept.nonzero()[0, 0]) if bool(kept.any()) else len(ids)
        prompt = ids[:first][real[:first]]
        dev_rows.append(selfdata.is_dev(" ".join(map(str, (prompt if len(prompt) else ids[real]).tolist())),
                                        dev_share))
    sides = []
    for want in (False, True):
        index = torch.tensor([row for row, dev in enumerate(dev_rows) if dev == want], dtype=torch.long)
        sides.append(CalibrationSet(calib.input_ids[index], calib.attention_mask[index], calib.keep[index],
                                    calib.source))
    if not len(sides[0]) or not len(sides[1]):
        raise RepairError(f"the {len(calib)} calibration sequences leave one side of repair's train/dev split empty; "
                          f"raise --tokens or use --calibration self")
    return sides[0], sides[1]


def prompt_sides(config: PruneConfig) -> tuple[list[str], list[str]]:
    """`--prompts` split for on-policy repair by a hash of their text (as selfdata splits its prompts): (train, dev)."""
    prompts = read_prompts(config.prompts)[:config.n_prompts]
    train, dev = ([prompt for prompt in prompts if selfdata.is_dev(prompt, 0.1) == side] for side in (False, True))
    if not train or not dev:
        raise RepairError(f"the {len(prompts)} prompts leave one side of repair's train/dev split empty; add "
                          f"prompts or use --calibration self")
    return train, dev


def on_policy_set(student, tokenizer, prompt_ids: list[list[int]], token_budget: int | None, config: PruneConfig,
                  stage: str, progress: bool) -> CalibrationSet:
    """The student's sampled answers to `prompt_ids` (`repair.student_samples`), in chunks with a seed each, going
    round the prompts until `token_budget` decode tokens (None: every prompt once)."""
    temperature, top_p = config.answer_sampling()
    size = config.self_batch_size * 4
    chunks = [prompt_ids[start:start + size] for start in range(0, len(prompt_ids), size)]
    sets, tokens = [], 0
    for index in itertools.count():
        if token_budget is None and index == len(chunks):
            break
        part = repair.student_samples(student, tokenizer, chunks[index % len(chunks)], config.max_new_tokens,
                                      config.self_batch_size, temperature, top_p,
                                      selfdata.shard_seed(config.seed, stage, index),
                                      None if token_budget is None else token_budget - tokens, progress=progress,
                                      backend=config.gen_backend)
        sets.append(part)
        tokens += part.tokens
        if token_budget is not None and tokens >= token_budget:
            break
    return sets[0] if len(sets) == 1 else concat(sets, tokenizer.pad_token_id, "student")


def repair_data(config: PruneConfig, teacher, student, tokenizer, calib: CalibrationSet, work: WorkDir,
                progress: bool) -> tuple[CalibrationSet, CalibrationSet]:
    """(train, dev) sets for repair. Prompts: selfdata's two sides with `--calibration self` (rebuilt from the shards
    with the dense `teacher`), else `--prompts` split by a hash of their text. On-policy: the student's answers to
    them (at most 256 dev prompts, as many as repair scores); otherwise the dense answers, or the calibration
    sequences split by a hash of their tokens."""
    pad = tokenizer.pad_token_id
    if config.calibration == "self":
        data = selfdata.build(teacher, tokenizer, work.selfdata_folder, selfdata_config(config), progress)
        if not config.repair_on_policy:
            return selfdata.calibration_sets(data, pad, config.repair_tokens)
        train_ids, dev_ids = [gen.prompt_ids for gen in data.train], [gen.prompt_ids for gen in data.dev]
    elif not config.repair_on_policy:
        return split_by_hash(calib)
    else:
        train_ids, dev_ids = (tokenize_prompts(tokenizer, chat_format(tokenizer, side)) for side in prompt_sides(config))
    if not dev_ids:
        raise RepairError("selfdata's dev side is empty; raise --self-answers")
    return (on_policy_set(student, tokenizer, train_ids, config.repair_tokens, config, "repair-train", progress),
            on_policy_set(student, tokenizer, dev_ids[:256], None, config, "repair-dev", progress))


def repair_model(config: PruneConfig, folder: Path, student, tokenizer, calib: CalibrationSet, work: WorkDir,
                 progress: bool) -> dict:
    """Distil the pruned `student` in place from a second copy of the dense model (`repair.repair`); returns the
    report for the manifest. The data are saved in the work folder, so a resumed run trains on the same sequences
    (repair's checkpoints are tied to them) and a finished repair only restores its best state."""
    teacher, _, _ = load_model(folder, next(student.parameters()).device, next(student.parameters()).dtype)
    files = work.path / "repair-train.safetensors", work.path / "repair-dev.safetensors"
    if all(file.exists() for file in files):
        train, dev = (CalibrationSet.load(file) for file in files)
    else:
        train, dev = repair_data(config, teacher, student, tokenizer, calib, work, progress)
        dev.save(files[1])
        train.save(files[0].with_suffix(".tmp"))
        os.replace(files[0].with_suffix(".tmp"), files[0])  # last and atomic: its presence says both are complete
    with torch.enable_grad():  # prune runs under no_grad
        report = repair.repair(teacher, student, train, dev, work.repair_folder, repair_config(config))
    del teacher
    report["data"] = {"on_policy": config.repair_on_policy, "train": describe(train), "dev": describe(dev)}
    return report


class _FirstLayerInputs(Exception):
    """Raised by the hook on layer 0 to stop the forward pass once its inputs are caught."""


@torch.no_grad()
def first_layer_inputs(model, calib: CalibrationSet, batch_size: int, device: torch.device):
    """Run every batch up to the first decoder layer; returns [(hidden_states, layer kwargs, keep)] per batch.
    The kwargs (attention mask, position embeddings, ...) are whatever the model passes its layers, so any
    supported architecture replays exactly as in its own forward."""
    layer0 = model.model.layers[0]
    caught = []

    def catch(module, args, kwargs):
        hidden = args[0] if args else kwargs.pop("hidden_states")
        caught.append((hidden, {key: value for key, value in kwargs.items() if key != "hidden_states"}))
        raise _FirstLayerInputs

    handle = layer0.register_forward_pre_hook(catch, with_kwargs=True)
    batches = []
    try:
        for input_ids, attention_mask, keep in calib.batches(batch_size):
            try:
                model.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                            position_ids=position_ids_from_mask(attention_mask).to(device), use_cache=False)
            except _FirstLayerInputs:
                pass
            hidden, kwargs = caught.pop()
            batches.append((hidden, kwargs, keep.to(device)))
    finally:
        handle.remove()
    return batches


def layer_hessians(layer, linears: dict, batches, dtype: torch.dtype, where: str) -> tuple[dict, list[torch.Tensor]]:
    """The Hessians of `linears` (by module name) from one pass of `layer` over `batches` at their kept positions,
    and the layer's outputs."""
    keep = KeepMask()
    with accumulate_inputs(linears, keep, dtype, where=where) as accumulators:
        outputs = []
        for hidden, kwargs, kept in batches:
            keep.set(kept)
            out = layer(hidden, **kwargs)
            outputs.append(out[0] if isinstance(out, tuple) else out)
    return hessians_by_module(accumulators, list(linears)), outputs


def run_layer(layer, batches) -> list[torch.Tensor]:
    outputs = []
    for hidden, kwargs, _ in batches:
        out = layer(hidden, **kwargs)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    return outputs


def paired_statistics(layer, dense_layer, linears: dict, batches, dense_stream: list[torch.Tensor],
                      keep: KeepMask, dtype: torch.dtype, where: str) -> tuple[dict, dict, list[torch.Tensor]]:
    """Run the dense copy of the layer on each batch's dense hidden states and `layer` (whose earlier linears may
    already be pruned) on the pruned model's, collecting H and C for `linears` (`hessian.accumulate_paired_inputs`);
    returns them and the dense stream's next hidden states."""
    dense_linears = prunable_linears(dense_layer)
    with accumulate_paired_inputs(linears, keep, dtype, where=where,
                                  dense_modules={name: dense_linears[name] for name in linears}) as state:
        dense_outputs = []
        for dense_hidden, (hidden, kwargs, kept) in zip(dense_stream, batches):
            keep.set(kept)
            state.mode = "dense"
            out = dense_layer(dense_hidden, **kwargs)
            dense_outputs.append(out[0] if isinstance(out, tuple) else out)
            state.mode = "pruned"
            layer(hidden, **kwargs)
    hessians, crosses = paired_by_module(state, list(linears))
    return hessians, crosses, dense_outputs


def dense_target_layer(config: PruneConfig, pattern: SparsityPattern | None, layer, linears: dict, batches,
                       dense_stream: list[torch.Tensor], dtype: torch.dtype, where: str
                       ) -> tuple[dict[str, dict], list[torch.Tensor]]:
    """Dense-target reconstruction of one layer, one input group at a time in forward order (q/k/v, o, gate/up,
    down): each group is fitted on the inputs the layer gives after its earlier groups were pruned and fitted, so a
    later linear does not correct again what an earlier one already corrected. Returns the per-linear statistics
    and the dense stream's next hidden states."""
    dense_layer = copy.deepcopy(layer)
    stats: dict[str, dict] = {}
    dense_outputs = dense_stream
    for names in input_groups(list(linears)).values():
        group = {name: linears[name] for name in names}
        hessians, crosses, dense_outputs = paired_statistics(layer, dense_layer, group, batches, dense_stream,
                                                             KeepMask(), dtype, where)
        stats.update(solve_layer(config, pattern, group, hessians, crosses))
    return stats, dense_outputs


def relative_error(weight: torch.Tensor, pruned: torch.Tensor, hessian: torch.Tensor) -> float:
    """tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ): the layer's reconstruction loss relative to its output energy."""
    W = weight.to(hessian.dtype)
    delta = W - pruned.to(hessian.dtype)
    return float(((delta @ hessian) * delta).sum() / ((W @ hessian) * W).sum().clamp(min=1e-30))


def saliency(weight: torch.Tensor, hessian: torch.Tensor) -> torch.Tensor:
    """W_ij² · H_jj: the loss of dropping one weight alone (the ordering --permute-channels balances)."""
    return weight.float() ** 2 * hessian.diagonal().float().to(weight.device)[None, :]


def reorder_hessian(hessians: dict, name: str, order: torch.Tensor) -> None:
    hessian = hessians[name]
    index = order.to(hessian.device)
    hessians[name] = hessian[index][:, index]


@torch.no_grad()
def permute_layer(config: PruneConfig, pattern: SparsityPattern, layer, linears: dict,
                  hessians: dict) -> dict[str, float]:
    """--permute-channels: reorder, in place, channels that the layer lets reorder without changing what it computes,
    so that the N:M groups of down (and of o) drop less saliency; the Hessians of down and o are reordered with them.
    A reordering needs every linear it touches among `linears` (none left dense by --dense-linears). Returns, for
    down and o, the dropped saliency under the new order over that under the old."""
    ratios = {}
    if {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"} <= linears.keys():
        down = linears["mlp.down_proj"]
        S = saliency(down.weight, hessians["mlp.down_proj"])
        order = column_order(S, pattern, scope_block(config, down.in_features, down.in_features), config.seed)
        ratios["mlp.down_proj"] = order_ratio(S, order, pattern)
        for name in ("mlp.gate_proj", "mlp.up_proj"):
            permute_rows(linears[name], order)
        down.weight.data = down.weight.data[:, order.to(down.weight.device)].contiguous()
        reorder_hessian(hessians, "mlp.down_proj", order)
    if config.permute_channels == "mlp+attention" and {"self_attn.v_proj", "self_attn.o_proj"} <= linears.keys():
        attention = layer.self_attn
        heads, kv_heads = attention.config.num_attention_heads, attention.config.num_key_value_heads
        head_dim = attention.head_dim
        width, _ = solvers.permutation_groups(pattern)
        if head_dim % width:  # a group of o's columns would span two heads, whose value channels move apart
            log.warning("--permute-channels mlp+attention: head_dim %d is not a multiple of %s's groups of %d, so "
                        "the value channels keep their order (the MLP's are reordered)", head_dim, config.pattern,
                        width)
        else:
            o_proj = linears["self_attn.o_proj"]
            S = saliency(o_proj.weight, hessians["self_attn.o_proj"])
            full = torch.arange(heads * head_dim)
            value_order = torch.arange(kv_heads * head_dim)
            block = scope_block(config, o_proj.in_features, head_dim)
            for group, columns in enumerate(kv_head_columns(heads, kv_heads, head_dim)):
                # one order for the group's value channels, chosen on every query head's o columns at once
                stacked = torch.cat([S[:, c.to(S.device)] for c in columns], 0)
                order = column_order(stacked, pattern, block, config.seed).cpu()
                for c in columns:
                    full[c] = c[order]
                value_order[group * head_dim:(group + 1) * head_dim] = group * head_dim + order
            ratios["self_attn.o_proj"] = order_ratio(S, full, pattern)
            permute_rows(linears["self_attn.v_proj"], value_order)
            o_proj.weight.data = o_proj.weight.data[:, full.to(o_proj.weight.device)].contiguous()
            reorder_hessian(hessians, "self_attn.o_proj", full)
    return ratios


def scope_block(config: PruneConfig, in_features: int, span: int) -> int | None:
    """--permute-scope group: the runs of columns an order over `span` columns (down's all, or one head's of o) must
    keep each column in, so that every int4 scale group keeps its columns; None where any order does (layer scope,
    no int4 values, or scale groups that hold whole spans)."""
    if config.permute_scope == "layer":
        return None
    group = solvers.quantization_group(config.quantize, config.group_size, in_features)
    if group is None or group == in_features:  # no values rounded, or int8's one scale a row
        return None
    block = math.gcd(span, group)
    return None if block == span else block


def column_order(S: torch.Tensor, pattern: SparsityPattern, block: int | None, seed: int) -> torch.Tensor:
    """The balanced order of S's columns, within runs of `block` columns when one is given; where `block` does not
    split into the pattern's groups no order keeps both, so the columns keep their own (and a warning says so)."""
    if block is None:
        return solvers.balanced_column_order(S, pattern, seed=seed)
    width, _ = solvers.permutation_groups(pattern)
    if block % width:
        log.warning("--permute-scope group: int4 scale groups of %d columns do not split into %s's groups of %d, so "
                    "these columns keep their order", block, pattern, width)
        return torch.arange(S.shape[1], device=S.device)
    return solvers.grouped_column_order(S, pattern, block, seed=seed)


def kv_head_columns(heads: int, kv_heads: int, head_dim: int) -> list[list[torch.Tensor]]:
    """For each KV head, the o columns of every query head that reads its values (one index tensor a query head)."""
    per_group = heads // kv_heads
    return [[torch.arange(h * head_dim, (h + 1) * head_dim) for h in range(g * per_group, (g + 1) * per_group)]
            for g in range(kv_heads)]


def permute_rows(linear, order: torch.Tensor) -> None:
    index = order.to(linear.weight.device)
    linear.weight.data = linear.weight.data[index].contiguous()
    if linear.bias is not None:
        linear.bias.data = linear.bias.data[index].contiguous()


def order_ratio(S: torch.Tensor, order: torch.Tensor, pattern: SparsityPattern) -> float:
    width, drop = solvers.permutation_groups(pattern)
    before = solvers.dropped_saliency(S, width, drop).sum()
    after = solvers.dropped_saliency(S[:, order.to(S.device)], width, drop).sum()
    return round(float(after / before.clamp(min=1e-30)), 6)


def rounding_options(config: PruneConfig, quantize: str) -> dict:
    """The solvers' rounding options (`scale_search`, `rounding_sweeps`) for a solve with `quantize`: none without
    one (those runs do not read them, `unread_options`)."""
    if quantize == "none":
        return {}
    return {"scale_search": config.scale_search, "rounding_sweeps": config.rounding_sweeps}


def solve_layer(config: PruneConfig, pattern: SparsityPattern | None, linears: dict, hessians: dict,
                crosses: dict | None = None) -> dict[str, dict]:
    """Prune every linear of one layer in place; returns per-linear sparsity and relative reconstruction error.
    Linears that share an input share a Hessian, and SparseGPT solves them together (same result, fewer launches).
    With `crosses` (dense-target reconstruction) each solver runs on W·C·H⁻¹ instead of W, and the error is
    relative to that target."""
    stats = {}
    rounding = rounding_options(config, config.quantize)
    for names in input_groups(list(linears)).values():
        hessian = hessians[names[0]]
        weights = [linears[name].weight.data for name in names]
        if crosses is not None:
            weights = [dense_target(weight, crosses[names[0]], hessian, config.percdamp) for weight in weights]
        if pattern is None:  # --pattern dense: GPTQ, the joint solver's loop without pruning
            pruned = solvers.gptq_shared(weights, hessian, config.quantize, group_size=config.group_size,
                                         blocksize=config.blocksize, percdamp=config.percdamp,
                                         order=config.solver_order, **rounding)
        elif config.solver == "admm" and not config.keep_mask:
            pruned = solvers.admm_shared(weights, hessian, pattern, iterations=config.admm_iterations,
                                         products=config.admm_products, settle=config.admm_settle,
                                         split=config.admm_split, blocksize=config.blocksize, percdamp=config.percdamp,
                                         quantize=config.quantize, group_size=config.group_size,
                                         order=config.solver_order, refit_steps=config.refit_steps, **rounding)
        elif config.solver in ("sparsegpt", "admm"):  # admm with --keep-mask: the mask is kept, nothing to search
            pruned = solvers.sparsegpt_shared(weights, hessian, pattern, blocksize=config.blocksize,
                                              percdamp=config.percdamp, quantize=config.quantize,
                                              group_size=config.group_size, keep_zeros=config.keep_mask,
                                              order=config.solver_order,
                                              refit_steps=0 if config.keep_mask else config.refit_steps, **rounding)
        else:
            pruned = [SOLVERS[config.solver](weight, hessian, pattern) for weight in weights]
            if config.refit_steps:
                pruned = solvers.refit_shared(weights, pruned, hessian, steps=config.refit_steps,
                                              percdamp=config.percdamp)
        for name, weight, new in zip(names, weights, pruned):
            stats[name] = {"sparsity": round(float((new == 0).float().mean()), 6),
                           "relative_error": relative_error(weight, new, hessian)}
            linears[name].weight.data.copy_(new)
    return stats


@torch.no_grad()
def quantize_head(model, batches, config: PruneConfig, dtype: torch.dtype) -> dict:
    """GPTQ on lm_head in place (`config.quantize_head`, `config.group_size` columns a scale for int4): its Hessian
    is that of the final normed hidden states of `batches` (the last layer's outputs) at their kept positions. A
    tied lm_head gets a weight of its own and the config says it is untied, so the embedding keeps its values.
    Returns its statistics, as a layer's linear."""
    head, norm = model.get_output_embeddings(), model.model.norm
    accumulator, keep = HessianAccumulator(head.in_features, dtype, head.weight.device), KeepMask()
    for hidden, _, kept in batches:
        keep.set(kept)
        accumulator.add(kept_rows(norm(hidden), keep, "lm_head"))
    hessian = accumulator.hessian()
    weight = head.weight.detach()
    new, = solvers.gptq_shared([weight], hessian, config.quantize_head, group_size=config.group_size,
                               blocksize=config.blocksize, percdamp=config.percdamp, order=config.solver_order,
                               **rounding_options(config, config.quantize_head))
    stats = {"sparsity": round(float((new == 0).float().mean()), 6),
             "relative_error": relative_error(weight, new, hessian), "quantize": config.quantize_head}
    tied = head.weight is model.get_input_embeddings().weight
    if tied:
        head.weight = torch.nn.Parameter(new.clone(), requires_grad=False)
        model.config.tie_word_embeddings = False
        stats["untied"] = True
    else:
        head.weight.data.copy_(new)
    return stats


def solver_name(config: PruneConfig) -> str:
    """The solver that runs: gptq for --pattern dense (nothing pruned), sparsegpt for --keep-mask (its loop rounds
    the kept weights; nothing searches a mask, whatever --solver says), else --solver."""
    if config.sparsity_pattern() is None:
        return "gptq"
    return "sparsegpt" if config.keep_mask and config.solver in ("sparsegpt", "admm") else config.solver


def _read_state(path: Path) -> dict | None:
    """A work folder's state.json, None when it is not a JSON object (a run killed while writing it)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return state if isinstance(state, dict) else None


class WorkDir:
    """`OUT.partial/`: state.json, calibration.safetensors and layers/NNN.safetensors of finished layers."""

    def __init__(self, out: Path, fingerprint: str):
        remove_partial(out, keep_folder=True)  # a file or link there is no work folder
        self.path = partial_path(out)
        self.fingerprint = fingerprint
        state_file = self.path / "state.json"
        state = _read_state(state_file) if state_file.exists() else None
        if state_file.exists() and state is None:
            log.warning("removing %s: its state.json is damaged, so the run starts over", self.path)
            shutil.rmtree(self.path)
        elif state is not None and state.get("fingerprint") != fingerprint:
            log.info("removing %s from a run with other settings", self.path)
            shutil.rmtree(self.path)
            state = None
        self.state = state or {"fingerprint": fingerprint, "finished_layers": 0, "layers": {}, "calibration": {}}
        (self.path / "layers").mkdir(parents=True, exist_ok=True)
        if state is None:  # recorded before any work, so a run stopped in generation is not resumed by other settings
            self.save_state()

    @property
    def generation_store(self) -> BatchStore:
        return BatchStore(self.path / "generation")

    @property
    def calibration_file(self) -> Path:
        return self.path / "calibration.safetensors"

    @property
    def selfdata_folder(self) -> Path:
        return self.path / "selfdata"

    @property
    def repair_folder(self) -> Path:
        return self.path / "repair"

    def save_state(self) -> None:
        write_json(self.path / "state.json", self.state)

    def save_layer(self, index: int, linears: dict, stats: dict) -> None:
        file = self.path / "layers" / f"{index:03d}.safetensors"
        tensors = {name: linear.weight.data.contiguous() for name, linear in linears.items()}
        # biases too: --permute-channels reorders v's with its rows
        tensors.update({f"{name}.bias": linear.bias.data.contiguous() for name, linear in linears.items()
                        if linear.bias is not None})
        save_file(tensors, str(file) + ".tmp")
        os.replace(str(file) + ".tmp", file)
        self.state["layers"][str(index)] = stats
        self.state["finished_layers"] = index + 1
        self.save_state()

    def load_layer(self, index: int) -> dict[str, torch.Tensor]:
        return load_file(str(self.path / "layers" / f"{index:03d}.safetensors"))


def kept_dense(config: PruneConfig, name: str) -> bool:
    """Whether --dense-linears leaves the linear `name` (model.layers.I.self_attn.q_proj ...) as it is."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in config.dense_linear_patterns())


def solved_linears(config: PruneConfig, layer, index: int) -> dict:
    """The prunable linears of decoder layer `index` that the solver changes: all but those --dense-linears names."""
    return {name: linear for name, linear in prunable_linears(layer).items()
            if not kept_dense(config, f"model.layers.{index}.{name}")}


def check_dense_linears(config: PruneConfig, model_config: dict) -> list[str]:
    """The names of the linears --dense-linears leaves dense, after checking (from config.json, before the model
    loads) that each of its patterns matches one at least and that something is left to solve."""
    names = decoder_linear_names(model_config)
    for pattern in config.dense_linear_patterns():
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise SparseDecodingError(f"--dense-linears pattern {pattern!r} matches no linear of this model; names "
                                      f"look like {names[0]} (shell patterns: model.layers.0.*, *.mlp.down_proj)")
    dense = [name for name in names if kept_dense(config, name)]
    if dense and len(dense) == len(names):
        raise SparseDecodingError(f"--dense-linears {config.dense_linears!r} leaves every linear dense: nothing is "
                                  f"left to prune; narrow it")
    return dense


@torch.no_grad()
def prune_layers(model, calib: CalibrationSet, config: PruneConfig, work: WorkDir | None = None,
                 progress: bool = True) -> dict:
    """Prune a loaded model in place, layer by layer (see the module docstring). With `work`, each finished layer is
    saved there and layers finished by an interrupted run are restored instead of solved again.
    Returns {"layers": {module name: stats}, "solver_seconds": float, "resumed_from_layer": int}."""
    pattern = config.sparsity_pattern()
    if config.target == "dense" and config.propagation != "sequential":
        raise SparseDecodingError("target dense needs sequential propagation (the two streams are equal otherwise)")
    device = next(model.parameters()).device
    hessian_dtype = getattr(torch, config.hessian_dtype)
    if config.first_positions:
        fitted = calib.with_first(config.first_positions)
        log.info("fitting each sequence's first %d position(s) as well: %d positions in all (%d from the set)",
                 config.first_positions, fitted.tokens, calib.tokens)
        calib = fitted
    batches = first_layer_inputs(model, calib, config.batch_size, device)
    # Dense-target reconstruction carries the dense model's hidden states beside the pruned model's.
    dense_stream = [hidden for hidden, _, _ in batches] if config.target == "dense" else None
    layers = model.model.layers
    start = work.state["finished_layers"] if work else 0
    layer_stats = {int(index): stats for index, stats in work.state["layers"].items()} if work else {}
    solver_seconds = 0.0
    if start:
        log.info("resuming from layer %d of %d (the earlier layers are restored from %s)", start, len(layers),
                 work.path)
    bar = tqdm(range(len(layers)), desc=f"pruning {config.pattern} ({solver_name(config)})", unit="layer",
               disable=not progress)
    for index in bar:
        layer = layers[index]
        linears = solved_linears(config, layer, index)
        if index < start:  # finished before an interruption: replay exactly what the first run did
            saved = work.load_layer(index)
            if dense_stream is not None:
                dense_stream = run_layer(layer, [(hidden, kwargs, kept) for hidden, (_, kwargs, kept)
                                                 in zip(dense_stream, batches)])
            if config.propagation == "dense":
                outputs = run_layer(layer, batches)
            for name, linear in linears.items():
                linear.weight.data.copy_(saved[name])
                if f"{name}.bias" in saved:  # layers saved before biases were saved have none: unchanged then
                    linear.bias.data.copy_(saved[f"{name}.bias"])
            if config.propagation == "sequential":
                outputs = run_layer(layer, batches)
        elif not linears:  # --dense-linears leaves the whole layer as it is: both streams pass through it
            layer_stats[index] = {}
            if dense_stream is not None:
                dense_stream = run_layer(layer, [(hidden, kwargs, kept) for hidden, (_, kwargs, kept)
                                                 in zip(dense_stream, batches)])
            outputs = run_layer(layer, batches)
            if work:
                work.save_layer(index, linears, layer_stats[index])
        else:
            if dense_stream is not None:
                solve_started = time.perf_counter()
                layer_stats[index], dense_stream = dense_target_layer(config, pattern, layer, linears, batches,
                                                                      dense_stream, hessian_dtype, f"layer {index} ")
                solver_seconds += time.perf_counter() - solve_started  # statistics included: they interleave
            else:
                hessians, outputs = layer_hessians(layer, linears, batches, hessian_dtype, f"layer {index} ")
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                solve_started = time.perf_counter()
                ratios = permute_layer(config, pattern, layer, linears, hessians) \
                    if config.permute_channels != "none" else {}
                layer_stats[index] = solve_layer(config, pattern, linears, hessians)
                for name, ratio in ratios.items():
                    layer_stats[index][name]["permuted_dropped_saliency"] = ratio
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                solver_seconds += time.perf_counter() - solve_started
                del hessians
            if config.propagation == "sequential":
                outputs = run_layer(layer, batches)
            if work:
                work.save_layer(index, linears, layer_stats[index])
            worst = max(item["relative_error"] for item in layer_stats[index].values())
            bar.set_postfix(max_rel_error=f"{worst:.3g}")
        batches = [(output, kwargs, kept) for output, (_, kwargs, kept) in zip(outputs, batches)]
    linear_stats = {f"model.layers.{index}.{name}": item for index, found in sorted(layer_stats.items())
                    for name, item in found.items()}
    if config.quantize_head != "none":
        solve_started = time.perf_counter()
        linear_stats["lm_head"] = quantize_head(model, batches, config, hessian_dtype)
        solver_seconds += time.perf_counter() - solve_started
    return {"layers": linear_stats, "solver_seconds": round(solver_seconds, 2), "resumed_from_layer": start}


def load_reused_set(file: Path) -> CalibrationSet:
    """The set --calibration-from names, or one error line: `prune` reads it once before the model loads (it is a
    few MB), so a foreign or damaged file is refused before any work."""
    try:
        return CalibrationSet.load(file)
    except Exception as error:  # safetensors' own errors (a truncated or foreign file) name no flag
        raise CalibrationError(f"--calibration-from {file}: not a calibration set ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else 'unreadable'})") from None


def reused_calibration(config: PruneConfig, model, calib: CalibrationSet) -> tuple[CalibrationSet, dict]:
    """--calibration-from: the earlier run's set (`calib`, as `load_reused_set` read it before the model loaded),
    checked against this model's vocabulary, and its record (the earlier manifest's calibration record under
    `from_record` where the folder has one)."""
    file = config.calibration_source()
    vocabulary = model.get_input_embeddings().num_embeddings
    if int(calib.input_ids.max()) >= vocabulary:
        raise CalibrationError(f"--calibration-from {file}: token id {int(calib.input_ids.max())} is past this "
                               f"model's vocabulary ({vocabulary}); the set was made with another tokenizer")
    record = {**describe(calib), "from": str(file)}
    manifest = file.parents[1] / PRUNED_MANIFEST if file.parent.name == "calibration" else None
    if manifest is not None and manifest.is_file():
        record["from_record"] = json.loads(manifest.read_text()).get("calibration")
    return calib, record


def resume_fingerprint(config: PruneConfig, folder: Path, device: torch.device) -> str:
    """The work folder's fingerprint (`PruneConfig.fingerprint`) with the model as its resolved folder, the files
    it names as absolute paths and the device as picked: "m", "m/" and /abs/m, or auto and the device it picks,
    are one run, whose finished layers a resume keeps (a differing fingerprint discards them)."""
    def absolute(name: str | None) -> str | None:
        return str(Path(name).resolve()) if name and Path(name).exists() else name

    return config.fingerprint(inputs_digest(config, folder), model=str(folder.resolve()),
                              prompts=absolute(config.prompts), text=absolute(config.text),
                              calibration_from=absolute(config.calibration_from), device=str(device))


def inputs_digest(config: PruneConfig, folder: Path) -> str:
    """A digest of what the run reads besides its settings: the prompt, text and selfdata source files' contents and
    the model folder's config, generation config, tokenizer and weight files (name, size, modification time), so
    that a resumed run never goes on with calibration or layers built from inputs that have changed since (the
    chat template and the stop tokens shape the calibration tokens)."""
    digest = hashlib.sha256()
    named = [config.prompts, config.text, *(name for name, _ in selfdata_config(config).mix())] \
        if config.calibration == "self" else [config.prompts, config.text]
    named.append(config.calibration_source())  # None without --calibration-from
    for name in named:
        if name and Path(name).is_file():
            digest.update(f"{name}:".encode() + sha256_file(Path(name)).encode())
    read = [folder / "config.json", folder / "generation_config.json", *folder.glob("*.safetensors"),
            *(file for file in folder.iterdir() if is_tokenizer_file(file.name))]
    for file in sorted(set(read)):
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def unread_options(config: PruneConfig) -> list[str]:
    """The fields set away from their defaults (the recipe's, under a recipe) that this run does not read."""
    defaults = PruneConfig(model=config.model, out=config.out, recipe=config.recipe)
    on_policy_repair = bool(config.repair_steps) and config.repair_on_policy  # samples task prompts' answers
    unread = []
    if not config.do_sample and config.calibration != "self" and not on_policy_repair:
        unread += ["temperature", "top_p"]  # self-written answers and on-policy samples are always sampled
    if config.solver in ("wanda", "magnitude") and config.sparsity_pattern() is not None:
        unread += ["blocksize", "solver_order"]
        unread += ["percdamp"] if config.target != "dense" and not config.refit_steps else []  # both damp
    if config.solver == "admm" and config.quantize == "none" and config.sparsity_pattern() is not None:
        unread += ["solver_order"]  # only the rounding loop after ADMM reads it
    if config.solver != "admm" or config.keep_mask or config.sparsity_pattern() is None:
        unread += ["admm_iterations", "admm_products", "admm_settle", "admm_split"]
    elif config.sparsity_pattern().placement != "groups":
        unread += ["admm_split"]  # only a grouped pattern's projection searches a split
    if config.sparsity_pattern() is None:
        unread += ["refit_steps"]  # GPTQ alone: no mask to refit for
    if config.quantize == "none" and config.quantize_head == "none":
        unread += ["scale_search", "rounding_sweeps"]  # nothing is rounded
    if config.keep_mask:
        unread += ["refit_steps"]  # the kept weights are already the best for their own mask (their own target)
    if config.calibration_from is not None:  # the tokens are an earlier run's: nothing draws or reads new ones
        unread += ["text", "text_seq_len", "mix_ratio", "tokens", "n_prompts", "samples_per_prompt",
                   "max_new_tokens", "do_sample", "gen_batch_size", "self_sources", "self_meta", "self_answers"]
        unread += [] if on_policy_repair else ["prompts", "temperature", "top_p", "self_batch_size", "gen_backend"]
    if config.calibration == "decode":
        unread += ["text", "text_seq_len", "mix_ratio"]
    if config.calibration == "text":
        unread += ["gen_batch_size", "do_sample", "mix_ratio", "samples_per_prompt", "first_positions"]  # all kept
        if not on_policy_repair:  # on-policy repair samples the task prompts' answers with these
            unread += ["prompts", "n_prompts", "max_new_tokens", "temperature", "top_p"]
    if config.calibration == "self":
        unread += ["gen_batch_size", "do_sample"] + ([] if on_policy_repair else ["prompts", "n_prompts"])
    recipe = settings.RECIPES.get(config.recipe, {})  # a recipe's own fields count as set
    return [name for name in dict.fromkeys(unread) if getattr(config, name) != getattr(defaults, name)
            or name in recipe]


def warn_ignored_options(config: PruneConfig) -> None:
    """One warning naming the options set away from their defaults that this run does not read (they still change
    its fingerprint and record)."""
    changed = unread_options(config)
    if changed:
        fields = {item.name: item for item in dataclasses.fields(PruneConfig)}
        log.warning("this run does not read %s (solver %s, calibration %s%s): drop them, or see `sparsedecoding "
                    "prune --help`", ", ".join(settings.flag_of(fields[name]) for name in changed), config.solver,
                    config.calibration, "" if config.do_sample else ", greedy")


@torch.no_grad()
def prune(config: PruneConfig, progress: bool = True) -> Path:
    """Run (or resume) a pruning job and return the output folder. See the module docstring."""
    pattern = config.validate()
    out = output_target(config.out)
    device = pick_device(config.device)
    folder = resolve_model(config.model)
    self_sources = [name for name, _ in selfdata_config(config).mix()] if config.calibration == "self" else []
    check_not_source(out, config.model, folder, config.prompts, config.text, config.calibration_from, *self_sources)
    if pattern is not None:
        check_pattern_fits(folder, pattern, config.solver, config.blocksize)
    grouped = pattern is not None and pattern.placement == "groups"
    if grouped and not config.keep_mask:  # SPARSEDECODING_GROUPED_SEARCH: checked before the model loads
        solvers.grouped_search_setting(device)
    if config.quantize == "int4":  # every linear's rows must hold whole scale groups
        for size in linear_input_sizes(read_config(folder)).values():
            solvers.quantization_group(config.quantize, config.group_size, size)
        if pattern is None:  # dense GPTQ: the engine runs it on the dense int4 kernel
            check_dense_quantization("int4", config.group_size)
        elif pattern.is_nm:  # the packed format and its kernels: checked here, not after the whole run at `pack`
            check_packed_quantization("int4", config.group_size)
    if config.quantize_head == "int4":  # lm_head's rows too, and a group the engine's dense int4 kernel takes
        solvers.quantization_group("int4", config.group_size, read_config(folder)["hidden_size"])
        check_dense_quantization("int4", config.group_size)
    draws = config.calibration_from is None  # a reused set draws nothing and reads no prompt
    reused = None if draws else load_reused_set(config.calibration_source())
    if config.calibration in ("decode", "mix") and draws:
        read_prompts(config.prompts)  # fail on a bad prompt file before any work
    if config.repair_steps and config.repair_on_policy and config.calibration != "self":
        prompt_sides(config)
    reads_prompts = config.calibration in ("decode", "mix") and draws or bool(config.repair_steps
                                                                             and config.repair_on_policy)
    if reads_prompts and shares_problems(config.prompts, "eval"):
        log.warning("--prompts %s holds HumanEval's held-out half (humaneval:eval): pass@1 there, `eval`'s default, "
                    "no longer measures held-out quality for this model", config.prompts)
    if config.calibration == "self":
        for name, _ in selfdata_config(config).mix():
            if name != "self":
                read_prompts(name)
    if config.text:
        read_text_file(config.text)
    model_config = read_config(folder)
    check_context(config, folder)
    check_gen_backend(config, model_config)
    dense_linears = check_dense_linears(config, model_config)  # a pattern that names nothing: one line
    if config.quantize != "none" and config.quantize_head == "none":
        log.info("lm_head stays bf16; --quantize-head int8 runs the 8B preset's 2:4 + int4 step 5.6%% faster (one "
                 "run) and is off by default: its dev check lost two problems of 41 or raised KL by 9%% "
                 "(benchmarks/results/quality-head-dev-qwen2.5-coder-1.5b)")
    warn_ignored_options(config)
    if config.solver == "admm" and pattern is not None and not config.keep_mask and device.type == "cpu":
        log.info("--solver admm (the default) on a CPU: %d iterations a layer; at 100 they took 15-47x SparseGPT's "
                 "solver time (SmolLM2-135M: several minutes on 2 cores); --solver sparsegpt is the quick choice "
                 "here", config.admm_iterations)
    started = time.perf_counter()
    # loaded before the work folder exists: a model that cannot load leaves nothing, and an interrupted run's folder
    # is kept for resuming
    model, tokenizer, _ = load_model(folder, device)
    work = WorkDir(out, resume_fingerprint(config, folder, device))
    try:
        if config.keep_mask:  # the model must already be pruned to --pattern: say so before calibration
            for index, layer in enumerate(model.model.layers):
                for linear in solved_linears(config, layer, index).values():
                    solvers.check_kept_zeros(linear.weight.data, pattern)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if work.calibration_file.exists():
            calib = CalibrationSet.load(work.calibration_file)
        elif config.calibration_from is not None:
            calib, work.state["calibration"] = reused_calibration(config, model, reused)
            work.save_state()
            temporary = work.calibration_file.with_name(work.calibration_file.name + ".tmp")
            calib.save(temporary)  # whole or absent, as below: a truncated set would stop every resume
            os.replace(temporary, work.calibration_file)
        else:
            torch.manual_seed(config.seed)
            calib, work.state["calibration"] = build_calibration(config, model, tokenizer, work.generation_store,
                                                                 work.selfdata_folder, progress)
            work.save_state()  # before the file: a run killed in between rebuilds the set and its record
            temporary = work.calibration_file.with_name(work.calibration_file.name + ".tmp")
            calib.save(temporary)
            os.replace(temporary, work.calibration_file)
        log.info("calibration: %s, %d tokens in %d sequences", calib.source, calib.tokens, len(calib))
        if config.repair_steps and not config.repair_on_policy and config.calibration != "self":
            split_by_hash(calib)  # repair's split of these sequences must have two sides: say so before the solve
        result = prune_layers(model, calib, config, work, progress)
        repair_report = repair_model(config, folder, model, tokenizer, calib, work, progress) \
            if config.repair_steps else None
        manifest = {
            "pattern": config.pattern if pattern is None else str(pattern), "solver": solver_name(config),
            "propagation": config.propagation,
            "calibration": work.state["calibration"], "source_model": str(folder),
            "solver_options": {"blocksize": config.blocksize, "percdamp": config.percdamp,
                               "solver_order": config.solver_order, "refit_steps": config.refit_steps,
                               "admm_iterations": config.admm_iterations if solver_name(config) == "admm" else None,
                               "admm_products": config.admm_products if solver_name(config) == "admm" else None,
                               "admm_settle": config.admm_settle if solver_name(config) == "admm" else None,
                               "admm_split": config.admm_split if solver_name(config) == "admm" else None,
                               "grouped_search": solvers.grouped_search_setting(device)
                               if grouped and not config.keep_mask else None,
                               "hessian_dtype": config.hessian_dtype, "quantize": config.quantize,
                               "group_size": config.group_size, "quantize_head": config.quantize_head,
                               "permute_channels": config.permute_channels,
                               "permute_scope": config.permute_scope, "scale_search": config.scale_search,
                               "rounding_sweeps": config.rounding_sweeps},
            "seed": config.seed, "config": asdict(config), "layers": result["layers"],
            "dense_linears": dense_linears,
            "timing": {"solver_seconds_this_run": result["solver_seconds"],
                       "total_seconds_this_run": round(time.perf_counter() - started, 2),
                       "resumed_from_layer": result["resumed_from_layer"]},
            "peak_memory_gb": peak_memory_gb(device), "device": str(device), "versions": versions(),
            "command": config.command or command(),
        }
        if repair_report is not None:
            manifest["repair"] = repair_report
        final = work.path / "final"
        shutil.rmtree(final, ignore_errors=True)
        model.to(source_dtype(folder)).save_pretrained(final)
        tokenizer.save_pretrained(final)
        kept_set = final / settings.CALIBRATION_FILE  # in a folder of its own: model loaders glob *.safetensors
        kept_set.parent.mkdir()
        shutil.copyfile(work.calibration_file, kept_set)
        manifest["calibration"] = {**manifest["calibration"], "file": settings.CALIBRATION_FILE}
        write_json(final / PRUNED_MANIFEST, manifest)
        if out.exists():  # only reachable with --overwrite (validate refuses otherwise)
            shutil.rmtree(out)
        os.replace(final, out)
        shutil.rmtree(work.path)
        return out
    except SparseDecodingError:
        shutil.rmtree(work.path, ignore_errors=True)  # a user error is not resumable: leave nothing behind
        raise
