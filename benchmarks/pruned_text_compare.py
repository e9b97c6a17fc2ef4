"""Pruned checkpoints of one model side by side on held-out text: perplexity, teacher-forced KL(dense‖model) and
top-1 agreement with the dense model on the Lee test corpus, each model's share of mask decisions alike with the
first one's, and its solver seconds and options from its manifest. A CPU-sized check of solver settings on the whole
model (`plan-admm2.json` found TF32 products cost Qwen-1.5B's whole model more than SmolLM2's single layers had
suggested), without sampling or a sandbox: everything is teacher-forced and deterministic.

    PYTHONPATH=src python benchmarks/pruned_text_compare.py --dense smollm2-135m \\
        --pruned f32=/tmp/tf/f32 tf32=/tmp/tf/tf32 --out benchmarks/results/admm_tf32_model_smollm2_cpu.md

Each pruned folder's prune command is listed from its manifest (`sparsedecoding.json`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.data import lee_text
from sparsedecoding.generation import position_ids_from_mask
from sparsedecoding.models import load_model
from sparsedecoding.patterns import PRUNABLE_LINEARS
from sparsedecoding.runenv import environment_markdown


@torch.no_grad()
def text_scores(dense, model, token_ids: list[int], window: int, batch_size: int) -> dict:
    """Perplexity, KL(dense‖model) and top-1 agreement per predicted token over non-overlapping windows."""
    windows = [token_ids[start:start + window] for start in range(0, len(token_ids), window)]
    windows = [piece for piece in windows if len(piece) == window]  # equal lengths: no padding
    if not windows:
        raise SystemExit(f"error: the text has {len(token_ids)} tokens, fewer than one window of {window}")
    nll = kl = agree = 0.0
    count = 0
    for start in range(0, len(windows), batch_size):
        ids = torch.tensor(windows[start:start + batch_size], device=next(model.parameters()).device)
        log_q = model(ids).logits[:, :-1].float().log_softmax(-1)
        log_p = dense(ids).logits[:, :-1].float().log_softmax(-1)
        targets = ids[:, 1:]
        nll -= float(log_q.gather(-1, targets[..., None]).sum())
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        agree += float((log_q.argmax(-1) == log_p.argmax(-1)).sum())
        count += targets.numel()
    return {"ppl": math.exp(nll / count), "kl": kl / count, "top1_agree": agree / count, "tokens": count}


@torch.no_grad()
def decode_scores(dense, model, calibration: CalibrationSet, batch_size: int) -> dict:
    """KL(dense‖model) and top-1 agreement per position at the kept (decode) positions of a calibration set: the
    next-token distributions along the dense model's own answers, teacher-forced, where a decode-calibrated Hessian
    takes its inputs."""
    device = next(model.parameters()).device
    kl = agree = 0.0
    count = 0
    for ids, mask, keep in calibration.batches(batch_size):
        ids, mask, keep = ids.to(device), mask.to(device), keep.to(device)
        positions = position_ids_from_mask(mask)
        log_q = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[keep].float().log_softmax(-1)
        log_p = dense(input_ids=ids, attention_mask=mask, position_ids=positions).logits[keep].float().log_softmax(-1)
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        agree += float((log_q.argmax(-1) == log_p.argmax(-1)).sum())
        count += int(keep.sum())
    return {"decode_kl": kl / count, "decode_top1_agree": agree / count, "decode_tokens": count}


def masks(folder: Path) -> dict[str, torch.Tensor]:
    """The kept-weight masks of every prunable linear in a pruned folder's safetensors files."""
    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as handle:
            for name in handle.keys():
                if name.endswith(".weight") and name.split(".")[-2] in PRUNABLE_LINEARS:
                    found[name] = handle.get_tensor(name) != 0
    if not found:
        raise SystemExit(f"error: {folder} holds no prunable linear weights")
    return found


