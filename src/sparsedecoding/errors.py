"""One exception type per user mistake. The CLI prints `ClassName: message` on one line and exits with code 2."""


class SparseDecodingError(Exception):
    """Base class: anything the user can fix by changing their input."""


class SparsityPatternError(SparseDecodingError, ValueError):
    """A pattern string that is not `N:M` with 0 < N < M, nor a percentage like `50%`."""


class ModelNotFoundError(SparseDecodingError, FileNotFoundError):
    """A model path or name that does not exist."""


class UnsupportedArchitectureError(SparseDecodingError):
    """A model whose architecture the pipeline or engine does not handle."""


class PromptsError(SparseDecodingError):
    """A prompt file that is missing, empty or malformed."""


class CalibrationError(SparseDecodingError):
    """Calibration produced no usable tokens (for example generation stopped at once)."""


class NonFiniteActivationError(SparseDecodingError):
    """NaN or inf in a layer input during calibration."""


class OutputExistsError(SparseDecodingError, FileExistsError):
    """The output directory exists and `--overwrite` was not given."""


class FetchError(SparseDecodingError):
    """Downloading or verifying an offline model or data wheel failed."""


class PackingError(SparseDecodingError, ValueError):
    """A weight that cannot be packed in the requested N:M format."""


class KernelInputError(SparseDecodingError, ValueError):
    """Inputs to the sparse kernel with the wrong dtype, device, layout or shape."""


class EngineError(SparseDecodingError):
    """Bad engine request: unknown preset, batch larger than the cache, non-N:M weight under `--sparse packed`."""


class SandboxError(SparseDecodingError):
    """The code sandbox could not be set up."""


class RepairError(SparseDecodingError):
    """Bad repair settings, a student that does not match its teacher, or a work folder from other settings."""


class DeviceError(SparseDecodingError):
    """A `--device` that is not a device name, or names a CUDA device this machine does not have."""


class ModelFileError(SparseDecodingError):
    """A model that exists but cannot be used: truncated or malformed weights or config, a file that is not a GGUF,
    non-finite weights, or layer shapes that the requested pattern does not fit."""


class OutputNotWritableError(SparseDecodingError, PermissionError):
    """The output folder cannot be created: its parent is read-only, or a file stands where a folder must be."""


class SolverSettingsError(SparseDecodingError, ValueError):
    """Solver settings that cannot work, such as a damping that is not a positive finite number."""


class QuantizationError(SparseDecodingError, ValueError):
    """An unsupported quantization, a group size that is not positive or does not divide the row, or a weight that
    is not on the quantization grid it is said to be on."""
