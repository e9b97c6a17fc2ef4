// y_out = y_in + x·W_overᵀ for the overflow slots of a 16:32+K weight tiled for sp24.cu (`over_v`, `over_o`, the
// layout sp24.py `tile_overflow` writes), as a launch of its own after sp24 has computed y_in = x·W24ᵀ on the 2:4
// part. This is the split form of sp24.cu's OVER path: there the slots ride in the MMA loop, whose warps then wait
// on the slots' shared loads at 9-16 rows of x (results/overflow_h200_one_cta.md); here a grid of its own adds them
// with every warp free to keep its loads in flight.
//
// Layout read (see sp24.cu, "Overflow slots"): per row tile and step, lane (g, t) of the tile's 32 lanes holds 8
// values (16 B) and 8 staged-x offsets (8 B); its slot k (0..7) is in word 8·step + 2t + k / 4, row g + 8·((k / 2) %
// 2), and the offset o gives the word's column c = 8·((o / 4) % 4) + 2·(o / 16) + (o / 2) % 2.
//
// x comes transposed and padded, xt [in][NB] (NB = 4, 8 or 16 ≥ batch, zeros beyond it), so a slot reads its column
// of x for every row of x with one or two 16-byte loads (xt stays in L1 / L2: 32 bytes a column at NB = 16).
//
// A CTA owns one row tile; its 8 warps share out the steps (warp w: steps w, w + 8, ...). Each lane keeps float32
// partials p[row g / g+8][row of x] over its steps, the quad's four lanes are summed with two butterflies, the 8
// warps through shared memory, and 16·NB threads each write one y entry in y's dtype (rows past `out` and rows of x
// past `batch` are not written). Rows are those of the tiled layout (for a GLU weight, `glu_order`), as sp24
// writes y_in for the same weight without its GLU epilogue.
//
// With `pdl` on compute capability 9.0 the launch is programmatic: CTAs may start while sp24 finishes, read their
// first slots, and wait (griddepcontrol.wait) before they read xt or y_in.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 8;

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

// The 16-bit words of xt's row `col` (NB of them) into w[NB / 2].
template <int NB>
__device__ __forceinline__ void load_column(const uint32_t* __restrict__ xt, int col, uint32_t (&w)[NB / 2]) {
  if constexpr (NB == 4) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(xt) + col);
    w[0] = v.x;
    w[1] = v.y;
  } else {
#pragma unroll
    for (int q = 0; q < NB / 8; ++q) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(xt) + col * (NB / 8) + q);
      w[4 * q] = v.x;
      w[4 * q + 1] = v.y;
      w[4 * q + 2] = v.z;
      w[4 * q + 3] = v.w;
    }
  }
}

