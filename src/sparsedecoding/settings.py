"""Every knob of pruning, evaluation and the quality grid, defined once: default, help text and the values it accepts.

The settings are plain dataclasses in groups: `CalibrationSettings` (where the Hessians' tokens come from),
`SolverSettings` (how each layer is pruned), `RepairSettings` (optional distillation after it), `EvalSettings` (how a
model is scored) and `RunSettings` (model, output, device, seed). `PruneConfig` is all of calibration, solver, repair
and run, flat; `CompareSettings` takes the grid's knobs from the same definitions. The command line is built from
these fields (`add_arguments`, `from_args`), so `--help` always shows the defaults used, and `check` validates every
value with a one-line `SparseDecodingError` before any model work.

How to add a knob: add one `knob(...)` field to its group below (default, help, and `choices` or a numeric range).
Its flag, its help line, its validation and its place in manifests and fingerprints follow; read it where it acts.
For the compare grid as well, add `name: type = like(Group, "name")` to CompareSettings (passed on by name).

This module imports neither torch nor transformers, so `sparsedecoding --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

from .data import HUMANEVAL_INSTRUCTIONS, SPLITS, shares_problems
from .errors import CalibrationError, OutputExistsError, SparseDecodingError, SparsityPatternError
from .patterns import SparsityPattern

CALIBRATION_TOKENS = 16384  # every calibration source gets this many tokens unless told otherwise
SEED_MAX = 2**63 - 1  # seeds live in int64 tensors and torch generators
SOLVERS = ("admm", "sparsegpt", "wanda", "magnitude")
CALIBRATION_FILE = "calibration/set.safetensors"  # in a pruned model's folder: the tokens it was calibrated on
ADMM_PRODUCTS = ("float32", "tf32")  # solvers.ADMM_PRODUCTS
ADMM_SPLITS = ("squared", "magnitude")  # what ADMM's 16:32g projection searches each word's split on (solvers)
QUANTIZATIONS = ("none", "int8", "int4")
SOLVER_ORDERS = ("columns", "hessian")  # solvers.check_order
METRICS = ("pass@1", "kl", "repetition", "ppl")
DENSE_PATTERN = "dense"  # --pattern dense: nothing pruned, the weights only quantized (GPTQ; needs --quantize)
GEN_BACKENDS = ("engine", "hf")  # batchgen.BACKENDS, without importing torch
ALL_REDUCE = ("auto", "nccl", "one-shot")  # engine.parallel's ways to sum tensor-parallel partial outputs
ALL_REDUCE_HELP = ("under torchrun: how the ranks sum their partial outputs: nccl (NCCL's all-reduce), one-shot (a "
                   "symmetric-memory kernel for decode-step sizes, CUDA only; NCCL above its buffer), or auto: "
                   "one-shot when the GPUs share a host and have peer access, else NCCL (default: auto)")


def add_all_reduce_option(parser: argparse.ArgumentParser) -> None:
    """`--all-reduce` on an argparse parser: the one definition that `generate`, `bench` and the TP benchmarks share
    (`engine.parallel.start_from_env` takes its value)."""
    parser.add_argument("--all-reduce", choices=ALL_REDUCE, default="auto", help=ALL_REDUCE_HELP)


def knob(default=MISSING, help: str = "", *, flag: str | None = None, choices: tuple | None = None,
         minimum: float | None = None, above: float | None = None, maximum: float | None = None,
         below: float | None = None, shown: str | None = None, parse=None, factory=MISSING, cli: bool = True):
    """A settings field. minimum/maximum are inclusive bounds, above/below exclusive; None (for a field whose default
    is None) is always allowed. shown: how --help names the default when its value says little (None, a path).
    parse: how the command line's text becomes the value (default: the type of the default). cli=False: no flag."""
    metadata = {"help": help, "flag": flag, "choices": choices, "minimum": minimum, "above": above, "maximum": maximum,
                "below": below, "shown": shown, "parse": parse, "cli": cli}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def like(owner, name: str, **changes):
    """The field `name` of settings class `owner` again (same help and validation), with `changes` (default, flag,
    help, shown, ...): lets another settings class take a knob without defining it twice."""
    original = next(item for item in dataclasses.fields(owner) if item.name == name)
    metadata = {**original.metadata, **{key: value for key, value in changes.items() if key != "default"}}
    if "default" not in changes and original.default_factory is not MISSING:
        return field(default_factory=original.default_factory, metadata=metadata)
    return field(default=changes.get("default", original.default), metadata=metadata)


def flag_of(item: dataclasses.Field) -> str:
    return item.metadata.get("flag") or "--" + item.name.replace("_", "-")


