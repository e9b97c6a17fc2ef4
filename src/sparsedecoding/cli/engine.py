"""`sparsedecoding generate` (stream text from a model with the decode engine) and `sparsedecoding bench` (dense
and sparse decode speed side by side in one process). Both run tensor-parallel when started by
`torchrun --nproc-per-node N -m sparsedecoding ...`: every rank runs the command on its shards and rank 0 prints."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path

from ..errors import EngineError
from ..patterns import SparsityPattern
from ..settings import SEED_MAX, add_all_reduce_option
from .check import check_report_path

log = logging.getLogger(__name__)


# engine.config.PRESETS' names, spelled out so that `--help` does not import torch (a test keeps the two equal).
PRESET_NAMES = ("llama-3.1-8b", "llama-3.3-70b", "qwen3-14b", "qwen3-32b", "qwen2.5-coder-1.5b", "smollm2-135m")


def register(subparsers: argparse._SubParsersAction) -> None:
    generate = subparsers.add_parser(
        "generate", help="stream a continuation with the compiled decode engine",
        description="Stream a continuation of --prompt from a dense, pruned or packed checkpoint with the decode "
                    "engine (static KV cache; on CUDA compiled and captured in a CUDA graph). N:M sparse linears run "
                    "the packed kernel on CUDA; on the CPU the dense weights run, since the kernel is CUDA-only. Under "
                    "`torchrun --nproc-per-node N -m sparsedecoding generate ...` the model is split over N GPUs "
                    "(tensor parallel, NCCL; gloo with --device cpu) and rank 0 prints.")
    generate.add_argument("--model", required=True, type=Path, help="HF safetensors folder or packed checkpoint")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--chat", action="store_true",
                          help="wrap the prompt in the tokenizer's chat template (default: off)")
    generate.add_argument("--new-tokens", type=int, default=256, help="tokens to generate at most (default: 256)")
    generate.add_argument("--sparse", choices=["none", "auto", "packed"], default="auto",
                          help="auto: pack every N:M block linear; packed: require all to be N:M; none: all dense "
                               "(default: auto)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    generate.add_argument("--top-k", type=int, help="sample among the k likeliest tokens (default: all)")
    generate.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    generate.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1 ... "
                          "(default: auto)")
    generate.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                          help="weights and activations; packed linears need bfloat16 or float16 (default: bfloat16)")
    generate.add_argument("--no-compile", action="store_true",
                          help="eager decode steps, no torch.compile or CUDA graph (default: off)")
    add_all_reduce_option(generate)
    generate.set_defaults(func=_generate)

    bench = subparsers.add_parser(
        "bench", help="decode tok/s of dense vs sparse weights, same process (CUDA)",
        description="Measure decode speed (tok/s of decode steps, prefill excluded; median over repeats) of dense and "
                    "N:M sparse weights in one process, with the weight bytes each step reads and the achieved "
                    "bandwidth against a device-to-device copy. Needs a CUDA device. Under "
                    "`torchrun --nproc-per-node N -m sparsedecoding bench ...` every model is split over N GPUs "
                    "(tensor parallel) and the byte counts and bandwidth are per GPU.")
    source = bench.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help="random weights of a named architecture: " + ", ".join(PRESET_NAMES))
    source.add_argument("--model", type=Path, help="an HF folder with N:M-pruned weights (zeros kept)")
    bench.add_argument("--pattern", nargs="+", help="N:M patterns for --preset (default: 2:4)")
    bench.add_argument("--quantize", nargs="+", choices=["none", "int8", "int4"], default=["none"],
                       help="value formats of the block linears for --preset: none (bf16), int8 (one scale a row), "
                            "int4 (one scale per --group-size columns); each quantized format is measured dense "
                            "(PyTorch's weight-only int8/int4 matmuls) and with every --pattern (the quantized N:M "
                            "kernel). The bf16 dense model is always measured: ratios are against it "
                            "(default: none)")
    bench.add_argument("--group-size", type=int, default=128,
                       help="int4: input columns that share a scale, a multiple of 32 (default: 128)")
    bench.add_argument("--batch", nargs="+", type=int, default=[1], help="batch sizes (default: 1)")
    bench.add_argument("--dense-copy-from-batch", type=int, metavar="B",
                       help="also measure the sparse model holding a dense copy of each packed linear with 16-bit "
                            "values, used from batch B on; smaller batches stay on the sparse kernels, the 2:4 "
                            "tensor-core ones included (the packed 16:32 kernel is slower than cuBLAS from about "
                            "batch 3, 16:32+2 on the 2:4 kernel from batch 8; costs the memory of both) "
                            "(default: off)")
    bench.add_argument("--new-tokens", type=int, default=256, help="decode steps per generation (default: 256)")
    bench.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (default: 16)")
    bench.add_argument("--repeats", type=int, default=3, help="timed generations per row (default: 3)")
    add_all_reduce_option(bench)
    bench.add_argument("--out", type=Path, help="also write the markdown report here, and its rows, settings and "
                       "environment as JSON beside it (the same name ending .json) (default: print only)")
    bench.set_defaults(func=_bench)


def _check_kernel_setting() -> None:
    """The engine's environment settings (`kernels.op.settings`) are read when the model is built, compiled or first
    runs; a bad value fails here, before any loading."""
    from ..kernels.op import settings

    settings()


def _check_generate_args(args: argparse.Namespace) -> None:
    """The request's own values, checked before the model loads (the engine would refuse them only after)."""
    if args.new_tokens < 1:
        raise EngineError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if not args.prompt:
        raise EngineError("--prompt is empty; give the text to continue")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise EngineError(f"--temperature {args.temperature} must be a finite number of at least 0 (0 = greedy)")
    if args.top_k is not None and args.top_k < 1:
        raise EngineError(f"--top-k must be at least 1, got {args.top_k}")
    if not 0 <= args.seed <= SEED_MAX:
        raise EngineError(f"--seed must be in [0, {SEED_MAX}], got {args.seed}")


