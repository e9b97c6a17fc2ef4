"""Calibration discrepancy: how far a calibration Hessian H_C is from the decode-time Hessian H_dec, measured where
pruning errors matter.

A layer's reconstruction loss for a weight change δ (one row of ΔW) is δᵀHδ. With H_dec = U Λ Uᵀ (eigenvalues in
decreasing order) and U_k, Λ_k its top-k eigenpairs, every δ = U_k Λ_k^{-1/2} z in that eigenspace has
δᵀH_decδ = ‖z‖², so

    ε_C = max_δ |δᵀ(H_C − H_dec)δ| / δᵀH_decδ = ‖Λ_k^{-1/2} U_kᵀ (H_C − H_dec) U_k Λ_k^{-1/2}‖₂

is the worst-case relative gap between the calibration and decode-time losses over those weight changes, with
k = max(1, ⌈ρ·d_in⌉) for a retained fraction ρ. H_dec comes from the dense model decoding held-out prompts; C = text
(teacher-forced natural text) and C = decode (the dense model decoding the calibration prompts) use the same number of
tokens. Eigenvalues below `RANK_TOLERANCE`·λ₁ are numerically zero: a k reaching them gives ε = NaN (H_dec has too
little data there), counted and reported, never replaced.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from ..calibration import decode_calibration, describe, text_calibration, text_windows
from ..data import lee_text, prompts_hash, read_prompts
from ..errors import SparseDecodingError
from ..outputs import check_output, markdown_table, output_folder
from ..hessian import collect_hessians
from ..models import load_model
from ..invocation import command
from ..runenv import environment, environment_lines, pick_device, versions, write_json
from ..settings import CALIBRATION_TOKENS, SEED_MAX
from .plots import plot_discrepancy, require_matplotlib

RHOS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.50)
RANK_TOLERANCE = 1e-10


class DiscrepancySettingsError(SparseDecodingError, ValueError):
    """Discrepancy settings that cannot work: a token count or batch size below 1, a ρ outside (0, 1], an unknown
    Hessian dtype."""


def retained_rank(rho: float, d_in: int) -> int:
    """k = max(1, ⌈ρ·d_in⌉)."""
    return max(1, math.ceil(rho * d_in - 1e-9))  # the guard keeps exact products (0.5·64) from rounding up


def decreasing_eigh(H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (decreasing) and eigenvectors (columns) of a symmetric matrix, in float64."""
    eigenvalues, eigenvectors = torch.linalg.eigh(H.double())
    return eigenvalues.flip(0), eigenvectors.flip(1)


def discrepancies(H_C: torch.Tensor, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, H_dec: torch.Tensor,
                  ks: list[int]) -> list[float]:
    """ε_C for each k in `ks` (see the module docstring), from H_dec's decreasing eigenpairs. The projection onto the
    largest k is computed once; each smaller k reads its leading block."""
    K = max(ks)
    U = eigenvectors[:, :K]
    projected = U.T @ (H_C.double() - H_dec.double()) @ U
    scale = eigenvalues[:K].clamp(min=0).rsqrt()
    whitened = scale[:, None] * projected * scale[None, :]
    floor = RANK_TOLERANCE * float(eigenvalues[0])
    result = []
    for k in ks:
        if float(eigenvalues[k - 1]) <= floor:
            result.append(float("nan"))
            continue
        block = whitened[:k, :k]
        result.append(float(torch.linalg.eigvalsh((block + block.T) / 2).abs().max()))
    return result


def discrepancy(H_C: torch.Tensor, H_dec: torch.Tensor, k: int) -> float:
    """ε_C for one k."""
    eigenvalues, eigenvectors = decreasing_eigh(H_dec)
    return discrepancies(H_C, eigenvalues, eigenvectors, H_dec, [k])[0]