def _number(value) -> str:
    """A bound as --help and errors show it: integers in full (a seed's 2^63 - 1), other numbers short."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def _range_text(meta: dict) -> str | None:
    low = f"[{_number(meta['minimum'])}" if meta["minimum"] is not None else f"({_number(meta['above'])}" \
        if meta["above"] is not None else None
    high = f"{_number(meta['maximum'])}]" if meta["maximum"] is not None else f"{_number(meta['below'])})" \
        if meta["below"] is not None else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f"at least {_number(meta['minimum'])}" if meta["minimum"] is not None else \
            f"above {_number(meta['above'])}"
    if high:
        return f"at most {_number(meta['maximum'])}" if meta["maximum"] is not None else \
            f"below {_number(meta['below'])}"
    return None


def _in_range(value, meta: dict) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return ((meta["minimum"] is None or value >= meta["minimum"]) and (meta["above"] is None or value > meta["above"])
            and (meta["maximum"] is None or value <= meta["maximum"])
            and (meta["below"] is None or value < meta["below"]))


_KINDS = {"int": "a whole number", "float": "a number", "str": "text", "bool": "True or False"}


def _of_kind(value, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, {"int": int, "float": (int, float), "str": str}[kind])


def check(settings) -> None:
    """Raise a one-line SparseDecodingError for the first field of `settings` of the wrong type (a settings object
    built in Python: `PruneConfig(tokens="many")`), outside its choices or outside its range."""
    for item in dataclasses.fields(settings):
        meta, value = item.metadata, getattr(settings, item.name)
        if "help" not in meta:
            continue
        kinds = [part.strip() for part in str(item.type).split("|") if part.strip() != "None"]
        if value is None and len(kinds) == 1 and "None" not in str(item.type) and kinds[0] in _KINDS:
            raise SparseDecodingError(f"{flag_of(item)} must be {_KINDS[kinds[0]]}, got None")
        if value is None:
            continue
        if len(kinds) == 1 and kinds[0] in _KINDS and not _of_kind(value, kinds[0]):
            raise SparseDecodingError(f"{flag_of(item)} must be {_KINDS[kinds[0]]}, got {value!r}")
        if meta["choices"] and value not in meta["choices"]:
            raise SparseDecodingError(f"{flag_of(item)} {value!r} is not one of {', '.join(meta['choices'])}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not _in_range(value, meta):
            finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
            raise SparseDecodingError(f"{flag_of(item)} must be {finite}{_range_text(meta)}, got {value}")


def _default_text(item: dataclasses.Field, default) -> str:
    if item.metadata.get("shown") and default == item.default:  # a command's own default is shown as it is
        return item.metadata["shown"]
    if isinstance(default, bool):
        return "on" if default else "off"
    return "none" if default is None else str(default)


def add_arguments(parser, settings, title: str | None = None, defaults: dict | None = None, prefix: str = "",
                  skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the settings class `settings` (in an argument group titled `title`). defaults: other
    defaults for this command (its --help shows them). prefix: put each value at args.<prefix><name>, so two groups
    may share a field name."""
    target = parser.add_argument_group(title) if title else parser
    defaults = defaults or {}
    for item in dataclasses.fields(settings):
        meta = item.metadata
        if not meta.get("cli") or item.name in skip:
            continue
        default = defaults.get(item.name, item.default)
        help_text = meta["help"].replace("%", "%%")
        options = {"dest": prefix + item.name}
        if not meta["choices"] and not isinstance(default, bool):
            options["metavar"] = flag_of(item)[2:].upper().replace("-", "_")
        if isinstance(default, bool):
            options.update(action="store_false" if default else "store_true", default=default)
        else:
            if default is MISSING:
                options["required"] = True
            else:
                options["default"] = default
            if meta["parse"] is not None:
                options["type"] = meta["parse"]
            elif isinstance(default, (int, float)) and not isinstance(default, bool):
                options["type"] = type(default)
            elif item.type in ("int | None", "int"):
                options["type"] = int
            elif item.type in ("float | None", "float"):
                options["type"] = float
            if meta["choices"]:
                options["choices"] = meta["choices"]
        if default is not MISSING:
            help_text += f" (default: {_default_text(item, default)})"
        target.add_argument(flag_of(item), help=help_text, **options)


def from_args(settings, args, prefix: str = "", **values) -> dict:
    """The values of `settings`' fields that `add_arguments` put on `args` (plus `values`), as keyword arguments."""
    found = {item.name: getattr(args, prefix + item.name) for item in dataclasses.fields(settings)
             if hasattr(args, prefix + item.name)}
    return {**found, **values}