def _generate(args: argparse.Namespace) -> int:
    from ..engine.config import check_model_folder
    from ..engine.parallel import start_from_env
    from ..runenv import pick_device

    _check_kernel_setting()
    _check_generate_args(args)
    check_model_folder(args.model)
    with start_from_env(pick_device(args.device), args.all_reduce) as (tp, device):
        return _generate_on(args, device, tp)


def _generate_on(args: argparse.Namespace, device, tp) -> int:
    """generate on `device`, with this rank's shards when `tp` is a process group; only rank 0 prints."""
    import torch

    from ..engine import Engine, Sampling, load_model
    from ..models import check_fits_context, load_tokenizer

    first = tp is None or tp.rank() == 0
    dense_instead = args.sparse == "auto" and device.type != "cuda"
    sparse = "none" if dense_instead else args.sparse
    if sparse != "none" and args.dtype == "float32":
        raise EngineError(f"--sparse {sparse} runs N:M linears packed, in bfloat16 or float16, not float32; pass "
                          f"--dtype bfloat16 or float16, or --sparse none")
    tokenizer = load_tokenizer(args.model)
    if args.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
    else:
        ids = tokenizer(args.prompt)["input_ids"]
    if not ids:
        raise EngineError(f"--prompt {args.prompt!r} encodes to no tokens; give text to continue")
    check_fits_context(Path(args.model), args.new_tokens, "--new-tokens", EngineError, prompt_tokens=len(ids))
    model = load_model(args.model, sparse=sparse, dtype=getattr(torch, args.dtype), device=device, tp=tp)
    if dense_instead and first:  # said once the model loaded, so a bad model still gives one error line
        print(f"generate: running the dense weights on {device.type}: the packed N:M kernel is CUDA-only, and its "
              f"reference implementation here is many times slower than dense (--sparse packed forces it)",
              file=sys.stderr)
    engine = Engine(model, 1, len(ids) + args.new_tokens, Sampling(args.temperature, args.top_k),
                    compile=device.type == "cuda" and not args.no_compile)
    stops = _stop_ids(args.model, tokenizer)
    generated: list[int] = []
    shown = ""
    start = time.perf_counter()
    for token in engine.stream(torch.tensor([ids]), args.new_tokens, seed=args.seed):
        token_id = int(token[0])
        if token_id in stops:
            break
        generated.append(token_id)
        text = tokenizer.decode(generated, skip_special_tokens=True)
        if first and not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            print(text[len(shown):], end="", flush=True)
            shown = text
    elapsed = time.perf_counter() - start
    if not first:
        return 0
    print()
    log.info("%d tokens in %.2f s (%.1f tok/s, streaming syncs once per token)", len(generated), elapsed,
             len(generated) / elapsed)
    return 0


