// y = x·Wᵀ for a 50% N:M bitmask-packed W (2:4, 4:8, 8:16, 16:32) and 1..16 rows of x, on tensor cores.
//
// "Load as sparse, compute as dense": the packed bytes (values + bitmask) stream into shared memory through a
// cp.async pipeline; each warp rebuilds a dense 16-row slice of W in registers, directly in the A-operand layout
// of mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate), and multiplies it by x as the B operand (batch = the
// n side, one n-tile for batch 1-8, two for 9-16).
//
// Column order. The dot product does not care in which order the k positions of an MMA visit the columns, as
// long as A and B agree. Lane (g, t) (g = lane / 4, t = lane % 4) is given columns 16t..16t+15 of every 64-column
// word pair, four per k-step s: its A registers a0/a1 hold columns 16t+4s+{0,1} and a2/a3 columns 16t+4s+{2,3}
// (rows g and g+8), its B registers b0/b1 the same columns of batch row g. So a lane's 16 columns are one 16-bit
// half of one mask word, its kept values are a contiguous run of that word's values, and its x slice is 32
// contiguous bytes.
//
// Expansion. Every mask nibble (4 columns, one k-step of one lane) becomes two A registers with two byte
// permutes (prmt) from a 64-bit window holding the nibble's kept values in order, unused bytes zero; the permute
// selectors come from a 16-entry table indexed by the nibble. For 2:4 every nibble keeps exactly 2 values, so
// nibble s of a lane's half is exactly the lane's 32-bit value word s (FAST24: one 16-byte shared load per row
// and k-range of 64 columns). Other 50% patterns fetch the window at the nibble's rank from shared memory.
//
// Split-K: blockIdx.y is a range of column chunks; with more than one split, each CTA writes fp32 partials and
// the last CTA of a row block (counted with an atomic that it resets) sums them and writes y.
//
// Built by sparsedecoding/kernels/cuda_mma.py with nvcc into a shared library called through ctypes (no torch
// headers, no ninja), so compiling takes seconds.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace {

constexpr int kWarps = 4;                        // warps per CTA, 16 rows each
constexpr int kRows = 16 * kWarps;               // rows per CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kChunkWords = 4;                   // mask words (128 columns) per pipeline stage
constexpr int kStages = 4;
constexpr int kValsBytes = kRows * kChunkWords * 32;   // [pair][row][64 B]
constexpr int kValsPad = 16;                     // the generic path reads up to 8 bytes past the last row
constexpr int kMaskBytes = kRows * kChunkWords * 4;    // [row][word]
constexpr int kXStride = kChunkWords * 32 + 8;   // halves per x row; +16 B keeps the B loads conflict-free
constexpr int kLutBytes = 64;

