"""PNG figures of the two analyses and of a `compare` report, drawn from their JSON results (so they can be drawn on
another machine with `sparsedecoding analyze plot DIR`). matplotlib is an optional dependency
(`pip install sparsedecoding[plots]`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SparseDecodingError


class AnalysisResultError(SparseDecodingError):
    """A folder given to `analyze plot` whose analysis JSON is missing, empty, cut short or lacks what a figure
    needs."""


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


def number(value) -> float:
    """A figure's value: result files hold null where the number was not finite (`runenv.strict`); drawn as a gap.
    AnalysisResultError for anything else that is not a number (an edited or foreign file)."""
    if value is None:
        return float("nan")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnalysisResultError(f"holds {value!r} where a number belongs")
    return float(value)


def plot_discrepancy(summary: list[dict], path: Path, title: str) -> None:
    """Left: median ε_text/ε_decode per retained fraction ρ with the interquartile band (above 1: decode-time
    calibration is closer to held-out decoding). Right: share of modules where ε_decode < ε_text."""
    plt = require_matplotlib()
    rhos = [number(row["rho"]) for row in summary]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    left.fill_between(rhos, [number(row["ratio_q1"]) for row in summary],
                      [number(row["ratio_q3"]) for row in summary],
                      alpha=0.25, label="interquartile range")
    left.plot(rhos, [number(row["median_ratio"]) for row in summary], marker="o", label="median")
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set(xscale="log", xlabel="retained fraction ρ", ylabel="ε_text / ε_decode", title="discrepancy ratio")
    left.legend()
    right.plot(rhos, [100 * number(row["decode_smaller_share"]) for row in summary], marker="o")
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
        axes.plot(steps, [number(value) for value in layer["curve"]],
                  color=colours(layer["layer"] / max(len(layers) - 1, 1)), linewidth=1)
    scale = plt.cm.ScalarMappable(cmap=colours, norm=plt.Normalize(0, len(layers) - 1))
    figure.colorbar(scale, ax=axes, label="layer")
    axes.set(xlabel="decode step t", ylabel="‖x_pruned − x_dense‖ / ‖x_dense‖", title=title)
    figure.savefig(path, dpi=120)
    plt.close(figure)


SOURCE_COLOURS = {"text": "tab:orange", "decode": "tab:blue", "mix": "tab:green", "cross": "tab:purple"}


def plot_quality(results: list[dict], path: Path, title: str) -> None:
    """A `compare` report's pruned configurations of one model, one bar each, coloured by calibration source; left
    pass@1 with the dense model's as a dashed line, right on-policy KL(dense‖pruned)."""
    plt = require_matplotlib()
    dense = [r for r in results if r["config"]["calibration"] is None]
    pruned = [r for r in results if r["config"]["calibration"] is not None]
    if not pruned:
        raise SparseDecodingError("the report has no pruned configuration to draw")
    names = [r["name"] for r in pruned]
    colours = [SOURCE_COLOURS.get(r["config"]["calibration"], "tab:grey") for r in pruned]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.35 * len(names) + 1.8), constrained_layout=True,
                                         sharey=True)
    for axes, key, label in ((left, "pass@1", "pass@1 (held-out)"), (right, "kl", "KL(dense‖pruned)")):
        values = [number(r["metrics"].get(key)) for r in pruned]
        axes.barh(names, values, color=colours)
        for y, value in enumerate(values):
            axes.annotate(f"{value:.3g}", (value, y), xytext=(3, 0), textcoords="offset points", va="center",
                          fontsize=8)
        if dense and key in dense[0]["metrics"] and key == "pass@1":
            axes.axvline(number(dense[0]["metrics"][key]), color="grey", linestyle="--", linewidth=1, label="dense")
            axes.legend(loc="lower right")
        axes.set(xlabel=label)
    left.invert_yaxis()
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
    plt.close(figure)


# What each result file's figures read: `a.b` is key b of object a, `a[].b` key b of every item of list a.
RESULT_FIELDS = {
    "discrepancy.json": ("model", "summary[].rho", "summary[].median_ratio", "summary[].ratio_q1",
                         "summary[].ratio_q3", "summary[].decode_smaller_share"),
    "drift.json": ("pruned", "layers[].layer", "layers[].curve"),
    "quality.json": ("settings.model", "settings.small_model", "settings.tokens", "results[].name",
                     "results[].config.role", "results[].config.calibration", "results[].metrics"),
}
WRITTEN_BY = {"discrepancy.json": "sparsedecoding analyze discrepancy", "drift.json": "sparsedecoding analyze drift",
              "quality.json": "sparsedecoding compare"}


