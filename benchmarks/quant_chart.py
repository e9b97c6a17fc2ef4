"""Issue 13's picture: held-out pass@1 of Qwen2.5-Coder-1.5B against batch-1 decode tok/s, one point per weight
configuration (dense and 16:32, each in bf16, int8 and int4), decode- and text-calibrated marked apart, one panel
per speed source. Draws from committed files only and measures nothing:

- quality: `summary.json` of `quality_recipes.py` runs (held-out rows, `final`); the quant round
  (benchmarks/recipes/plan-quant.json) holds its own items and the earlier round's dense bf16 and 16:32 bf16 ones;
- speed: reports of `sparsedecoding bench` or `benchmarks/quant_e2e_bench.py` (their markdown table, batch-1 rows,
  looked up by the weights column: "dense", "16:32", "dense int8", "16:32 int4 g128", ...), or a JSON object
  {weights label: tok/s at batch 1}. Speed does not depend on weight values, so a preset's random weights time
  the same shapes as the real checkpoints.

    python benchmarks/quant_chart.py          # the committed summaries and reports named in DEFAULT_*
    python benchmarks/quant_chart.py --summary S.json --speed "8B=a.md,b.md" --speed "Qwen=q.json" --out C.png

writes the PNG (default benchmarks/results/quant_quality_speed.png) and a markdown table beside it (same name,
.md). A configuration without a held-out result, or without a speed in some panel, is left out of that panel and
listed as not measured; nothing is filled in.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
GROUP_SIZE = 128  # int4 columns per scale in plan-quant.json and in the speed reports
DEFAULT_SUMMARIES = (RESULTS / "quality-quant5-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-quant4-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-quant3-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-quant2-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-quant-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-repair-qwen2.5-coder-1.5b" / "summary.json",
                     RESULTS / "quality-recipes-qwen2.5-coder-1.5b" / "summary.json")
# The panels by default, each from the reports that exist (first file wins per weights label). The 8B preset: the
# run under today's defaults with int4 heads (twenty-fifth session: dense int4 / int8 and the heads on sp24's dense
# mode) and its 16:32 run; the twenty-fourth session's run with dense int4 and the int4 heads on sp24's dense mode
# (its dense int8 rows ran triton_w8); the nineteenth session's run (sp24 with the halved metadata, every dense and
# 2:4 row and the int8-head rows in one run); the twelfth session's run under the same settings otherwise (2:4 on the
# sparse tensor-core kernel sp24, dense int8 on triton_w8, Inductor's combo kernels and programmatic launches,
# attention as reductions at batch 1); its 16:32 run; the older 2:4 one. The Qwen2.5-Coder-1.5B shapes: the 16:32 rows
# after the twenty-sixth session's change to the quantized Triton kernel (`h200.sh nmq-ab`, with its own dense rows);
# the one-run panel (`h200.sh quant-qwen-all`); the preset's earlier runs; the real pruned Qwen's 2:4 run under the
# same settings. Last in both, the 16:32+2 rows with slots of codes (twenty-eighth session; its dense rows come
# earlier from the files above, so a 16:32+2 point's ratio is against its own file's dense); 16:32+2 + int8's from
# the twenty-ninth session's run (its rows before had bf16 slots, a kernel the engine no longer runs); before those,
# the thirtieth session's runs of both with codes in steps of 8, the default since (the older runs' rows yield).
DEFAULT_SPEEDS = (("Llama-3.1-8B preset", (RESULTS / "quant_e2e_h200_head_int4_run3.md",
                                           RESULTS / "quant_e2e_h200_8b_16of32_today.md",
                                           RESULTS / "quant_e2e_h200_head_int4_sp24.md",
                                           RESULTS / "quant_e2e_h200_head_int8.md",
                                           RESULTS / "quant_e2e_h200_sp24_inductor.md",
                                           RESULTS / "quant_e2e_h200_8b_16of32.md", RESULTS / "quant_e2e_h200.md",
                                           RESULTS / "quant_e2e_h200_8b_slot_codes_int4_step8.md",
                                           RESULTS / "quant_e2e_h200_8b_slot_codes_int8_step8.md",
                                           RESULTS / "quant_e2e_h200_8b_slot_codes.md",
                                           RESULTS / "quant_e2e_h200_8b_slot_codes_int8.md")),
                  ("Qwen2.5-Coder-1.5B shapes", (RESULTS / "quant_e2e_h200_qwen_16of32_after.md",
                                                 RESULTS / "quant_e2e_h200_qwen2.5-coder-1.5b_all.md",
                                                 RESULTS / "quant_e2e_h200_qwen2.5-coder-1.5b_head_int4.md",
                                                 RESULTS / "quant_e2e_h200_qwen2.5-coder-1.5b.md",
                                                 RESULTS / "bench_qwen2.5-coder-1.5b_2of4_h200_inductor.md",
                                                 RESULTS / "quant_e2e_h200_qwen2.5-coder-1.5b_2of4_head_int8.md",
                                                 RESULTS / "quant_e2e_h200_qwen_slot_codes_int4_step8.md",
                                                 RESULTS / "quant_e2e_h200_qwen_slot_codes_int8_step8.md",
                                                 RESULTS / "quant_e2e_h200_qwen_slot_codes.md",
                                                 RESULTS / "quant_e2e_h200_qwen_slot_codes_int8.md")))
TARGET_GAP = 0.03  # issue 13: N:M + int8 within this pass@1 of the same N:M in bf16 (decode-time calibration)


@dataclass(frozen=True)
class Config:
    """One point: `pattern` ("dense" or N:M), `quantize` ("none", "int8", "int4"), `calibration` ("decode", "text"
    or "none" for the unpruned bf16 model) and the held-out items that score it, first found wins."""

    pattern: str
    quantize: str
    calibration: str
    items: tuple[str, ...]
    repaired: bool = False  # fixed-mask repair after pruning (plan-repair.json; quantized after it: plan-quant2.json)
    head: str = "none"  # lm_head rounded too (`prune --quantize-head`; plan-quant3.json)
    note: str = ""  # told apart from a point of the same weights (another recreation of the same recipe)
    control: str = ""  # held-out item of the same round's bf16 model, where issue 13's target pairs this point with it

    @property
    def weights(self) -> str:
        """The speed reports' label of these weights (`engine.bench.run_label`)."""
        head = "" if self.head == "none" else f", {self.head} head"
        if self.quantize == "none":
            return self.pattern + head
        return f"{self.pattern} {self.quantize}" + (f" g{GROUP_SIZE}" if self.quantize == "int4" else "") + head

    @property
    def label(self) -> str:
        values = "bf16" if self.quantize == "none" else self.quantize
        name = f"{self.pattern} {values}" + ("" if self.head == "none" else f" + {self.head} head")
        if self.note:  # short, beside a point of the same weights: the table says the rest
            return f"{name} ({self.note})"
        return name + ("" if self.calibration == "none" else f", {self.calibration}") \
            + (", repaired" if self.repaired else "")

    @property
    def short(self) -> str:
        """The label drawn beside the point: the marker already says decode / text / repaired."""
        values = "bf16" if self.quantize == "none" else self.quantize
        return f"{self.pattern} {values}" + ("" if self.head == "none" else f" + {self.head} head") \
            + (f" ({self.note})" if self.note else "")