def same_share(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise SystemExit("error: the pruned folders hold different linears; prune the same model")
    same = sum(int((a[name] == b[name]).sum()) for name in a)
    return same / sum(mask.numel() for mask in a.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dense", required=True, help="the dense model (folder or offline name)")
    parser.add_argument("--pruned", nargs="+", required=True, metavar="NAME=FOLDER",
                        help="pruned folders of the same model; the first is the masks' reference")
    parser.add_argument("--window", type=int, default=512, help="tokens a window (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=None, help="only the first N tokens of the Lee test text")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--decode-set", type=Path, default=None,
                        help="also score KL and top-1 agreement at the decode positions of this calibration set "
                             "(a .safetensors file from a prune folder's calibration/; use one no model was pruned "
                             "from)")
    parser.add_argument("--out", required=True, help="the markdown report")
    args = parser.parse_args(argv)
    pairs = [item.partition("=") for item in args.pruned]
    bad = [item for item, (name, sep, folder) in zip(args.pruned, pairs) if not sep or not name or not folder]
    if bad:
        parser.error(f"--pruned takes NAME=FOLDER; got {', '.join(bad)}")
    folders = {name: Path(folder) for name, _, folder in pairs}
    if len(folders) != len(pairs):
        parser.error("--pruned names must differ")
    for name, folder in folders.items():
        if not (folder / "sparsedecoding.json").is_file():
            parser.error(f"--pruned {name}={folder}: not a pruned folder (no sparsedecoding.json)")
    if args.window < 2 or args.batch_size < 1:
        parser.error("--window must be at least 2 and --batch-size at least 1")
    if args.max_tokens is not None and args.max_tokens < args.window:
        parser.error(f"--max-tokens {args.max_tokens} is less than one window of {args.window}")
    if not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    decode_set = None
    if args.decode_set is not None:
        try:
            decode_set = CalibrationSet.load(args.decode_set)
        except (OSError, SafetensorError, KeyError, TypeError) as error:  # one line, before any model loads
            parser.error(f"--decode-set {args.decode_set}: not a calibration set ({error!r})")
    started = time.perf_counter()
    dense, tokenizer, _ = load_model(args.dense, args.device, torch.float32)
    dense.eval()
    token_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:args.max_tokens]

    def scores(model) -> dict:
        found = text_scores(dense, model, token_ids, args.window, args.batch_size)
        return found if decode_set is None else {**found, **decode_scores(dense, model, decode_set, args.batch_size)}

    rows = [{"name": "dense", **scores(dense)}]
    reference = None
    for name, folder in folders.items():
        manifest = json.loads((folder / "sparsedecoding.json").read_text())
        model, _, _ = load_model(folder, args.device, torch.float32)
        model.eval()
        found = masks(folder)
        reference = reference or found
        rows.append({"name": name, **scores(model),
                     "same_mask": same_share(found, reference),
                     "solver_s": manifest["timing"]["solver_seconds_this_run"],
                     "command": " ".join(manifest["command"])})
        print(f"{name}: ppl {rows[-1]['ppl']:.3f}, KL {rows[-1]['kl']:.5f}", flush=True)
        del model
    base = rows[1]
    decode_head = " decode KL | x first | decode top-1 agree |" if decode_set is not None else ""
    lines = ["| model | Lee ppl | x first | KL(dense‖model) | x first | top-1 agree |" + decode_head
             + " masks alike the first's | solver s |",
             "|---|---|---|---|---|---|" + ("---|---|---|" if decode_set is not None else "") + "---|---|"]
    for row in rows:
        pruned = row["name"] != "dense"
        decode = ""
        if decode_set is not None:
            decode = (f" {row['decode_kl']:.5f} | " + (f"{row['decode_kl'] / base['decode_kl']:.3f}" if pruned else "-")
                      + f" | {row['decode_top1_agree']:.4f} |")
        lines.append(f"| {row['name']} | {row['ppl']:.3f} | {row['ppl'] / base['ppl']:.3f} | {row['kl']:.5f} | "
                     + (f"{row['kl'] / base['kl']:.3f}" if pruned else "-") + f" | {row['top1_agree']:.4f} |"
                     + decode + (f" {row['same_mask']:.2%} | {row['solver_s']:.0f}" if pruned else " - | -") + " |")
    report = ("# Pruned checkpoints side by side on held-out text (teacher-forced)\n\n"
              + environment_markdown(" ".join(["python", *sys.argv]), torch.device(args.device))
              + f"- text: the Lee test corpus, {rows[0]['tokens']} predicted tokens in windows of {args.window}; "
              + "KL and agreement against the dense model on the same windows; float32 weights as stored\n"
              + (f"- decode set: `{args.decode_set}`, {rows[0]['decode_tokens']} decode positions (the dense model's "
                 "own answers, teacher-forced; KL and top-1 agreement of the next token there)\n"
                 if decode_set is not None else "")
              + "- pruned with:\n" + "".join(f"  - {row['name']}: `{row['command']}`\n" for row in rows[1:])
              + "\n" + "\n".join(lines) + f"\n\nWhole run: {time.perf_counter() - started:.0f} s\n")
    Path(args.out).write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