def _has_field(value, path: list[str]) -> bool:
    if not path:
        return True
    key, rest = path[0], path[1:]
    if key.endswith("[]"):
        items = value.get(key[:-2]) if isinstance(value, dict) else None
        return isinstance(items, list) and all(_has_field(item, rest) for item in items)
    return isinstance(value, dict) and key in value and _has_field(value[key], rest)


def read_result(file: Path) -> dict:
    """The payload of an analysis or `compare` JSON file, checked for every field its figures read, so that an empty,
    cut-short or foreign file gives one error that names it instead of a decoding error or a KeyError mid-plot."""
    redo = f"re-run `{WRITTEN_BY[file.name]}` to write it again"
    if file.name == "quality.json":
        redo += " (with the same --out: finished configurations are kept)"
    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise AnalysisResultError(f"{file} is not UTF-8 text; {redo}") from None
    except json.JSONDecodeError as exc:
        state = "is empty" if not exc.doc.strip() else f"is not valid JSON, perhaps cut short ({exc})"
        raise AnalysisResultError(f"{file} {state}; {redo}") from None
    missing = [field for field in RESULT_FIELDS[file.name] if not _has_field(payload, field.split("."))]
    if missing:
        raise AnalysisResultError(f"{file} lacks {', '.join(missing)}; {redo}")
    return payload


def _quality_figures(folder: Path) -> list[Path]:
    """quality-ROLE.png for each model role in a `compare` folder's quality.json."""
    payload = read_result(folder / "quality.json")
    drawn = []
    for role in ("main", "small"):
        results = [r for r in payload["results"] if r["config"]["role"] == role]
        if any(r["config"]["calibration"] is not None for r in results):
            model = Path(payload["settings"]["model" if role == "main" else "small_model"]).name
            budget = payload["settings"]["tokens"]
            drawn.append(_drawn(folder / "quality.json", f"quality-{role}", plot_quality, results,
                                f"{model}: calibration budget {budget} tokens per source"))
    if not drawn:
        raise SparseDecodingError(f"{folder}/quality.json has no pruned configuration to draw")
    return drawn


def redraw(folder: str | Path) -> list[Path]:
    """Draw the PNGs of an analysis or `compare` folder from its JSON (for results computed with --no-plot, or on a
    machine without matplotlib); returns them."""
    folder = Path(folder)
    if (folder / "discrepancy.json").exists():
        payload = read_result(folder / "discrepancy.json")
        draw, data, title, name = plot_discrepancy, payload["summary"], Path(payload["model"]).name, "discrepancy"
    elif (folder / "drift.json").exists():
        payload = read_result(folder / "drift.json")
        draw, data, title, name = plot_drift, payload["layers"], f"{Path(payload['pruned']).name} vs dense", "drift"
    elif (folder / "quality.json").exists():
        return _quality_figures(folder)
    else:
        raise AnalysisResultError(f"{folder} holds no discrepancy.json, drift.json or quality.json; pass a folder "
                                  f"written by `sparsedecoding analyze discrepancy`, `analyze drift` or `compare`")
    if not data:
        raise AnalysisResultError(f"{folder / f'{name}.json'} has nothing to draw (an empty list); "
                                  f"re-run `{WRITTEN_BY[f'{name}.json']}` to write it again")
    return [_drawn(folder / f"{name}.json", name, draw, data, title)]


def _drawn(file: Path, name: str, draw, data, title: str) -> Path:
    """NAME.png beside `file`, drawn by `draw` from `data` into NAME.partial.png and renamed; AnalysisResultError
    naming the file for a value that is not a number, or naming the folder where it cannot be written."""
    partial, final = file.with_name(f"{name}.partial.png"), file.with_name(f"{name}.png")
    try:
        draw(data, partial, title)
        os.replace(partial, final)
    except AnalysisResultError as exc:
        raise AnalysisResultError(f"{file} {exc}; re-run `{WRITTEN_BY[file.name]}` to write it again") from None
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise AnalysisResultError(f"cannot write {final} ({exc.strerror or exc}); make {file.parent} writable or "
                                  "copy the folder somewhere writable and draw there") from None
    return final
