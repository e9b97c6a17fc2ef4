// Device helpers shared by the tensor-core kernels built through kernels/cuda_mma.py (nm_mma.cu, nm_scatter.cu):
// a shared-memory address, the dense m16n8k16 MMA (bf16 or fp16 in, fp32 accumulate), the store conversion and the
// split-K partial sums' addition.
// cuda_mma's build hashes this header with each source that includes it, so a change here builds them anew.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// The last CTA of a split-K group: y[b, row] for its kRows rows from row0 = the sum over the `splits` partial sums
// the group's CTAs left in `partials` [splits, batch, out], read past L1 (other CTAs wrote them).
template <int kRows, int kThreads, typename T>
__device__ __forceinline__ void add_split_partials(const float* partials, T* y, int row0, int batch, int out,
                                                   int splits, int tid) {
  for (int e = tid; e < kRows * batch; e += kThreads) {
    const int b = e / kRows, row = row0 + e % kRows;
    if (row >= out) continue;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(partials + (static_cast<size_t>(s) * batch + b) * out + row);
    y[static_cast<size_t>(b) * out + row] = from_float<T>(sum);
  }
}

}  // namespace