# nm16-bf16-fit (the quant round's own 16:32 bf16 control on the same data) before the first round's pick of the same
# recipe: the target pairs N:M + int8 with the N:M bf16 model calibrated on the same sampled tokens. Likewise the
# repaired rows read the second quant round's recreated model itself (p2r-bf16, p16r-bf16) before the repair round's.
# The third quant round (plan-quant3.json) recreated the repaired 2:4 model once more and rounded it to int4 with and
# without an int8 lm_head: its int4 point without the head is drawn too, since it, not p2r-int4, is the head's control.
# The fourth (plan-quant4.json) did the same for int8 with an int4 head; its int8 and bf16 controls repeat p2r-int8's
# and p2r-bf16's counts exactly, so only the head point is drawn. The fifth (plan-quant5.json) recreated the repaired
# 16:32+2 model (plan-overflow2.json's p16o2r) and rounded it to int8 and int4, its own bf16 item the control.
CONFIGS = (
    Config("dense", "none", "none", ("dense",)),
    Config("dense", "int8", "decode", ("gptq-int8-fit",)),
    Config("dense", "int4", "decode", ("gptq-int4-fit",)),
    Config("dense", "int4", "text", ("gptq-int4-text",)),
    Config("16:32", "none", "decode", ("nm16-bf16-fit", "nm50-p16-fit")),
    Config("16:32", "none", "text", ("text-16of32",)),
    Config("16:32", "int8", "decode", ("nm16-int8-fit",)),
    Config("16:32", "int4", "decode", ("nm16-int4-fit",)),
    Config("16:32", "int4", "text", ("nm16-int4-text",)),
    Config("16:32", "none", "decode", ("p16r-bf16", "check-p16-fit-repair-lr1e5"), repaired=True),
    Config("16:32", "int8", "decode", ("p16r-int8",), repaired=True),
    Config("16:32", "int4", "decode", ("p16r-int4",), repaired=True),
    Config("2:4", "none", "decode", ("p2r-bf16", "2of4-p2-broad-seq-repair-lr1e5"), repaired=True),
    Config("2:4", "int8", "decode", ("p2r-int8",), repaired=True),
    Config("2:4", "int4", "decode", ("p2r-int4",), repaired=True),
    Config("2:4", "int4", "decode", ("q3-p2r-int4",), repaired=True, note="rerun"),
    Config("2:4", "int4", "decode", ("q3-p2r-int4-h8",), repaired=True, head="int8", note="rerun"),
    Config("2:4", "int4", "decode", ("q3-p2r-int4-h4",), repaired=True, head="int4", note="rerun"),
    Config("2:4", "int8", "decode", ("q4-p2r-int8-h4",), repaired=True, head="int4", note="rerun",
           control="q4-p2r-bf16"),
    Config("16:32+2", "none", "decode", ("q5-p16o2r-bf16",), repaired=True),
    Config("16:32+2", "int8", "decode", ("q5-p16o2r-int8",), repaired=True, control="q5-p16o2r-bf16"),
    Config("16:32+2", "int4", "decode", ("q5-p16o2r-int4",), repaired=True),
)
COLORS = {"none": "tab:blue", "int8": "tab:orange", "int4": "tab:green"}
MARKERS = {"none": "*", "decode": "o", "text": "s"}


