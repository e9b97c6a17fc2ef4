"""N:M packed weights and the sparse matrix-vector kernel that decodes with them.

`pack_nm` / `PackedNM`: the packed format (values + one bit per column). `nm_spmv`: y = x·Wᵀ for 1..16 rows of
x, a torch custom op backed on CUDA by a Triton kernel or a tensor-core kernel (chosen per pattern and batch in
`op.choose_kernel`; SPARSEDECODING_KERNEL=auto|triton|cuda overrides) and by `nm_spmv_reference` on CPU.
`PackedLinear`: a module holding a packed weight. Triton is imported, and the tensor-core kernel compiled, only when
first needed. 2:4 weights also run on sparse tensor cores from a tiled copy of the same bytes (`sp24`, `Sp24Linear`
in `sp24_linear`; the engine tiles them when it builds a model)."""

from .format import PackedNM, pack_nm
from .linear import PackedLinear
from .op import nm_spmv
from .reference import nm_spmv_reference

__all__ = ["PackedLinear", "PackedNM", "nm_spmv", "nm_spmv_reference", "pack_nm"]
