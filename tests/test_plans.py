"""Every committed quality plan (benchmarks/recipes/*.json) names only PruneConfig fields its runner knows and gives
settings that PruneConfig accepts, so that a device session never loses its minutes to a typo in a plan."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from sparsedecoding.pipeline import PruneConfig

PLANS = sorted((Path(__file__).parent.parent / "benchmarks" / "recipes").glob("*.json"))
# keys of plan items that the runner reads itself (quality_recipes.py), not PruneConfig fields
RUNNER_KEYS = {"name", "data", "estimate_s", "against", "start", "as_is", "late", "repair", "model", "dense"}


def items(plan: dict) -> list[dict]:
    return [*plan.get("recipes", []), *plan.get("baselines", [])]


@pytest.mark.parametrize("path", PLANS, ids=[path.name for path in PLANS])
def test_plan_items_are_valid_prune_settings(path):
    plan = json.loads(path.read_text())
    known = {field.name for field in fields(PruneConfig)}
    names = [item["name"] for item in items(plan)]
    assert len(names) == len(set(names)), "item names repeat"
    if not plan.get("earlier"):  # a later round's families may name the earlier round's recipes
        for family, members in plan.get("families", {}).items():
            assert set(members) <= set(names), f"family {family} names items the plan lacks"
    for item in items(plan):
        unknown = set(item) - known - RUNNER_KEYS
        assert not unknown, f"{item['name']}: {sorted(unknown)} are neither PruneConfig fields nor runner keys"
        if item.get("as_is"):
            continue
        values = {key: value for key, value in item.items() if key in known}
        data = item.get("data", "humaneval:fit")
        config = PruneConfig(model="unused", out="", calibration="text" if data == "text" else "decode",
                             prompts=data if data.startswith("humaneval:") else "humaneval:fit",
                             do_sample=item.get("samples_per_prompt", 1) > 1, **values)
        config.check_values()
