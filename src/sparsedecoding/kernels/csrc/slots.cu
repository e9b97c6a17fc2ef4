// y_out = y_in + x·W_overᵀ for the overflow slots of a 16:32+K weight tiled for sp24.cu (`over_v`, `over_o`, the
// layout sp24.py `tile_overflow` writes), as a launch of its own after sp24 has computed y_in = x·W24ᵀ on the 2:4
// part. This is the split form of sp24.cu's OVER path: there the slots ride in the MMA loop, whose warps then wait
// on the slots' shared loads at 9-16 rows of x (results/overflow_h200_one_cta.md); here a grid of its own adds them.
//
// Layout read (see sp24.cu, "Overflow slots"): per row tile and step, lane (g, t) of the tile's 32 lanes holds 8
// values (16 B) and 8 staged-x offsets (8 B); its slot k (0..7) is in word 8·step + (t - g) % 4 + 4·(k / 4), row
// g + 8·((k / 2) % 2), and the offset o gives the word's column c = 8·((o / 4) % 4) + 2·(o / 16) + (o / 2) % 2.
//
// x comes transposed and padded, xt [in][NB] (NB = 4, 8 or 16 ≥ batch, zeros beyond it), so that one column of x
// for every row of x is NB·2 contiguous bytes. A first version read those straight from global memory, one gather a
// slot: at NB = 16 that is 32 bytes of x (from L2) for 3 bytes of slot, and it ran at L2's pace
// (results/overflow_h200_split_gathers.md). Here a CTA owns 8 row tiles (one a warp) and a range of steps
// (blockIdx.y, `per_split` steps), copies that range of xt into shared memory once (cp.async), and its warps gather
// from there: x crosses L2 once per 128 rows. That did not make it faster (results/overflow_h200_split.md): the
// gathers themselves, 32 bytes of x a slot at 16 rows of x, bound it wherever they come from, and the split stays
// slower than the fused kernel at batch 8-16 (sp24_split.py).
//
// Each lane keeps float32 partials p[row g / g+8][row of x] over the range; two butterflies sum the quad. With one
// split the lanes add y_in and write y_out; with more, they add into `ws` (float32 [batch][out], zeroed by the
// caller, followed by one int counter a CTA row, zeroed too) and the CTA whose counter reaches `splits` writes
// y_out = y_in + ws for its rows. Rows are those of the tiled layout (for a GLU weight, `glu_order`), as sp24
// writes y_in for the same weight without its GLU epilogue; rows past `out` and rows of x past `batch` are not
// written.
//
// With `pdl` on compute capability 9.0 the launch is programmatic: CTAs may start while sp24 finishes, load their
// first slots, and wait (griddepcontrol.wait) before they read xt, y_in or ws.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 8;

