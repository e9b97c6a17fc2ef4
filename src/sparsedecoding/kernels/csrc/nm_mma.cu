// y = x·Wᵀ for a 50% N:M bitmask-packed W (2:4, 4:8, 8:16, 16:32) and 1..16 rows of x, on tensor cores.
//
// "Load as sparse, compute as dense": the packed bytes (values + bitmask) stream into shared memory through a
// cp.async pipeline; each warp rebuilds two dense 16-row slices of W in registers, directly in the A-operand layout
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
// selectors are computed from the nibble with a few integer multiplies. For 2:4 every nibble keeps exactly 2
// values, so nibble s of a lane's half is exactly the lane's 32-bit value word s (FAST24: one 16-byte shared load
// per row and 64 columns). Other 50% patterns fetch the window at the nibble's rank from shared memory.
//
// Quantized values (2:4 only): CODE = 8 or 4 streams int8 codes or int4 codes (two a byte, the earlier value in
// the low nibble) in the same order instead of 16-bit values, 2 or 4 times fewer bytes. A lane dequantizes its 8
// codes per row and word pair with the row's scale of that word's group into the four 32-bit value words that
// FAST24 reads from shared memory for 16-bit values, so the expansion and the MMAs are unchanged. code·scale is
// exact in bf16 and fp16 (the solvers keep scales to a few significant bits), so the product equals the 16-bit
// kernel's on the dequantized weight.
//
// Sparse tensor cores (SP, 2:4 only, not yet run on a GPU): instead of expanding, each mask word feeds one
// mma.sp m16n8k32, the kept values as the compressed A operand and 2-bit positions as metadata. MMA group q of the
// instruction is the word's column group 2q (q < 4) or 2(q - 4) + 1, so that lane (g, t)'s A registers are the
// word's kept values 4t..4t+3, contiguous; B follows the same column map (four 4-byte x loads per MMA); the
// metadata comes from the mask word by SWAR (`sp_meta_codes`). Layouts per the PTX ISA's m16n8k32 figures.
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

#include "mma_common.cuh"