template <typename T, int NB>
__global__ void __launch_bounds__(32 * kWarps) slots_kernel(const T* __restrict__ xt, const uint4* __restrict__ over_v,
                                                           const uint2* __restrict__ over_o,
                                                           const T* y_in, T* y_out,
                                                           int batch, int out, int in, int steps) {
  const int tile = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, g = lane / 4;
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(xt);
  float p[2][NB];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b) p[h][b] = 0.f;

  uint4 vals = make_uint4(0, 0, 0, 0);
  uint2 offs = make_uint2(0, 0);
  const long long lane0 = static_cast<long long>(tile) * steps * 32 + lane;
  if (warp < steps) {
    vals = over_v[lane0 + static_cast<long long>(warp) * 32];
    offs = over_o[lane0 + static_cast<long long>(warp) * 32];
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  for (int step = warp; step < steps; step += kWarps) {
    const uint4 v_now = vals;
    const uint2 o_now = offs;
    if (step + kWarps < steps) {  // the next step's slots, in flight while this one multiplies
      vals = over_v[lane0 + static_cast<long long>(step + kWarps) * 32];
      offs = over_o[lane0 + static_cast<long long>(step + kWarps) * 32];
    }
    const uint32_t vw[4] = {v_now.x, v_now.y, v_now.z, v_now.w};
    const uint32_t ow[2] = {o_now.x, o_now.y};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float v = half_bits<T>((vw[k >> 1] >> (16 * (k & 1))) & 0xFFFFu);
      const uint32_t o = (ow[k >> 2] >> (8 * (k & 3))) & 0xFFu;
      const int c = 8 * ((o >> 2) & 3) + 2 * (o >> 4) + ((o >> 1) & 1);
      int col = 32 * (8 * step + 2 * t + (k >> 2)) + c;
      col = col < in ? col : 0;  // padded words past `in` hold value 0
      uint32_t w[NB / 2];
      load_column<NB>(xw, col, w);
#pragma unroll
      for (int b = 0; b < NB; ++b)
        p[(k >> 1) & 1][b] = fmaf(v, half_bits<T>((w[b >> 1] >> (16 * (b & 1))) & 0xFFFFu), p[(k >> 1) & 1][b]);
    }
  }
  // The quad's lanes hold the same two rows over different words: sum them.
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      p[h][b] += __shfl_xor_sync(0xFFFFFFFFu, p[h][b], 1);
      p[h][b] += __shfl_xor_sync(0xFFFFFFFFu, p[h][b], 2);
    }
  __shared__ float sums[kWarps][16][NB];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (b % 4 == t) sums[warp][g + 8 * h][b] = p[h][b];
  __syncthreads();
  if (threadIdx.x < 16 * NB) {
    const int r = threadIdx.x / NB, b = threadIdx.x % NB, row = 16 * tile + r;
    if (b < batch && row < out) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += sums[w][r][b];
      const long long at = static_cast<long long>(b) * out + row;
      y_out[at] = from_float<T>(to_float<T>(y_in[at]) + s);
    }
  }
}

template <typename T, int NB>
cudaError_t launch(const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out, int batch,
                   int out, int in, int steps, int pdl, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((out + 15) / 16);
  config.blockDim = dim3(32 * kWarps);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, slots_kernel<T, NB>, static_cast<const T*>(xt),
                            static_cast<const uint4*>(over_v), static_cast<const uint2*>(over_o),
                            static_cast<const T*>(y_in), static_cast<T*>(y_out), batch, out, in, steps);
}

template <typename T>
cudaError_t by_width(int nb, const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out,
                     int batch, int out, int in, int steps, int pdl, cudaStream_t stream) {
  switch (nb) {
    case 4: return launch<T, 4>(xt, over_v, over_o, y_in, y_out, batch, out, in, steps, pdl, stream);
    case 8: return launch<T, 8>(xt, over_v, over_o, y_in, y_out, batch, out, in, steps, pdl, stream);
    case 16: return launch<T, 16>(xt, over_v, over_o, y_in, y_out, batch, out, in, steps, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

// xt: x transposed [in][nb] (nb 4, 8 or 16, batch ≤ nb, zeros past batch), T = bf16 when is_bf16 else fp16;
// over_v / over_o: the tiled slots (steps steps of 8 words a row tile); y_in, y_out: [batch][out] (may be the same
// buffer). Returns 0 or a cudaError_t.
int slots_launch(const void* xt, const void* over_v, const void* over_o, const void* y_in, void* y_out, int batch,
                 int nb, int out, int in, int steps, int is_bf16, int pdl, void* stream) {
  if (batch < 1 || batch > nb || out < 1 || in < 32 || in % 32 || steps < 1 || steps * 256 < in)
    return cudaErrorInvalidValue;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return is_bf16 ? by_width<__nv_bfloat16>(nb, xt, over_v, over_o, y_in, y_out, batch, out, in, steps, pdl, s)
                 : by_width<__half>(nb, xt, over_v, over_o, y_in, y_out, batch, out, in, steps, pdl, s);
}

const char* slots_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // extern "C"
