"""Where a run happens and how its record is written: the device, software versions, peak memory, atomic JSON.

Every tool (prune, eval, compare, analyses, engine benchmarks) records its environment through `environment()`, so
results from different tools read alike.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
from importlib import metadata
from pathlib import Path

import torch

from .errors import DeviceError

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def pick_device(name: str | None = "auto") -> torch.device:
    """`auto` (or None): the first CUDA device when there is one, else the CPU; `cpu`; `cuda` / `cuda:N` only where
    that device exists. Anything else is a DeviceError, never a silent fallback."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA.match(name)
    if not match:
        raise DeviceError(f"--device {name!r} is not a device; choose auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {name} needs CUDA, which this PyTorch build or machine lacks; use --device cpu")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise DeviceError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                          f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return torch.device(name)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict:
    """Versions of this package, its numeric stack and Python."""
    found = {package: _version(package) for package in ("torch", "triton", "transformers")}
    return {"sparsedecoding": __import__("sparsedecoding").__version__, **found,
            "python": platform.python_version()}


def device_name(device: torch.device | None = None) -> str:
    device = device or pick_device("auto")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or "CPU"


def environment(device: torch.device | None = None) -> dict:
    """Date, device name and versions of a run (device: where it ran; default the one `auto` picks)."""
    return {"date": datetime.date.today().isoformat(), "device": device_name(device), "versions": versions()}


def environment_markdown(command: str, device: torch.device | None = None) -> str:
    """`environment()` and the exact command as markdown list lines, for the head of a results file."""
    return environment_lines(environment(device), command)


def environment_lines(found: dict, command: str) -> str:
    """A stored `environment()` and the command as markdown list lines (`environment_markdown`)."""
    software = ", ".join(f"{package} {version}" for package, version in found["versions"].items()
                         if package not in ("sparsedecoding", "python"))
    return (f"- date: {found['date']}\n- device: {found['device']}\n- software: {software}\n"
            f"- command: `{command}`\n")


def peak_memory_gb(device: torch.device) -> float:
    """Peak CUDA memory allocated on `device`, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # Linux reports KiB


def print_report(text: str, path: Path | None) -> None:
    """Print a markdown report and, given `path`, also write it there (`write_report`)."""
    print(text)
    if path is not None:
        write_report(path, text)


def write_report(path: Path, text: str) -> None:
    """A results file (markdown), its folder created, written atomically (temp file + rename); says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    print(f"wrote {path}")


def strict(value):
    """`value` with every NaN or infinite float (also inside lists, tuples and dicts) replaced by None, so that
    `json.dumps(..., allow_nan=False)` writes standard JSON: Python reads bare `NaN`, but jq, JavaScript and most
    plotting front ends refuse the whole file. A value that was not finite reads back as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def json_text(payload, indent: int | None = None) -> str:
    """Standard JSON for a results file: non-finite floats written as null (`strict`)."""
    return json.dumps(strict(payload), indent=indent, allow_nan=False)


def write_json(path: Path, payload: dict) -> None:
    """Atomic JSON write (temp file + rename) of standard JSON (`json_text`: a non-finite float becomes null)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json_text(payload, indent=2))
    os.replace(temporary, path)