def _tokens(text: str) -> int | None:
    """--tokens: 0 is every decode token (None); below 0 is neither a budget nor that."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (every decode token generated) or a budget of at least 1, "
                                         f"got {value}")
    return value or None


@dataclass(kw_only=True)
class RunSettings:
    """What to prune, where the result goes, and where the work runs."""

    model: str = knob(help="HF model folder, .gguf file, or offline model name (smollm2-135m, qwen2.5-coder-1.5b)")
    out: str = knob(help="output folder (written atomically)")
    device: str = knob("auto", "auto (cuda when available), cpu, cuda, cuda:1 ...")
    seed: int = knob(0, "seed of sampling and text window order", minimum=0, maximum=SEED_MAX)
    overwrite: bool = knob(False, "replace --out if it exists")
    recipe: str = knob("none", "recommended: the calibration chosen on the dev split of issue 11's recipe search "
                       "(benchmarks/results/quality-recipes-qwen2.5-coder-1.5b): the fit quarter's prompts "
                       "(humaneval:fit), 4 sampled continuations per prompt at temperature 0.7, top-p 0.95, 32768 "
                       "tokens; it sets those fields left at their defaults (a value given equal to its default counts "
                       "as left)",
                       choices=("none", "recommended"))
    command: list[str] = knob(help="the command line recorded in the output", factory=list, cli=False)


@dataclass(kw_only=True)
class CalibrationSettings:
    """Where the calibration tokens come from."""

    calibration: str = knob("decode", "decode: the dense model's own decode steps on --prompts; text: teacher-forced "
                            "--text; mix: both, --mix-ratio of the tokens from decode; self: the dense model writes "
                            "its own task prompts (--self-sources) and answers them, --tokens of the answers' decode "
                            "steps, a prompt-hash tenth kept apart for repair's early stopping",
                            choices=("decode", "text", "mix", "self"))
    prompts: str = knob("humaneval:calib", "task prompts: a .jsonl file (field 'prompt'), a text file (one prompt per "
                        "line), or humaneval:calib (the even half of HumanEval)")
    text: str | None = knob(None, "natural text file for text calibration", shown="the Lee background corpus")
    tokens: int | None = knob(CALIBRATION_TOKENS, "calibration token budget, equal for every source (0: every decode "
                              "token generated)", minimum=1, parse=_tokens)
    n_prompts: int | None = knob(None, "use only the first N prompts", minimum=1, shown="all")
    samples_per_prompt: int = knob(1, "continuations drawn per prompt (more than 1 needs --sample)", minimum=1,
                                   maximum=4096)
    max_new_tokens: int = knob(512, "new tokens per calibration prompt", minimum=1)
    mix_ratio: float = knob(0.5, "share of decode tokens in --calibration mix", above=0.0, below=1.0)
    text_seq_len: int = knob(512, "window length of the text source", minimum=2)
    do_sample: bool = knob(False, "sample (seeded) instead of greedy decoding", flag="--sample")
    temperature: float = knob(1.0, "sampling temperature; --calibration self and on-policy repair always sample, "
                              "at 0.7 while this is left at 1.0", above=0.0)
    top_p: float = knob(1.0, "sampling top-p; --calibration self and on-policy repair use 0.95 while this is left at "
                        "1.0", above=0.0, maximum=1.0)
    gen_batch_size: int = knob(32, "prompts per generation batch", minimum=1)
    self_sources: str = knob("self=0.9,humaneval:fit=0.1", "--calibration self: prompt sources as name=weight pairs; "
                             "self (written by the model), humaneval:fit, humaneval:calib or a prompt file")
    self_meta: int = knob(4096, "--calibration self: meta-prompts asking the model for a task prompt", minimum=1)
    self_answers: int = knob(4096, "--calibration self: prompts answered, mixed from --self-sources", minimum=1)
    self_batch_size: int = knob(256, "--calibration self and on-policy repair: generator rows", minimum=1)
    first_positions: int = knob(0, "also fit each calibration sequence's first N positions (prompt positions, which "
                                "every decode step attends to; the first holds the attention sink, where Qwen's "
                                "largest activations sit and which decode steps alone never show the solver); on "
                                "Qwen2.5-Coder-1.5B 1 lowered Lee perplexity but not pass@1 (see the README)",
                                minimum=0)
    calibration_from: str | None = knob(None, "reuse an earlier run's calibration tokens instead of drawing new ones: "
                                        "its output folder (which keeps them in calibration/) or that .safetensors "
                                        "file; the prompt, budget and sampling options are then not read (and "
                                        "--calibration stays at decode). "
                                        "GPU sampling does not redraw a set bit for bit, so two solvers or patterns "
                                        "compare fairly only on one set", shown="none")
    gen_backend: str = knob("engine", "--calibration self and on-policy repair: what runs the large-batch "
                            "generator: engine (the engine's transformer in CUDA graphs, 5.9x hf's tokens/s on an "
                            "H200; refuses models with extras it lacks, such as a non-SiLU activation) or hf (the "
                            "model's own forward)", choices=GEN_BACKENDS)

    def answer_sampling(self) -> tuple[float, float]:
        """(temperature, top_p) of self-written answers and on-policy repair samples: the given values, or 0.7 and
        0.95 for a field left at its default of 1.0 (pure sampling at 1.0 drifts off-task)."""
        return (0.7 if self.temperature == 1.0 else self.temperature, 0.95 if self.top_p == 1.0 else self.top_p)


@dataclass(kw_only=True)
class SolverSettings:
    """How each layer is pruned from its Hessians."""

    pattern: str = knob("16:32", "16:32 (default: keeps the most quality at full kernel speed), 2:4 (for hardware "
                        "that needs it), 16:32+2 (16:32 with at most two kept weights a word beyond two in a group "
                        "of four: the engine runs it on the 2:4 sparse tensor-core kernel with overflow slots; "
                        "repaired, 0.482 held-out pass@1 against 0.463 for 16:32), 16:32+4q / 16:32+2l (those weights "
                        "placed per tensor-core lane, for an experimental slot loop; the engine runs them as "
                        "16:32), 16:32g (each 16-row tile's words split into groups of four, two kept a row and "
                        "group: the engine runs it on the 2:4 kernel in each tile's column order, no slots; the "
                        "split's search slows the solvers), 16:32g8 (the same with a split for every 8 rows: on "
                        "the layer loss between 16:32+2 and 16:32; the engine runs it on the 2:4 kernel in each 8 "
                        "rows' column order, two gathers a k-tile; failed its dev quality rule against 16:32+2, "
                        "level with it held out, benchmarks/results/quality-grouped8-qwen2.5-coder-1.5b), 4:8, "
                        "8:16, any N:M, 50%, or dense "
                        "(nothing pruned: with --quantize, GPTQ rounds every weight on the same Hessians)")
    solver: str = knob("admm", "pruning solver: admm (default: every group's mask revisited by ADMM on the whole "
                       "layer loss, --admm-iterations steps; on Qwen2.5-Coder-1.5B's dev quarter pass@1 0.512 vs "
                       "SparseGPT's 0.500 at 16:32 and 0.268 vs 0.244 at 2:4, KL 8% and 27% lower; 12-30x "
                       "SparseGPT's solver time, about 8.5 minutes for Llama-3.1-8B on an H100; see the README), "
                       "sparsegpt (one pass over the columns, each group's mask chosen as the pass reaches it), "
                       "wanda, magnitude", choices=SOLVERS)
    propagation: str = knob("dense", "dense: every Hessian from the dense model (paper); sequential: layer l sees "
                            "pruned layers < l", choices=("dense", "sequential"))
    target: str = knob("self", "what each pruned layer is fitted to: self (its own output on the inputs it sees, as "
                       "SparseGPT) or dense (the dense model's output: the solver runs on W·C·H⁻¹ from paired dense "
                       "and pruned inputs; needs --propagation sequential)", choices=("self", "dense"))
    blocksize: int = knob(128, "SparseGPT block size", minimum=1)
    percdamp: float = knob(0.01, "SparseGPT damping, relative to the mean Hessian diagonal", above=0.0, maximum=1.0)
    solver_order: str = knob("columns", "the order in which SparseGPT and GPTQ visit a weight's columns: columns "
                             "(left to right, as both papers) or hessian (whole N:M groups, the one with the largest "
                             "Hessian diagonal first: GPTQ's activation order kept to groups; the mask stays N:M; "
                             "int4 scales are then fixed before the loop)", choices=SOLVER_ORDERS)
    refit_steps: int = knob(0, "after the solver, re-solve the kept weights for the mask it chose, by this many "
                            "conjugate-gradient steps toward the least layer loss the mask allows (0: off). Few steps "
                            "also regularize: on SmolLM2 10 kept most of 40's dev KL gain at 40-60% of its rise in "
                            "news-text perplexity; any solver's mask; with --quantize the refit weights are rounded "
                            "with the mask fixed", minimum=0, maximum=10_000)
    admm_iterations: int = knob(100, "--solver admm: ADMM steps (its penalty grows from 0.1 to 1000 times the "
                                "mean eigenvalue of the damped Hessian over them)", minimum=1, maximum=10_000)
    admm_products: str = knob("float32", "--solver admm: how each step's two products with the Hessian's "
                              "eigenvectors run: float32, or tf32 (both operands rounded to 10 mantissa bits: "
                              "tensor cores, 6-8x faster products on an H100; emulated on a CPU; on SmolLM2's "
                              "layers 0.4-0.7% more layer loss; on Qwen-1.5B's recommended 16:32 recipe dev KL "
                              "+17% and Lee perplexity +26%, +12% and +24% with --refit-steps 10, so not the default)",
                              choices=ADMM_PRODUCTS)
    admm_split: str = knob("squared", "--solver admm with --pattern 16:32g / 16:32g8: what each step's projection "
                           "searches a tile word's split on: squared (x², the Euclidean projection, the kept set "
                           "that leaves the least of each step's distance) or magnitude (|x|, what 16:32g was first "
                           "pruned with; on 20 of Qwen-1.5B's linears the two differ by under 1% of layer loss); other "
                           "patterns keep the same mask either way", choices=ADMM_SPLITS)
    admm_settle: int = knob(0, "--solver admm: stop ADMM on a layer's linears that share an input (q/k/v, gate/up "
                            "stacked; o, down alone) once their mask has come out the same this many "
                            "steps in a row, then move the kept weights by 10 conjugate-gradient steps toward the "
                            "best for that mask (0: run every step). On SmolLM2's layers --admm-iterations 200 "
                            "--admm-settle 5 reached 200 full steps' layer loss after 84-98 steps on average; on "
                            "Qwen-1.5B's recommended 16:32 recipe its dev KL was 8% higher, so not the default",
                            minimum=0, maximum=10_000)
    quantize: str = knob("none", "also round the kept weights to a grid, jointly with SparseGPT's pruning: int8 (one "
                         "scale per output row) or int4 (one per --group-size input columns)", choices=QUANTIZATIONS)
    group_size: int = knob(128, "int4: input columns that share a scale (a multiple of 32 packs)", minimum=1)
    scale_search: bool = knob(False, "with --quantize (and --quantize-head): choose each scale (int4 group, int8 row) "
                              "among its largest kept magnitude shrunk by 0-45% in steps of 2.5%, for the least "
                              "rounding loss the solver charges, instead of the largest magnitude itself (clipping). "
                              "Not recommended: with --rounding-sweeps 3 it raised 2:4 + int4's dev KL by 36% on "
                              "Qwen2.5-Coder-1.5B (it fits the calibration's Hessians closer, other inputs worse)")
    rounding_sweeps: int = knob(0, "with --quantize (and --quantize-head): after the solver has rounded, this many "
                                "passes of coordinate descent over the kept weights, each moved to the grid point that "
                                "lowers the layer loss most with the mask and scales held (0: off). Not recommended: "
                                "3 passes with --scale-search cut 2:4 + int4's layer loss on two of "
                                "Qwen2.5-Coder-1.5B's down layers, but raised the decode-calibrated model's dev KL by "
                                "36% and Lee perplexity by 52% (on text-calibrated SmolLM2-135M they cut Lee "
                                "perplexity by 10%)", minimum=0, maximum=1000)
    quantize_head: str = knob("none", "also round lm_head to a grid by GPTQ on the Hessian of its inputs (the final "
                              "normed hidden states at the calibration's kept positions): int8 (one scale per row) or "
                              "int4 (one per --group-size columns); a tied lm_head is untied, the embedding kept. "
                              "With int8 the 8B preset's 2:4 + int4 step ran 5.6% faster in one run; off by default: "
                              "on the dev quarter it lost two problems of 41 (16:32 + int4) or raised KL by 9% "
                              "(16:32 + int8)",
                              choices=QUANTIZATIONS)
    keep_mask: bool = knob(False, "keep the mask the model already has (its zeros; --model a pruned, possibly "
                           "repaired checkpoint of --pattern) and only quantize its kept weights (needs --quantize)")
    dense_linears: str | None = knob(None, "decoder linears to leave dense (neither pruned nor rounded; "
                                     "--repair-steps trains them with the kept weights), by "
                                     "name: comma-separated shell patterns such as 'model.layers.0.*' or "
                                     "'*.mlp.down_proj', each matching at least one linear. They trade speed for "
                                     "quality: the engine runs a fused q|k|v or gate|up linear dense when any of its "
                                     "parts is dense, and `pack` (--pattern auto) keeps them dense", shown="none")
    permute_channels: str = knob("none", "reorder channels the model lets reorder without changing what it "
                                 "computes, before each layer is pruned, so that the N:M groups of down (mlp: the "
                                 "MLP's intermediate channels, gate and up rows with down columns) and also of o "
                                 "(mlp+attention: each KV head's value channels, v rows with the o columns of every "
                                 "query head reading it) drop less saliency (W² times the Hessian diagonal); free at "
                                 "run time. A channel permutation as Pool & Yu chose for 2:4. Recommended with 2:4 "
                                 "(mlp+attention: on Qwen2.5-Coder-1.5B dev KL -9.8%, pass@1 up); not taken by the "
                                 "16:32 recipe",
                                 choices=("none", "mlp", "mlp+attention"))
    permute_scope: str = knob("group", "where --permute-channels may move a column: group (only within its int4 "
                              "scale group of --group-size columns with --quantize int4; anywhere otherwise) or "
                              "layer (anywhere). With int4 values at 2:4 on Qwen2.5-Coder-1.5B the dev KL was 1.156 "
                              "of the unreordered model's with layer and 1.017 with group",
                              choices=("group", "layer"))
    hessian_dtype: str = knob("float32", "Hessian accumulation dtype", choices=("float32", "float64"))
    batch_size: int = knob(8, "sequences per replay batch", minimum=1)


@dataclass(kw_only=True)
class RepairSettings:
    """Fixed-mask repair after the solver (`repair.repair`): the kept weights are trained towards the dense model."""

    repair_steps: int = knob(0, "optimizer steps of fixed-mask distillation from the dense model after pruning "
                             "(0: no repair)", minimum=0)
    repair_lr: float = knob(2e-5, "repair peak learning rate (AdamW, warm-up then cosine)", above=0.0, below=1.0)
    repair_batch: int = knob(16, "repair sequences per optimizer step", minimum=1)
    repair_micro_batch: int = knob(4, "repair sequences per forward/backward pass (memory only)", minimum=1)
    repair_eval_every: int = knob(50, "repair steps between dev KL evaluations", minimum=1)
    repair_patience: int = knob(4, "stop repair after this many evaluations without a better dev KL", minimum=1)
    repair_time_budget: float = knob(600.0, "stop repair after this many seconds of training", above=0.0)
    repair_on_policy: bool = knob(True, "repair on the calibration sequences instead of the pruned model's own "
                                  "sampled answers to the train prompts (dev: to the dev prompts) scored by the dense "
                                  "model", flag="--no-repair-on-policy", shown="on-policy")
    repair_tokens: int = knob(262144, "decode tokens of repair training data", minimum=1)


# Issue 11's dev pick (p16-fit): with the default 16:32 pattern, dense propagation and the self target; since the
# fifty-eighth session with the default solver, admm (benchmarks/results/quality-admm-qwen2.5-coder-1.5b/NOTES.md).
RECIPES = {"recommended": {"prompts": "humaneval:fit", "do_sample": True, "samples_per_prompt": 4, "temperature": 0.7,
                           "top_p": 0.95, "tokens": 32768}}


@dataclass(kw_only=True)
class PruneConfig(RunSettings, CalibrationSettings, SolverSettings, RepairSettings):
    """Every knob of a pruning run (`pipeline.prune`), flat: PruneConfig(model=..., out=..., pattern=..., tokens=...).
    The fields, their defaults and help are those of RunSettings, CalibrationSettings, SolverSettings and
    RepairSettings."""

    def __post_init__(self) -> None:
        """`recipe`: fill the recipe's fields that still hold their defaults (a value given explicitly wins). A
        `SparsityPattern` given as `pattern` is taken as its text."""
        if isinstance(self.pattern, SparsityPattern):
            self.pattern = str(self.pattern)
        elif isinstance(self.pattern, str):  # written as every record then shows it: " 16 : 32" is 16:32
            try:
                self.pattern = DENSE_PATTERN if self.pattern.strip() == DENSE_PATTERN else \
                    str(SparsityPattern.parse(self.pattern))
            except SparsityPatternError:
                pass  # check_values reports it
        if self.recipe not in RECIPES:  # "none", or a bad value that check_values reports
            return
        defaults = {item.name: item.default for item in dataclasses.fields(self)}
        for name, value in RECIPES[self.recipe].items():
            if getattr(self, name) == defaults[name]:
                setattr(self, name, value)

    def validate(self) -> SparsityPattern | None:
        """Check everything that can be checked before loading anything; returns the parsed pattern (None: dense)."""
        from .outputs import check_writable, output_target  # imports torch: not when the CLI is only built

        pattern = self.check_values()
        out = output_target(self.out)
        check_writable(out)
        if out.exists() and not self.overwrite:
            raise OutputExistsError(f"{out} exists; choose another --out or pass --overwrite")
        return pattern

    def check_values(self) -> SparsityPattern | None:
        """The settings' own checks (ranges, choices, the pattern and rules between fields), the output folder aside;
        returns the parsed pattern (None for --pattern dense)."""
        check(self)
        pattern = self.sparsity_pattern()
        if pattern is None and self.quantize == "none":
            raise SparseDecodingError("--pattern dense prunes nothing and, without --quantize, changes nothing; add "
                                      "--quantize int8 or int4 (dense GPTQ), or choose a pattern such as 16:32")
        if self.calibration_source() is not None and self.calibration != "decode":
            raise CalibrationError(f"--calibration-from takes an earlier run's tokens, whatever their source; "
                                   f"--calibration {self.calibration} would draw new ones (and, with self, repair "
                                   f"from new self-written data): drop one of the two")
        if self.calibration in ("text", "mix") and not self.tokens:
            raise SparseDecodingError(f"--calibration {self.calibration} needs a token budget (--tokens N)")
        if self.target == "dense" and self.propagation != "sequential":
            raise SparseDecodingError("--target dense fits the pruned model's inputs to the dense outputs, which differ "
                                      "only with --propagation sequential; add it or use --target self")
        if self.keep_mask and (pattern is None or not pattern.is_nm or self.quantize == "none"):
            raise SparseDecodingError("--keep-mask quantizes the kept weights of an already pruned model: it needs "
                                      "the model's N:M --pattern (such as 2:4) and --quantize int8 or int4 (without "
                                      "--quantize it changes nothing)")
        if self.quantize != "none" and (self.solver not in ("sparsegpt", "admm") or self.repair_steps):
            raise SparseDecodingError(f"--quantize {self.quantize} runs inside SparseGPT's loop (after ADMM's mask "
                                      f"with --solver admm) and needs its result untouched; use --solver sparsegpt "
                                      f"or admm and --repair-steps 0")
        self.dense_linear_patterns()
        if self.permute_channels != "none" and (pattern is None or not pattern.is_nm or self.keep_mask
                                                or self.target == "dense"):
            raise SparseDecodingError(f"--permute-channels {self.permute_channels} reorders channels for an N:M "
                                      f"pattern before the layer is solved: it needs an N:M --pattern, --target self "
                                      f"and no --keep-mask (whose mask is the model's own, in its own order)")
        if self.samples_per_prompt > 1 and not self.do_sample:
            raise SparseDecodingError("--samples-per-prompt needs --sample (greedy continuations would repeat)")
        if self.calibration == "self":
            from .selfdata import SelfDataConfig  # imports torch: only when the source is used

            SelfDataConfig(sources=self.self_sources).mix()
        if self.repair_steps and self.repair_on_policy and self.calibration == "text":
            raise SparseDecodingError("on-policy repair samples answers to task prompts, which --calibration text "
                                      "has none of; use --calibration decode, mix or self, or --no-repair-on-policy")
        if self.repair_steps and self.repair_micro_batch > self.repair_batch:
            raise SparseDecodingError(f"--repair-micro-batch {self.repair_micro_batch} is larger than --repair-batch "
                                      f"{self.repair_batch}; lower it")
        return pattern

    def calibration_source(self) -> Path | None:
        """The calibration file --calibration-from names (a pruned folder's `CALIBRATION_FILE`, or the file itself);
        None without it. A path that holds none is one error line."""
        if self.calibration_from is None:
            return None
        given = Path(self.calibration_from)
        file = given / CALIBRATION_FILE if given.is_dir() else given
        if not file.is_file() or file.suffix != ".safetensors":
            raise CalibrationError(f"--calibration-from {self.calibration_from}: no calibration set there; name an "
                                   f"earlier prune's output folder (it keeps {CALIBRATION_FILE}) or that .safetensors "
                                   f"file")
        return file

    def dense_linear_patterns(self) -> tuple[str, ...]:
        """--dense-linears as its shell patterns (none without it); an empty one is one error line."""
        if self.dense_linears is None:
            return ()
        patterns = tuple(part.strip() for part in self.dense_linears.split(","))
        if not all(patterns):
            raise SparseDecodingError(f"--dense-linears {self.dense_linears!r} holds an empty pattern; give "
                                      f"comma-separated names or shell patterns such as 'model.layers.0.*'")
        return patterns

    def sparsity_pattern(self) -> SparsityPattern | None:
        """The parsed --pattern; None for dense (GPTQ alone)."""
        return None if self.pattern.strip() == DENSE_PATTERN else SparsityPattern.parse(self.pattern)

    def fingerprint(self, inputs: str = "", **resolved) -> str:
        """What must match for a partial run to be resumed: every setting but output handling and the recipe's name
        (its values are in the fields), and `inputs`, a digest of the files the run reads (`pipeline.inputs_digest`).
        `resolved`: fields as the run resolved them (`pipeline.resume_fingerprint`: paths made absolute, the device
        that "auto" picked), so that another spelling of the same run resumes it."""
        relevant = {key: value for key, value in asdict(self).items()
                    if key not in ("out", "overwrite", "command", "recipe")}
        relevant.update(resolved)
        relevant["inputs"] = inputs
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(kw_only=True)
class EvalSettings:
    """How a model is scored (`evaluation.suite`). split: HumanEval half (eval = odd indices, the held-out half; dev
    is the recipe-choice quarter of the calibration side)."""

    metrics: tuple[str, ...] = knob(METRICS, "any of pass@1, kl (needs a reference model), repetition, ppl", cli=False)
    split: str = knob("eval", "HumanEval half for pass@1 (eval: the odd, held-out half; dev: the recipe-choice quarter "
                      "of the calibration half)", choices=SPLITS)
    wording: str = knob("fenced", "HumanEval instruction wording", choices=tuple(HUMANEVAL_INSTRUCTIONS))
    prompts: str | None = knob(None, "prompts for kl/repetition: a .jsonl/.txt file or humaneval:SPLIT",
                               shown="the --split")
    limit: int | None = knob(None, "only the first N problems/prompts (smoke tests)", minimum=1, shown="all")
    max_new_tokens: int = knob(512, "greedy new tokens per prompt", minimum=1)
    gen_batch_size: int = knob(32, "prompts per generation batch", flag="--eval-batch-size", minimum=1)
    score_batch_size: int = knob(8, "sequences per teacher-forced scoring pass", minimum=1)
    ppl_window: int = knob(512, "tokens per perplexity window", minimum=2)
    timeout_s: float = knob(10.0, "sandbox wall/CPU seconds per problem", flag="--timeout", above=0.0)
    memory_mb: int = knob(1024, "sandbox address-space limit in MB (Python needs 64 to start)", minimum=64)
    workers: int | None = knob(None, "parallel sandboxes", minimum=1, shown="CPU count")

    def validate(self, has_reference: bool) -> None:
        unknown = [name for name in self.metrics if name not in METRICS]
        if unknown or not self.metrics:
            raise SparseDecodingError(f"unknown metric(s) {', '.join(unknown) or '(none given)'}; "
                                      f"choose from {', '.join(METRICS)}")
        if "kl" in self.metrics and not has_reference:
            raise SparseDecodingError("the kl metric compares against a dense model: pass --reference DENSE_DIR "
                                      "or leave kl out of --metrics")
        check(self)


def _compare_evaluation() -> EvalSettings:
    return EvalSettings(gen_batch_size=82, score_batch_size=16)


@dataclass(kw_only=True)
class CompareSettings:
    """The quality grid's settings (`compare`); every pruning knob is the one of PruneConfig's groups. samples_per_prompt
    > 1 samples that many continuations per prompt (at temperature / top_p), else greedy."""

    model: str = like(RunSettings, "model", default="qwen2.5-coder-1.5b", help="main model")
    small_model: str = knob("smollm2-135m", "model of the cross-model ablation")
    out: str = like(RunSettings, "out", default="benchmarks/results/quality", help="report folder")
    calib_prompts: str = like(CalibrationSettings, "prompts", flag="--calib-prompts")
    text: str | None = like(CalibrationSettings, "text")
    tokens: int = like(CalibrationSettings, "tokens", help="calibration tokens per source", parse=None)
    max_new_tokens: int = like(CalibrationSettings, "max_new_tokens", flag="--calib-new-tokens")
    samples_per_prompt: int = like(CalibrationSettings, "samples_per_prompt",
                                   help="sampled calibration continuations per prompt (1: greedy)")
    temperature: float = like(CalibrationSettings, "temperature",
                              help="sampling temperature of the calibration continuations (with --samples-per-prompt "
                                   "above 1)")
    top_p: float = like(CalibrationSettings, "top_p",
                        help="sampling top-p of the calibration continuations (with --samples-per-prompt above 1)")
    percdamp: float = like(SolverSettings, "percdamp")
    solver_order: str = like(SolverSettings, "solver_order")
    refit_steps: int = like(SolverSettings, "refit_steps")
    mix_ratio: float = like(CalibrationSettings, "mix_ratio")
    gen_batch_size: int = like(CalibrationSettings, "gen_batch_size", default=82,
                               help="prompts per calibration generation batch")
    batch_size: int = like(SolverSettings, "batch_size")
    device: str = like(RunSettings, "device")
    seed: int = like(RunSettings, "seed")
    evaluation: EvalSettings = knob(help="metric settings", factory=_compare_evaluation, cli=False)
    command: list[str] = like(RunSettings, "command")

    def validate(self) -> None:
        check(self)
        self.evaluation.validate(has_reference=True)
        if shares_problems(self.calib_prompts, self.evaluation.split):
            raise SparseDecodingError(f"--calib-prompts {self.calib_prompts} holds problems of the split pass@1 is "
                                      f"scored on (--split {self.evaluation.split}); calibrate on another split, "
                                      f"such as humaneval:calib against --split eval")

    def comparable(self) -> dict:
        """What every result in one report folder must share."""
        values = asdict(self)
        for key in ("out", "device", "command"):
            values.pop(key)
        values["evaluation"].pop("workers")
        return values