// The 16-bit conversions below repeat sp24.cu's and nm_mma.cu's on purpose: each .cu file is its own library, and
// cuda_mma.build names a cached build by the hash of that one file, so a shared header could change unseen.
template <typename T>
__device__ __forceinline__ float half_bits(uint32_t bits);
template <>
__device__ __forceinline__ float half_bits<__nv_bfloat16>(uint32_t bits) { return __uint_as_float(bits << 16); }
template <>
__device__ __forceinline__ float half_bits<__half>(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

// The 16-bit words of staged column `col` (NB of them, from shared memory) into w[NB / 2].
template <int NB>
__device__ __forceinline__ void load_column(const uint32_t* xs, int col, uint32_t (&w)[NB / 2]) {
  if constexpr (NB == 4) {
    const uint2 v = reinterpret_cast<const uint2*>(xs)[col];
    w[0] = v.x;
    w[1] = v.y;
  } else {
#pragma unroll
    for (int q = 0; q < NB / 8; ++q) {
      const uint4 v = reinterpret_cast<const uint4*>(xs)[col * (NB / 8) + q];
      w[4 * q] = v.x;
      w[4 * q + 1] = v.y;
      w[4 * q + 2] = v.z;
      w[4 * q + 3] = v.w;
    }
  }
}

constexpr int kMaxSmem = 64 * 1024;  // the staged range of xt

template <typename T, int NB>
__global__ void __launch_bounds__(32 * kWarps) slots_kernel(const T* __restrict__ xt, const uint4* __restrict__ over_v,
                                                           const uint2* __restrict__ over_o, const T* y_in, T* y_out,
                                                           float* ws, int batch, int out, int in, int steps,
                                                           int per_split, int splits) {
  extern __shared__ __align__(16) unsigned char xs[];  // xt columns [32·8·step0, 32·8·step1), NB·2 bytes each
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, g = lane / 4;
  const int row_tiles = (out + 15) / 16, tile = blockIdx.x * kWarps + warp;
  const int step0 = blockIdx.y * per_split, step1 = min(steps, step0 + per_split);
  const int col0 = step0 * 256, cols = min(in, step1 * 256) - col0;  // columns of x this CTA stages (≤ `in`)
  constexpr int kColBytes = NB * 2;
  float p[2][NB];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b) p[h][b] = 0.f;
  const bool active = tile < row_tiles;
  const long long lane0 = static_cast<long long>(tile) * steps * 32 + lane;
  uint4 vals = make_uint4(0, 0, 0, 0);
  uint2 offs = make_uint2(0, 0);
  if (active && step0 < step1) {
    vals = over_v[lane0 + static_cast<long long>(step0) * 32];
    offs = over_o[lane0 + static_cast<long long>(step0) * 32];
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  {  // stage the range of xt: 16-byte copies, zeros past `in` (padded words hold value 0, but 0 · garbage may not be)
    const char* src = reinterpret_cast<const char*>(xt) + static_cast<long long>(col0) * kColBytes;
    const int bytes = cols * kColBytes, staged = (step1 - step0) * 256 * kColBytes;
    for (int i = threadIdx.x * 16; i < staged; i += 32 * kWarps * 16) {
      if (i < bytes) {
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(xs + i));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + i));
      } else {
        *reinterpret_cast<uint4*>(xs + i) = make_uint4(0, 0, 0, 0);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  }
  __syncthreads();
  if (active) {
    for (int step = step0; step < step1; ++step) {
      const uint4 v_now = vals;
      const uint2 o_now = offs;
      if (step + 1 < step1) {  // the next step's slots, in flight while this one multiplies
        vals = over_v[lane0 + static_cast<long long>(step + 1) * 32];
        offs = over_o[lane0 + static_cast<long long>(step + 1) * 32];
      }
      const uint32_t vw[4] = {v_now.x, v_now.y, v_now.z, v_now.w};
      const uint32_t ow[2] = {o_now.x, o_now.y};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float v = half_bits<T>((vw[k >> 1] >> (16 * (k & 1))) & 0xFFFFu);
        const uint32_t o = (ow[k >> 2] >> (8 * (k & 3))) & 0xFFu;
        const int c = 8 * ((o >> 2) & 3) + 2 * (o >> 4) + ((o >> 1) & 1);
        const int col = 32 * (8 * (step - step0) + ((t - g) & 3) + 4 * (k >> 2)) + c;  // in the staged range
        uint32_t w[NB / 2];
        load_column<NB>(reinterpret_cast<const uint32_t*>(xs), col, w);
#pragma unroll
        for (int b = 0; b < NB; ++b)
          p[(k >> 1) & 1][b] = fmaf(v, half_bits<T>((w[b >> 1] >> (16 * (b & 1))) & 0xFFFFu), p[(k >> 1) & 1][b]);
      }
    }
  }
  // The quad's lanes hold the same two rows over different words: sum them; lane t then owns rows of x b ≡ t mod 4.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      p[h][b] += __shfl_xor_sync(0xFFFFFFFFu, p[h][b], 1);
      p[h][b] += __shfl_xor_sync(0xFFFFFFFFu, p[h][b], 2);
    }
  if (splits == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int row = 16 * tile + g + 8 * h;
        if (active && b % 4 == t && b < batch && row < out) {
          const long long at = static_cast<long long>(b) * out + row;
          y_out[at] = from_float<T>(to_float<T>(y_in[at]) + p[h][b]);
        }
      }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int row = 16 * tile + g + 8 * h;
      if (active && b % 4 == t && b < batch && row < out)
        atomicAdd(ws + static_cast<long long>(b) * out + row, p[h][b]);
    }
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    int* counters = reinterpret_cast<int*>(ws + static_cast<long long>(batch) * out);
    last = atomicAdd(counters + blockIdx.x, 1) == splits - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int rows = min(out - blockIdx.x * 16 * kWarps, 16 * kWarps);
  for (int i = threadIdx.x; i < rows * batch; i += 32 * kWarps) {
    const int b = i / rows, row = blockIdx.x * 16 * kWarps + i % rows;
    const long long at = static_cast<long long>(b) * out + row;
    y_out[at] = from_float<T>(to_float<T>(y_in[at]) + __ldcg(ws + at));
  }
}

