"""Fixed-mask repair by distillation: after the one-shot solver, train the kept weights of the pruned linears so that
the sparse model q matches the dense model p on decode positions, with every pruned weight held at zero.

Loss: the mean over kept positions t of KL(p_t ‖ q_t) = Σ_v p_t(v)·(log p_t(v) − log q_t(v)), full vocabulary, in
float32. The output layer is applied to `kl_chunk` positions at a time and each chunk is recomputed in the backward
pass (activation checkpointing), so a 151k vocabulary never holds more than one chunk's logits.

Precision: both models run in their own dtype (bf16 on a GPU). The trained weights have float32 master copies that
AdamW updates (its state is float32 too); after each step the masters are cast into the model. An Adam step of
lr ≈ 2e-5 on a weight of size ≈ 0.02 is a relative change of 1e-3, below bf16's resolution (≈ 4e-3), so bf16 weights
updated in place would mostly not move. Memory for a 1.5B model: 2 × 3 GB for the models, 2.6 GB bf16 gradients,
5.2 GB masters, 10.4 GB Adam state, 2.6 GB for the best state: about 27 GB plus activations (one micro-batch, one
saved hidden state per layer with gradient checkpointing).

Mask: every pruned linear's gradient is multiplied by its mask before the step. A pruned entry then has zero gradient,
zero Adam moments and so a zero update, and decoupled weight decay keeps zero at zero; the masks are checked against
the weights at the start, at every checkpoint and at the end.

Trained: the weights of the prunable linears (q/k/v/o, gate/up/down), the only tensors the solver changed.
`train_extra="norms_biases"` also trains RMSNorm weights and linear biases (Qwen2's q/k/v): a few hundred thousand
values that can rescale activations, but more freedom to overfit, which the probe in issue 11 showed is the risk;
off by default until a dev-split run says otherwise. Embeddings and the output layer are never trained.

Stopping: dev KL is measured before the first step and every `eval_every` steps; the best state (lowest dev KL,
the untrained model included) is kept in memory and restored at the end. Training stops at `max_steps`, when the
trained decode tokens reach `token_budget`, when `time_budget_s` has passed, or after `patience` evaluations without
improvement. The work folder holds the masters, the optimizer state, the best state (safetensors) and the progress
(JSON) at every checkpoint; a run restarted with the same settings and data resumes there and ends as an
uninterrupted run would (bit-identical on the CPU).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.utils.checkpoint import checkpoint

from .batchgen import DEFAULT_KV_BUDGET, generate_many
from .calibration import CalibrationSet, decode_set_from_generations
from .errors import RepairError
from .generation import position_ids_from_mask
from .hessian import prunable_linears

log = logging.getLogger(__name__)

SCHEDULES = ("cosine", "constant")
EXTRAS = ("none", "norms_biases")
# Settings that may change when resuming: they bound how long the run goes on, not what a step does.
RESUMABLE = ("time_budget_s",)


@dataclass
class RepairConfig:
    """Every knob of a repair run.

    lr (2e-5): peak AdamW learning rate. schedule: `cosine` (linear warm-up, then cosine decay to 0 at `max_steps`)
    or `constant` (warm-up, then flat). warmup_steps (20). weight_decay (0.0): decoupled, on the trained weights.
    betas ((0.9, 0.999)). max_grad_norm (1.0; None: no clipping): clips the float32 gradient of all trained tensors.
    batch_size (16): sequences per optimizer step; micro_batch_size (4): sequences per forward/backward pass (memory;
    the step is the same for any value). max_steps (1000). token_budget (None): stop once this many decode tokens have
    been trained on. time_budget_s (1500): stop after this many seconds of training (resumed runs count the time
    before the interruption). eval_every (50): steps between dev evaluations. patience (4): stop after this many
    evaluations without a new best dev KL. min_delta (0.0): a new best must beat the old by more than this.
    dev_max_sequences (256; None: all): dev sequences scored at each evaluation (the first ones, always the same).
    checkpoint_every (500): steps between checkpoints in the work folder; a multiple of eval_every (a checkpoint of
    a 1.5B model writes about 18 GB: masters, Adam state and the best state).
    kl_chunk (1024): positions per output-layer chunk. train_extra: `none` | `norms_biases` (module docstring).
    gradient_checkpointing (True): recompute each decoder layer in the backward pass. max_skipped_steps (10): steps
    whose gradient is not finite (a bf16 overflow on some sample) are skipped and counted; past this many, repair
    stops (`stopped_by` = `non_finite`) and keeps its best state. seed (0): data order."""

    lr: float = 2e-5
    schedule: str = "cosine"
    warmup_steps: int = 20
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    batch_size: int = 16
    micro_batch_size: int = 4
    max_steps: int = 1000
    token_budget: int | None = None
    time_budget_s: float | None = 1500.0
    eval_every: int = 50
    patience: int = 4
    min_delta: float = 0.0
    dev_max_sequences: int | None = 256
    checkpoint_every: int = 500
    kl_chunk: int = 1024
    train_extra: str = "none"
    gradient_checkpointing: bool = True
    max_skipped_steps: int = 10
    seed: int = 0

    def validate(self) -> None:
        if not 0 < self.lr < 1:
            raise RepairError(f"repair lr must be in (0, 1), got {self.lr}; try 2e-5")
        if self.schedule not in SCHEDULES:
            raise RepairError(f"repair schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.train_extra not in EXTRAS:
            raise RepairError(f"repair train_extra {self.train_extra!r} is not one of {', '.join(EXTRAS)}")
        positive = {"batch_size": self.batch_size, "micro_batch_size": self.micro_batch_size,
                    "max_steps": self.max_steps, "eval_every": self.eval_every, "patience": self.patience,
                    "checkpoint_every": self.checkpoint_every, "kl_chunk": self.kl_chunk}
        for name, value in positive.items():
            if value < 1:
                raise RepairError(f"repair {name} must be at least 1, got {value}")
        if not 0 <= self.warmup_steps < self.max_steps:
            raise RepairError(f"repair warmup_steps must be in [0, max_steps), got {self.warmup_steps}")
        if self.checkpoint_every % self.eval_every:
            raise RepairError(f"repair checkpoint_every ({self.checkpoint_every}) must be a multiple of eval_every "
                              f"({self.eval_every})")
        for name in ("token_budget", "time_budget_s", "dev_max_sequences", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise RepairError(f"repair {name} must be positive or None, got {value}")
        if self.weight_decay < 0 or self.min_delta < 0 or not all(0 <= beta < 1 for beta in self.betas):
            raise RepairError("repair weight_decay and min_delta must be ≥ 0 and betas in [0, 1)")


# --- masks and trained tensors --------------------------------------------------------------------------------------

def pruned_masks(model) -> dict[str, torch.Tensor]:
    """{parameter name: bool mask of kept weights} for every prunable linear of every decoder layer."""
    masks = {}
    for index, layer in enumerate(model.model.layers):
        for name, linear in prunable_linears(layer).items():
            masks[f"model.layers.{index}.{name}.weight"] = linear.weight.detach() != 0
    return masks


def check_masks(model, masks: dict[str, torch.Tensor]) -> None:
    """Every pruned weight is still exactly zero."""
    parameters = dict(model.named_parameters())
    for name, mask in masks.items():
        moved = int((parameters[name].detach()[~mask] != 0).sum())
        if moved:
            raise RuntimeError(f"{moved} pruned weights of {name} are no longer zero; the mask was not kept")


def trained_parameters(model, masks: dict[str, torch.Tensor], extra: str) -> dict[str, torch.nn.Parameter]:
    """The tensors repair updates, by name, in a fixed order: the pruned linears' weights, plus norms and biases of
    the decoder layers and the final norm with `extra="norms_biases"`."""
    parameters = dict(model.named_parameters())
    chosen = {name: parameters[name] for name in masks}
    if extra == "norms_biases":
        for name, parameter in parameters.items():
            in_layers = name.startswith("model.layers.") or name.startswith("model.norm.")
            if in_layers and parameter.dim() == 1:
                chosen[name] = parameter
    return dict(sorted(chosen.items()))


def check_pair(teacher, student) -> None:
    """The student must be the teacher's architecture with the same shapes (it is the teacher, pruned)."""
    shapes_t = {name: tuple(p.shape) for name, p in teacher.named_parameters()}
    shapes_s = {name: tuple(p.shape) for name, p in student.named_parameters()}
    if shapes_t != shapes_s:
        differing = sorted(set(shapes_t.items()) ^ set(shapes_s.items()))
        raise RepairError(f"the pruned model does not match the dense model ({differing[0][0]} differs); repair "
                          f"needs the dense model it was pruned from")