def read_quality(paths: list[Path]) -> dict[str, dict]:
    """Held-out rows by item name from the summaries, an earlier path's row winning over a later one's."""
    rows: dict[str, dict] = {}
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"error: quality summary {path} does not exist (quality_recipes.py writes summary.json)")
        for row in json.loads(path.read_text()).get("final", []):
            rows.setdefault(row["name"], {**row, "source": str(path)})
    return rows


def quality_of(config: Config, rows: dict[str, dict]) -> dict | None:
    """The first of the config's items with a held-out row; SystemExit if that row is another configuration."""
    for item in config.items:
        if item in rows:
            row = rows[item]
            found = (row.get("pattern", "dense"), row.get("quantize") or "none")  # rows before issue 13: no key
            if found != (config.pattern, config.quantize):
                raise SystemExit(f"error: held-out item {item} is {' '.join(found)}, not {config.label}; the plan "
                                 f"and quant_chart.CONFIGS disagree")
            return row
    return None


# Weights whose kernel the code no longer runs, and the report text that names the retired kernel: such a row is
# not today's speed, so it is left out (listed as not measured, with the reason) instead of being drawn.
RETIRED = {"dense int8": ("`_weight_int8pack_mm`", "ran PyTorch's `_weight_int8pack_mm` (0.07x cuBLAS at batch 1), "
                          "which dense int8 no longer runs (triton_w8 since 2026-12-01); not re-measured end to end")}


def retired_rows(text: str) -> dict[str, str]:
    """{weights label: why its row is not today's speed} for a report's text (`RETIRED`)."""
    runs_line = next((line for line in text.splitlines() if "Dense int8" in line and " run" in line), "")
    return {label: reason for label, (mark, reason) in RETIRED.items() if mark in runs_line
            and "triton_w8" not in runs_line}


def parse_speed_table(path: Path, batch: int = 1) -> dict[str, tuple[float, str]]:
    """{weights label: (tok/s per sequence, model)} of the `batch` rows of a bench report's table; the first row of
    a label wins. Rows reported as not run are skipped; a row whose kernel is retired (`RETIRED`) gets NaN and the
    reason in place of the model."""
    speeds: dict[str, tuple[float, str]] = {}
    header = None
    text = path.read_text()
    retired = retired_rows(text)
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[:3] == ["model", "weights", "batch"]:
            header = cells
            continue
        if header is None or len(cells) != len(header) or not cells[2].isdigit() or int(cells[2]) != batch:
            continue
        value = cells[header.index("tok/s per seq")]
        if cells[1] in retired:
            speeds.setdefault(cells[1], (float("nan"), retired[cells[1]]))
            continue
        try:
            speeds.setdefault(cells[1], (float(value), cells[0]))
        except ValueError:  # "not run: ..."
            continue
    if header is None:
        raise SystemExit(f"error: {path} has no `sparsedecoding bench` table (| model | weights | batch | ...)")
    return speeds


