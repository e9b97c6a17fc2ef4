"""`sparsedecoding prune`: calibrate, prune layer by layer, write an HF checkpoint plus sparsedecoding.json."""

from __future__ import annotations

from ..invocation import command
from ..settings import (CalibrationSettings, PruneConfig, RepairSettings, RunSettings, SolverSettings, add_arguments,
                        from_args)


def register(subparsers) -> None:
    parser = subparsers.add_parser("prune", help="prune a model with decode-time (or text) calibration",
                                   description=__doc__)
    add_arguments(parser, RunSettings)
    add_arguments(parser, SolverSettings, "solver")
    add_arguments(parser, CalibrationSettings, "calibration")
    add_arguments(parser, RepairSettings, "repair")
    parser.set_defaults(func=run)


def config_from_args(args, **overrides) -> PruneConfig:
    """The PruneConfig of the parsed flags, with `overrides` (any PruneConfig field) on top."""
    return PruneConfig(**from_args(PruneConfig, args, command=command(), **overrides))


def run(args) -> int:
    from ..pipeline import PRUNED_MANIFEST, prune

    out = prune(config_from_args(args))
    print(f"pruned model written to {out} (details in {out / PRUNED_MANIFEST})")
    return 0
