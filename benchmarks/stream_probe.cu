// A probe, not a kernel of the package (benchmarks/stream_probe.py builds and runs it): how fast can a grid stream a
// weight-sized buffer from HBM while it spends `work` rounds of integer arithmetic on every 16 bytes, the way sp24's
// codes kernels dequantize and multiply what they load? Three ways to bring the bytes in:
//
//   mode 0, registers: every warp streams its own contiguous range in steps of 8 16-byte loads a lane, two register
//           buffers (one computed while the other is in flight), as sp24.cu does; 8 warps a CTA, 2 CTAs an SM.
//   mode 1, bulk ring: a CTA of one producer warp and 8 consumer warps. The producer's lane 0 fills a ring of
//           `stages` shared-memory stages of `stage_bytes` each with one cp.async.bulk copy a stage, counted on the
//           stage's "full" mbarrier; the consumers wait on it, each reads its eighth of the stage (16-byte shared
//           loads), computes, and arrives on the stage's "empty" mbarrier, which the producer waits on before it
//           refills the stage. Loads in flight are then bounded by shared memory, not by registers, and no warp's
//           compute waits on a load scoreboard.
//   mode 2, cp.async ring: all 256 threads of a CTA copy each stage with 16-byte cp.async (one commit group a stage,
//           `stages - 1` groups in flight), then wait, synchronize and compute from shared memory (Marlin's
//           multistage pattern).
//
// The arithmetic (`mix`) cannot be folded by the compiler: `work` rounds on each 16-byte piece, either one dependent
// chain (chain 1, about 10 instructions a round, bound by instruction latency when few warps share a scheduler) or
// four independent ones, a word each (chain 0, about 12 instructions a round, as independent as a k-tile's
// dequantizations). Mode 3 runs mode 0's loop with values made from indices instead of loads: the compute alone, to
// set `work` against what sp24's int4 loop spends. The sums land in `out` so nothing is dead.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kLoads = 8;  // mode 0: 16-byte loads a lane a step

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// CHAIN 1: one dependent chain a piece (instruction latency bound with few warps); 0: four independent chains a
// piece, one a word, summed at the end (the independent dequantizations of a k-tile are like that)
template <int CHAIN>
__device__ __forceinline__ uint32_t mix(uint32_t acc, const uint4& v, int work) {
  if constexpr (CHAIN) {
#pragma unroll 1
    for (int i = 0; i < work; ++i) {
      acc = (acc ^ v.x) * 0x9E3779B1u + (acc >> 7);
      acc ^= (v.y + acc) >> ((v.z ^ i) & 7);
      acc += v.w;
    }
    return work > 0 ? acc : acc ^ v.x ^ v.y ^ v.z ^ v.w;
  } else {
    uint32_t a = v.x, b = v.y, c = v.z, d = v.w;
#pragma unroll 1
    for (int i = 0; i < work; ++i) {
      a = (a ^ i) * 0x9E3779B1u + (a >> 7);
      b = (b ^ i) * 0x9E3779B1u + (b >> 7);
      c = (c ^ i) * 0x9E3779B1u + (c >> 7);
      d = (d ^ i) * 0x9E3779B1u + (d >> 7);
    }
    return acc + (a ^ b ^ c ^ d);
  }
}

// mode 0: [warp's range of steps] of kLoads * 512 bytes each
// LOADS 0: the same loop with every load replaced by a value made from its indices (the compute alone)
template <int CHAIN, int LOADS>
__global__ void __launch_bounds__(256, 2) registers_kernel(const char* __restrict__ w, size_t steps,
                                                           uint32_t* __restrict__ out, int work) {
  const int lane = threadIdx.x % 32;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  const size_t s0 = warp * steps / warps, s1 = (warp + 1) * steps / warps;
  uint4 r[2][kLoads];
  uint32_t acc = lane;
  auto load = [&](uint4 (&b)[kLoads], size_t s) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j)
      b[j] = LOADS ? ld_stream(w + (s * kLoads + j) * 512 + 16 * lane)
                   : make_uint4(static_cast<uint32_t>(s), j, lane, 0x12345678u);
  };
  if (s0 < s1) load(r[0], s0);
  if (s0 + 1 < s1) load(r[1], s0 + 1);
  for (size_t s = s0; s < s1; s += 2) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if (s + b >= s1) break;
