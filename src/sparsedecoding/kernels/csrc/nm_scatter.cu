// y = x·Wᵀ for a 50% N:M bitmask-packed W (any pattern whose 32-column mask words keep 16 values: 16:32, 8:16, 4:8,
// 2:4) and 1..16 rows of x: each warp scatters its packed words into a dense tile in shared memory and feeds the
// tensor cores from it with ldmatrix ("load as sparse, compute as dense" with the expansion done by stores, not by
// per-column rank arithmetic).
//
// Why a scatter: nm_mma.cu expands each mask nibble in registers, which needs every column's rank among the kept
// values (a popcount, a shared-memory window at that rank, selects): a dependent integer chain that made 16:32 issue-
// bound at 0.6-0.8x cuBLAS (benchmarks/CUDA_KERNEL_NOTES.md). Walking a word's kept values instead needs no rank:
// value i of a word is the i-th set bit from the top, found by one count-leading-zeros, so each kept value costs a
// handful of independent instructions and one 16-bit shared store.
//
// Per warp and step (16 rows x 128 columns = 4 mask words a row):
// - lane l holds word (l & 3) of rows (l >> 2) and (l >> 2) + 8 of the warp's strip: its 16 values (32 bytes) and
//   its mask word, loaded from global memory straight into registers one step ahead;
// - the warp zeroes its tile (16-byte stores, 8 lanes a row segment, no bank conflicts), then each lane stores its
//   words' kept values at their columns;
// - ldmatrix.x4 reads the A operand of mma.m16n8k16 from the tile, and the B operand (x) from a copy of x that the CTA
//   stages once for its column range; one n-tile of 8 batch rows for batch 1-8, two for 9-16.
// Tile rows are 256 + 16 bytes apart and x rows 32·range_words·2 + 16, so that the 8 rows an ldmatrix phase reads
// fall on 8 different 16-byte bank groups.
//
// Split-K: blockIdx.y is a range of at most kRangeWords mask words (the x copy holds that range); with more than one
// split each CTA writes fp32 partials and the last CTA of a row block (counted with an atomic that it resets) sums
// them, as in nm_mma.cu.
//
// NM_SCATTER_PREFETCH = D > 0 also asks the L2 for each lane's words D steps past the ones it loads into registers
// (prefetch.global.L2: no register or shared memory held), so that a warp has more than one step of its weight in
// flight; the register loads then mostly hit the L2.
//
// NM_SCATTER_NO_EXPAND builds a probe without the zeroing and the scatter (its products are wrong): the loads, the x
// copy, ldmatrix and the MMAs alone, to measure what the expansion costs (benchmarks/scatter_bench.py --probe).
//
// Requires exactly 16 set bits in every mask word (pack_nm keeps explicit zeros to guarantee it; nm_scatter.py
// checks a weight when a launch is built). Built by sparsedecoding/kernels/nm_scatter.py through cuda_mma's build
// (nvcc into a plain shared library, called through ctypes). Compute capability 8.0+ (ldmatrix, bf16 mma).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "mma_common.cuh"