template <int NT>
struct Layout {
  static constexpr int x_rows = 8 * NT;
  static constexpr int vals = 0;
  static constexpr int mask = kValsBytes + kValsPad;
  static constexpr int x = mask + kMaskBytes;
  static constexpr int stage = x + x_rows * kXStride * 2;
  static constexpr int smem = kLutBytes + kStages * stage;
  static_assert(mask % 16 == 0 && x % 16 == 0 && stage % 16 == 0, "16-byte alignment of stage parts");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// src_bytes = 0 fills the destination with zeros without reading (columns past the end of a row).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
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

// Permute selectors for one nibble: a kept column of rank r takes bytes 2r, 2r+1 of the window; a dropped one
// takes byte 7 twice, which is zero whenever the nibble keeps fewer than 4 values (and with 4 kept none is
// dropped). Low 16 bits: columns 0-1 (first A register), high 16 bits: columns 2-3.
__device__ __forceinline__ uint32_t nibble_selectors(uint32_t nib) {
  uint32_t sel = 0;
  uint32_t rank = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t kept = (nib >> c) & 1u;
    const uint32_t code = kept ? ((2 * rank) | ((2 * rank + 1) << 4)) : 0x77u;
    sel |= code << (8 * c);
    rank += kept;
  }
  return sel;
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// The 64-bit window of a row's values starting at element `rank` of a 32-value word pair row in shared memory,
// with everything past the first `count` values zeroed.
__device__ __forceinline__ void value_window(const char* pair_row, uint32_t rank, uint32_t count, uint32_t& q0,
                                             uint32_t& q1) {
  const uint2 lo = *reinterpret_cast<const uint2*>(pair_row + 2 * (rank & ~3u));
  const uint2 hi = *reinterpret_cast<const uint2*>(pair_row + 2 * (rank & ~3u) + 8);
  uint32_t w0 = lo.x, w1 = lo.y, w2 = hi.x;
  if (rank & 2u) {
    w0 = lo.y;
    w1 = hi.x;
    w2 = hi.y;
  }
  if (rank & 1u) {
    w0 = __funnelshift_r(w0, w1, 16);
    w1 = __funnelshift_r(w1, w2, 16);
  }
  const uint64_t keep = count >= 4 ? ~0ull : ((1ull << (16 * count)) - 1);
  q0 = w0 & static_cast<uint32_t>(keep);
  q1 = w1 & static_cast<uint32_t>(keep >> 32);
}

template <typename T, int NT, bool FAST24>
__global__ void __launch_bounds__(kThreads) nm_mma_kernel(const T* __restrict__ x, const T* __restrict__ values,
                                                          const uint32_t* __restrict__ bitmask, T* __restrict__ y,
                                                          float* __restrict__ partials, int* __restrict__ counters,
                                                          int batch, int out, int words, int chunks_per_split) {
  using L = Layout<NT>;
  extern __shared__ __align__(16) char smem[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  char* stages = smem + kLutBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const int split = blockIdx.y, splits = gridDim.y;
  const int chunks = (words + kChunkWords - 1) / kChunkWords;
  const int chunk0 = split * chunks_per_split;
  const int n_chunks = max(0, min(chunks, chunk0 + chunks_per_split) - chunk0);
  const int in_features = words * 32;

  if (tid < 16) lut[tid] = nibble_selectors(tid);

  auto load_stage = [&](int slot, int chunk) {
    char* st = stages + slot * L::stage;
    const int w0 = chunk * kChunkWords;
    // values: per row 4 words = 128 B = 8 pieces of 16 B; piece q goes to word pair q/4, offset (q%4)·16.
#pragma unroll
    for (int k = 0; k < kRows * 8 / kThreads; ++k) {
      const int piece = tid + k * kThreads;
      const int r = piece / 8, q = piece % 8;
      const int grow = min(row0 + r, out - 1);
      const bool ok = w0 + q / 2 < words;
      const T* src = ok ? values + (static_cast<size_t>(grow) * words + w0) * 16 + q * 8 : values;
      cp_async16(st + L::vals + (q / 4) * (kRows * 64) + r * 64 + (q % 4) * 16, src, ok ? 16 : 0);
    }
#pragma unroll
    for (int k = 0; k < kRows * kChunkWords / kThreads; ++k) {
      const int e = tid + k * kThreads;
      const int r = e / kChunkWords, wi = e % kChunkWords;
      const int grow = min(row0 + r, out - 1);
      const bool ok = w0 + wi < words;
      const uint32_t* src = ok ? bitmask + static_cast<size_t>(grow) * words + w0 + wi : bitmask;
      cp_async4(st + L::mask + (r * kChunkWords + wi) * 4, src, ok ? 4 : 0);
    }
    // x: rows past the batch are never loaded; they only feed output columns that are not stored.
#pragma unroll
    for (int k = 0; k < L::x_rows * 16 / kThreads; ++k) {
      const int e = tid + k * kThreads;
      const int b = e / 16, q = e % 16;
      if (b < batch) {
        const int col = w0 * 32 + q * 8;
        const bool ok = col < in_features;
        const T* src = ok ? x + static_cast<size_t>(b) * in_features + col : x;
        cp_async16(st + L::x + (b * kXStride + q * 8) * 2, src, ok ? 16 : 0);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_chunks) load_stage(s, chunk0 + s);
    cp_async_commit();
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const int rg = warp * 16 + g;  // this lane's first row within the CTA; the second is rg + 8
  for (int i = 0; i < n_chunks; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage i has landed for every thread, and every warp is done with stage i - 1
    if (i + kStages - 1 < n_chunks) load_stage((i + kStages - 1) % kStages, chunk0 + i + kStages - 1);
    cp_async_commit();

    const char* st = stages + (i % kStages) * L::stage;
    const uint4 mask_g = *reinterpret_cast<const uint4*>(st + L::mask + rg * kChunkWords * 4);
    const uint4 mask_g8 = *reinterpret_cast<const uint4*>(st + L::mask + (rg + 8) * kChunkWords * 4);
#pragma unroll
    for (int p = 0; p < kChunkWords / 2; ++p) {
      // lane's mask word: 2p + t/2; its half: t % 2
      const uint32_t word_g = (t / 2) ? (p ? mask_g.w : mask_g.y) : (p ? mask_g.z : mask_g.x);
      const uint32_t word_g8 = (t / 2) ? (p ? mask_g8.w : mask_g8.y) : (p ? mask_g8.z : mask_g8.x);
      const uint32_t half_g = (t % 2) ? word_g >> 16 : word_g & 0xFFFFu;
      const uint32_t half_g8 = (t % 2) ? word_g8 >> 16 : word_g8 & 0xFFFFu;

      uint32_t xb[NT][8];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const char* xr = st + L::x + ((8 * j + g) * kXStride + 64 * p + 16 * t) * 2;
        const uint4 lo = *reinterpret_cast<const uint4*>(xr);
        const uint4 hi = *reinterpret_cast<const uint4*>(xr + 16);
        xb[j][0] = lo.x; xb[j][1] = lo.y; xb[j][2] = lo.z; xb[j][3] = lo.w;
        xb[j][4] = hi.x; xb[j][5] = hi.y; xb[j][6] = hi.z; xb[j][7] = hi.w;
      }

      const char* pair_g = st + L::vals + p * (kRows * 64) + rg * 64;
      const char* pair_g8 = pair_g + 8 * 64;
      uint4 v_g, v_g8;
      uint32_t rank_g = 0, rank_g8 = 0;
      if constexpr (FAST24) {
        v_g = *reinterpret_cast<const uint4*>(pair_g + 16 * t);
        v_g8 = *reinterpret_cast<const uint4*>(pair_g8 + 16 * t);
      } else {
        // first kept value of the lane's half, counted from the start of the word pair's 32 values
        rank_g = 16 * (t / 2) + ((t % 2) ? __popc(word_g & 0xFFFFu) : 0);
        rank_g8 = 16 * (t / 2) + ((t % 2) ? __popc(word_g8 & 0xFFFFu) : 0);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t nib_g = (half_g >> (4 * s)) & 0xFu;
        const uint32_t nib_g8 = (half_g8 >> (4 * s)) & 0xFu;
        const uint32_t sel_g = lut[nib_g], sel_g8 = lut[nib_g8];
        uint32_t q0_g, q1_g, q0_g8, q1_g8;
        if constexpr (FAST24) {
          q0_g = s == 0 ? v_g.x : s == 1 ? v_g.y : s == 2 ? v_g.z : v_g.w;
          q0_g8 = s == 0 ? v_g8.x : s == 1 ? v_g8.y : s == 2 ? v_g8.z : v_g8.w;
          q1_g = q1_g8 = 0;
        } else {
          const uint32_t c_g = __popc(nib_g), c_g8 = __popc(nib_g8);
          value_window(pair_g, rank_g, c_g, q0_g, q1_g);
          value_window(pair_g8, rank_g8, c_g8, q0_g8, q1_g8);
          rank_g += c_g;
          rank_g8 += c_g8;
        }
        const uint32_t a0 = prmt(q0_g, q1_g, sel_g);
        const uint32_t a2 = prmt(q0_g, q1_g, sel_g >> 16);
        const uint32_t a1 = prmt(q0_g8, q1_g8, sel_g8);
        const uint32_t a3 = prmt(q0_g8, q1_g8, sel_g8 >> 16);
#pragma unroll
        for (int j = 0; j < NT; ++j)
          mma16816<std::is_same<T, __nv_bfloat16>::value>(acc[j], a0, a1, a2, a3, xb[j][2 * s], xb[j][2 * s + 1]);
      }
    }
  }
  cp_async_wait<0>();

  // acc[j][0..1]: row rg, batch rows 8j + 2t, +1; acc[j][2..3]: row rg + 8.
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1);
        const int row = row0 + rg + 8 * (e >> 1);
        if (b < batch && row < out) y[static_cast<size_t>(b) * out + row] = from_float<T>(acc[j][e]);
      }
    return;
  }

#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int b = 8 * j + 2 * t + (e & 1);
      const int row = row0 + rg + 8 * (e >> 1);
      if (b < batch && row < out) partials[(static_cast<size_t>(split) * batch + b) * out + row] = acc[j][e];
    }
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (tid == 0) {
    last = atomicAdd(&counters[blockIdx.x], 1) == splits - 1;
    if (last) counters[blockIdx.x] = 0;  // ready for the next launch; every other CTA of the block has counted
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = tid; e < kRows * batch; e += kThreads) {
    const int b = e / kRows, row = row0 + e % kRows;
    if (row >= out) continue;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(partials + (static_cast<size_t>(s) * batch + b) * out + row);
    y[static_cast<size_t>(b) * out + row] = from_float<T>(sum);
  }
}

