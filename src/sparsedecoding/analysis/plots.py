"""PNG figures of the two analyses, drawn from their JSON results (so they can be redrawn on another machine with
`sparsedecoding analyze plot DIR`). matplotlib is an optional dependency (`pip install sparsedecoding[plots]`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SparseDecodingError


def require_matplotlib():
    """The pyplot module on the non-interactive Agg backend; a clear error where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise SparseDecodingError("matplotlib is not installed: pip install 'sparsedecoding[plots]', or pass "
                                  "--no-plot and draw later with `sparsedecoding analyze plot OUT`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_discrepancy(summary: list[dict], path: Path, title: str) -> None:
    """Left: median ε_text/ε_decode per retained fraction ρ with the interquartile band (above 1: decode-time
    calibration is closer to held-out decoding). Right: share of modules where ε_decode < ε_text."""
    plt = require_matplotlib()
    rhos = [row["rho"] for row in summary]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    left.fill_between(rhos, [row["ratio_q1"] for row in summary], [row["ratio_q3"] for row in summary],
                      alpha=0.25, label="interquartile range")
    left.plot(rhos, [row["median_ratio"] for row in summary], marker="o", label="median")
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set(xscale="log", xlabel="retained fraction ρ", ylabel="ε_text / ε_decode", title="discrepancy ratio")
    left.legend()
    right.plot(rhos, [100 * row["decode_smaller_share"] for row in summary], marker="o")
    right.axhline(50, color="grey", linestyle="--", linewidth=1)
    right.set(xscale="log", xlabel="retained fraction ρ", ylabel="% of modules", ylim=(0, 100),
              title="modules where ε_decode < ε_text")
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_drift(layers: list[dict], path: Path, title: str) -> None:
    """One curve per decoder layer: mean relative distance of the pruned model's layer input from the dense one's
    over decode steps, coloured from the first layer (dark) to the last (light)."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    colours = plt.get_cmap("viridis")
    for layer in layers:
        steps = range(1, len(layer["curve"]) + 1)
        axes.plot(steps, layer["curve"], color=colours(layer["layer"] / max(len(layers) - 1, 1)), linewidth=1)
    scale = plt.cm.ScalarMappable(cmap=colours, norm=plt.Normalize(0, len(layers) - 1))
    figure.colorbar(scale, ax=axes, label="layer")
    axes.set(xlabel="decode step t", ylabel="‖x_pruned − x_dense‖ / ‖x_dense‖", title=title)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def redraw(folder: str | Path) -> Path:
    """Draw the PNG of an analysis folder from its JSON (for results computed with --no-plot); returns the PNG."""
    folder = Path(folder)
    if (folder / "discrepancy.json").exists():
        payload = json.loads((folder / "discrepancy.json").read_text())
        draw, data, title, name = plot_discrepancy, payload["summary"], Path(payload["model"]).name, "discrepancy"
    elif (folder / "drift.json").exists():
        payload = json.loads((folder / "drift.json").read_text())
        draw, data, title, name = plot_drift, payload["layers"], f"{Path(payload['pruned']).name} vs dense", "drift"
    else:
        raise SparseDecodingError(f"{folder} holds neither discrepancy.json nor drift.json; pass a folder written by "
                                  f"`sparsedecoding analyze discrepancy` or `analyze drift`")
    partial = folder / f"{name}.partial.png"
    draw(data, partial, title)
    os.replace(partial, folder / f"{name}.png")
    return folder / f"{name}.png"