namespace {

#ifndef NM_SCATTER_WARPS
#define NM_SCATTER_WARPS 8
#endif
#ifndef NM_SCATTER_RANGE_WORDS
#define NM_SCATTER_RANGE_WORDS 64
#endif
constexpr int kWarps = NM_SCATTER_WARPS;          // warps a CTA, one 16-row strip each
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;                // rows of W a CTA
constexpr int kStepWords = 4;                     // mask words a row and step: 128 columns
constexpr int kRangeWords = NM_SCATTER_RANGE_WORDS;  // the most mask words one CTA covers (its x copy)
static_assert(kWarps == 4 || kWarps == 8 || kWarps == 16, "NM_SCATTER_WARPS: 4, 8 or 16");
constexpr int kMinCtas = kWarps == 16 ? 1 : 2;  // CTAs a multiprocessor the registers must allow
#ifndef NM_SCATTER_PREFETCH
#define NM_SCATTER_PREFETCH 0
#endif
constexpr int kPrefetch = NM_SCATTER_PREFETCH;  // steps past the register load that the L2 is asked for
static_assert(kPrefetch >= 0 && kPrefetch <= 32, "NM_SCATTER_PREFETCH: 0..32 steps");
static_assert(kRangeWords % kStepWords == 0 && kRangeWords >= 8 && kRangeWords <= 128, "NM_SCATTER_RANGE_WORDS");
constexpr int kTileRowBytes = kStepWords * 64 + 16;  // a tile row: 128 bf16 columns and 16 bytes of stagger
constexpr int kTileBytes = 16 * kTileRowBytes;
constexpr int kXRowBytes = kRangeWords * 64 + 16;    // an x row of the CTA's range, staggered the same way

template <int NT>
struct Layout {
  static constexpr int tiles = 0;                      // kWarps tiles
  static constexpr int x = kWarps * kTileBytes;        // 8·NT rows of x
  static constexpr int smem = x + 8 * NT * kXRowBytes;
  static_assert(x % 128 == 0, "x copy on a 128-byte boundary");
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// One lane's words of a step: 16 values (8 pair registers, value 2k in the low half of register k) and the mask of
// each of its two rows.
struct Words {
  uint4 v[2][2];
  uint32_t m[2];
};

// Stores a word's 16 kept values at their columns of a zeroed 64-byte tile segment starting at shared address
// `base`: value i (counted from the top) sits at the highest set bit left after clearing the 15 - i above it.
__device__ __forceinline__ void scatter_word(uint32_t base, const uint4 (&v)[2], uint32_t m) {
  const uint32_t r[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
#pragma unroll
  for (int i = 15; i >= 0; --i) {
    const uint32_t z = __clz(m);  // the column is 31 - z; 16 set bits, so m != 0 here
    m &= 0x7FFFFFFFu >> z;
    st_shared_u16(base + 62 - 2 * z, (i & 1) ? r[i >> 1] >> 16 : r[i >> 1]);
  }
}

template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    nm_scatter_kernel(const T* __restrict__ x, const T* __restrict__ values, const uint32_t* __restrict__ bitmask,
                      T* __restrict__ y, float* __restrict__ partials, int* __restrict__ counters, int batch, int out,
                      int words, int words_per_split, int row_blocks) {
  using L = Layout<NT>;
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int split = blockIdx.y, splits = gridDim.y;
  const int w_begin = split * words_per_split;
  const int n_words = max(0, min(words, w_begin + words_per_split) - w_begin);
  const int steps = (n_words + kStepWords - 1) / kStepWords;
  const int in_features = words * 32;
  // The CTA's row blocks: blockIdx.x, + gridDim.x, ... below row_blocks, one after the other with the same x copy;
  // the loads run through them as one sequence of steps, so that the next block's first words are in flight while
  // this block's last step computes.
  const int my_blocks = blockIdx.x < row_blocks ? (row_blocks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total = my_blocks * steps;

  // A place in that sequence: a row block, a step of it, and the first mask word (of the row) of the lane's two rows
  // in that block (rows past the end read the last row; their outputs are never stored). 32-bit: nm_scatter.py
  // refuses weights of 2^31 mask words or more.
  const int lw = lane & 3, lr = lane >> 2;
  struct Cursor {
    int block, s;
    int row_word[2];
  };
  auto at_block = [&](Cursor& c, int block) {
    c.block = block;
    c.s = 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) c.row_word[e] = min(block * kRows + warp * 16 + lr + 8 * e, out - 1) * words;
  };
  auto advance = [&](Cursor& c) {
    if (++c.s == steps) at_block(c, c.block + gridDim.x);
  };
  // The lane's word of a step. Words past the split's end become 16 zeros in the low columns (x is zero there too),
  // so that every word the scatter walks has 16 set bits.
  auto load = [&](const Cursor& c, Words& d) {
    const int local = c.s * kStepWords + lw;
    const bool ok = local < n_words;
    const int w = w_begin + min(local, max(n_words - 1, 0));
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const size_t word = static_cast<size_t>(c.row_word[e] + w);
      const uint4* src = reinterpret_cast<const uint4*>(values + word * 16);
      const uint4 a = __ldcs(src), b = __ldcs(src + 1);
      const uint32_t m = __ldcs(bitmask + word);
      d.v[e][0] = ok ? a : make_uint4(0u, 0u, 0u, 0u);
      d.v[e][1] = ok ? b : make_uint4(0u, 0u, 0u, 0u);
      d.m[e] = ok ? m : 0xFFFFu;
    }
  };
  // The L2 prefetch of a step: the lane's 32 value bytes of each row, and (one lane of four) the row's 4 mask words.
  auto prefetch = [&](const Cursor& c) {
    const int local = c.s * kStepWords + lw;
    if (c.block >= row_blocks || local >= n_words) return;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const size_t word = static_cast<size_t>(c.row_word[e] + w_begin + local);
      prefetch_l2(values + word * 16);
      if (lw == 0) prefetch_l2(bitmask + word);
    }
  };