def read_speed(spec: str) -> tuple[str, dict[str, tuple[float, str]]]:
    """`TITLE=FILE[,FILE...]`: a panel's title and its batch-1 speeds (`read_panel`)."""
    title, separator, files = spec.partition("=")
    if not separator or not title.strip() or not files.strip():
        raise SystemExit(f"error: --speed {spec!r} is not TITLE=FILE[,FILE...]")
    return title.strip(), read_panel([Path(name.strip()) for name in files.split(",")])


def read_panel(paths: list[Path]) -> dict[str, tuple[float, str, float]]:
    """{weights label: (batch-1 tok/s, where it was read, dense bf16 tok/s of the same file or NaN)} from bench
    reports or JSON {label: tok/s}, an earlier file's value winning over a later one's, except that a row of a
    retired kernel (NaN) gives way to a later file's measured row. The dense value of the same
    file is what a ratio is taken against: two files are two runs."""
    speeds: dict[str, tuple[float, str, float]] = {}
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"error: speed report {path} does not exist")
        if path.suffix == ".json":
            found = {label: (float(value), path.name) for label, value in json.loads(path.read_text()).items()}
        else:
            found = parse_speed_table(path)
        dense = found["dense"][0] if "dense" in found else math.nan
        for label, value in found.items():
            if label not in speeds or (math.isnan(speeds[label][0]) and not math.isnan(value[0])):
                speeds[label] = (value[0], f"{path.name}: {value[1]}", dense)  # a retired row yields to a measured one
    return speeds


def chart(quality: dict[str, dict], panels: list[tuple[str, dict]], out: Path) -> list[str]:
    """Draw the PNG at `out` and return the markdown lines of its table."""
    from sparsedecoding.analysis.plots import require_matplotlib

    plt = require_matplotlib()
    scored = {config: quality_of(config, quality) for config in CONFIGS}
    missing = [f"- {config.label}: no held-out result (items {', '.join(config.items)})"
               for config, row in scored.items() if row is None]
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    labels: list[tuple[object, float, float, str]] = []  # (axis, x, y, text), placed once the layout is fixed
    for axis, (title, speeds) in zip(axes[0], panels):
        span = max([entry[0] for entry in speeds.values() if not math.isnan(entry[0])] + [1.0])
        for config, row in scored.items():
            if row is None:
                continue
            if config.weights not in speeds:
                missing.append(f"- {config.label} in {title}: no batch-1 speed for weights `{config.weights}`")
                continue
            if math.isnan(speeds[config.weights][0]):
                missing.append(f"- {config.label} in {title}: {speeds[config.weights][1]}")
                continue
            x, y = speeds[config.weights][0], row["pass@1_mean"]
            text = config.calibration == "text"  # open marker, edge in the value format's colour
            marker = "D" if config.repaired else MARKERS[config.calibration]
            axis.scatter(x, y, s=140 if config.calibration == "none" else 70, marker=marker,
                         facecolors="none" if text else COLORS[config.quantize], zorder=3,
                         edgecolors=COLORS[config.quantize] if text else "black", linewidths=1.8 if text else 0.6)
            labels.append((axis, x, y, config.short))
        mixed = " (runs mixed: see the table)" if mixed_runs([(title, speeds)]) else ""
        axis.set(title=title + mixed, xlabel="batch-1 decode tok/s", ylabel="held-out pass@1 (mean of two wordings)",
                 ylim=(0, 0.05 + max([row["pass@1_mean"] for row in scored.values() if row] + [0.75])))
        axis.set_xlim(0, 1.45 * span)  # room for the labels of the fastest points
        axis.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker=MARKERS[c], linestyle="", color="gray",
                          markerfacecolor="none" if c == "text" else "gray", label=text)
               for c, text in (("none", "dense bf16"), ("decode", "decode-calibrated"), ("text", "text-calibrated"))]
    handles += [plt.Line2D([], [], marker="D", linestyle="", color="gray", label="repaired")]
    handles += [plt.Line2D([], [], marker="o", linestyle="", color=color, label="bf16" if q == "none" else q)
                for q, color in COLORS.items()]
    figure.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    figure.suptitle("Qwen2.5-Coder-1.5B held-out HumanEval pass@1\n"
                    "vs batch-1 decode speed (H200) of each panel's model")
    figure.tight_layout(rect=(0, 0.06, 1, 0.93))
    place_labels(figure, labels)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return table(scored, panels) + ["", "Not measured (left out of the chart):", *(missing or ["- (none)"])] \
        + target_lines(scored, quality)