# --- the loss -------------------------------------------------------------------------------------------------------

def _chunk_kl(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_head: torch.nn.Module,
              teacher_head: torch.nn.Module) -> torch.Tensor:
    log_q = F.linear(student_hidden, student_head.weight, student_head.bias).float().log_softmax(-1)
    with torch.no_grad():
        log_p = F.linear(teacher_hidden, teacher_head.weight, teacher_head.bias).float().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum()


def kl_sum(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_head, teacher_head,
           chunk: int) -> torch.Tensor:
    """Σ over positions of KL(p ‖ q) from final hidden states [N, H] (after the final norm), `chunk` positions of
    logits at a time; with gradients on, each chunk's logits are recomputed in the backward pass instead of kept."""
    total = student_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, student_hidden.shape[0], chunk):
        pieces = (student_hidden[start:start + chunk], teacher_hidden[start:start + chunk])
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_kl, *pieces, student_head, teacher_head, use_reentrant=False)
        else:
            total = total + _chunk_kl(*pieces, student_head, teacher_head)
    return total


def _hidden(model, input_ids, attention_mask) -> torch.Tensor:
    return model.model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state


def rows(calib: CalibrationSet, indices: list[int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The selected sequences with the columns that are padding in every one of them removed."""
    index = torch.tensor(indices)
    mask = calib.attention_mask[index]
    first = int((mask.sum(0) > 0).nonzero()[0])
    return (calib.input_ids[index, first:].to(device), mask[:, first:].to(device), calib.keep[index, first:].to(device))


def batch_kl(teacher, student, input_ids, attention_mask, keep, chunk: int) -> torch.Tensor:
    """Σ KL(teacher ‖ student) over the kept positions of one batch (differentiable in the student)."""
    with torch.no_grad():
        teacher_hidden = _hidden(teacher, input_ids, attention_mask)[keep]
    student_hidden = _hidden(student, input_ids, attention_mask)[keep]
    return kl_sum(student_hidden, teacher_hidden.to(student_hidden.device), student.lm_head, teacher.lm_head, chunk)


@torch.no_grad()
def mean_kl(teacher, student, calib: CalibrationSet, batch_size: int, chunk: int,
            max_sequences: int | None = None) -> float:
    """Mean KL(teacher ‖ student) per kept position over the first `max_sequences` sequences of `calib`."""
    device = next(student.parameters()).device
    count = len(calib) if max_sequences is None else min(max_sequences, len(calib))
    total, tokens = 0.0, 0
    for start in range(0, count, batch_size):
        ids, mask, keep = rows(calib, list(range(start, min(start + batch_size, count))), device)
        total += float(batch_kl(teacher, student, ids, mask, keep, chunk))
        tokens += int(keep.sum())
    return total / max(tokens, 1)


# --- training state -------------------------------------------------------------------------------------------------

def learning_rate(config: RepairConfig, step: int) -> float:
    """The lr of optimizer step `step` (0-based): linear warm-up over `warmup_steps`, then flat or cosine to 0."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return config.lr
    progress = (step - config.warmup_steps) / max(config.max_steps - config.warmup_steps, 1)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(step: int, batch_size: int, sequences: int, seed: int) -> list[int]:
    """Sequences of step `step`: the training stream is one seeded permutation per epoch, read in order, so any
    step's batch is known without replaying the steps before it (resumption needs only the step number)."""
    indices, cache = [], {}
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch = position // sequences
        if epoch not in cache:
            cache[epoch] = torch.randperm(sequences, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        indices.append(cache[epoch][position % sequences])
    return indices


def data_fingerprint(calib: CalibrationSet) -> str:
    digest = hashlib.sha256()
    for tensor in (calib.input_ids, calib.attention_mask, calib.keep):
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Checkpoint:
    """The work folder: progress.json and the tensor files it names (masters, optimizer state and best state of
    the step it records, `masters-STEP.safetensors` and so on). Each save writes a new step's files in full, then
    replaces progress.json atomically, then deletes the files no progress names: a crash at any point leaves a
    progress file whose tensors are all of its own step."""

    KINDS = ("masters", "optimizer", "best")

    def __init__(self, folder: Path, fingerprint: dict):
        self.folder = folder
        self.fingerprint = fingerprint
        folder.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict | None:
        path = self.folder / "progress.json"
        if not path.exists():
            return None
        progress = json.loads(path.read_text())
        if progress["fingerprint"] != self.fingerprint:
            differing = sorted(key for key in self.fingerprint
                               if progress["fingerprint"].get(key) != self.fingerprint[key])
            raise RepairError(f"{self.folder} holds a repair run with other settings or data ({', '.join(differing)}); "
                              f"use another work folder or delete it")
        return progress

    def save(self, progress: dict, masters: dict, optimizer: torch.optim.Optimizer, names: list[str],
             best: dict) -> None:
        """This step's tensor files first, then progress.json naming them (atomically), then the older files."""
        files = {kind: f"{kind}-{progress['step']}.safetensors" for kind in self.KINDS}
        save_file({name: tensor.detach().cpu().contiguous() for name, tensor in masters.items()},
                  str(self.folder / files["masters"]))
        state = optimizer.state_dict()["state"]
        tensors = {}
        for index, values in state.items():
            for key, value in values.items():
                tensors[f"{names[index]}::{key}"] = torch.as_tensor(value).detach().cpu().reshape(-1).contiguous()
        save_file(tensors, str(self.folder / files["optimizer"]))
        save_file({name: tensor.detach().cpu().contiguous() for name, tensor in best.items()},
                  str(self.folder / files["best"]))
        temporary = self.folder / "progress.json.tmp"
        temporary.write_text(json.dumps({**progress, "files": files, "fingerprint": self.fingerprint}, indent=2))
        temporary.replace(self.folder / "progress.json")
        for path in self.folder.glob("*.safetensors"):
            if path.name not in files.values():
                path.unlink()

    def restore(self, masters: dict, optimizer: torch.optim.Optimizer, names: list[str], progress: dict) -> dict:
        """Load masters and optimizer state in place from the files `progress` names; returns the best state."""
        files = progress.get("files") or {kind: f"{kind}.safetensors" for kind in self.KINDS}  # before the step names
        saved = load_file(str(self.folder / files["masters"]))
        for name, master in masters.items():
            master.data.copy_(saved[name])
        tensors = load_file(str(self.folder / files["optimizer"]))
        state = {}
        for index, name in enumerate(names):
            entries = {key.split("::", 1)[1]: value for key, value in tensors.items() if key.split("::", 1)[0] == name}
            if entries:
                state[index] = {key: (value.reshape(masters[name].shape) if key != "step" else value.reshape(()))
                                for key, value in entries.items()}
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
        return load_file(str(self.folder / files["best"]))


# --- the loop -------------------------------------------------------------------------------------------------------

def repair(teacher, student, train: CalibrationSet, dev: CalibrationSet, work_dir: str | Path,
           config: RepairConfig | None = None, on_eval: Callable[[dict], None] | None = None) -> dict:
    """Train `student` (the pruned model, changed in place) towards `teacher` (the dense model) on the kept positions
    of `train`, stopping early on `dev` (module docstring). The student ends with its best dev state. on_eval gets
    each evaluation's record (for progress output). Returns the report for the manifest: curve (step, tokens,
    seconds, train_kl since the last evaluation, dev_kl), best and initial dev KL, steps, tokens, seconds, why it
    stopped, trained tensor and weight counts, and the settings."""
    config = config or RepairConfig()
    config.validate()
    check_pair(teacher, student)
    if train.tokens == 0 or dev.tokens == 0:
        raise RepairError("repair needs train and dev sequences with decode positions; build more data")
    device = next(student.parameters()).device
    masks = pruned_masks(student)
    if not masks:
        raise RepairError("the student has no prunable linears; repair expects a pruned decoder model")
    check_masks(student, masks)
    params = trained_parameters(student, masks, config.train_extra)
    names = list(params)
    fingerprint = {**{key: value for key, value in asdict(config).items() if key not in RESUMABLE},
                   "betas": list(config.betas), "train": data_fingerprint(train), "dev": data_fingerprint(dev),
                   "kept_weights": int(sum(int(mask.sum()) for mask in masks.values()))}
    store = Checkpoint(Path(work_dir), fingerprint)

    for parameter in student.parameters():
        parameter.requires_grad_(False)
    for parameter in params.values():
        parameter.requires_grad_(True)
    masters = {name: parameter.detach().float().clone() for name, parameter in params.items()}
    optimizer = torch.optim.AdamW(list(masters.values()), lr=config.lr, betas=config.betas,
                                  weight_decay=config.weight_decay)
    was_training = student.training
    if config.gradient_checkpointing:
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def evaluate() -> float:
        student.eval()
        return mean_kl(teacher, student, dev, config.micro_batch_size, config.kl_chunk, config.dev_max_sequences)

    def snapshot() -> dict:
        return {name: parameter.detach().clone() for name, parameter in params.items()}

    try:
        progress = store.load()
        if progress is None:
            initial = evaluate()
            progress = {"step": 0, "tokens": 0, "seconds": 0.0, "best_dev_kl": initial, "best_step": 0,
                        "initial_dev_kl": initial, "bad_evals": 0, "stopped_by": None,
                        "curve": [{"step": 0, "tokens": 0, "seconds": 0.0, "train_kl": None, "dev_kl": initial}]}
            best = snapshot()
        else:
            best = store.restore(masters, optimizer, names, progress)
            best = {name: tensor.to(device) for name, tensor in best.items()}
            with torch.no_grad():
                for name, parameter in params.items():
                    parameter.copy_(masters[name])
            log.info("resuming repair at step %d", progress["step"])
        progress = _train(teacher, student, train, config, params, masks, masters, optimizer, progress, best,
                          evaluate, snapshot, store, names, on_eval)
    finally:
        for parameter in params.values():
            parameter.requires_grad_(False)
            parameter.grad = None
        if config.gradient_checkpointing:
            student.gradient_checkpointing_disable()
        student.train(was_training)
    with torch.no_grad():
        for name, parameter in params.items():
            parameter.copy_(best[name])
    check_masks(student, masks)
    return {**{key: progress[key] for key in ("step", "tokens", "seconds", "best_step", "best_dev_kl",
                                                "initial_dev_kl", "stopped_by", "curve")},
            "skipped_steps": progress.get("skipped_steps", 0),
            "trained_tensors": len(params), "trained_weights": int(sum(int(mask.sum()) for mask in masks.values())),
            "settings": asdict(config)}


def _train(teacher, student, train, config, params, masks, masters, optimizer, progress, best, evaluate, snapshot,
           store, names, on_eval) -> dict:
    device = next(student.parameters()).device
    started = time.perf_counter() - progress["seconds"]
    window_kl, window_tokens = 0.0, 0
    if progress["stopped_by"] == "time_budget" and (config.time_budget_s is None
                                                   or progress["seconds"] < config.time_budget_s):
        progress["stopped_by"] = None  # resumed with more time (time_budget_s may change on resume): go on
        log.info("repair stopped by its time budget at %.0f s; continuing to %s", progress["seconds"],
                 f"{config.time_budget_s:g} s" if config.time_budget_s is not None else "its other limits")
    stopped_before = progress["stopped_by"] is not None  # a finished run loaded from its checkpoint
    while not stopped_before:
        step = progress["step"]
        if progress["stopped_by"] is not None:  # set by the last step (too many non-finite steps)
            pass
        elif step >= config.max_steps:
            progress["stopped_by"] = "max_steps"
        elif config.token_budget is not None and progress["tokens"] >= config.token_budget:
            progress["stopped_by"] = "token_budget"
        elif config.time_budget_s is not None and time.perf_counter() - started >= config.time_budget_s:
            progress["stopped_by"] = "time_budget"
        if progress["stopped_by"] is not None:
            if progress["curve"][-1]["step"] != step:  # score the last steps too, so they can be the best
                _evaluate(progress, config, evaluate, snapshot, best, window_kl, window_tokens, started)
            # the time at the stop, so that a rerun with the same budget finds it spent
            progress["seconds"] = max(progress["seconds"], round(time.perf_counter() - started, 3))
            check_masks(student, masks)
            store.save(progress, masters, optimizer, names, best)
            break
        student.train()
        batch = batch_indices(step, config.batch_size, len(train), config.seed)
        micro = [rows(train, batch[start:start + config.micro_batch_size], device)
                 for start in range(0, len(batch), config.micro_batch_size)]
        tokens = sum(int(keep.sum()) for _, _, keep in micro)
        for ids, mask, keep in micro:
            if keep.any():
                loss = batch_kl(teacher, student, ids, mask, keep, config.kl_chunk)
                window_kl += float(loss.detach())
                (loss / max(tokens, 1)).backward()
        for name, parameter in params.items():
            grad = parameter.grad.float() if parameter.grad is not None else torch.zeros_like(masters[name])
            # where, not a product: inf·0 would put NaN on pruned weights
            masters[name].grad = torch.where(masks[name], grad, 0.0) if name in masks else grad
            parameter.grad = None
        finite = bool(torch.stack([torch.isfinite(master.grad).all() for master in masters.values()]).all())  # one sync
        if finite:  # a non-finite step (a bf16 overflow on some sample) is skipped and counted, not applied
            if config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(list(masters.values()), config.max_grad_norm)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, step)
            optimizer.step()
            with torch.no_grad():
                for name, parameter in params.items():
                    parameter.copy_(masters[name])
        else:
            progress["skipped_steps"] = progress.get("skipped_steps", 0) + 1
            log.warning("repair step %d: non-finite gradient, step skipped (%d so far)", step,
                        progress["skipped_steps"])
            if progress["skipped_steps"] > config.max_skipped_steps:
                progress["stopped_by"] = "non_finite"
        optimizer.zero_grad(set_to_none=True)
        progress["step"] = step + 1
        progress["tokens"] += tokens
        window_tokens += tokens
        if progress["step"] % config.eval_every == 0:
            record = _evaluate(progress, config, evaluate, snapshot, best, window_kl, window_tokens, started)
            window_kl, window_tokens = 0.0, 0
            if progress["bad_evals"] >= config.patience and progress["stopped_by"] is None:
                progress["stopped_by"] = "patience"
            if progress["step"] % config.checkpoint_every == 0 or progress["stopped_by"]:
                check_masks(student, masks)
                store.save(progress, masters, optimizer, names, best)
            if on_eval is not None:
                on_eval(record)
            if progress["stopped_by"] is not None:  # scored and saved above
                break
    return progress


def _evaluate(progress, config, evaluate, snapshot, best, window_kl, window_tokens, started) -> dict:
    """Score dev, append to the curve, and update the best state and the count of evaluations without progress."""
    dev_kl = evaluate()
    progress["seconds"] = round(time.perf_counter() - started, 3)
    record = {"step": progress["step"], "tokens": progress["tokens"], "seconds": progress["seconds"],
              "train_kl": window_kl / window_tokens if window_tokens else None, "dev_kl": dev_kl}
    progress["curve"].append(record)
    if dev_kl < progress["best_dev_kl"] - config.min_delta:
        progress.update(best_dev_kl=dev_kl, best_step=progress["step"], bad_evals=0)
        best.update(snapshot())
    else:
        progress["bad_evals"] += 1
    return record


def student_samples(student, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int = 512,
                    batch_size: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                    token_budget: int | None = None, kv_budget_bytes: int = DEFAULT_KV_BUDGET,
                    progress: bool = True, backend: str = "engine") -> CalibrationSet:
    """On-policy repair data: the student's own sampled continuations of chat-formatted prompts (for example
    `[gen.prompt_ids for gen in selfdata.train]`), as a set whose kept positions are its decode steps; repair then
    scores them with the teacher. backend: `batchgen.generate_many`'s, "engine" (default, the faster) or "hf"."""
    generations = generate_many(student, tokenizer, prompt_ids, max_new_tokens, batch_size, do_sample=True,
                                temperature=temperature, top_p=top_p, seed=seed, kv_budget_bytes=kv_budget_bytes,
                                progress=progress, backend=backend)
    calib = decode_set_from_generations(generations, tokenizer.pad_token_id, token_budget)
    calib.source = "student"
    return calib