#pragma unroll
      for (int j = 0; j < kLoads; ++j) acc = mix<CHAIN>(acc, r[b][j], work);
      if (s + b + 2 < s1) load(r[b], s + b + 2);
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mode 4, hybrid: mode 0's warps and steps, but the odd steps go through the warp's own 4 KB of shared memory by
// cp.async (lane-for-lane the bytes it reads back) while the even steps stay in registers. The register loads and the
// cp.async groups are waited on separately (a load scoreboard, DEPBAR on the groups), so computing the register step
// no longer waits for the other step's loads, as mode 0's single scoreboard makes it (see sp24.cu's notes).
template <int CHAIN>
__global__ void __launch_bounds__(256, 2) hybrid_kernel(const char* __restrict__ w, size_t steps,
                                                        uint32_t* __restrict__ out, int work) {
  __shared__ __align__(16) char slots[8][kLoads * 512];
  const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  const size_t s0 = warp * steps / warps, s1 = (warp + 1) * steps / warps;
  char* slot = slots[wid];
  uint4 r[kLoads];
  uint32_t acc = lane;
  auto load = [&](size_t s) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) r[j] = ld_stream(w + (s * kLoads + j) * 512 + 16 * lane);
  };
  auto copy = [&](size_t s) {  // a group even when past the range, so that wait_group 0 always means this step
    if (s < s1) {
#pragma unroll
      for (int j = 0; j < kLoads; ++j)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(slot + j * 512 + 16 * lane)),
                     "l"(w + (s * kLoads + j) * 512 + 16 * lane)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  if (s0 < s1) load(s0);
  copy(s0 + 1);
  for (size_t s = s0; s < s1; s += 2) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc = mix<CHAIN>(acc, r[j], work);
    if (s + 2 < s1) load(s + 2);
    if (s + 1 >= s1) break;
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // each lane reads back only its own pieces
#pragma unroll
    for (int j = 0; j < kLoads; ++j)
      acc = mix<CHAIN>(acc, *reinterpret_cast<const uint4*>(slot + j * 512 + 16 * lane), work);
    copy(s + 3);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// mode 1: 288 threads (warp 8 the producer); the CTA's range of stages of `stage_bytes` each
template <int CHAIN>
__global__ void __launch_bounds__(288) bulk_kernel(const char* __restrict__ w, size_t chunks, int stage_bytes,
                                                   int stages, uint32_t* __restrict__ out, int work) {
  extern __shared__ __align__(128) char ring[];
  __shared__ uint64_t full[16], empty[16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t c0 = blockIdx.x * chunks / gridDim.x, c1 = (blockIdx.x + 1) * chunks / gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  uint32_t acc = threadIdx.x;
  if (warp == 8) {
    if (lane == 0) {
      for (size_t c = c0; c < c1; ++c) {
        const int s = static_cast<int>((c - c0) % stages);
        const uint32_t round = static_cast<uint32_t>((c - c0) / stages);
        if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
        mbar_expect_tx(&full[s], stage_bytes);
        bulk_copy(ring + static_cast<size_t>(s) * stage_bytes, w + c * stage_bytes, stage_bytes, &full[s]);
      }
    }
  } else {
    const int per_warp = stage_bytes / 8;  // bytes of a stage each consumer warp reads
    for (size_t c = c0; c < c1; ++c) {
      const int s = static_cast<int>((c - c0) % stages);
      const uint32_t round = static_cast<uint32_t>((c - c0) / stages);
      mbar_wait(&full[s], round & 1);
      const char* mine = ring + static_cast<size_t>(s) * stage_bytes + warp * per_warp;
      for (int at = 16 * lane; at < per_warp; at += 512)
        acc = mix<CHAIN>(acc, *reinterpret_cast<const uint4*>(mine + at), work);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// mode 2: 256 threads; the CTA's range of stages, each copied by every thread's 16-byte cp.async pieces
template <int CHAIN, int stages>
__global__ void __launch_bounds__(256) cp_async_kernel(const char* __restrict__ w, size_t chunks, int stage_bytes,
                                                       uint32_t* __restrict__ out, int work) {
  extern __shared__ __align__(128) char ring[];
  const size_t c0 = blockIdx.x * chunks / gridDim.x, c1 = (blockIdx.x + 1) * chunks / gridDim.x;
  const int tid = threadIdx.x;
  auto issue = [&](size_t c) {
    if (c < c1) {
      char* dst = ring + static_cast<size_t>((c - c0) % stages) * stage_bytes;
      const char* src = w + c * stage_bytes;
      for (int at = 16 * tid; at < stage_bytes; at += 16 * 256)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst + at)), "l"(src + at)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");  // an empty group past the range keeps the count
  };
  for (int s = 0; s < stages - 1; ++s) issue(c0 + s);
  uint32_t acc = tid;
  for (size_t c = c0; c < c1; ++c) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(stages - 2) : "memory");  // stage c's group has landed
    __syncthreads();
    issue(c + stages - 1);
    const char* stage = ring + static_cast<size_t>((c - c0) % stages) * stage_bytes;
    for (int at = 16 * tid; at < stage_bytes; at += 16 * 256)
      acc = mix<CHAIN>(acc, *reinterpret_cast<const uint4*>(stage + at), work);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

}  // namespace

extern "C" {

// mode 0 / 1 / 2 (see the top), 3 (mode 0 without its loads: the compute alone), 4 (hybrid_kernel) over `bytes` of w
// (a multiple of 4096 for modes 0, 3 and 4, of stage_bytes for 1 and 2); `ctas` CTAs (modes 1 and 2: what their
// shared memory allows); `chain` 1 for one dependent chain of arithmetic a piece, 0 for four; `out` holds a word per
// thread.
int stream_launch(int mode, const void* w, size_t bytes, void* out, int work, int ctas, int stages, int stage_bytes,
                  int chain, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const char* src = static_cast<const char*>(w);
  uint32_t* o = static_cast<uint32_t*>(out);
  if (mode == 4) {
    if (bytes % (kLoads * 512)) return cudaErrorInvalidValue;
    auto kernel = chain ? hybrid_kernel<1> : hybrid_kernel<0>;
    kernel<<<ctas, 256, 0, st>>>(src, bytes / (kLoads * 512), o, work);
    return cudaGetLastError();
  }
  if (mode == 0 || mode == 3) {
    if (bytes % (kLoads * 512)) return cudaErrorInvalidValue;
    auto kernel = mode == 0 ? (chain ? registers_kernel<1, 1> : registers_kernel<0, 1>)
                            : (chain ? registers_kernel<1, 0> : registers_kernel<0, 0>);
    kernel<<<ctas, 256, 0, st>>>(src, bytes / (kLoads * 512), o, work);
    return cudaGetLastError();
  }
  if (stages < 2 || stages > 16 || stage_bytes < 4096 || stage_bytes % 4096 || bytes % stage_bytes)
    return cudaErrorInvalidValue;
  const int smem = stages * stage_bytes;
  if (mode == 1) {
    auto kernel = chain ? bulk_kernel<1> : bulk_kernel<0>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<ctas, 288, smem, st>>>(src, bytes / stage_bytes, stage_bytes, stages, o, work);
    return cudaGetLastError();
  }
  if (mode == 2) {
    using Kernel = void (*)(const char*, size_t, int, uint32_t*, int);
    Kernel kernel = nullptr;
    if (stages == 3) kernel = chain ? cp_async_kernel<1, 3> : cp_async_kernel<0, 3>;
    if (stages == 4) kernel = chain ? cp_async_kernel<1, 4> : cp_async_kernel<0, 4>;
    if (stages == 6) kernel = chain ? cp_async_kernel<1, 6> : cp_async_kernel<0, 6>;
    if (stages == 8) kernel = chain ? cp_async_kernel<1, 8> : cp_async_kernel<0, 8>;
    if (kernel == nullptr) return cudaErrorInvalidValue;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<ctas, 256, smem, st>>>(src, bytes / stage_bytes, stage_bytes, o, work);
    return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

const char* stream_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }
}