# Where a point's label may go, in points from the point, tried in this order: right, then right a line up or down,
# then left (right-aligned), then further down and up on each side (with a line to the point).
LABEL_SPOTS = ((6, 3, "left"), (6, -11, "left"), (6, 12, "left"), (-6, 3, "right"), (-6, -11, "right"),
               (-6, 12, "right"), (6, -22, "left"), (6, 22, "left"), (-6, -22, "right"), (-6, 22, "right"),
               *((dx, sign * dy, align) for dy in (33, 44, 55) for sign in (-1, 1)
                 for dx, align in ((6, "left"), (-6, "right"))))


def place_labels(figure, labels: list[tuple[object, float, float, str]]) -> None:
    """Annotate each point at the first spot of LABEL_SPOTS whose text box overlaps no label or point placed before it
    on the same axis and stays inside the axis; if none is free, at the spot that overlaps fewest of them."""
    renderer = figure.canvas.get_renderer()
    taken: dict[object, list] = {}
    for axis, x, y, text in labels:
        points = [axis.transData.transform((px, py)) for other, px, py, _ in labels if other is axis]
        inside = axis.get_window_extent(renderer)
        best = None
        for dx, dy, align in LABEL_SPOTS:
            far = abs(dy) > 20  # a label a line or more off its point gets a thin line to it
            note = axis.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=8,
                                 ha=align, va="center",
                                 arrowprops=dict(arrowstyle="-", color="gray", lw=0.6, shrinkB=4) if far else None)
            box = note.get_window_extent(renderer).expanded(1.02, 1.1)
            clashes = sum(box.overlaps(other) for other in taken.get(axis, [])) \
                + sum(box.x0 - 5 < px < box.x1 + 5 and box.y0 - 5 < py < box.y1 + 5 for px, py in points)
            if not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1):
                clashes += 100
            if best is None or clashes < best[0]:
                if best is not None:
                    best[1].remove()
                best = (clashes, note, box)
            else:
                note.remove()
            if clashes == 0:
                break
        taken.setdefault(axis, []).append(best[2])


def table(scored: dict[Config, dict | None], panels: list[tuple[str, dict]]) -> list[str]:
    titles = [title for title, _ in panels]
    lines = ["| weights | calibration | held-out item | pass@1 fenced | pass@1 plain | pass@1 mean | "
             "KL(dense‖model) | " + " | ".join(f"tok/s: {title} (x dense bf16)" for title in titles) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(titles)]
    for config, row in scored.items():
        cells = [config.label.split(",")[0], config.calibration + (" + repair" if config.repaired else "")]
        cells += ["-"] * 5 if row is None else [row["name"], f"{row['pass@1_fenced']:.3f}",
                                               f"{row['pass@1_plain']:.3f}", f"{row['pass@1_mean']:.3f}",
                                               f"{row['kl']:.4f}"]
        for _, speeds in panels:
            if config.weights not in speeds:
                cells.append("not measured")
                continue
            value = speeds[config.weights][0]
            if math.isnan(value):
                cells.append("not measured (retired kernel)")
                continue
            dense = speeds[config.weights][2]  # the same report's dense bf16: a ratio within one run
            ratio = "" if math.isnan(dense) else f" ({value / dense:.2f}x)"
            cells.append(f"{value:.1f}{ratio}")
        lines.append("| " + " | ".join(cells) + " |")
    sources = sorted({f"{title}: {source}" for title, speeds in panels for value, source, _ in speeds.values()
                      if not math.isnan(value)})
    return lines + ["", "Speed rows read (panel: file: model):", *[f"- {source}" for source in sources]] \
        + mixed_runs(panels)


MIXED_RUNS = 1.05  # a panel whose files' dense bf16 tok/s differ by more than this factor gets a warning


def mixed_runs(panels: list[tuple[str, dict]]) -> list[str]:
    """A warning for each panel that draws rows from runs whose dense bf16 speeds differ by more than MIXED_RUNS:
    its points' tok/s then come from different engines, and only their ratios (x dense bf16) compare."""
    lines = []
    for title, speeds in panels:
        dense = {source.split(":")[0]: value for speed, source, value in speeds.values()
                 if not math.isnan(speed) and not math.isnan(value)}
        if dense and max(dense.values()) > MIXED_RUNS * min(dense.values()):
            runs = ", ".join(f"{name} {value:.1f}" for name, value in sorted(dense.items()))
            lines += ["", f"Warning: the {title} panel mixes runs whose dense bf16 differ ({runs} tok/s). Its points' "
                          "tok/s come from different engines; compare them across files by their ratios (x dense "
                          "bf16 of the same file), not by position."]
    return lines


