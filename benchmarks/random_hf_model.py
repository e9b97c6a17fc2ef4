"""A transformers folder with random weights in the shape of an engine preset, plus a real tokenizer: for speed
benchmarks of code paths that take an HF folder (generation, `sparsify`) when the real checkpoint is not on the
machine. Speed does not depend on the weights' values; a random model never emits end-of-turn, so every row runs to
its token limit (the report must say the model was random).

    python benchmarks/random_hf_model.py --preset qwen2.5-coder-1.5b --tokenizer TOKENIZER_DIR --out DIR [--prune 2:4]

`--prune N:M` zeroes all but the N largest of every M weights of each decoder linear (magnitude), so `sparsify` finds
a kernel pattern.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from sparsedecoding import solvers
from sparsedecoding.engine.config import preset
from sparsedecoding.hessian import prunable_linears


RANDOM_RECORD = "random_weights.json"  # written into the folder, so that reports on it can say the weights are random


def hf_config(name: str):
    args = preset(name)
    if args.architecture not in ("llama", "qwen2"):
        raise SystemExit(f"{name}: only llama and qwen2 presets are written as HF folders here")
    return AutoConfig.for_model(
        args.architecture, vocab_size=args.vocab_size, hidden_size=args.dim, num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads, head_dim=args.head_dim,
        intermediate_size=args.intermediate_size, rms_norm_eps=args.norm_eps, rope_theta=args.rope_theta,
        tie_word_embeddings=args.tie_embeddings, max_position_embeddings=32768, dtype="bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen2.5-coder-1.5b")
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder with the model's tokenizer files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prune", default=None, help="N:M magnitude pruning of every decoder linear")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(hf_config(args.preset), dtype=torch.bfloat16)
    if args.prune:
        for layer in model.model.layers:
            for linear in prunable_linears(layer).values():
                linear.weight.data = solvers.magnitude(linear.weight.data, None, args.prune)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]) \
        if "<|im_end|>" in tokenizer.get_vocab() else tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(args.out)
    for file in args.tokenizer.iterdir():
        shutil.copy(file, args.out / file.name)
    (args.out / RANDOM_RECORD).write_text(json.dumps({"preset": args.preset, "prune": args.prune, "seed": 0}) + "\n",
                                          encoding="utf-8")
    print(f"random {args.preset}{' pruned ' + args.prune if args.prune else ''} written to {args.out}")


if __name__ == "__main__":
    main()