template <typename T, int NT, bool FAST24>
cudaError_t launch(const void* x, const void* values, const void* bitmask, void* y, float* partials, int* counters,
                   int batch, int out, int words, int splits, cudaStream_t stream) {
  auto kernel = nm_mma_kernel<T, NT, FAST24>;
  const int smem = Layout<NT>::smem;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const int chunks = (words + kChunkWords - 1) / kChunkWords;
  const int per_split = (chunks + splits - 1) / splits;
  const int used_splits = (chunks + per_split - 1) / per_split;  // no split without work
  dim3 grid((out + kRows - 1) / kRows, used_splits);
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(x), static_cast<const T*>(values),
                                           static_cast<const uint32_t*>(bitmask), static_cast<T*>(y), partials,
                                           counters, batch, out, words, per_split);
  return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch(const void* x, const void* values, const void* bitmask, void* y, float* partials,
                     int* counters, int batch, int out, int words, int fast24, int splits, cudaStream_t stream) {
  if (batch <= 8) {
    return fast24 ? launch<T, 1, true>(x, values, bitmask, y, partials, counters, batch, out, words, splits, stream)
                  : launch<T, 1, false>(x, values, bitmask, y, partials, counters, batch, out, words, splits, stream);
  }
  return fast24 ? launch<T, 2, true>(x, values, bitmask, y, partials, counters, batch, out, words, splits, stream)
                : launch<T, 2, false>(x, values, bitmask, y, partials, counters, batch, out, words, splits, stream);
}

}  // namespace

extern "C" {

// Launch on `stream`. Returns 0 or a cudaError_t; bad arguments give cudaErrorInvalidValue (the Python wrapper
// validates first, so that is a second line of defence). `partials` holds splits·batch·out floats and `counters`
// one zeroed int per 64-row block when splits > 1; both are unused otherwise.
int nm_mma_launch(const void* x, const void* values, const void* bitmask, void* y, float* partials, int* counters,
                  int batch, int out, int words, int is_bf16, int fast24, int splits, void* stream) {
  if (batch < 1 || batch > 16 || out < 1 || words < 1 || splits < 1) return cudaErrorInvalidValue;
  if (splits > 1 && (partials == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  return is_bf16 ? dispatch<__nv_bfloat16>(x, values, bitmask, y, partials, counters, batch, out, words, fast24,
                                           splits, s)
                 : dispatch<__half>(x, values, bitmask, y, partials, counters, batch, out, words, fast24, splits, s);
}

const char* nm_mma_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

int nm_mma_rows_per_block() { return kRows; }

int nm_mma_chunk_words() { return kChunkWords; }

}  // extern "C"