def target_lines(scored: dict[Config, dict | None], quality: dict[str, dict]) -> list[str]:
    """Issue 13's quality target for each N:M int8 point: unrepaired 16:32 (the first quant round, its own bf16
    control), the repaired 16:32 and 2:4 (plan-quant2.json, paired with the repaired bf16 model), and any point that
    names its own round's bf16 control (`Config.control`: the int4 head on 2:4 + int8, plan-quant4.json)."""
    plain = {(c.pattern, c.quantize, c.calibration, c.repaired): row for c, row in scored.items()
             if c.head == "none" and not c.note}
    lines = ["", f"## Target (issue 13): N:M + int8 within {TARGET_GAP} held-out pass@1 of the same N:M in bf16, "
                 "both decode-calibrated", ""]
    for config, int8 in scored.items():
        if config.quantize != "int8" or config.pattern == "dense" or config.calibration != "decode":
            continue
        bf16 = quality.get(config.control) if config.control else \
            plain.get((config.pattern, "none", "decode", config.repaired))
        what = f"{config.pattern}{', repaired' if config.repaired else ''}" \
            + ("" if config.head == "none" else f", {config.head} head")
        if bf16 is None or int8 is None:
            lines.append(f"- {what}: not measured (both held-out results are needed)")
            continue
        gap = bf16["pass@1_mean"] - int8["pass@1_mean"]
        verdict = "met" if gap <= TARGET_GAP else f"missed by {gap - TARGET_GAP:.3f}"
        side = "equal" if abs(gap) < 5e-4 else f"{abs(gap):.3f} {'below' if gap > 0 else 'above'}"
        lines.append(f"- {what}: {int8['name']} {int8['pass@1_mean']:.3f} vs {bf16['name']} "
                     f"{bf16['pass@1_mean']:.3f}: {side} ({verdict}); paired per-problem counts in the "
                     "quality report's McNemar tests")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summary", type=Path, action="append",
                        help="quality_recipes summary.json (repeat: an earlier one wins for an item in both) "
                             "(default: the quant round's, then the first round's)")
    parser.add_argument("--speed", action="append",
                        help="TITLE=FILE[,FILE...]: one panel of batch-1 speeds (bench reports or JSON; repeat for "
                             "more panels) (default: the 8B preset's and the Qwen preset's quant_e2e reports that "
                             "exist in benchmarks/results)")
    parser.add_argument("--out", type=Path, default=RESULTS / "quant_quality_speed.png",
                        help="the PNG; the table goes beside it as .md (default: %(default)s)")
    args = parser.parse_args(argv)
    # by default the summaries that exist: before the quant round only the first round's bf16 points
    summaries = args.summary or [path for path in DEFAULT_SUMMARIES if path.is_file()]
    panels = [read_speed(spec) for spec in args.speed] if args.speed else \
        [(title, read_panel([path for path in paths if path.is_file()])) for title, paths in DEFAULT_SPEEDS]
    quality = read_quality(summaries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = chart(quality, panels, args.out)
    command = "python benchmarks/quant_chart.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = ["# Issue 13: held-out quality vs decode speed (Qwen2.5-Coder-1.5B-Instruct)", "",
              f"- date: {datetime.date.today().isoformat()}",
              f"- software: matplotlib {metadata.version('matplotlib')}, Python {platform.python_version()} "
              "(drawn from the reports named below, each of which names its GPU and versions)",
              f"- command: `{command.strip()}`", "",
              f"![chart]({args.out.name})", "",
              "Held-out odd half of HumanEval (82 problems), greedy, mean of the fenced and plain wordings; speed: "
              "decode tok/s at batch 1 from the reports listed below, ratio against dense bf16 in the same report "
              "(one run; a panel may draw from two runs, so compare tok/s across rows, ratios within a row's own "
              f"run). int4: one scale per {GROUP_SIZE} input columns; int8: one per row. Repaired: fixed-mask repair "
              "after pruning, then quantized with the mask kept; each quality round recreates the repaired model, "
              "and (rerun) marks the third round's recreation (plan-quant3.json), the int8 head's own control.",
              "", *lines]
    markdown = args.out.with_suffix(".md")
    markdown.write_text("\n".join(report) + "\n")
    print(f"wrote {args.out} and {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