template <typename T, int NB>
cudaError_t launch(const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out, float* ws,
                   int batch, int out, int in, int steps, int splits, int pdl, cudaStream_t stream) {
  auto kernel = slots_kernel<T, NB>;
  const int per_split = (steps + splits - 1) / splits;
  const int used = (steps + per_split - 1) / per_split;
  const int smem = per_split * 256 * NB * 2;
  if (smem > kMaxSmem || (used > 1 && ws == nullptr)) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(((out + 15) / 16 + kWarps - 1) / kWarps, used);
  config.blockDim = dim3(32 * kWarps);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(xt), static_cast<const uint4*>(over_v),
                            static_cast<const uint2*>(over_o), static_cast<const T*>(y_in), static_cast<T*>(y_out),
                            ws, batch, out, in, steps, per_split, used);
}

template <typename T>
cudaError_t by_width(int nb, const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out,
                     float* ws, int batch, int out, int in, int steps, int splits, int pdl, cudaStream_t stream) {
  switch (nb) {
    case 4: return launch<T, 4>(xt, over_v, over_o, y_in, y_out, ws, batch, out, in, steps, splits, pdl, stream);
    case 8: return launch<T, 8>(xt, over_v, over_o, y_in, y_out, ws, batch, out, in, steps, splits, pdl, stream);
    case 16: return launch<T, 16>(xt, over_v, over_o, y_in, y_out, ws, batch, out, in, steps, splits, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

// xt: x transposed [in][nb] (nb 4, 8 or 16, batch ≤ nb, zeros past batch), T = bf16 when is_bf16 else fp16;
// over_v / over_o: the tiled slots (steps steps of 8 words a row tile); y_in, y_out: [batch][out] (may be the same
// buffer); `splits` step ranges (CTAs along y), each staging per_split = ceil(steps / splits) steps of xt (at most
// 64 KB); with more than one used, ws: float32 [batch·out] then one int a CTA row (ceil(out / 128)), all zero.
// Returns 0 or a cudaError_t.
int slots_launch(const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out, float* ws,
                 int batch, int nb, int out, int in, int steps, int splits, int is_bf16, int pdl, void* stream) {
  if (batch < 1 || batch > nb || out < 1 || in < 32 || in % 32 || steps < 1 || steps * 256 < in || splits < 1)
    return cudaErrorInvalidValue;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return is_bf16 ? by_width<__nv_bfloat16>(nb, xt, over_v, over_o, y_in, y_out, ws, batch, out, in, steps, splits,
                                           pdl, s)
                 : by_width<__half>(nb, xt, over_v, over_o, y_in, y_out, ws, batch, out, in, steps, splits, pdl, s);
}

int slots_max_smem() { return kMaxSmem; }

const char* slots_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // extern "C"