def _stop_ids(folder: Path, tokenizer) -> set[int]:
    from transformers import GenerationConfig

    from ..models import read_config

    # as models.stop_token_ids: the generation config's, else config.json's, else the tokenizer's
    eos = GenerationConfig.from_pretrained(folder).eos_token_id if (folder / "generation_config.json").exists() \
        else None
    if eos is None:
        eos = read_config(folder).get("eos_token_id")
    if eos is None:
        eos = tokenizer.eos_token_id
    return {eos} if isinstance(eos, int) else set(eos or [])


def _bench(args: argparse.Namespace) -> int:
    import torch

    _check_kernel_setting()
    from ..engine.bench import (bench_folder, bench_preset, check_group_size, check_plan, check_timing,
                                copy_bandwidth, format_table, results_records)
    from ..engine.config import check_model_folder, preset
    from ..engine.parallel import start_from_env
    from ..kernels.op import settings, settings_line
    from ..invocation import command as invocation
    from ..runenv import environment, environment_markdown, write_json

    if args.model is not None and args.pattern:
        raise EngineError("--pattern applies to --preset; a --model folder is measured with its own N:M weights")
    if args.model is not None and args.quantize != ["none"]:
        raise EngineError("--quantize applies to --preset; a --model folder is measured with its own weights (pack "
                          "a `prune --quantize` checkpoint to measure its quantized values)")
    # parsed here rather than by argparse, which would hide the pattern error's advice behind "invalid value"
    patterns = [SparsityPattern.parse(text) for text in args.pattern or ["2:4"]]
    bf16 = "none" in args.quantize
    plan = [(None, args.batch)] + [(pattern, args.batch) for pattern in patterns if bf16]
    dense_from = args.dense_copy_from_batch
    if dense_from is not None:
        wider = [batch for batch in args.batch if batch >= dense_from]
        if not wider:
            raise EngineError(f"--dense-copy-from-batch {dense_from} is above every --batch {args.batch}; "
                              "nothing would use the copies")
        if not bf16:
            raise EngineError("--dense-copy-from-batch keeps copies of bf16 packed weights; add none to --quantize")
        plan += [(pattern, wider, dense_from) for pattern in patterns]
    quantized_plan = [(None, args.batch)] + [(pattern, args.batch) for pattern in patterns]
    quantizations = list(dict.fromkeys(q for q in args.quantize if q != "none"))
    model_args = preset(args.preset) if args.preset else None  # bad requests fail here, before any GPU work
    check_plan(plan, args.new_tokens)
    for quantize in quantizations:
        check_plan(quantized_plan, args.new_tokens, quantize, args.group_size)
        check_group_size(model_args, quantize, args.group_size)
    check_timing(args.prompt_tokens, args.repeats)
    if args.out:
        if args.out.suffix == ".json":
            raise EngineError(f"--out {args.out} names the markdown report; give it another ending, such as .md (the "
                              "JSON goes beside it)")
        check_report_path(args.out, args.model)
        check_report_path(args.out.with_suffix(".json"), args.model)
    if args.model is not None:
        check_model_folder(args.model, tokenizer=False)  # bench feeds token ids, it never tokenizes
    if not torch.cuda.is_available():
        raise EngineError("bench measures GPU decode speed and needs a CUDA device")
    with start_from_env(torch.device("cuda"), args.all_reduce) as (tp, device):
        copy = copy_bandwidth(device)
        if args.preset:
            results = bench_preset(args.preset, plan, device, args.prompt_tokens, args.new_tokens, args.repeats, tp)
            for quantize in quantizations:
                results += bench_preset(args.preset, quantized_plan, device, args.prompt_tokens, args.new_tokens,
                                        args.repeats, tp, quantize, args.group_size)
        else:
            results = bench_folder(args.model, args.batch, device, args.prompt_tokens, args.new_tokens, args.repeats,
                                   dense_from, tp)
        if tp is not None and tp.rank() != 0:
            return 0
    command = " ".join(invocation())
    if tp is not None:
        command = f"torchrun --nproc-per-node {tp.size()} -m {command}"
    report = environment_markdown(command, device) + "\n" + settings_line() + "\n\n" + format_table(results, copy)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        write_json(args.out.with_suffix(".json"), {
            "command": command, "environment": environment(device), "settings": settings(),
            "copy_bytes_per_second": copy, "results": results_records(results, copy)})
    return 0