  Words cur, nxt;
  Cursor loading, prefetching;
  at_block(loading, blockIdx.x);
  prefetching = loading;
  if (total > 0) {
    load(loading, cur);
    advance(loading);
  }
  if constexpr (kPrefetch > 0) {
    advance(prefetching);
    for (int i = 1; i <= kPrefetch && i < total; ++i) {
      prefetch(prefetching);
      advance(prefetching);
    }
  }

  // x[b, 32·w_begin ...] for the steps' columns into shared memory; rows past the batch and columns past the range
  // are zero (they meet only zero weights or outputs that are not stored).
  char* xs = smem + L::x;
  {
    const int pieces = steps * kStepWords * 4;  // 16-byte pieces an x row
    const int valid = n_words * 4;
    for (int e = tid; e < 8 * NT * pieces; e += kThreads) {
      const int b = e / pieces, q = e % pieces;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (b < batch && q < valid)
        v = *reinterpret_cast<const uint4*>(x + static_cast<size_t>(b) * in_features + w_begin * 32 + q * 8);
      *reinterpret_cast<uint4*>(xs + b * kXRowBytes + q * 16) = v;
    }
  }
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  const uint32_t tile = smem_addr(smem + L::tiles + warp * kTileBytes);
  // scatter segments of the lane's two rows; zeroing: 16-byte piece j·32 + lane of the tile's 256 (row piece / 16)
  const uint32_t seg0 = tile + lr * kTileRowBytes + lw * 64, seg1 = seg0 + 8 * kTileRowBytes;
  const uint32_t zero_at = tile + (lane >> 4) * kTileRowBytes + (lane & 15) * 16;
  // ldmatrix addresses: A matrix q = lane / 8 is rows 8(q & 1) + (lane & 7), columns 8(q >> 1) of a k-step; B matrix
  // q is batch rows (lane & 7) of an n-tile, columns 8q of a 32-column pair of k-steps
  const uint32_t a_at = tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kTileRowBytes + 16 * (lane >> 4);
  const uint32_t b_at = smem_addr(xs) + (lane & 7) * kXRowBytes + 16 * (lane >> 3);

  // A row block's outputs, after its last step: acc[j][0..1] are row strip + g, batch rows 8j + 2t, +1; acc[j][2..3]
  // row strip + g + 8. One split writes y, more write fp32 partials that the last CTA of the row block adds. Every
  // thread of the CTA comes here at the same block (the barriers need it).
  __shared__ int last;
  auto finish = [&](int block) {
    const int row0 = block * kRows, strip = row0 + warp * 16;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1);
        const int row = strip + g + 8 * (e >> 1);
        const float v = acc[j][e];
        acc[j][e] = 0.f;
        if (b >= batch || row >= out) continue;
        if (splits == 1)
          y[static_cast<size_t>(b) * out + row] = from_float<T>(v);
        else
          partials[(static_cast<size_t>(split) * batch + b) * out + row] = v;
      }
    if (splits == 1) return;
    __threadfence();
    __syncthreads();  // also: every thread has read `last` of the previous block
    if (tid == 0) {
      last = atomicAdd(&counters[block], 1) == splits - 1;
      if (last) counters[block] = 0;  // ready for the next launch; every other CTA of the block has counted
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    add_split_partials<kRows, kThreads>(partials, y, row0, batch, out, splits, tid);
  };

  auto step = [&](int s, Words& now, Words& next) {
    if (loading.block < row_blocks) {  // the loads run one step ahead: none past the CTA's last step
      load(loading, next);
      advance(loading);
    }
    if constexpr (kPrefetch > 0) {
      prefetch(prefetching);
      advance(prefetching);
    }
    __syncwarp();  // every lane has read the previous step's tile
#ifndef NM_SCATTER_NO_EXPAND
#pragma unroll
    for (int j = 0; j < 8; ++j) st_shared_zero16(zero_at + 2 * j * kTileRowBytes);
    __syncwarp();
    scatter_word(seg0, now.v[0], now.m[0]);
    scatter_word(seg1, now.v[1], now.m[1]);
#else  // a probe of what the kernel costs without its expansion (wrong products): the words are only kept alive
    uint32_t fold = now.m[0] ^ now.m[1];
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int h = 0; h < 2; ++h) fold ^= now.v[e][h].x ^ now.v[e][h].y ^ now.v[e][h].z ^ now.v[e][h].w;
    if (fold == 0x9E3779B9u) st_shared_u16(seg0, fold);  // (almost never) stores, so no load is dropped
#endif
    __syncwarp();
    const uint32_t b_step = b_at + 2 * s * kStepWords * 32;
#pragma unroll
    for (int kp = 0; kp < kStepWords; ++kp) {  // 32 columns: two k-steps
      uint32_t a[2][4];
      ldmatrix_x4(a_at + 64 * kp, a[0][0], a[0][1], a[0][2], a[0][3]);
      ldmatrix_x4(a_at + 64 * kp + 32, a[1][0], a[1][1], a[1][2], a[1][3]);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b_step + j * 8 * kXRowBytes + 64 * kp, b0, b1, b2, b3);
        mma16816<kBf16>(acc[j], a[0][0], a[0][1], a[0][2], a[0][3], b0, b1);
        mma16816<kBf16>(acc[j], a[1][0], a[1][1], a[1][2], a[1][3], b2, b3);
      }
    }
  };
  // Blocks outer, steps in pairs inner (cur and nxt take turns); after an odd number of steps the next block's first
  // words are in nxt, so the two change places once a block.
  for (int block = blockIdx.x; block < row_blocks; block += gridDim.x) {
    int s = 0;
    for (; s + 1 < steps; s += 2) {
      step(s, cur, nxt);
      step(s + 1, nxt, cur);
    }
    if (s < steps) {
      step(s, cur, nxt);
      const Words held = cur;
      cur = nxt;
      nxt = held;
    }
    finish(block);
  }
}