def module_discrepancies(H_dec: dict[str, torch.Tensor], H_text: dict[str, torch.Tensor],
                         H_decode: dict[str, torch.Tensor], rhos: tuple[float, ...] = RHOS) -> list[dict]:
    """Per module and ρ: ε_text and ε_decode. Modules that read one input share one Hessian object (q/k/v, gate/up),
    so each distinct triple is decomposed once."""
    done: dict[tuple[int, int, int], tuple[list[float], list[float]]] = {}
    records = []
    for name, dec in H_dec.items():
        key = (id(dec), id(H_text[name]), id(H_decode[name]))
        if key not in done:
            ks = [retained_rank(rho, dec.shape[0]) for rho in rhos]
            eigenvalues, eigenvectors = decreasing_eigh(dec)
            done[key] = (discrepancies(H_text[name], eigenvalues, eigenvectors, dec, ks),
                         discrepancies(H_decode[name], eigenvalues, eigenvectors, dec, ks))
        eps_text, eps_decode = done[key]
        records.append({"module": name, "d_in": dec.shape[0],
                        "eps_text": dict(zip(map(str, rhos), eps_text)),
                        "eps_decode": dict(zip(map(str, rhos), eps_decode))})
    return records


def summarize(records: list[dict], rhos: tuple[float, ...] = RHOS) -> list[dict]:
    """Per ρ over modules with finite values: median ε_text/ε_decode (with quartiles), the share of modules where
    decode is smaller, the medians of each ε, and how many modules had a rank-deficient H_dec."""
    rows = []
    for rho in rhos:
        pairs = [(record["eps_text"][str(rho)], record["eps_decode"][str(rho)]) for record in records]
        finite = [(text, decode) for text, decode in pairs if math.isfinite(text) and math.isfinite(decode)]
        ratios = [text / decode for text, decode in finite if decode > 0]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [math.nan] * 3
        rows.append({
            "rho": rho, "modules": len(finite), "rank_deficient": len(pairs) - len(finite),
            "median_ratio": statistics.median(ratios) if ratios else math.nan,
            "ratio_q1": quartiles[0], "ratio_q3": quartiles[2],
            "decode_smaller_share": sum(decode < text for text, decode in finite) / len(finite) if finite else math.nan,
            "median_eps_text": statistics.median(text for text, _ in finite) if finite else math.nan,
            "median_eps_decode": statistics.median(decode for _, decode in finite) if finite else math.nan,
        })
    return rows


def report(payload: dict) -> str:
    """The markdown summary of a discrepancy run."""
    rows = [[row["rho"], row["modules"], row["median_ratio"], f"{row['ratio_q1']:.3g}–{row['ratio_q3']:.3g}",
             f"{100 * row['decode_smaller_share']:.1f}%", row["median_eps_text"], row["median_eps_decode"],
             row["rank_deficient"]] for row in payload["summary"]]
    tokens = payload["calibration"]
    return (
        f"# Calibration discrepancy: {payload['model']}\n\n"
        f"H_dec: dense decode on `{payload['settings']['heldout']}` ({tokens['heldout']['tokens']} tokens); "
        f"decode calibration on `{payload['settings']['calib_prompts']}` ({tokens['decode']['tokens']} tokens); "
        f"text calibration on `{payload['settings']['text']}` ({tokens['text']['tokens']} tokens). "
        f"ε_C = ‖Λ_k^(-1/2) U_kᵀ (H_C − H_dec) U_k Λ_k^(-1/2)‖₂ over the top k = max(1, ⌈ρ·d_in⌉) eigenpairs of "
        f"H_dec, for every prunable linear. For reference, the paper reports medians of 1.81-3.26 with decode "
        f"smaller in at least 87% of modules (Qwen3-14B/32B).\n\n"
        + markdown_table(["ρ", "modules", "median ε_text/ε_decode", "IQR", "decode smaller", "median ε_text",
                          "median ε_decode", "rank-deficient H_dec"], rows)
        + "\n" + environment_lines(payload["environment"], " ".join(payload["command"]))
    )


