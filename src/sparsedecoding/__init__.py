"""SparseDecoding: prune LLM weights with Hessians calibrated on the model's own decode steps, and decode fast
with an N:M bitmask sparse matrix-vector kernel."""

from .errors import SparseDecodingError, SparsityPatternError
from .patterns import SparsityPattern

__version__ = "0.1.0"

__all__ = ["SparsityPattern", "SparsityPatternError", "SparseDecodingError", "SparsifySummary", "load_packed",
           "save_packed", "sparsify", "tile_packed", "__version__"]

_FROM_SWAP = ("SparsifySummary", "load_packed", "save_packed", "sparsify", "tile_packed")


def __getattr__(name: str):
    # `sparsify` and friends import torch and transformers; importing the package (the CLI's --help) should not
    if name in _FROM_SWAP:
        from . import swap

        return getattr(swap, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