template <typename T, int NT>
cudaError_t launch(const void* x, const void* values, const void* bitmask, void* y, float* partials, int* counters,
                   int batch, int out, int words, int splits, int row_ctas, cudaStream_t stream) {
  auto kernel = nm_scatter_kernel<T, NT>;
  const int smem = Layout<NT>::smem;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const int per_split = (words + splits - 1) / splits;
  if (per_split > kRangeWords) return cudaErrorInvalidValue;
  const int used_splits = (words + per_split - 1) / per_split;  // no split without work
  const int row_blocks = (out + kRows - 1) / kRows;
  dim3 grid(row_ctas < 1 || row_ctas > row_blocks ? row_blocks : row_ctas, used_splits);
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(x), static_cast<const T*>(values),
                                           static_cast<const uint32_t*>(bitmask), static_cast<T*>(y), partials,
                                           counters, batch, out, words, per_split, row_blocks);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

// Launch on `stream`. Returns 0 or a cudaError_t; bad arguments give cudaErrorInvalidValue (nm_scatter.py validates
// first). `splits` must leave at most nm_scatter_range_words() mask words a split; with splits > 1, `partials` holds
// splits·batch·out floats and `counters` one zeroed int per block of nm_scatter_rows_per_block() rows. `row_ctas`
// CTAs a split share its row blocks (each takes every row_ctas-th); 0 or more than the row blocks gives one each.
int nm_scatter_launch(const void* x, const void* values, const void* bitmask, void* y, float* partials,
                      int* counters, int batch, int out, int words, int is_bf16, int splits, int row_ctas,
                      void* stream) {
  if (batch < 1 || batch > 16 || out < 1 || words < 1 || splits < 1) return cudaErrorInvalidValue;
  if (splits > 1 && (partials == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto run = [&](auto launch_nt) {
    return launch_nt(x, values, bitmask, y, partials, counters, batch, out, words, splits, row_ctas, s);
  };
  if (batch <= 8) return is_bf16 ? run(launch<__nv_bfloat16, 1>) : run(launch<__half, 1>);
  return is_bf16 ? run(launch<__nv_bfloat16, 2>) : run(launch<__half, 2>);
}

const char* nm_scatter_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

int nm_scatter_rows_per_block() { return kRows; }

int nm_scatter_range_words() { return kRangeWords; }

// Bytes of dynamic shared memory a CTA of `nt` n-tiles takes (0 for another nt).
int nm_scatter_smem_bytes(int nt) { return nt == 1 ? Layout<1>::smem : nt == 2 ? Layout<2>::smem : 0; }

// CTAs of `nt` n-tiles that fit on one multiprocessor of the current device, by registers and shared memory both
// (the occupancy calculator); 0 when one CTA does not fit (a GPU with less shared memory a block than the CTA takes)
// or the device cannot be queried, or nt is not 1 or 2.
int nm_scatter_ctas_per_sm(int nt) {
  auto kernel = nt == 1 ? nm_scatter_kernel<__nv_bfloat16, 1> : nm_scatter_kernel<__nv_bfloat16, 2>;
  const int smem = nm_scatter_smem_bytes(nt);
  int ctas = 0;
  if (smem == 0 || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads, smem) != cudaSuccess) {
    cudaGetLastError();  // clear the error, so that it does not surface at the next launch
    return 0;
  }
  return ctas;
}

}  // extern "C"