@torch.no_grad()
def run_discrepancy(model: str, out: str | Path, *, heldout: str = "humaneval:eval",
                    calib_prompts: str = "humaneval:calib", text: str | None = None, tokens: int = CALIBRATION_TOKENS,
                    max_new_tokens: int = 512,
                    rhos: tuple[float, ...] = RHOS, gen_batch_size: int = 32, batch_size: int = 8,
                    hessian_dtype: str = "float64", device: str = "auto", seed: int = 0, plot: bool = True,
                    overwrite: bool = False, progress: bool = True) -> Path:
    """Measure ε_text and ε_decode for every prunable linear of `model` and write discrepancy.{json,md,png} to OUT.

    heldout: prompts whose dense decoding gives H_dec (all generated tokens). calib_prompts / tokens: the decode
    calibration source and its token budget; the text source (`text` file, default the Lee background corpus) gets
    exactly as many tokens. hessian_dtype: accumulation
    and decomposition precision (float64 by default: small eigenvalues matter here)."""
    out = Path(out)
    check_output(out, overwrite, inputs=(model, heldout, calib_prompts, text))
    counts = {"--tokens": tokens, "--max-new-tokens": max_new_tokens, "--gen-batch-size": gen_batch_size,
              "--batch-size": batch_size}
    for option, value in counts.items():
        if value < 1:
            raise DiscrepancySettingsError(f"{option} must be at least 1, got {value}")
    if not 0 <= seed <= SEED_MAX:  # the text windows' order comes from a torch generator
        raise DiscrepancySettingsError(f"--seed must be in [0, {SEED_MAX}], got {seed}")
    if not rhos or not all(0.0 < rho <= 1.0 for rho in rhos):
        raise DiscrepancySettingsError(f"--rhos must be fractions in (0, 1], got {', '.join(map(str, rhos)) or 'none'}")
    if hessian_dtype not in ("float32", "float64"):
        raise DiscrepancySettingsError(f"--hessian-dtype must be float32 or float64, got {hessian_dtype!r}")
    if plot:
        require_matplotlib()
    heldout_prompts, calibration_prompts = read_prompts(heldout), read_prompts(calib_prompts)
    if text and not Path(text).is_file():
        raise SparseDecodingError(f"--text {text} is not a file; pass a natural-text file or leave it out (Lee corpus)")
    # Read as the pipeline reads its --text, so both see the same tokens.
    text_body = Path(text).read_text(encoding="latin-1") if text else lee_text("background")
    if prompts_hash(heldout_prompts) == prompts_hash(calibration_prompts):
        raise SparseDecodingError("the held-out and calibration prompts are the same list; H_dec must come from "
                                  "prompts the calibration never saw (e.g. humaneval:eval vs humaneval:calib)")
    started = time.perf_counter()
    torch_device = pick_device(device)
    dense, tokenizer, folder = load_model(model, torch_device)
    text_windows(tokenizer, text_body, tokens, 512)  # the text gets as many tokens as decode: at most --tokens
    generation = {"max_new_tokens": max_new_tokens, "batch_size": gen_batch_size, "progress": progress}
    sets = {"heldout": decode_calibration(dense, tokenizer, heldout_prompts, **generation)}
    sets["decode"] = decode_calibration(dense, tokenizer, calibration_prompts, token_budget=tokens, **generation)
    sets["text"] = text_calibration(tokenizer, text_body, token_budget=sets["decode"].tokens, seed=seed)
    dtype = getattr(torch, hessian_dtype)
    hessians = {source: collect_hessians(dense, calib, batch_size=batch_size, dtype=dtype, progress=progress)
                for source, calib in sets.items()}
    del dense
    records = module_discrepancies(hessians["heldout"], hessians["text"], hessians["decode"], rhos)
    payload = {
        "model": str(folder), "summary": summarize(records, rhos),
        "calibration": {source: describe(calib) for source, calib in sets.items()},
        "settings": {"heldout": heldout, "calib_prompts": calib_prompts, "text": text or "lee_background.cor",
                     "tokens": tokens,
                     "max_new_tokens": max_new_tokens, "rhos": list(rhos), "hessian_dtype": hessian_dtype,
                     "seed": seed},
        "seconds": round(time.perf_counter() - started, 1), "versions": versions(),
        "environment": environment(torch_device), "command": command(), "modules": records,
    }
    with output_folder(out, overwrite) as folder_out:
        write_json(folder_out / "discrepancy.json", payload)
        (folder_out / "discrepancy.md").write_text(report(payload), encoding="utf-8")
        if plot:
            plot_discrepancy(payload["summary"], folder_out / "discrepancy.png", Path(payload["model"]).name)
    return out
