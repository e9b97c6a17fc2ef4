"""SparseDecoding: prune LLM weights with Hessians calibrated on the model's own decode steps, and decode fast
with an N:M bitmask sparse matrix-vector kernel."""

from .errors import SparseDecodingError, SparsityPatternError
from .patterns import SparsityPattern

__version__ = "0.1.0"

__all__ = ["SparsityPattern", "SparsityPatternError", "SparseDecodingError", "__version__"]