namespace {

// The CTA's geometry, 8 warps and 8 words a stage unless the build defines otherwise (cuda_mma.py passes
// SPARSEDECODING_NM_MMA_DEFINES to nvcc): fewer warps or words a stage make a CTA's shared memory smaller, so more
// CTAs fit on a multiprocessor. Python reads the values back (nm_mma_rows_per_block, nm_mma_chunk_words).
#ifndef NM_MMA_WARPS
#define NM_MMA_WARPS 8
#endif
#ifndef NM_MMA_CHUNK_WORDS
#define NM_MMA_CHUNK_WORDS 8
#endif
constexpr int kWarps = NM_MMA_WARPS;             // warps per CTA
constexpr int kStrips = 1;                       // 16-row strips per warp, sharing the warp's x fragments
constexpr int kRows = 16 * kStrips * kWarps;     // rows per CTA
constexpr int kThreads = 32 * kWarps;
constexpr int kChunkWords = NM_MMA_CHUNK_WORDS;  // mask words (32 columns each) per pipeline stage
static_assert(kWarps == 4 || kWarps == 8, "NM_MMA_WARPS: 4 or 8");
static_assert(kChunkWords == 4 || kChunkWords == 8, "NM_MMA_CHUNK_WORDS: 4 or 8");
// A row's chunk of values lands contiguously (one bulk copy); 64 bytes of padding per row put rows g and g+1 on
// disjoint banks for the 16-byte loads of a quarter-warp, and cover the generic path's reads past a row's end.
constexpr int kRowBytes = kChunkWords * 32 + 64;
constexpr int kValsBytes = kRows * kRowBytes;
constexpr int kBarrierBytes = 64;                // one 8-byte mbarrier per stage, at the start of shared memory
constexpr int kMaskBytes = kRows * kChunkWords * 4;    // [row][word]
constexpr int kXStride = kChunkWords * 32 + 8;   // halves per x row; +16 B keeps the B loads conflict-free
// Bytes of one mask word's 16 kept values: 16-bit values (CODE 0), int8 codes (8) or int4 codes (4).
template <int CODE>
__host__ __device__ constexpr int word_bytes() { return CODE == 0 ? 32 : CODE * 2; }

template <int NT, int STAGES>
struct Layout {
  static constexpr int x_rows = 8 * NT;
  static constexpr int vals = 0;
  static constexpr int mask = kValsBytes;
  static constexpr int x = mask + kMaskBytes;
  static constexpr int stage = x + x_rows * kXStride * 2;
  static constexpr int smem = kBarrierBytes + STAGES * stage;
  static_assert(STAGES * 8 <= kBarrierBytes, "one mbarrier per stage");
  static_assert(mask % 16 == 0 && x % 16 == 0 && stage % 16 == 0, "16-byte alignment of stage parts");
};

// src_bytes = 0 fills the destination with zeros without reading (columns past the end of a row).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Values move by the copy engine (bulk copies, one per row and stage): the LSU-driven cp.async path tops out near
// 3 TB/s on this access pattern even with no math at all. Each copying thread announces its bytes on the stage's
// mbarrier, which completes once every copying thread has arrived and all bytes have landed.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
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

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// ::ordered_metadata (PTX ISA 8.5, nvcc 12.5+; our positions are always in increasing order) where the compiler
// has it, else the plain form, so that older toolkits still build the whole library.
#if (__CUDACC_VER_MAJOR__ > 12) || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 5)
#define SPARSEDECODING_MMA_SP "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32."
#else
#define SPARSEDECODING_MMA_SP "mma.sp.sync.aligned.m16n8k32.row.col.f32."
#endif

template <bool BF16>
__device__ __forceinline__ void mma_sp16832(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3, uint32_t e) {
  if constexpr (BF16) {
    asm volatile(
        SPARSEDECODING_MMA_SP "bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e));
  } else {
    asm volatile(
        SPARSEDECODING_MMA_SP "f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e));
  }
}

// The mma.sp metadata code of every nibble of a 2:4 mask word at once (each nibble has exactly two bits set):
// the lower kept position in bits 0-1 of the nibble, the upper in bits 2-3. Per nibble b3..b0: lower = (b1 & ~b0,
// ~b1 & ~b0), upper = (b3 | ~b2, b3 | b2); u and v line the neighbouring bits up.
__device__ __forceinline__ uint32_t sp_meta_codes(uint32_t m) {
  const uint32_t u = m >> 1, v = m << 1;
  return ((~m & u) & 0x11111111u) | (~(m | v) & 0x22222222u) | ((u | ~m) & 0x44444444u) | ((m | v) & 0x88888888u);
}

// Permute selectors for one nibble: a kept column of rank r takes bytes 2r, 2r+1 of the window (selector byte
// 0x10 + 0x22·r); a dropped one takes byte 7 twice (0x77), which is zero whenever the nibble keeps fewer than 4
// values (and with 4 kept none is dropped). Byte c of the result is column c's; the low 16 bits drive the first
// A register (columns 0-1), the high 16 bits the second (columns 2-3). Computed bytewise in a few integer ops:
// the multiply by 0x204081 moves bit c to bit 8c without carries, the one by 0x01010100 sums the bytes below.
__device__ __forceinline__ uint32_t nibble_selectors(uint32_t nib) {
  const uint32_t kept = (nib * 0x204081u) & 0x01010101u;
  const uint32_t rank = kept * 0x01010100u;
  const uint32_t take = 0x10101010u + rank * 0x22u;
  const uint32_t keep = kept * 0xFFu;
  return (take & keep) | (0x77777777u & ~keep);
}

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

// Two values as the 32-bit word of a 16-bit pair (the first in the low half), rounded to nearest (exact here).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Code k (0-3) of a 32-bit piece of codes, sign-extended, as float: bytes for CODE 8, nibbles for CODE 4 (of which
// a piece holds 8; k then counts 0-7).
template <int CODE>
__device__ __forceinline__ float code_at(uint32_t piece, int k) {
  return static_cast<float>(static_cast<int32_t>(piece << (32 - CODE * (k + 1))) >> (32 - CODE));
}

// Dequantization without int-to-float conversions (a quarter-rate pipe on sm_90), by exponent tricks, exact:
// - int8: a code v in offset binary (q = v + 128, one xor per 4 codes) becomes the low byte of the float
//   2^23 + q (one prmt), and 2^23 + q - (2^23 + 128) = v; then v·scale in fp32 (exact) rounds once to T.
// - int4, bf16: q = v + 8 (one xor per 8 codes) in the low nibble of the bf16 0x4300 (128.0, one unit per step)
//   is 128 + q, two to a 32-bit word (prmt + lop3 per two codes); minus 136 gives v exactly, and one bf16x2
//   multiply by the scale rounds v·scale once, as pack2 would. tests/test_cuda_mma_codes.py emulates both.
__device__ __forceinline__ float int8_code(uint32_t offset_bytes, int k) {
  return __uint_as_float(prmt(offset_bytes, 0x4B000000u, 0x7440u | k)) - 8388736.0f;
}

__device__ __forceinline__ uint32_t int4_pair_bf16(uint32_t even, uint32_t odd, int s, __nv_bfloat162 scale2) {
  const uint32_t w = (prmt(even, odd, s | ((4 + s) << 8)) & 0x00FF00FFu) | 0x43004300u;  // 128 + q, two halves
  const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&w), __float2bfloat162_rn(136.f));
  const __nv_bfloat162 r = __hmul2(v, scale2);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The lane's 8 kept values of one row and word pair as four 16-bit pair words (value 2s in the low half of word s),
// from 16-bit values or dequantized from codes with `scale`.
template <typename T, int CODE>
__device__ __forceinline__ uint4 lane_values(const char* pair, int t, float scale) {
  if constexpr (CODE == 0) {
    return *reinterpret_cast<const uint4*>(pair + 16 * t);
  } else if constexpr (CODE == 8) {
    const uint2 c = *reinterpret_cast<const uint2*>(pair + 8 * t);
    const uint32_t q0 = c.x ^ 0x80808080u, q1 = c.y ^ 0x80808080u;
    return make_uint4(pack2<T>(int8_code(q0, 0) * scale, int8_code(q0, 1) * scale),
                      pack2<T>(int8_code(q0, 2) * scale, int8_code(q0, 3) * scale),
                      pack2<T>(int8_code(q1, 0) * scale, int8_code(q1, 1) * scale),
                      pack2<T>(int8_code(q1, 2) * scale, int8_code(q1, 3) * scale));
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const uint32_t q = *reinterpret_cast<const uint32_t*>(pair + 4 * t) ^ 0x88888888u;
    const uint32_t even = q & 0x0F0F0F0Fu, odd = (q >> 4) & 0x0F0F0F0Fu;  // q of values 0,2,4,6 / 1,3,5,7
    const __nv_bfloat162 scale2 = __float2bfloat162_rn(scale);  // exact: the scale is a bf16
    return make_uint4(int4_pair_bf16(even, odd, 0, scale2), int4_pair_bf16(even, odd, 1, scale2),
                      int4_pair_bf16(even, odd, 2, scale2), int4_pair_bf16(even, odd, 3, scale2));
  } else {  // int4 with fp16 activations: through float (a bf16 scale need not be an fp16)
    const uint32_t c = *reinterpret_cast<const uint32_t*>(pair + 4 * t);
    return make_uint4(pack2<T>(code_at<4>(c, 0) * scale, code_at<4>(c, 1) * scale),
                      pack2<T>(code_at<4>(c, 2) * scale, code_at<4>(c, 3) * scale),
                      pack2<T>(code_at<4>(c, 4) * scale, code_at<4>(c, 5) * scale),
                      pack2<T>(code_at<4>(c, 6) * scale, code_at<4>(c, 7) * scale));
  }
}

// A registers of one 16-row strip for the 4 k-steps of one word pair, fed straight into the MMAs. `pair_g` is the
// pair's values (or codes) of row g in shared memory; scale_g / scale_g8 dequantize codes (CODE 8 or 4).
template <typename T, int NT, bool FAST24, int CODE>
__device__ __forceinline__ void strip_word_pair(float (&acc)[NT][4], const char* pair_g, uint32_t word_g,
                                                uint32_t word_g8, int t, const uint32_t (&xb)[NT][8],
                                                float scale_g, float scale_g8) {
  static_assert(CODE == 0 || FAST24, "quantized values run the 2:4 expansion only");
  const char* pair_g8 = pair_g + 8 * kRowBytes;
  const uint32_t half_g = (t % 2) ? word_g >> 16 : word_g & 0xFFFFu;
  const uint32_t half_g8 = (t % 2) ? word_g8 >> 16 : word_g8 & 0xFFFFu;
  uint4 v_g, v_g8;
  uint32_t rank_g = 0, rank_g8 = 0;
  if constexpr (FAST24) {
    v_g = lane_values<T, CODE>(pair_g, t, scale_g);
    v_g8 = lane_values<T, CODE>(pair_g8, t, scale_g8);
  } else {
    // first kept value of the lane's half, counted from the start of the word pair's 32 values
    rank_g = 16 * (t / 2) + ((t % 2) ? __popc(word_g & 0xFFFFu) : 0);
    rank_g8 = 16 * (t / 2) + ((t % 2) ? __popc(word_g8 & 0xFFFFu) : 0);
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t nib_g = (half_g >> (4 * s)) & 0xFu;
    const uint32_t nib_g8 = (half_g8 >> (4 * s)) & 0xFu;
    const uint32_t sel_g = nibble_selectors(nib_g), sel_g8 = nibble_selectors(nib_g8);
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

// One mask word of one 16-row strip on sparse tensor cores (SP): `vals_g` is the word's values (or codes) of row g
// in shared memory, `codes_g`/`codes_g8` its mask words of rows g and g+8 already through `sp_meta_codes`, `x_word`
// the word's first x column of batch row 0.
template <typename T, int NT, int CODE>
__device__ __forceinline__ void strip_word_sp(float (&acc)[NT][4], const char* vals_g, uint32_t codes_g,
                                              uint32_t codes_g8, int g, int t, const char* x_word, float scale_g,
                                              float scale_g8) {
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  const char* vals_g8 = vals_g + 8 * kRowBytes;
  uint32_t a0, a1, a2, a3;  // rows g / g+8; a0, a1: MMA group t (column group 2t), a2, a3: group t + 4 (2t + 1)
  if constexpr (CODE == 0) {
    const uint2 vg = *reinterpret_cast<const uint2*>(vals_g + 8 * t);
    const uint2 vg8 = *reinterpret_cast<const uint2*>(vals_g8 + 8 * t);
    a0 = vg.x; a2 = vg.y; a1 = vg8.x; a3 = vg8.y;
  } else if constexpr (CODE == 8) {
    const uint32_t qg = *reinterpret_cast<const uint32_t*>(vals_g + 4 * t) ^ 0x80808080u;
    const uint32_t qg8 = *reinterpret_cast<const uint32_t*>(vals_g8 + 4 * t) ^ 0x80808080u;
    a0 = pack2<T>(int8_code(qg, 0) * scale_g, int8_code(qg, 1) * scale_g);
    a2 = pack2<T>(int8_code(qg, 2) * scale_g, int8_code(qg, 3) * scale_g);
    a1 = pack2<T>(int8_code(qg8, 0) * scale_g8, int8_code(qg8, 1) * scale_g8);
    a3 = pack2<T>(int8_code(qg8, 2) * scale_g8, int8_code(qg8, 3) * scale_g8);
  } else {
    const uint32_t cg = *reinterpret_cast<const uint16_t*>(vals_g + 2 * t);
    const uint32_t cg8 = *reinterpret_cast<const uint16_t*>(vals_g8 + 2 * t);
    if constexpr (kBf16) {
      const uint32_t qg = cg ^ 0x8888u, qg8 = cg8 ^ 0x8888u;
      const __nv_bfloat162 sg = __float2bfloat162_rn(scale_g), sg8 = __float2bfloat162_rn(scale_g8);
      a0 = int4_pair_bf16(qg & 0x0F0Fu, (qg >> 4) & 0x0F0Fu, 0, sg);
      a2 = int4_pair_bf16(qg & 0x0F0Fu, (qg >> 4) & 0x0F0Fu, 1, sg);
      a1 = int4_pair_bf16(qg8 & 0x0F0Fu, (qg8 >> 4) & 0x0F0Fu, 0, sg8);
      a3 = int4_pair_bf16(qg8 & 0x0F0Fu, (qg8 >> 4) & 0x0F0Fu, 1, sg8);
    } else {
      a0 = pack2<T>(code_at<4>(cg, 0) * scale_g, code_at<4>(cg, 1) * scale_g);
      a2 = pack2<T>(code_at<4>(cg, 2) * scale_g, code_at<4>(cg, 3) * scale_g);
      a1 = pack2<T>(code_at<4>(cg8, 0) * scale_g8, code_at<4>(cg8, 1) * scale_g8);
      a3 = pack2<T>(code_at<4>(cg8, 2) * scale_g8, code_at<4>(cg8, 3) * scale_g8);
    }
  }
  // metadata (used from lanes t = 0, 1): rows g (bits 0-15) and g+8 (16-31), MMA groups 4(t&1)..4(t&1)+3 = the
  // word's even (t&1 = 0) or odd nibbles, lowest first
  const uint32_t shift = 4 * (t & 1);
  uint32_t fg = (codes_g >> shift) & 0x0F0F0F0Fu;
  uint32_t fg8 = (codes_g8 >> shift) & 0x0F0F0F0Fu;
  fg |= fg >> 4;
  fg8 |= fg8 >> 4;
  const uint32_t e = prmt(fg, fg8, 0x6420u);
  // B register i: MMA k = 2t + 8i + {0, 1}, MMA group (t >> 1) + 2i, so word columns 4·G + 2(t & 1) + {0, 1} with
  // G = 2(t >> 1), 4 + 2(t >> 1), 2(t >> 1) + 1, 5 + 2(t >> 1)
  const int c0 = 8 * (t >> 1) + 2 * (t & 1);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const char* xr = x_word + (8 * j + g) * kXStride * 2;
    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xr + 2 * c0);
    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xr + 2 * (c0 + 16));
    const uint32_t b2 = *reinterpret_cast<const uint32_t*>(xr + 2 * (c0 + 4));
    const uint32_t b3 = *reinterpret_cast<const uint32_t*>(xr + 2 * (c0 + 20));
    mma_sp16832<kBf16>(acc[j], a0, a1, a2, a3, b0, b1, b2, b3, e);
  }
}

// `values`: 16-bit values of type T (CODE 0) or codes (CODE 8, 4) with `scales` (bf16, [out][groups], a group
// 2^group_shift mask words wide, or one group a row when groups == 1; unused for CODE 0).
// GW (SP with codes only): the group width in words when known at compile time (4: int4 with 128 columns a scale),
// so that the scales are read where a group starts only; 0: every word looks its group up.
template <typename T, int NT, bool FAST24, int STAGES, int CODE, bool SP, int GW = 0>
__global__ void __launch_bounds__(kThreads) nm_mma_kernel(const T* __restrict__ x, const void* __restrict__ values,
                                                          const __nv_bfloat16* __restrict__ scales,
                                                          const uint32_t* __restrict__ bitmask, T* __restrict__ y,
                                                          float* __restrict__ partials, int* __restrict__ counters,
                                                          int batch, int out, int words, int chunks_per_split,
                                                          int groups, int group_shift) {
  constexpr int kWordBytes = word_bytes<CODE>();
  using L = Layout<NT, STAGES>;
  extern __shared__ __align__(16) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  char* stages = smem + kBarrierBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kRows;
  const int split = blockIdx.y, splits = gridDim.y;
  const int chunks = (words + kChunkWords - 1) / kChunkWords;
  const int chunk0 = split * chunks_per_split;
  const int n_chunks = max(0, min(chunks, chunk0 + chunks_per_split) - chunk0);
  const int in_features = words * 32;
  const bool mask16 = words % 4 == 0;  // a row's mask words then come in aligned 16-byte pieces of 4

  // Copy assignments are fixed for the whole column range; a stage only adds its chunk's offset. Values: thread r
  // (r < kRows) bulk-copies row r's chunk.
  static_assert(kRows <= kThreads, "one copying thread per row");
  const char* vsrc = static_cast<const char*>(values) +
                     static_cast<size_t>(min(row0 + tid % kRows, out - 1)) * words * kWordBytes;
  if (tid == 0)
    for (int s = 0; s < STAGES; ++s) mbarrier_init(&bars[s], kRows);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  // Masks: aligned 16-byte pieces of 4 words when words % 4 == 0, else single 4-byte words.
  // With fewer pieces than threads (4 words a stage), the threads past the last row copy nothing.
  constexpr int kMaskPieces = (kRows * kChunkWords / 4 + kThreads - 1) / kThreads;
  constexpr int kMaskWords = kRows * kChunkWords / kThreads;
  static_assert(kRows * kChunkWords / 4 % kThreads == 0 || kRows * kChunkWords / 4 < kThreads,
                "mask pieces spread evenly");
  static_assert(kMaskWords >= 1 && kRows * kChunkWords % kThreads == 0, "mask words spread evenly");
  const int mp = tid % (kChunkWords / 4), mw = tid % kChunkWords;
  // x: thread tid copies 16 bytes (8 columns, piece xq) of batch rows xb, xb + kThreads / kXPieces, ...; rows past
  // the batch are never loaded, as they only feed output columns that are not stored.
  constexpr int kXPieces = kChunkWords * 4;
  constexpr int kXRowsPerPass = kThreads / kXPieces;
  static_assert(kThreads % kXPieces == 0, "x pieces spread evenly");
  const int xq = tid % kXPieces;

  auto load_stage = [&](int slot, int chunk) {
    char* st = stages + slot * L::stage;
    const int w0 = chunk * kChunkWords;
    // A row's last chunk may be partial: its missing words have zero masks (below), so their values are unused.
    if (tid < kRows)
      bulk_copy(st + L::vals + tid * kRowBytes, vsrc + static_cast<size_t>(w0) * kWordBytes,
                min(kChunkWords, words - w0) * kWordBytes, &bars[slot]);
    if (mask16) {
      const bool m_ok = w0 + 4 * mp < words;
#pragma unroll
      for (int k = 0; k < kMaskPieces; ++k) {
        const int r = tid / (kChunkWords / 4) + k * (kThreads / (kChunkWords / 4));
        if (r >= kRows) break;
        const uint32_t* src = bitmask + static_cast<size_t>(min(row0 + r, out - 1)) * words + w0 + 4 * mp;
        cp_async16(st + L::mask + (r * kChunkWords + 4 * mp) * 4, m_ok ? src : bitmask, m_ok ? 16 : 0);
      }
    } else {
      const bool m_ok = w0 + mw < words;
#pragma unroll
      for (int k = 0; k < kMaskWords; ++k) {
        const int r = tid / kChunkWords + k * (kThreads / kChunkWords);
        const uint32_t* src = bitmask + static_cast<size_t>(min(row0 + r, out - 1)) * words + w0 + mw;
        cp_async4(st + L::mask + (r * kChunkWords + mw) * 4, m_ok ? src : bitmask, m_ok ? 4 : 0);
      }
    }
    const bool x_ok = w0 * 32 + xq * 8 < in_features;
#pragma unroll
    for (int k = 0; k < (L::x_rows + kXRowsPerPass - 1) / kXRowsPerPass; ++k) {
      const int b = tid / kXPieces + k * kXRowsPerPass;
      if (b < L::x_rows && b < batch) {
        const T* src = x + static_cast<size_t>(b) * in_features + w0 * 32 + xq * 8;
        cp_async16(st + L::x + (b * kXStride + xq * 8) * 2, x_ok ? src : x, x_ok ? 16 : 0);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_chunks) load_stage(s, chunk0 + s);
    cp_async_commit();
  }

  float acc[kStrips][NT][4];
#pragma unroll
  for (int h = 0; h < kStrips; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;

  const int rw = warp * 16 * kStrips + g;  // this lane's first row within the CTA; strip h adds 16h, +8
  // Scale rows of the lane's rows (rows past the end read the last row, like the values; never stored).
  const __nv_bfloat16* scale_rows[kStrips][2];
#pragma unroll
  for (int h = 0; h < kStrips; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      scale_rows[h][e] = scales + static_cast<size_t>(min(row0 + rw + 16 * h + 8 * e, out - 1)) * groups;
  // One scale a row (int8): read once. Otherwise a word's group is its index shifted (no division in the loop).
  float row_scale[kStrips][2];
#pragma unroll
  for (int h = 0; h < kStrips; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e) row_scale[h][e] = CODE != 0 ? __bfloat162float(scale_rows[h][e][0]) : 1.f;
  auto word_scales = [&](int h, int word, float& scale_g, float& scale_g8) {
    if (CODE == 8 || groups == 1) {  // int8 always has one scale a row (PackedNMQ; the C entry checks)
      scale_g = row_scale[h][0];
      scale_g8 = row_scale[h][1];
    } else {
      const int group = min(word, words - 1) >> group_shift;
      scale_g = __bfloat162float(scale_rows[h][0][group]);
      scale_g8 = __bfloat162float(scale_rows[h][1][group]);
    }
  };
  for (int i = 0; i < n_chunks; ++i) {
    cp_async_wait<STAGES - 2>();
    mbarrier_wait(&bars[i % STAGES], (i / STAGES) & 1);
    __syncthreads();  // stage i has landed for every thread, and every warp is done with stage i - 1
    if (i + STAGES - 1 < n_chunks) load_stage((i + STAGES - 1) % STAGES, chunk0 + i + STAGES - 1);
    cp_async_commit();

    const char* st = stages + (i % STAGES) * L::stage;
    if constexpr (SP) {
      // Words past the row's end (a partial last chunk) are skipped: their shared values are stale bytes, which the
      // expansion masks out but an mma.sp would multiply (a stale NaN times a zero x is NaN).
      const int valid_words = words - (chunk0 + i) * kChunkWords;
      float group_scale[kStrips][2] = {};  // 1 for 16-bit values (unused), else the current word's group's scales
      if constexpr (CODE == 0)
        for (int h = 0; h < kStrips; ++h) group_scale[h][0] = group_scale[h][1] = 1.f;
      // The warp's mask words of this stage become metadata codes in place, once: 4 words a lane instead of each
      // lane of a quad converting the same two rows for every word (no other warp reads these rows' masks).
      {
        uint32_t* codes = reinterpret_cast<uint32_t*>(stages + (i % STAGES) * L::stage + L::mask) +
                          warp * 16 * kStrips * kChunkWords;
#pragma unroll
        for (int k = lane; k < 16 * kStrips * kChunkWords; k += 32) codes[k] = sp_meta_codes(codes[k]);
        __syncwarp();
      }
#pragma unroll
      for (int w = 0; w < kChunkWords; ++w) {
        if (w >= valid_words) break;
#pragma unroll
        for (int h = 0; h < kStrips; ++h) {
          const uint32_t* codes = reinterpret_cast<const uint32_t*>(st + L::mask) + (rw + 16 * h) * kChunkWords;
          if constexpr (CODE != 0) {
            if constexpr (GW > 0) {  // chunks start on group boundaries (8 words, GW a power of two up to 8)
              if (w % GW == 0) word_scales(h, (chunk0 + i) * kChunkWords + w, group_scale[h][0], group_scale[h][1]);
            } else {
              word_scales(h, (chunk0 + i) * kChunkWords + w, group_scale[h][0], group_scale[h][1]);
            }
          }
          strip_word_sp<T, NT, CODE>(acc[h], st + L::vals + (rw + 16 * h) * kRowBytes + w * kWordBytes, codes[w],
                                     codes[8 * kChunkWords + w], g, t, st + L::x + w * 64, group_scale[h][0],
                                     group_scale[h][1]);
        }
      }
    } else {
#pragma unroll
      for (int p = 0; p < kChunkWords / 2; ++p) {
        uint32_t xb[NT][8];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const char* xr = st + L::x + ((8 * j + g) * kXStride + 64 * p + 16 * t) * 2;
          const uint4 lo = *reinterpret_cast<const uint4*>(xr);
          const uint4 hi = *reinterpret_cast<const uint4*>(xr + 16);
          xb[j][0] = lo.x; xb[j][1] = lo.y; xb[j][2] = lo.z; xb[j][3] = lo.w;
          xb[j][4] = hi.x; xb[j][5] = hi.y; xb[j][6] = hi.z; xb[j][7] = hi.w;
        }
#pragma unroll
        for (int h = 0; h < kStrips; ++h) {
          // the lane's mask word is 2p + t/2 of the chunk
          const uint32_t* mask = reinterpret_cast<const uint32_t*>(st + L::mask) + (rw + 16 * h) * kChunkWords;
          const uint32_t word_g = mask[2 * p + t / 2];
          const uint32_t word_g8 = mask[8 * kChunkWords + 2 * p + t / 2];
          float scale_g = 1.f, scale_g8 = 1.f;
          if constexpr (CODE != 0)  // the lane's word lies in one group (group sizes are multiples of 32)
            word_scales(h, (chunk0 + i) * kChunkWords + 2 * p + t / 2, scale_g, scale_g8);
          strip_word_pair<T, NT, FAST24, CODE>(acc[h], st + L::vals + (rw + 16 * h) * kRowBytes + p * 2 * kWordBytes,
                                               word_g, word_g8, t, xb, scale_g, scale_g8);
        }
      }
    }
  }
  cp_async_wait<0>();

  // acc[h][j][0..1]: row rw + 16h, batch rows 8j + 2t, +1; acc[h][j][2..3]: row rw + 16h + 8.
  if (splits == 1) {
#pragma unroll
    for (int h = 0; h < kStrips; ++h)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int b = 8 * j + 2 * t + (e & 1);
          const int row = row0 + rw + 16 * h + 8 * (e >> 1);
          if (b < batch && row < out) y[static_cast<size_t>(b) * out + row] = from_float<T>(acc[h][j][e]);
        }
    return;
  }

#pragma unroll
  for (int h = 0; h < kStrips; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1);
        const int row = row0 + rw + 16 * h + 8 * (e >> 1);
        if (b < batch && row < out) partials[(static_cast<size_t>(split) * batch + b) * out + row] = acc[h][j][e];
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
  add_split_partials<kRows, kThreads>(partials, y, row0, batch, out, splits, tid);
}

template <typename T, int NT, bool FAST24, int STAGES, int CODE, bool SP, int GW = 0>
cudaError_t launch(const void* x, const void* values, const void* scales, const void* bitmask, void* y,
                   float* partials, int* counters, int batch, int out, int words, int splits, int groups,
                   int group_shift, cudaStream_t stream) {
  auto kernel = nm_mma_kernel<T, NT, FAST24, STAGES, CODE, SP, GW>;
  const int smem = Layout<NT, STAGES>::smem;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const int chunks = (words + kChunkWords - 1) / kChunkWords;
  const int per_split = (chunks + splits - 1) / splits;
  const int used_splits = (chunks + per_split - 1) / per_split;  // no split without work
  dim3 grid((out + kRows - 1) / kRows, used_splits);
  kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(x), values,
                                           static_cast<const __nv_bfloat16*>(scales),
                                           static_cast<const uint32_t*>(bitmask), static_cast<T*>(y), partials,
                                           counters, batch, out, words, per_split, groups, group_shift);
  return cudaGetLastError();
}

struct Problem {
  const void *x, *values, *scales, *bitmask;
  void* y;
  float* partials;
  int* counters;
  int batch, out, words, splits, groups, group_shift;
  cudaStream_t stream;
};

template <typename T, int NT, bool FAST24, int CODE>
cudaError_t launch_stages(const Problem& p, int stages, int sparse_mma) {
  auto run = [&](auto kernel_launch) {
    return kernel_launch(p.x, p.values, p.scales, p.bitmask, p.y, p.partials, p.counters, p.batch, p.out, p.words,
                         p.splits, p.groups, p.group_shift, p.stream);
  };
  if (sparse_mma) {  // 2:4 only, two stages only (fewer instances to build)
    if (stages != 2) return cudaErrorInvalidValue;
    if constexpr (FAST24) {
      if constexpr (CODE == 4)
        if (p.groups > 1 && p.group_shift == 2) return run(launch<T, NT, true, 2, CODE, true, 4>);
      return run(launch<T, NT, true, 2, CODE, true>);
    }
    return cudaErrorInvalidValue;
  }
  switch (stages) {
    case 2: return run(launch<T, NT, FAST24, 2, CODE, false>);
    case 3: return run(launch<T, NT, FAST24, 3, CODE, false>);
    case 4: return run(launch<T, NT, FAST24, 4, CODE, false>);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t dispatch(const Problem& p, int fast24, int stages, int sparse_mma) {
  if (p.batch <= 8)
    return fast24 ? launch_stages<T, 1, true, 0>(p, stages, sparse_mma)
                  : launch_stages<T, 1, false, 0>(p, stages, sparse_mma);
  return fast24 ? launch_stages<T, 2, true, 0>(p, stages, sparse_mma)
                : launch_stages<T, 2, false, 0>(p, stages, sparse_mma);
}

template <typename T, int CODE>
cudaError_t dispatch_codes(const Problem& p, int stages, int sparse_mma) {
  return p.batch <= 8 ? launch_stages<T, 1, true, CODE>(p, stages, sparse_mma)
                      : launch_stages<T, 2, true, CODE>(p, stages, sparse_mma);
}

}  // namespace

extern "C" {

// Launch on `stream` with `stages` (2-4) pipeline stages. Returns 0 or a cudaError_t; bad arguments give
// cudaErrorInvalidValue (the Python wrapper validates first, so that is a second line of defence). `partials`
// holds splits·batch·out floats and `counters` one zeroed int per block of nm_mma_rows_per_block() rows when
// splits > 1; both are unused otherwise.
// sparse_mma = 1 runs 2:4 on sparse tensor cores (SP; fast24 must be 1 and stages 2).
int nm_mma_launch(const void* x, const void* values, const void* bitmask, void* y, float* partials, int* counters,
                  int batch, int out, int words, int is_bf16, int fast24, int splits, int stages, int sparse_mma,
                  void* stream) {
  if (batch < 1 || batch > 16 || out < 1 || words < 1 || splits < 1) return cudaErrorInvalidValue;
  if (splits > 1 && (partials == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  const Problem p{x, values, nullptr, bitmask, y, partials, counters, batch, out, words, splits, 1, 1,
                  static_cast<cudaStream_t>(stream)};
  return is_bf16 ? dispatch<__nv_bfloat16>(p, fast24, stages, sparse_mma)
                 : dispatch<__half>(p, fast24, stages, sparse_mma);
}

// The same for a 2:4 weight with quantized kept values: `codes` int8 (code_bits 8) or int4 pairs (4, in_features a
// multiple of 64 so that rows start on 16 bytes), `scales` bf16 [out][groups], each group `group_words` mask words
// (a power of two when groups > 1).
int nm_mma_codes_launch(const void* x, const void* codes, const void* scales, const void* bitmask, void* y,
                        float* partials, int* counters, int batch, int out, int words, int is_bf16, int code_bits,
                        int groups, int group_words, int splits, int stages, int sparse_mma, void* stream) {
  if (batch < 1 || batch > 16 || out < 1 || words < 1 || splits < 1 || groups < 1 || group_words < 1 ||
      groups * group_words != words || (code_bits != 8 && code_bits != 4) || (code_bits == 4 && words % 2))
    return cudaErrorInvalidValue;
  int group_shift = 0;  // groups > 1 need a power-of-two group width in words
  while ((1 << group_shift) < group_words) ++group_shift;
  if (groups > 1 && (1 << group_shift) != group_words) return cudaErrorInvalidValue;
  if (code_bits == 8 && groups != 1) return cudaErrorInvalidValue;  // int8: one scale a row
  if (splits > 1 && (partials == nullptr || counters == nullptr)) return cudaErrorInvalidValue;
  const Problem p{x, codes, scales, bitmask, y, partials, counters, batch, out, words, splits, groups, group_shift,
                  static_cast<cudaStream_t>(stream)};
  if (code_bits == 8)
    return is_bf16 ? dispatch_codes<__nv_bfloat16, 8>(p, stages, sparse_mma)
                   : dispatch_codes<__half, 8>(p, stages, sparse_mma);
  return is_bf16 ? dispatch_codes<__nv_bfloat16, 4>(p, stages, sparse_mma)
                 : dispatch_codes<__half, 4>(p, stages, sparse_mma);
}

const char* nm_mma_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

int nm_mma_rows_per_block() { return kRows; }

int nm_mma_chunk_words() { return kChunkWords; }

// CTAs of `nt` n-tiles and `stages` stages that fit on one multiprocessor of the current device by shared memory
// (the limit that binds: registers allow more); 0 if the device cannot be queried or nt / stages are not built.
int nm_mma_ctas_per_sm(int nt, int stages) {
  int device = 0, per_sm = 0, reserved = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess)
    return 0;
  int smem = 0;
  if (nt == 1 && stages == 2) smem = Layout<1, 2>::smem;
  if (nt == 1 && stages == 3) smem = Layout<1, 3>::smem;
  if (nt == 1 && stages == 4) smem = Layout<1, 4>::smem;
  if (nt == 2 && stages == 2) smem = Layout<2, 2>::smem;
  if (nt == 2 && stages == 3) smem = Layout<2, 3>::smem;
  if (nt == 2 && stages == 4) smem = Layout<2, 4>::smem;
  if (smem == 0) return 0;
  return per_sm / (smem + reserved + 16);  // + the kernel's 16 bytes of static shared memory
}

}  // extern "C"
