// y = x·Wᵀ for a 2:4 W on sparse tensor cores (mma.sp m16n8k32), from a tiled layout in which every warp load
// is 512 contiguous bytes already in the lane order of the instruction's registers; 1..16 rows of x.
//
// Why a second 2:4 kernel. nm_mma.cu reads the bitmask format as stored (row-major values + mask words) and
// rearranges it per warp in shared memory; it moves its bytes at 2.6-3.0 TB/s and, on codes, turns issue-bound
// (results/quant_kernel_h200.md, results/cuda_sass_sm90.md). Here the weight is rearranged once, when a
// model is loaded (sparsedecoding/kernels/sp24.py `tile`): for each 16-row tile and 32-column k-tile the four A
// registers of mma.sp (kept values, or their int8/int4 codes), and the metadata words of lanes t = 0, 1. A warp
// then streams its rows with 16-byte loads straight into registers, two steps in flight, and the only work per
// k-tile is the dequantization (none for 16-bit values) and one mma.sp per 8 rows of x.
//
// Register semantics (the ones nm_mma.cu's SP path passed float64 checks with on the H200): lane (g, t)
// (g = lane / 4, t = lane % 4) holds in a0 / a1 the kept values of MMA group t (k = 4t..4t+3) of rows g / g+8,
// in a2 / a3 those of group t + 4, the lower column first; B register i holds k = 2t + 8i + {0, 1} of x row g;
// the metadata (selector 0, lanes t = 0, 1) holds 4 bits per group, groups 4t..4t+3, row g in bits 0-15 and row
// g+8 in bits 16-31, each the lower kept position in bits 0-1 and the upper in bits 2-3. Here MMA k is the
// k-tile's column itself, so the metadata of lane t is 16 bits of the row's mma.sp codes for columns 16t..16t+15.
//
// x is staged once per CTA in shared memory, permuted so that a lane's four B registers of a k-tile are 16
// contiguous bytes: byte 64s + 16t + 4i of a staged row holds columns 32s + 8i + 2t + {0, 1}.
//
// Values (CODE): 0 = bf16/fp16 kept values; 8 = int8 codes (offset binary, one scale a row, applied to the sum);
// 4 = int4 codes (offset binary, group scales applied to each group's fp32 sums, bf16 only). Codes enter the MMAs
// exactly, so the product is exact for any bf16 scales. Tiled layouts per step of KS k-tiles (sp24.py):
//   a:    [row tile][step][load j][lane][16 B]; CODE 0: load j = k-tile j (a0..a3); CODE 8: k-tiles 2j, 2j+1,
//         each two words (row g's codes of a0, a2; row g+8's of a1, a3); CODE 4: k-tiles 4j..4j+3, a word each,
//         nibble r and r + 4 making register r.
//   meta: [row tile][step][16 lanes (g, t < 2)][KS words]
//   scales (CODE 4): [row tile][group][8 (g)][2] bf16: rows g and g+8
//
// Split-K, two levels. Slices (in the CTA): its 8 warps cover 8 / slices row tiles, each row tile by `slices`
// warps that share out the CTA's steps and add their accumulators through shared memory, so a small weight fills
// the GPU with CTAs without a round trip through global memory. Splits (across CTAs): blockIdx.y is a range of
// steps; with more than one split each CTA writes fp32 partials and the last CTA of a row block (counted with an
// atomic that it resets) sums them and writes y.
//
// GLU (glu = 1, for a fused gate|up linear): the row tiles come in pairs, gate tile k then up tile k (sp24.py
// `tile(..., glu=True)` reorders the rows), and y holds silu(gate)·up, out / 2 columns, from the fp32 sums. A CTA
// holds whole pairs (8 / slices row tiles, slices ≤ 4).
//
// RMSNorm in front (NORM, for the engine's qkv and gate_up): y = W·rmsnorm(s) with s = x + res, the residual sum,
// which the CTAs of row block 0 also write out (`sum_out`, rounded to T). Since the norm's 1/rms is one factor per
// row of x, the kernel stages u = w ⊙ s (T, rounded once) while it sums s² over its columns, and multiplies the fp32
// sums by 1/rms = rsqrt(Σs² / in + eps) at the end: without split-K from its own Σs², with split-K the last CTA adds
// the Σs² each split's CTA left in `ss_slots`. The separate add+norm kernel, its launch and a pass over x go.
//
// Overflow slots (OVER): W = W24 + W_over for a 16:32+K weight (kernels/overflow.py), W_over held in two fixed
// slots a row and 32-column word. Tiled per row tile and slot step (8 k-tiles, the step of 16-bit values; a step of
// codes covers ks / 8 slot steps: two, or one in steps of 8) like `a`:
//   over_v: [row tile][slot step][lane][8 values] (16-bit values: 16 B a lane; codes: 8 B a lane, one int8 code
//   each), over_o: [row tile][slot step][lane][8 bytes];
//   lane (g, t)'s slot k (0..7) is in word j0 + 4·(k / 4) of the slot step, j0 = (t - g) % 4 (k-tile 8·step + j0 +
//   4·(k / 4)), row g + 8·((k / 2) % 2), slot k % 2; its byte is the column's offset in the staged x of its k-tile
//   (16·((c % 8) / 2) + 4·(c / 8) + 2·(c % 2) for column c, see above); value 0 where the slot is unused. So lane
//   (g, t) holds both slots of rows g and g + 8 in the two k-tiles whose MMA group (g + j) % 8 is t or t + 4, which
//   is what the tensor-core loop (OVER 4, see over_mma_step) needs; the CUDA-core loops take any assignment.
// With codes (CODE 8 or 4) a slot holds the int8 code of its weight, 2 bytes a slot with its offset instead of 3:
// for CODE 8 the row's scale multiplies it with the rest of the sum at the end; for CODE 4 (128 columns a scale,
// SPS ks / 4) the slot's code is multiplied by its row's scale of the group it lies in (slot k of slot step h of a step
// lies in scale group 2·h + k / 4 of the step), exactly in fp32, since the slots are added after the group scales.
// OVER 1-3 (CUDA cores): each lane adds its slots' products with every row of x into float32 partials p[row g /
// g+8][row of x], loaded with the step's weights (two steps in flight) and kept over all its steps; after the loop
// one butterfly in the quad sums the four lanes' partials, and each lane adds the sums for its own accumulators'
// entries. OVER 4 (tensor cores, 16-bit values only): one more mma.sp a k-tile and 8 rows of x, whose A holds the
// k-tile's 32 slots and whose B rows are the 32 slots' columns of x, gathered by ldmatrix from the column-major copy
// of the staged x, into the same accumulators as the 2:4 part (see over_mma_step). The slices, splits, GLU and the
// output then see a whole sum. With NORM the slots multiply the staged u = w ⊙ s as the MMAs do, so the epilogue's
// 1/rms scales both parts alike.
//
// Dense weights (DENSE: int8 or int4 codes, no RMSNorm, no slots): a dense [out, K] weight is held as the kept
// values of a 2:4 [out, 2K] one that keeps positions 0 and 1 of every group (sp24.py `tile_dense`), so each MMA
// group's two values are two adjacent columns of the dense weight. The metadata is then the same word everywhere
// (0x44444444): it is not stored or loaded. x is staged expanded, two columns of x and two zeros per MMA group
// (unit u of the expanded x: columns 4u..4u+3 of x as words 0 and 2), so the MMAs multiply every value by its own
// column. `in` is the expanded width 2K; x's rows are K long.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <climits>
#include <type_traits>

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerCta = 16 * kWarps;
constexpr int kMaxSmem = 66 * 1024;  // staged x: batch rows of (columns·2 + 64) bytes

// Metadata of half the k-tiles a lane (SP24_HALF_META, the default): mma.sp m16n8k32 with 16-bit A reads its
// metadata from lanes t = 0, 1 of each quad under sparsity selector 0 and from lanes t = 2, 3 under selector 1. Lanes
// t = 0, 1 hold the words of the step's first ks / 2 k-tiles and lanes t = 2, 3 (as t - 2) those of the second half,
// which their MMAs take with selector 1: half the metadata registers and loads. With SP24_HALF_META=0 every lane
// loads t % 2's words of all ks k-tiles and every MMA uses selector 0 (lanes t = 2, 3 then hold copies).
#ifndef SP24_HALF_META
#define SP24_HALF_META 1
#endif

// SP24_ABLATE (diagnostics only, never in a library the package loads; benchmarks/ablate_probe.py): a build whose
// products are wrong on purpose, to time what one part of a step costs. 1: constant metadata (no metadata loads);
// 2: the raw code words into the MMAs (no dequantization); 3: no MMAs (an XOR of A, B and the metadata into the
// sums keeps every load live); 4: no weight loads (constant values, metadata and scales: the compute alone); 5: the
// loads alone (each loaded word XORed into the sums once: no x, no dequantization, no MMAs). For the slots on the
// tensor cores (OVER 4): 6, each lane's own offset word in place of the holder's shuffle; 7, the shuffle kept but
// each gathered row moved to a place whose bank group is its lane's (no bank conflicts); 8, no slot MMAs and no
// gathers (the slot words are still loaded and kept live). 9: no staging of x without the RMSNorm in front (the
// shared memory holds whatever it holds; the barrier stays): what the staging costs. 10: stream-K launches whose
// partial slots are written but never counted nor added (what the counting at a CTA's end costs); 11: the same for
// split-K launches of more than one split (their partials written, y never). 10 and 11 ablate the counting: run them
// with SPARSEDECODING_SP24_HANDOFF=0 (launches that add by handoff never count, so the ablation would change nothing).
#ifndef SP24_ABLATE
#define SP24_ABLATE 0
#endif

// SP24_INT8_KS: k-tiles a step of int8 codes, 16 (the default: eight 16-byte loads a lane, as a step of 16-bit values)
// or 8 (four loads; a library of its own, which sp24.py loads for weights tiled with SPARSEDECODING_SP24_INT8_STEP=8):
// twice the steps a row tile, so that split-K and the warps of small shapes share finer work, and a warp's first sums
// wait for half the dequantized k-tiles. The tiled values' bytes are the same either way (a step's loads follow the
// last step's); the metadata words are laid out per step.
#ifndef SP24_INT8_KS
#define SP24_INT8_KS 16
#endif
static_assert(SP24_INT8_KS == 8 || SP24_INT8_KS == 16, "SP24_INT8_KS: 8 or 16 k-tiles a step of int8 codes");
// SP24_INT4_KS: the same for int4 codes, 16 (four 16-byte loads a lane) by default or 8 (two; a library of its own,
// for weights tiled with SPARSEDECODING_SP24_INT4_STEP=8). Scale loads a step follow: ks >> gk_shift, at least one.
#ifndef SP24_INT4_KS
#define SP24_INT4_KS 16
#endif
static_assert(SP24_INT4_KS == 8 || SP24_INT4_KS == 16, "SP24_INT4_KS: 8 or 16 k-tiles a step of int4 codes");
template <int CODE>
struct Steps {
  static constexpr int ks = CODE == 0 ? 8 : CODE == 8 ? SP24_INT8_KS : SP24_INT4_KS;  // k-tiles per step
  static constexpr int a_loads = CODE == 0 ? 8 : CODE == 8 ? ks / 2 : ks / 4;         // 16-byte loads a lane, step
  static constexpr int tiles_per_load = ks / a_loads;
  static constexpr int meta_words = SP24_HALF_META ? ks / 2 : ks;    // metadata words a lane holds per step
  static constexpr int meta_loads = meta_words / 4;                  // 16-byte metadata loads per lane
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

#if (__CUDACC_VER_MAJOR__ > 12) || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 5)
#define SP24_MMA_SP "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32."
#else
#define SP24_MMA_SP "mma.sp.sync.aligned.m16n8k32.row.col.f32."
#endif

// SEL: the sparsity selector, which pair of each quad's lanes supplies the metadata (0: t = 0, 1; 1: t = 2, 3)
template <bool BF16, int SEL>
__device__ __forceinline__ void mma_sp(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const uint4& b,
                                       uint32_t e) {
  static_assert(SEL == 0 || SEL == 1, "m16n8k32 with 16-bit A takes selector 0 or 1");
  if constexpr (BF16) {
    asm volatile(SP24_MMA_SP "bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w), "r"(e), "n"(SEL));
  } else {
    asm volatile(SP24_MMA_SP "f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w), "r"(e), "n"(SEL));
  }
}

__device__ __forceinline__ float silu_mul(float gate, float up) { return gate / (1.f + __expf(-gate)) * up; }

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// int8: offset-binary bytes k and k + 1 of w (u = code + 128) as the bf16 pair of their exact codes, in four
// instructions where the fp32 route (2^23 + u through two PRMT and two FADD, then one F2FP) took five. One PRMT puts
// the bytes in the low byte of each half. One LOP3 keeps their low 7 bits under 0x4300: bf16 128 + (u & 0x7F), exact
// (8 significant bits). Another gives 0x4380 (256) where u's top bit is clear and 0x4300 (128) where it is set. The
// difference is u - 128, an integer of at most 8 bits, which bf16 holds: exact. tests/test_sp24_int8_dequant.py
// emulates these instructions, constants read from here, on every byte.
__device__ __forceinline__ uint32_t int8_pair(uint32_t w, int k) {
  const uint32_t spread = __byte_perm(w, 0u, 0x4040u | k | ((k + 1) << 8));
  uint32_t magnitude, bias, magic;
  asm("mov.b32 %0, 0x43004300;\n" : "=r"(magic));  // in a register: with both constants immediate, ptxas emits two
  asm("lop3.b32 %0, %1, 0x007F007F, %2, 0xEA;\n" : "=r"(magnitude) : "r"(spread), "r"(magic));  // (a & b) | c
  asm("lop3.b32 %0, %1, 0x00800080, %2, 0xAE;\n" : "=r"(bias) : "r"(spread), "r"(magic));  // (~a & b) | c
  return bf16x2_bits(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&magnitude),
                             *reinterpret_cast<const __nv_bfloat162*>(&bias)));
}

// int4: nibbles r and r + 4 of q (offset binary u = code + 8) as bf16 128 + u, minus 136: the codes, exactly.
// The group's scales multiply the fp32 sums of the group's MMAs, so any bf16 scale gives the exact product.
__device__ __forceinline__ uint32_t int4_pair(uint32_t q, int r) {
  // (q >> 4r) & 0x000F000F | 0x43004300 as one LOP3: with both constants immediate, ptxas emits two
  uint32_t biased, magic;
  asm("mov.b32 %0, 0x43004300;\n" : "=r"(magic));
  asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;\n" : "=r"(biased) : "r"(q >> (4 * r)), "r"(magic));
  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&biased);
  return bf16x2_bits(__hsub2(v, __floats2bfloat162_rn(136.f, 136.f)));
}

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// a 16-bit value of T from its bits
template <typename T>
__device__ __forceinline__ float bits_to_float(uint32_t bits) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) return __uint_as_float(bits << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Stages one 16-byte unit (8 columns) of a row of x at unit u of the CTA's range, permuted (see the top).
__device__ __forceinline__ void stage_unit(char* row, int u, const uint4& v) {
  char* d = row + 64 * (u >> 2) + 4 * (u & 3);
  *reinterpret_cast<uint32_t*>(d) = v.x;
  *reinterpret_cast<uint32_t*>(d + 16) = v.y;
  *reinterpret_cast<uint32_t*>(d + 32) = v.z;
  *reinterpret_cast<uint32_t*>(d + 48) = v.w;
}

// NORM, 8 columns of a row: s = x + res and u = w·s, each rounded to T, and sq += Σs² (the squares of T values are
// exact in fp32).
template <typename T>
__device__ __forceinline__ void norm_unit(const uint4& xv, const uint4& rv, const uint4& wv, uint4& sv, uint4& uv,
                                          float& sq) {
  const T* xe = reinterpret_cast<const T*>(&xv);
  const T* re = reinterpret_cast<const T*>(&rv);
  const T* we = reinterpret_cast<const T*>(&wv);
  T* se = reinterpret_cast<T*>(&sv);
  T* ue = reinterpret_cast<T*>(&uv);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const T si = from_float<T>(to_float(xe[i]) + to_float(re[i]));
    const float sf = to_float(si);
    sq = fmaf(sf, sf, sq);
    se[i] = si;
    ue[i] = from_float<T>(to_float(we[i]) * sf);
  }
}

// SP24_GROUPED_HALVES (with SP24_GROUPED; default 0): OVER 6 for weights whose 8-row halves of each 16-row tile have
// their own column order (split rows 8, `tile_grouped(..., split_rows=8)`): `over_o` holds 16 bytes a lane and step,
// the first half's places (rows g) then the second half's (rows g + 8), and each k-tile takes two ldmatrix gathers and
// two mma.sp, rows g's A registers (a0, a2) against the first gather with rows g + 8's zero, then the other way round.
// 1: both products into the warp's one accumulator (each k-tile's second mma.sp waits for its first); 2: the second
// half's into an accumulator of its own (`acc8`, added in after the loop), so that the two do not wait on each other.
#ifndef SP24_GROUPED_HALVES
#define SP24_GROUPED_HALVES 0
#endif
static_assert(SP24_GROUPED_HALVES >= 0 && SP24_GROUPED_HALVES <= 2, "SP24_GROUPED_HALVES: 0, 1 or 2");

template <int CODE, int SPS>
struct StepRegs {
  uint4 a[Steps<CODE>::a_loads];
  uint4 m[Steps<CODE>::meta_loads];
  uint32_t s[CODE == 4 ? SPS : 1];
  // OVER: this lane's 8 slot values (16-bit values, or int8 codes) and their staged-x offsets per slot step (never
  // set, and so dropped, otherwise)
  std::conditional_t<CODE == 0, uint4, uint2> ov[Steps<CODE>::ks / 8];
  uint2 oc[Steps<CODE>::ks / 8 * (SP24_GROUPED_HALVES ? 2 : 1)];
};

// SPS (CODE 4): scale loads per step; group k-tiles 2^gk_shift.
template <int CODE, int SPS, bool OVER, bool DENSE, bool VALUES = true>
__device__ __forceinline__ void load_step(StepRegs<CODE, SPS>& r, const char* a, const char* meta,
                                          const char* scales, const char* ov, const char* oc, int step, int lane,
                                          int t, int g, int gk_shift, int groups) {
  using S = Steps<CODE>;
#pragma unroll
  for (int j = 0; j < S::a_loads; ++j)
    r.a[j] = SP24_ABLATE == 4 ? make_uint4(step, j, lane, 0x12345678u)
                              : ld_stream(a + (static_cast<size_t>(step) * S::a_loads + j) * 512 + 16 * lane);
  // lane t holds the words of lane t % 2's row pair: all ks k-tiles, or (SP24_HALF_META) half t / 2 of them
  const char* mp = DENSE ? nullptr : meta + ((static_cast<size_t>(step) * 16 + 2 * g + (t & 1)) * S::ks +
                           (SP24_HALF_META ? (t >> 1) * S::meta_words : 0)) * 4;
  if constexpr (!DENSE) {
#pragma unroll
    for (int j = 0; j < S::meta_loads; ++j)
      r.m[j] = SP24_ABLATE == 1 || SP24_ABLATE == 4 ? make_uint4(0x44444444u, 0x44444444u, 0x44444444u, 0x44444444u)
                                                    : ld_stream(mp + 16 * j);
  }
  if constexpr (CODE == 4) {
#pragma unroll
    for (int j = 0; j < SPS; ++j) {
      const int group = (step * S::ks + j * (S::ks / SPS)) >> gk_shift;
      r.s[j] = SP24_ABLATE == 4 ? 0x3F803F80u : ld_u32(scales + (static_cast<size_t>(group) * 8 + g) * 4);
    }
  }
  if constexpr (OVER) {
#pragma unroll
    for (int h = 0; h < S::ks / 8; ++h) {
      const size_t slot_step = static_cast<size_t>(step) * (S::ks / 8) + h;
      if constexpr (!VALUES && SP24_GROUPED_HALVES) {
        // OVER 6 (grouped columns) with 8-row halves: both halves' places of B's rows, no slot values
        static_assert(S::ks == 8, "grouped columns: one slot step a step");
        const uint4 both = ld_stream(oc + slot_step * 512 + 16 * lane);
        r.oc[0] = make_uint2(both.x, both.y);
        r.oc[1] = make_uint2(both.z, both.w);
        continue;
      } else if constexpr (!VALUES) {
        // OVER 6 (grouped columns): the places of B's rows only, no slot values
      } else if constexpr (CODE == 0) {
        r.ov[h] = ld_stream(ov + slot_step * 512 + 16 * lane);
      } else {
        r.ov[h] = ld_stream8(ov + slot_step * 256 + 8 * lane);
      }
      r.oc[h] = ld_stream8(oc + slot_step * 256 + 8 * lane);
    }
  }
  (void)groups;
}

// SP24_INT4_HYBRID (a build of its own; default 0): 2:4 + int4 weights without slots bring every other step of a warp
// through the warp's own slot of shared memory by cp.async instead of into registers: step wstep0 + 2i into registers
// (load_step), step wstep0 + 2i + 1 into the slot (copy_step), read back by each lane from the bytes it copied
// (read_slot) after `cp.async.wait_group 0`. The register loads and the cp.async groups are waited on apart (a load
// scoreboard; a DEPBAR on the groups), so a warp computes its register step while the other step's bytes are still
// on their way; with two register buffers ptxas gives every weight load one scoreboard and the first use of either
// buffer waits for both (nineteenth section of benchmarks/CUDA_KERNEL_NOTES.md). benchmarks/stream_probe.py measured
// the pattern (its mode 4) against register buffers with compute on every 16 bytes: equal with no compute, 3-7%
// faster with it (results/stream_probe_h200_hybrid.md). In sp24 it gained nothing: int4 geomean vs cuBLAS on the 8B
// + 14B shapes 3.261x against 3.240x at batch 1, 3.407x against 3.423x with the early trigger, within 1% at 8 and
// 16, bit for bit the default build's products (results/ablate_int4_hybrid_h200_b{1,8,16}.md); kept for probes.
// A slot: the step's a and metadata pieces at the offsets the lanes' global loads have (piece j of lane l at
// 512 j + 16 l), then its scale words (word j of lane l at 4 (32 j + l)).
#ifndef SP24_INT4_HYBRID
#define SP24_INT4_HYBRID 0
#endif
template <int CODE, int SPS>
struct StepSlot {
  static constexpr int pieces = Steps<CODE>::a_loads + Steps<CODE>::meta_loads;  // 16-byte pieces a lane
  static constexpr int bytes = pieces * 512 + (CODE == 4 ? SPS : 0) * 128;      // a warp's slot
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(char* dst, const char* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async4(char* dst, const char* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}

// load_step's bytes of `step` (no slots, not dense) into this lane's places of the warp's slot, as one commit group
// (an empty group when `copy` is false, so that `cp.async.wait_group 0` always means the last step asked for)
template <int CODE, int SPS>
__device__ __forceinline__ void copy_step(char* slot, bool copy, const char* a, const char* meta, const char* scales,
                                          int step, int lane, int t, int g, int gk_shift) {
  using S = Steps<CODE>;
  if (copy) {
#pragma unroll
    for (int j = 0; j < S::a_loads; ++j)
      cp_async16(slot + 512 * j + 16 * lane, a + (static_cast<size_t>(step) * S::a_loads + j) * 512 + 16 * lane);
    const char* mp = meta + ((static_cast<size_t>(step) * 16 + 2 * g + (t & 1)) * S::ks +
                             (SP24_HALF_META ? (t >> 1) * S::meta_words : 0)) * 4;
#pragma unroll
    for (int j = 0; j < S::meta_loads; ++j) cp_async16(slot + 512 * (S::a_loads + j) + 16 * lane, mp + 16 * j);
    if constexpr (CODE == 4) {
#pragma unroll
      for (int j = 0; j < SPS; ++j) {
        const int group = (step * S::ks + j * (S::ks / SPS)) >> gk_shift;
        cp_async4(slot + 512 * StepSlot<CODE, SPS>::pieces + 4 * (32 * j + lane),
                  scales + (static_cast<size_t>(group) * 8 + g) * 4);
      }
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// the step copy_step put in the slot, into registers as load_step leaves them
template <int CODE, int SPS>
__device__ __forceinline__ void read_slot(StepRegs<CODE, SPS>& r, const char* slot, int lane) {
  using S = Steps<CODE>;
#pragma unroll
  for (int j = 0; j < S::a_loads; ++j) r.a[j] = *reinterpret_cast<const uint4*>(slot + 512 * j + 16 * lane);
#pragma unroll
  for (int j = 0; j < S::meta_loads; ++j)
    r.m[j] = *reinterpret_cast<const uint4*>(slot + 512 * (S::a_loads + j) + 16 * lane);
  if constexpr (CODE == 4) {
#pragma unroll
    for (int j = 0; j < SPS; ++j)
      r.s[j] = *reinterpret_cast<const uint32_t*>(slot + 512 * StepSlot<CODE, SPS>::pieces + 4 * (32 * j + lane));
  }
}

// OVER: the products of this lane's 8 slots of a step with every row of x (p[h][b]: row g + 8h, row b of x), in one
// of three loop orders (OVER, see sp24_launch's `over_loop`):
// 1, rows of x outer: value and offset of the 8 slots decoded once, then one row of x at a time, left at the first row
//    past the batch (the same for every lane), so batch 1 issues 8 shared loads and FMAs a step; the decoded slots
//    stay live across the loop and the sums of rows beyond the first spill (measured better at batch 1-2, worse at
//    8 and 16: results/overflow_h200_8b_break.md);
// 2, slots outer: each slot decoded, then every row of x up to 8 · NT, predicated on the batch (batch 1 issues 64
//    loads a step, all but 8 predicated off; measured better than rows at batch 8 and 16: results/overflow_h200.md,
//    and since beaten there by columns);
// 3, columns: slots outer, each slot's x read for 8 rows at once from a column-major copy of the staged x (`xt`,
//    see stage_columns), one 16-byte shared load per slot and 8 rows of x instead of one per row (measured best
//    at batch 5-8 and 16: results/overflow_h200_auto.md, overflow_h200_one_cta.md). `xt` follows the row-major
//    staging in shared memory.
// Slot k's weight as the sums take it: a 16-bit value (CODE 0), an int8 code (CODE 8: the row scale comes at the
// end), or an int8 code times its row's scale (CODE 4: `scales[k / 4]`, the scales of its group, holds row g's bf16
// scale low, row g + 8's high).
template <typename T, int CODE>
__device__ __forceinline__ float slot_value(const uint32_t (&values)[4], int k, const uint32_t (&scales)[2]) {
  if constexpr (CODE == 0) {
    return bits_to_float<T>((values[k >> 1] >> (16 * (k & 1))) & 0xFFFFu);
  } else {
    const float code = static_cast<float>(static_cast<int8_t>((values[k >> 2] >> (8 * (k & 3))) & 0xFFu));
    if constexpr (CODE == 4) {
      const uint32_t scale = scales[k >> 2];
      const float s = (k >> 1) & 1 ? __uint_as_float(scale & 0xFFFF0000u) : __uint_as_float(scale << 16);
      return code * s;
    } else {
      return code;
    }
  }
}

// j0: the lane's first k-tile of the slot step, (t - g) % 4 (see the top)
template <typename T, int NT, int OVER, int CODE, typename OV>
__device__ __forceinline__ void over_step(float (&p)[2][8 * NT], const OV& ov, const uint2& oc,
                                          const uint32_t (&scale)[2], const char* xs, int xstride, int local_step,
                                          int j0, int batch) {
  uint32_t values[4];
  if constexpr (CODE == 0) {
    values[0] = ov.x; values[1] = ov.y; values[2] = ov.z; values[3] = ov.w;
  } else {
    values[0] = ov.x; values[1] = ov.y; values[2] = values[3] = 0u;
  }
  const uint32_t offsets[2] = {oc.x, oc.y};
  if constexpr (OVER == 3) {
    // place q of a k-tile (its staged byte / 2) holds 8 rows of x in each part's copy, 16 bytes (see
    // stage_columns); this lane's words j0, j0 + 4
    const char* xt = xs + batch * xstride + 32 * (local_step * 8 + j0) * 16;
    const int part_bytes = 8 * (xstride - 64);  // 16 bytes a staged column
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float v = slot_value<T, CODE>(values, k, scale);
      const int q = 128 * (k >> 2) + static_cast<int>((offsets[k >> 2] >> (8 * (k & 3) + 1)) & 0x7F);
      const int h = (k >> 1) & 1;
#pragma unroll
      for (int part = 0; part < NT; ++part) {
        if (8 * part >= batch) break;
        const uint4 rows = *reinterpret_cast<const uint4*>(xt + part * part_bytes + q * 16);
        const uint32_t words[4] = {rows.x, rows.y, rows.z, rows.w};
#pragma unroll
        for (int r = 0; r < 8; ++r)
          p[h][8 * part + r] = fmaf(v, bits_to_float<T>((words[r >> 1] >> (16 * (r & 1))) & 0xFFFFu),
                                    p[h][8 * part + r]);
      }
    }
  } else if constexpr (OVER == 1) {
    float v[8];
    int at[8];  // byte of the slot's column in row 0 of the staged x
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = slot_value<T, CODE>(values, k, scale);
      at[k] = 64 * (local_step * 8 + j0 + 4 * (k >> 2)) +
              static_cast<int>((offsets[k >> 2] >> (8 * (k & 3))) & 0xFF);
    }
#pragma unroll
    for (int b = 0; b < 8 * NT; ++b) {
      if (b >= batch) break;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        p[(k >> 1) & 1][b] = fmaf(v[k], to_float(*reinterpret_cast<const T*>(xs + at[k] + b * xstride)),
                                  p[(k >> 1) & 1][b]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float v = slot_value<T, CODE>(values, k, scale);
      const int offset = (offsets[k >> 2] >> (8 * (k & 3))) & 0xFF;
      const char* xp = xs + 64 * (local_step * 8 + j0 + 4 * (k >> 2)) + offset;
      const int h = (k >> 1) & 1;
#pragma unroll
      for (int b = 0; b < 8 * NT; ++b)
        if (b < batch) p[h][b] = fmaf(v, to_float(*reinterpret_cast<const T*>(xp + b * xstride)), p[h][b]);
    }
  }
}

// Four 8x8 matrices of 16-bit values from shared memory, transposed: lane 8i + r gives the (shared) address of row r
// of matrix i (16 contiguous bytes), and register i of lane (g, t) receives elements (2t, g) and (2t + 1, g) of
// matrix i.
// four 8x8 matrices of 16-bit elements from shared memory, transposed (TRANS) or not
template <bool TRANS>
__device__ __forceinline__ uint4 ldmatrix_x4(uint32_t at) {
  uint4 v;
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at));
  return v;
}

// SP24_MULTICAST C (a build of its own, C = 2 or 4; default 0, off): the kernels without the RMSNorm in front, slots
// or dense weights run in clusters of C CTAs along the row blocks, and stage x unpermuted (rows `xstride` = 2·columns
// + 16 bytes apart): each CTA of a cluster copies a C-th of every row with one cp.async.bulk multicast into all C
// CTAs' shared memory, counted on each CTA's mbarrier, so the L2 serves x once a cluster rather than once a CTA; the
// MMAs take B by ldmatrix (non-transposed: lane (g, t) gets row g, columns 2t, 2t + 1 of matrix m, which is B
// register m). Staging x in every CTA costs 0.8-2.1 us of the 8B down at batch 1 (results/ablate_staging_h200.md).
#ifndef SP24_MULTICAST
#define SP24_MULTICAST 0
#endif
static_assert(SP24_MULTICAST == 0 || SP24_MULTICAST == 2 || SP24_MULTICAST == 4, "SP24_MULTICAST: 0, 2 or 4");

// OVER 4: the slots of a slot step (16-bit values) on the tensor cores, one mma.sp m16n8k32 per k-tile and 8 rows of
// x into the 2:4 part's accumulators. The k-tile's 32 slots (16 rows, two each) become a 2:4 A whose B rows are their
// columns of x: row g's slots (and row g + 8's) go to MMA group G = (g + j) % 8 of k-tile j, B rows 4G + 2h + s for
// row g + 8h, slot s. So A's rows g keep positions 0 and 1 of their group and rows g + 8 positions 2 and 3, and the
// metadata is one constant (0x4 for rows g, 0xE for rows g + 8, every group). Lane (g, t) holds group t or t + 4 of
// rows g, g + 8 for exactly the k-tiles j with (g + j) % 4 = t, which are the k-tiles j0 and j0 + 4 whose slots the
// layout gave it (see the top): its A registers are its two words of that k-tile (a0, a1 for group t, a2, a3 for
// group t + 4), zeros in the other six k-tiles. B comes from the column-major copy of the staged x (`xt`, see
// stage_columns) by ldmatrix: lane l gives the address of B row l, the column of slot (row (l / 4 - j) % 8 + 8·(l % 4
// / 2), slot l % 2), whose offset byte its holder lane passes by shuffle. Unused slots have value 0 and some column.
template <typename T, int NT>
__device__ __forceinline__ void over_mma_step(float (&acc)[NT][4], const uint4& ov, const uint2& oc, const char* xs,
                                              int xstride, int local_step, int g, int t, int lane, int batch) {
  static_assert(NT == 1 || NT == 2, "one n-tile for batch 1-8, two for 9-16");
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  const int j0 = (t - g) & 3;
  const bool upper = ((g + j0) & 4) != 0;  // k-tile j0's group is t + 4 (a2, a3), and k-tile j0 + 4's then t
  const uint32_t pick = 0x4440u | (lane & 3);  // PRMT selector of the holder's offset byte l % 4 (see the top)
  const uint32_t xt =
      static_cast<uint32_t>(__cvta_generic_to_shared(xs + batch * xstride)) + 32 * (local_step * 8) * 16;
  const uint32_t part_bytes = 8 * (xstride - 64);  // each part's copy: 16 bytes a staged column (see stage_columns)
  if constexpr (SP24_ABLATE == 8) {
    asm volatile("" ::"r"(ov.x), "r"(ov.y), "r"(ov.z), "r"(ov.w), "r"(oc.x), "r"(oc.y));
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool holds = (j & 3) == j0, low = holds && upper == (j >= 4), high = holds && upper != (j >= 4);
    const uint32_t w0 = j < 4 ? ov.x : ov.z, w1 = j < 4 ? ov.y : ov.w;  // rows g, g + 8 of k-tile j0 or j0 + 4
    const uint32_t a0 = low ? w0 : 0u, a1 = low ? w1 : 0u, a2 = high ? w0 : 0u, a3 = high ? w1 : 0u;
    // B row l = 4G + 2h + s: slot s of row (G - j) % 8 + 8h, held by lane 4·((G - j) % 8) + G % 4
    const int holder = (((lane & 28) - 4 * j) & 28) | ((lane >> 2) & 3);
    const uint32_t word = SP24_ABLATE == 6 ? (j < 4 ? oc.x : oc.y)
                                           : __shfl_sync(0xFFFFFFFFu, j < 4 ? oc.x : oc.y, holder);
    // the staged offset (2 bytes a place) times 8: place · 16 bytes into the k-tile's copy
    const uint32_t byte = __byte_perm(word, 0u, pick);
    const uint32_t row =
        xt + 32 * j * 16 + (SP24_ABLATE == 7 ? ((lane & 7) | ((byte >> 1) & 0x18)) * 16 : byte * 8);
#pragma unroll
    for (int part = 0; part < NT; ++part) {  // batch 9-16 for two n-tiles: no part past the batch
      const uint4 b = ldmatrix_x4<true>(row + part * part_bytes);
      mma_sp<kBf16, 0>(acc[part], a0, a1, a2, a3, b, 0xEEEE4444u);
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// OVER 3 and 4: the column-major copy `xt` of the staged x, which follows the row-major staging (`batch` rows of
// `xstride` bytes) in shared memory, one copy per part (8 rows of x; 16 bytes a staged column, part p's copy 16·p·cols
// bytes in): staged place q (byte / 2 in its k-tile's row-major staging, see stage_unit) gets 16 bytes of each part,
// row 8p + r at 2r. Column 8u + e of unit u sits at place 32·(u / 4) + 2·(u % 4) + 8·(e / 2) + e % 2. Rows past the
// batch are zeros. Part by part rather than 32 bytes a place at two parts, so that the 16-byte rows the slots gather
// (eight at a time, one shared-memory wavefront) spread over all eight 16-byte bank groups rather than four.
template <int NT>
__device__ __forceinline__ void stage_columns(char* xs, int xstride, int units, int batch, int tid) {
  char* xt = xs + batch * xstride;
  for (int u = tid; u < units; u += kThreads) {
#pragma unroll
    for (int part = 0; part < NT; ++part) {
      if (8 * part >= batch) break;
      uint32_t w[8][4];  // word i of unit u in rows 8·part + r
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const char* d = xs + (8 * part + r) * xstride + 64 * (u >> 2) + 4 * (u & 3);  // as stage_unit wrote it
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[r][i] = 8 * part + r < batch ? *reinterpret_cast<const uint32_t*>(d + 16 * i) : 0u;
      }
      char* c = xt + part * (128 * units) + (32 * (u >> 2) + 2 * (u & 3)) * 16;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;  // the high or the low halves of two words
        const int i = e >> 1;
        *reinterpret_cast<uint4*>(c + (8 * i + (e & 1)) * 16) =
            make_uint4(__byte_perm(w[0][i], w[1][i], sel), __byte_perm(w[2][i], w[3][i], sel),
                       __byte_perm(w[4][i], w[5][i], sel), __byte_perm(w[6][i], w[7][i], sel));
      }
    }
  }
}

// OVER 6 without the RMSNorm in front: stage_columns' copy made straight from x in global memory (rows `batch` and
// on, and columns from `in` on, zeros), at the start of shared memory, with no row-major staging: half the shared
// memory of both at batch 9-16, so fewer splits are needed for x to fit.
template <typename T, int NT>
__device__ __forceinline__ void stage_columns_direct(char* xs, const T* __restrict__ x, int col0, int in, int units,
                                                     int batch, int tid) {
  for (int u = tid; u < units; u += kThreads) {
    const int col = col0 + 8 * u;
#pragma unroll
    for (int part = 0; part < NT; ++part) {
      uint32_t w[8][4];  // word i (columns 8u + 2i, 2i + 1) of rows 8·part + r
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int row = 8 * part + r;
        const uint4 v = row < batch && col < in ? *reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * in +
                                                                                   col)
                                                : make_uint4(0u, 0u, 0u, 0u);
        w[r][0] = v.x; w[r][1] = v.y; w[r][2] = v.z; w[r][3] = v.w;
      }
      char* c = xs + part * (128 * units) + (32 * (u >> 2) + 2 * (u & 3)) * 16;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;  // the high or the low halves of two words
        const int i = e >> 1;
        *reinterpret_cast<uint4*>(c + (8 * i + (e & 1)) * 16) =
            make_uint4(__byte_perm(w[0][i], w[1][i], sel), __byte_perm(w[2][i], w[3][i], sel),
                       __byte_perm(w[4][i], w[5][i], sel), __byte_perm(w[6][i], w[7][i], sel));
      }
    }
  }
}

// One k-tile of a step: A from the step's registers (dequantized to exact codes for CODE 8 and 4), one mma.sp per
// 8 rows of x into `acc`.
// OVER 5 (a build with SP24_QUADS; 16-bit values): quad-placed slots (16:32+4q, kernels/quad_slots.py). Lane t of a
// quad owns the place of group class t of rows g and g + 8 in each k-tile: its 16-bit value (ov, k-tile k's half of
// word k / 2) and a byte (oc, byte k: the low nibble its own, the high one lane t ^ 2's; nibble bit 0 row g + 8,
// bit 1 group t + 4, bits 2-3 the position). The place lies in the lane's own A fragment, so one more mma.sp with the
// 2:4 part's own B fragment adds it: A is the value in register 2·(group bit) + (row bit), in its second half at
// position 3, zeros elsewhere; the metadata (lanes t < 2: groups 4t..4t+3 of both rows, bits 16·h + 4·(group mod 4))
// is 0xCCCCCCCC (positions 0 and 3 everywhere) ORed with the position of each place whose group bit is t, taken from
// the lane's byte and its neighbour's (`nb`, one shfl.xor 1 a step). No gather, no copy of x, no partials.
__device__ __forceinline__ uint32_t quad_meta_bits(uint32_t nib, int c, int t) {
  const uint32_t p = nib >> 2, at = 16u * (nib & 1u) + 4u * static_cast<uint32_t>(c);
  return ((nib >> 1) & 1u) == static_cast<uint32_t>(t & 1) && p != 3u ? p << at : 0u;
}

// GROUPED (OVER 6): 0 no; 1 B gathered from the column copy after the staged rows (with the RMSNorm in front);
// 2 from the column copy alone, staged from global memory at the start of shared memory (stage_columns_direct)
template <typename T, int NT, int CODE, int SPS, bool DENSE, bool QUADS = false, bool RAW = false, int GROUPED = 0>
__device__ __forceinline__ void compute_tile(float (&acc)[NT][4], const StepRegs<CODE, SPS>& r, int k,
                                             const char* xs, int xstride, int local_step, int g, int t, int batch,
                                             uint2 nb = make_uint2(0u, 0u), float (*acc8)[4] = nullptr) {
  using S = Steps<CODE>;
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  uint32_t a0, a1, a2, a3;
  const uint4& v = r.a[k / S::tiles_per_load];
  if constexpr (SP24_ABLATE == 5) {
    const uint32_t words = k % S::tiles_per_load == 0 ? v.x ^ v.y ^ v.z ^ v.w : 0u;
    acc[0][0] += __uint_as_float((words ^ word_of(r.m[(k % S::meta_words) / 4], k % 4)) & 0x3FFFFFFFu);
    return;
  }
  if constexpr (CODE == 0) {
    a0 = v.x; a1 = v.y; a2 = v.z; a3 = v.w;
  } else if constexpr (CODE == 8) {
    const uint32_t wg = word_of(v, 2 * (k % 2)), wg8 = word_of(v, 2 * (k % 2) + 1);
    if constexpr (SP24_ABLATE == 2) {
      a0 = a2 = wg; a1 = a3 = wg8;
    } else {
      a0 = int8_pair(wg, 0); a2 = int8_pair(wg, 2); a1 = int8_pair(wg8, 0); a3 = int8_pair(wg8, 2);
    }
  } else {
    const uint32_t q = word_of(v, k % 4);
    if constexpr (SP24_ABLATE == 2) {
      a0 = a1 = a2 = a3 = q;
    } else {
      a0 = int4_pair(q, 0); a1 = int4_pair(q, 1); a2 = int4_pair(q, 2); a3 = int4_pair(q, 3);
    }
  }
  // k is a constant once compute_step's loop is unrolled, and so is the selector
  const uint32_t e = DENSE ? 0x44444444u : word_of(r.m[(k % S::meta_words) / 4], k % 4);
  const int tile = local_step * S::ks + k;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    // rows of x past the batch read the last row: their sums are never written, and no zeroing or predicate
    // is spent on them
    uint4 b;
    [[maybe_unused]] uint4 b8;  // SP24_GROUPED_HALVES: the second gather (rows g + 8)
    if constexpr (GROUPED != 0) {
      // OVER 6: B row l (the k-tile's position l, as A's metadata counts it) is the column whose place (see
      // stage_columns) lane l's byte k names, read by ldmatrix from the column-major copy after the staged rows
      static_assert(CODE == 0 && S::ks == 8, "grouped columns: 16-bit values, one byte a lane and k-tile a step");
      const uint32_t word = k < 4 ? r.oc[0].x : r.oc[0].y;
      const uint32_t place = (word >> (8 * (k & 3))) & 0x1Fu;
      const uint32_t copy = shared_address(GROUPED == 2 ? xs : xs + batch * xstride) + 32 * tile * 16 +
                            j * 8 * (xstride - 64);  // each part's copy: 16 bytes a staged column
      b = ldmatrix_x4<true>(copy + place * 16);
      if constexpr (SP24_GROUPED_HALVES) {
        const uint32_t word8 = k < 4 ? r.oc[1].x : r.oc[1].y;
        b8 = ldmatrix_x4<true>(copy + ((word8 >> (8 * (k & 3))) & 0x1Fu) * 16);
      }
    } else if constexpr (RAW) {
      // x unpermuted (SP24_MULTICAST): lane 8m + r gives row r of matrix m (columns 8m..8m + 7)
      const int lane = 4 * g + t;
      const int row = min(8 * j + (lane & 7), batch - 1);
      b = ldmatrix_x4<false>(shared_address(xs + row * xstride + 64 * tile + 16 * (lane >> 3)));
    } else {
      const int row = min(8 * j + g, batch - 1);
      b = *reinterpret_cast<const uint4*>(xs + row * xstride + 64 * tile + 16 * t);
    }
    if constexpr (SP24_ABLATE == 3) {
      acc[j][0] += __uint_as_float((a0 ^ a1 ^ a2 ^ a3 ^ b.x ^ b.y ^ b.z ^ b.w ^ e) & 0x3FFFFFFFu);
    } else if constexpr (GROUPED != 0 && SP24_GROUPED_HALVES) {
      // rows g (a0, a2) in the first half's order, rows g + 8 (a1, a3) in the second's: each product adds zeros to
      // the other half's accumulators (2: the second half's products into acc8)
      float* second = acc[j];
      if constexpr (SP24_GROUPED_HALVES == 2) second = acc8[j];
      if (k < S::meta_words) {
        mma_sp<kBf16, 0>(acc[j], a0, 0u, a2, 0u, b, e);
        mma_sp<kBf16, 0>(second, 0u, a1, 0u, a3, b8, e);
      } else {
        mma_sp<kBf16, 1>(acc[j], a0, 0u, a2, 0u, b, e);
        mma_sp<kBf16, 1>(second, 0u, a1, 0u, a3, b8, e);
      }
    } else {
      if (k < S::meta_words) mma_sp<kBf16, 0>(acc[j], a0, a1, a2, a3, b, e);
      else mma_sp<kBf16, 1>(acc[j], a0, a1, a2, a3, b, e);
    }
    if constexpr (QUADS) {
      static_assert(CODE == 0 && S::ks == 8, "quad-placed slots: 16-bit values, one slot step a step");
      const uint32_t word = word_of(r.ov[0], k / 2), value = k % 2 ? word >> 16 : word & 0xFFFFu;
      const uint32_t own = ((k < 4 ? r.oc[0].x : r.oc[0].y) >> (8 * (k % 4))) & 0xFFu;
      const uint32_t mate = ((k < 4 ? nb.x : nb.y) >> (8 * (k % 4))) & 0xFFu;
      const uint32_t nib = own & 0xFu, reg = 2u * ((nib >> 1) & 1u) + (nib & 1u);
      const uint32_t placed = (nib >> 2) == 3u ? value << 16 : value;
      const uint32_t q0 = reg == 0u ? placed : 0u, q1 = reg == 1u ? placed : 0u, q2 = reg == 2u ? placed : 0u,
                     q3 = reg == 3u ? placed : 0u;
      const uint32_t qe = 0xCCCCCCCCu | quad_meta_bits(nib, t, t) | quad_meta_bits(own >> 4, t ^ 2, t) |
                          quad_meta_bits(mate & 0xFu, t ^ 1, t) | quad_meta_bits(mate >> 4, t ^ 3, t);
      mma_sp<kBf16, 0>(acc[j], q0, q1, q2, q3, b, qe);
    }
  }
}

template <typename T, int NT, int CODE, int SPS, bool DENSE, bool QUADS = false, bool RAW = false, int GROUPED = 0>
__device__ __forceinline__ void compute_step(float (&acc)[NT][4], const StepRegs<CODE, SPS>& r, const char* xs,
                                             int xstride, int local_step, int g, int t, int batch,
                                             float (*acc8)[4] = nullptr) {
  using S = Steps<CODE>;
  if constexpr (QUADS) {  // the neighbour's info bytes: the places of classes t ^ 1 and t ^ 3
    const uint2 nb = make_uint2(__shfl_xor_sync(0xFFFFFFFFu, r.oc[0].x, 1), __shfl_xor_sync(0xFFFFFFFFu, r.oc[0].y, 1));
#pragma unroll
    for (int k = 0; k < S::ks; ++k)
      compute_tile<T, NT, CODE, SPS, DENSE, true>(acc, r, k, xs, xstride, local_step, g, t, batch, nb);
  } else if constexpr (CODE != 4) {
#pragma unroll
    for (int k = 0; k < S::ks; ++k)
      compute_tile<T, NT, CODE, SPS, DENSE, false, RAW, GROUPED>(acc, r, k, xs, xstride, local_step, g, t, batch,
                                                                 make_uint2(0u, 0u), acc8);
  } else {
    // int4: each scale group's MMAs sum into `part`, which its rows' scales (fp32) then add into acc
#pragma unroll
    for (int s = 0; s < SPS; ++s) {
      float part[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.f;
#pragma unroll
      for (int k = s * (S::ks / SPS); k < (s + 1) * (S::ks / SPS); ++k)
        compute_tile<T, NT, CODE, SPS, DENSE, false, RAW>(part, r, k, xs, xstride, local_step, g, t, batch);
      const float sg = __uint_as_float(r.s[s] << 16), sg8 = __uint_as_float(r.s[s] & 0xFFFF0000u);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[j][0] = fmaf(sg, part[j][0], acc[j][0]);
        acc[j][1] = fmaf(sg, part[j][1], acc[j][1]);
        acc[j][2] = fmaf(sg8, part[j][2], acc[j][2]);
        acc[j][3] = fmaf(sg8, part[j][3], acc[j][3]);
      }
    }
  }
}

// x [batch][in] (in = 32·k_tiles, contiguous); y [batch][out]; row_scales (CODE 8): bf16 [out]. Two CTAs per SM:
// left alone, the int8 and int4 kernels for 9-16 rows of x took 154 and 130 registers, one CTA per SM (int8 at
// batch 16 went from 1.16x to 1.29x cuBLAS with this bound alone: results/sp24_h200.md at commit 903c604). Except
// with overflow slots and NT >= SP24_OVER_ONE_CTA_NT (default 2): under the two-CTA bound's 128 registers those
// spilled in the main loop (rows 68, slots 44, columns 164 spill instructions without the RMSNorm in front, 36-230
// with and without it; results/sass_sp24_slots.md), with one CTA none do (results/sass_sp24_slots_one_cta.md).
#ifndef SP24_OVER_ONE_CTA_NT
#define SP24_OVER_ONE_CTA_NT 2
#endif
// int8 codes with slots take the one-CTA bound at one n-tile as well (SP24_OVER_INT8_ONE_CTA, default 1): under 128
// registers their two buffers of eight 16-byte code loads plus two slot steps' values and offsets spilled in the
// main loop (results/sass_sp24_slots_codes_int8_2ctas.md against results/sass_sp24_slots_codes.md; int4 codes, four
// loads a step, spill little and keep two CTAs).
#ifndef SP24_OVER_INT8_ONE_CTA
#define SP24_OVER_INT8_ONE_CTA 1
#endif
// Slots on the tensor cores (OVER 4) keep no partials of their own and take the two-CTA bound at both n-tiles
// (SP24_OVER_MMA_CTAS, default 2).
// SP24_GROUPED_CTAS (a build of its own; default 2): the same bound for grouped columns (OVER 6), whose kernels spill
// under 128 registers (results/ptxas_grouped_halves_sm90.md); 1 lets them take up to 255 at one CTA a multiprocessor.
#ifndef SP24_GROUPED_CTAS
#define SP24_GROUPED_CTAS 2
#endif
static_assert(SP24_GROUPED_CTAS == 1 || SP24_GROUPED_CTAS == 2, "SP24_GROUPED_CTAS: 1 or 2");
#ifndef SP24_OVER_MMA_CTAS
#define SP24_OVER_MMA_CTAS 2
#endif
// SP24_INT4_CTAS (a build of its own, for probes; default 2): the launch bound's CTAs a multiprocessor for 2:4 + int4
// weights without slots, and SP24_INT4_BUFFERS (default kBuffers, 2) their register buffers of steps. More CTAs a
// multiprocessor (fewer registers each) leave room beside a running grid for the next programmatic launch's CTAs,
// which with the early trigger then stream their weights under this grid's compute and tail.
#ifndef SP24_INT4_CTAS
#define SP24_INT4_CTAS 2
#endif
template <int NT, int CODE, int OVER, bool DENSE>
constexpr int kMinCtas = OVER == 5 ? 2 : OVER == 6 ? SP24_GROUPED_CTAS : OVER == 4 ? SP24_OVER_MMA_CTAS
                         : OVER != 0 && (NT >= SP24_OVER_ONE_CTA_NT || (CODE == 8 && SP24_OVER_INT8_ONE_CTA)) ? 1
                         : CODE == 4 && OVER == 0 && !DENSE ? SP24_INT4_CTAS
                                                            : 2;
// kBuffers: register buffers of steps a warp cycles through, one step in flight while one is computed. A third
// buffer for int4 codes (which keep a third of 16-bit values' bytes a step) was built, passed its tests, and gained
// nothing measurable (results/sp24_h200_buffers.md; commit 8aed30d), so two it is.
constexpr int kBuffers = 2;
#ifndef SP24_INT4_BUFFERS
#define SP24_INT4_BUFFERS kBuffers
#endif
// SP24_INT4_BUFFERS 3 (a probe, fifty-eighth session; lost on an H100 in the fifty-ninth): three buffers, only for the
// int4 instances that hold them without spilling (one n-tile, no stream-K, no RMSNorm, groups of at least 128 columns);
// the others keep kBuffers. Where a warp's share of a tile is three steps (the 14B o and qkv at 4 slices), all three
// are then requested before the early trigger's dependency wait (benchmarks/CUDA_KERNEL_NOTES.md, fifty-eighth
// session).
static_assert(SP24_INT4_BUFFERS >= 1 && SP24_INT4_BUFFERS <= 3, "SP24_INT4_BUFFERS: 1, 2 or 3 register buffers");
// SP24_INT4_SLOT3 (a probe, sixtieth session; lost on an H100 in the sixty-first): the int4 instances that keep two
// register buffers (one n-tile, no slots, stream-K, RMSNorm or dense weights, groups of at least 128 columns) also
// request a warp's third step before the dependency wait, by cp.async into the warp's slot of shared memory
// (copy_step), and read it back into the first buffer (read_slot) once that buffer's step is computed; every later step
// loads as before. Where a warp's share of a tile is three steps (the 14B o and qkv at 4 slices) all of them are then
// in flight before the wait without the third register buffer, whose 127 registers made ptxas chain a step's MMAs into
// one dependency (candidate 3 of benchmarks/CUDA_KERNEL_NOTES.md's fifty-eighth section; the third buffer: its
// fifty-ninth).
#ifndef SP24_INT4_SLOT3
#define SP24_INT4_SLOT3 0
#endif
static_assert(!SP24_INT4_SLOT3 || (!SP24_INT4_HYBRID && SP24_INT4_BUFFERS == 2),
              "SP24_INT4_SLOT3: a third step beside two register buffers, not with SP24_INT4_HYBRID or other "
              "buffers");
// SP24_EARLY_TRIGGER 1 (a build of its own; sp24.early_trigger picks it per launch under the default setting, auto):
// a CTA lets the next programmatic launch start as soon as it has requested its first steps, not after its main
// loop. Where a grid leaves room on the multiprocessors (fewer CTAs than two a multiprocessor), the next linear's CTAs
// then stream their weights under this one's loads, compute and tail rather than after them.
#ifndef SP24_EARLY_TRIGGER
#define SP24_EARLY_TRIGGER 0
#endif

// SP24_STREAM_FENCES (a build of its own, for probes; default 0): the counting at a stream-K CTA's end (and a split-K
// CTA's) as first built, a fence by every thread before a relaxed atomicAdd and another before the adding, in place of
// one acquire-release atomic by thread 0 between two barriers (the pattern of CUTLASS's semaphores)
#ifndef SP24_STREAM_FENCES
#define SP24_STREAM_FENCES 0
#endif

// SP24_CLUSTER_SPLIT (a build of its own, for probes; default 0; not with SP24_MULTICAST): split-K launches of 2-8
// splits without the RMSNorm in front, slots, dense weights or GLU run each row block's splits as one thread-block
// cluster along y, and add their partial sums through distributed shared memory (each CTA leaves its sums in its own
// shared memory, the cluster synchronises, each CTA adds its share of the rows from every CTA in split order) instead
// of the global slots and counter: bit for bit the same sums, without the L2 round trips of the counting
#ifndef SP24_CLUSTER_SPLIT
#define SP24_CLUSTER_SPLIT 0
#endif
#if SP24_CLUSTER_SPLIT && SP24_MULTICAST
#error "SP24_CLUSTER_SPLIT and SP24_MULTICAST both take the launch's clusters"
#endif

// the CTAs of this CTA's cluster (1 without clusters)
__device__ __forceinline__ uint32_t cluster_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// the float at shared address `address` (this CTA's) in the shared memory of CTA `rank` of the cluster
__device__ __forceinline__ float cluster_load(uint32_t address, uint32_t rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// counter += v at GPU scope with acquire-release order; the old value
__device__ __forceinline__ int atomic_add_acq_rel(int* counter, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(v) : "memory");
  return old;
}

// Handoff (split-K and stream-K launches whose grid fits on the GPU at once; see sp24_kernel): their partial slots and
// Σs² slots, in a workspace of their own (`hand`, not the counting's `partials` and `ss_slots`), hold kEmpty between
// launches (sp24.py fills it so; the adder writes kEmpty back after reading), so that an entry is its own flag. A
// producer CTA stores its sums and leaves, with no fence, atomic or barrier; the row block's one adder waits on each
// entry until it is not kEmpty. kEmpty is a NaN with every bit
// set, which no arithmetic produces (the GPU's NaNs are 0x7FFFFFFF); a sum that had those bits anyway is stored as
// that NaN, so that no adder waits for ever.
constexpr uint32_t kEmpty = 0xFFFFFFFFu;

__device__ __forceinline__ void put_entry(float* at, float v) {
  const uint32_t bits = __float_as_uint(v) == kEmpty ? 0x7FFFFFFFu : __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(at), "r"(bits) : "memory");
}

__device__ __forceinline__ uint32_t peek_entry(const float* at) {
  uint32_t bits;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(bits) : "l"(at) : "memory");
  return bits;
}

// v[k] = the entry at(k) for each k < N with ok(k), once written, and each written back as kEmpty for the next
// launch: all read together first; then, group by group (entries k / G, in order), those of the group still kEmpty
// read again together until none is (one round trip a group, however many of its entries were late).
// SP24_HANDOFF_WAIT_GROUP sets G where the callers hold one producer's entries in a row (split-K's splits, stream-K's
// contributors: 4 NT entries a thread): 2 (the default) = one producer's entries (they land together, so one round
// trip a late producer); 1 = each entry alone (the first handoff code, h200.sh lease82; at batch 4-16, 4-8 entries a
// split, a late split cost a round trip each: 0.92-0.98x of counting in sp24_h200_handoff_each.md at batch 4-16);
// 0 = all of them together, eight splits at a time at one n-tile (the code timed in sp24_h200_handoff_batched.md),
// which made ptxas spill in most split-K kernels (sm_90a, -Xptxas -v, results/ptxas_handoff_sm90a.md: 88 bytes of
// spill stores in the int4 kernel of one n-tile, some between the main loop's MMAs; up to 584 bytes of loads in the
// RMSNorm and dense-weight kernels). Builds other than 2 are probes (ablate_probe.py).
#ifndef SP24_HANDOFF_WAIT_GROUP
#define SP24_HANDOFF_WAIT_GROUP 2
#endif
template <int G, int N, typename At, typename Ok>
__device__ __forceinline__ void take_entries(uint32_t (&v)[N], At at, Ok ok) {
  static_assert(N % G == 0, "whole groups");
#pragma unroll
  for (int k = 0; k < N; ++k)
    if (ok(k)) v[k] = peek_entry(at(k));
#pragma unroll
  for (int k0 = 0; k0 < N; k0 += G)
    while (true) {
      bool pending = false;
#pragma unroll
      for (int k = k0; k < k0 + G; ++k) pending |= ok(k) && v[k] == kEmpty;
      if (!pending) break;
      __nanosleep(G == 1 ? 64 : 32);
#pragma unroll
      for (int k = k0; k < k0 + G; ++k)
        if (ok(k) && v[k] == kEmpty) v[k] = peek_entry(at(k));
    }
#pragma unroll
  for (int k = 0; k < N; ++k)
    if (ok(k)) asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(at(k)), "r"(kEmpty) : "memory");
}

// the group of take_entries for N entries, one producer's P of them in a row (see SP24_HANDOFF_WAIT_GROUP)
template <int N, int P>
__host__ __device__ constexpr int wait_group() {
  return SP24_HANDOFF_WAIT_GROUP == 0 ? N : SP24_HANDOFF_WAIT_GROUP == 1 ? 1 : P;
}

// 0 + v(0) + v(1) + ... + v(n - 1), added in that order (so bit for bit a plain loop's sum), v(i) = *at(i) read
// past the L1; the loads eight at a time in flight together (a plain loop waited for each before the next: one L2
// round trip a stream-K contributor at the end of the launch; nvcc already unrolls split-K's loops over splits so).
// WAIT (handoff): the entries waited for until written, and kEmpty written back (see take_entries).
template <bool WAIT, typename At>
__device__ __forceinline__ float ordered_sum(int n, At at) {
  float sum = 0.f;
  for (int i0 = 0; i0 < n; i0 += 8) {
    uint32_t v[8];
    if constexpr (WAIT) {
      take_entries<wait_group<8, 1>()>(v, [&](int i) { return at(i0 + i); }, [&](int i) { return i0 + i < n; });
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = i0 + i < n ? __float_as_uint(__ldcg(at(i0 + i))) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i0 + i < n) sum += __uint_as_float(v[i]);
  }
  return sum;
}

// STREAM (stream-K: one slice, no RMSNorm in front, no slots, dense weights or GLU): the row blocks' steps laid end to
// end, unit rb·steps + s being step s of row block rb (its eight row tiles, one a warp), and CTA c of a grid of G takes
// units [c·V / G, (c + 1)·V / G) of the V = row blocks · steps, so that every CTA has the same work to within one step
// however the row blocks divide among the multiprocessors (split-K leaves a last partial wave where they do not: the
// Qwen3-14B gate_up's 272 row blocks against 264 CTA places on an H200). A CTA stages x for the steps its units touch,
// from its first unit's step on and wrapping past the last step (at most all of them), so a unit's staged step is
// (step - first step) mod steps. Each run of units in one row block (a segment) ends where the row block or the CTA's
// units do: a whole row block's sums go to y; otherwise they go to the CTA's partial slot (0 for its first segment's
// row block, 1 for its last's: the segments between are whole), and the last of the row block's CTAs to count itself
// on the row block's counter adds the slots of all of them, in CTA order, into y.
struct StreamUnits {
  int u0 = 0, u1 = 0, units = 0, first_step = 0, staged_steps = 0;
};

__device__ __forceinline__ int stream_start(int c, int units, int ctas) {
  return static_cast<int>(static_cast<long long>(c) * units / ctas);
}

// the CTA whose units hold unit u: the last c with stream_start(c) <= u
__device__ __forceinline__ int stream_owner(int u, int units, int ctas) {
  return static_cast<int>((static_cast<long long>(u + 1) * ctas - 1) / units);
}

__device__ __forceinline__ StreamUnits stream_units(int row_tiles, int steps, int c, int ctas) {
  StreamUnits s;
  s.units = (row_tiles + kWarps - 1) / kWarps * steps;
  s.u0 = stream_start(c, s.units, ctas);
  s.u1 = stream_start(c + 1, s.units, ctas);
  s.first_step = s.u0 % steps;
  s.staged_steps = min(s.u1 - s.u0, steps);
  return s;
}

template <typename T, int NT, int CODE, int SPS, bool NORM, int OVER, bool DENSE, bool STREAM>
__global__ void __launch_bounds__(kThreads, (kMinCtas<NT, CODE, OVER, DENSE>))
sp24_kernel(const T* __restrict__ x, const char* __restrict__ a,
            const char* __restrict__ meta,
            const char* __restrict__ scales,
            const __nv_bfloat16* __restrict__ row_scales,
            T* __restrict__ y, float* __restrict__ partials,
            int* __restrict__ counters, int batch, int out, int in,
            int row_tiles, int steps, int per_split, int gk_shift,
            int groups, int slices, int glu,
            const T* __restrict__ res, const T* __restrict__ norm_w,
            T* __restrict__ sum_out, float* __restrict__ ss_slots,
            float eps, const char* __restrict__ over_v,
            const char* __restrict__ over_o, float* __restrict__ hand, int heavy) {
  using S = Steps<CODE>;
  static_assert(!DENSE || (CODE != 0 && !NORM && OVER == 0), "dense weights: codes, no RMSNorm, no slots");
  static_assert(!STREAM || (!NORM && OVER == 0 && !DENSE), "stream-K: no RMSNorm, slots or dense weights");
  extern __shared__ __align__(16) char xs[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int splits = gridDim.y, split = blockIdx.y;
  // handoff (see kEmpty): the slots in `hand`, split-K's Σs² slots after its partial slots (16-byte aligned)
  const bool handoff = hand != nullptr;
  float* const hand_ss = handoff ? hand + (static_cast<size_t>(splits) * batch * out + 3) / 4 * 4 : nullptr;
  // STREAM: this CTA's units [u0, u1) of the row blocks' steps laid end to end (see stream_units)
  const StreamUnits su = STREAM ? stream_units(row_tiles, steps, blockIdx.x, gridDim.x) : StreamUnits{};
  const int step0 = STREAM ? su.first_step : split * per_split;
  const int step1 = STREAM ? step0 + su.staged_steps : min(steps, step0 + per_split);
  // mixed grids (`heavy` below the grid; one split, one n-tile, no GLU or slots, see sp24_launch): CTAs from `heavy`
  // on take one row tile each, all kWarps warps sharing its steps; the first `heavy` take kWarps / slices row tiles, as
  // the others do in a grid of one kind. Only the kernels that can run them compute it (in the others the added
  // registers made ptxas spill 8-16 bytes in four kernels of two n-tiles)
  constexpr bool kMixed = NT == 1 && OVER == 0 && !STREAM;
  const bool light = kMixed && static_cast<int>(blockIdx.x) >= heavy;
  const int cta_slices = light ? kWarps : slices;
  const int cta_tiles = kWarps / cta_slices, slice = warp / cta_tiles;
  const int tile_row = (light ? heavy * (kWarps / slices) + (blockIdx.x - heavy) : blockIdx.x * cta_tiles) +
                       warp % cta_tiles;
  const bool active = tile_row < row_tiles;
  // this warp's steps: its slice of the CTA's
  const int per_slice = (step1 - step0 + cta_slices - 1) / cta_slices;
  const int wstep0 = min(step1, step0 + slice * per_slice), wstep1 = min(step1, wstep0 + per_slice);
  const size_t a_stride = static_cast<size_t>(steps) * S::a_loads * 512;  // bytes per row tile
  const size_t m_stride = static_cast<size_t>(steps) * 16 * S::ks * 4;
  const char* a_tile = a + tile_row * a_stride;
  const char* m_tile = DENSE ? nullptr : meta + tile_row * m_stride;
  const char* s_tile = CODE == 4 ? scales + static_cast<size_t>(tile_row) * groups * 32 : nullptr;
  const size_t slot_steps = static_cast<size_t>(steps) * (S::ks / 8);  // per row tile
  const char* ov_tile = OVER != 0 && OVER != 6 ? over_v + tile_row * slot_steps * (CODE == 0 ? 512 : 256) : nullptr;
  const char* oc_tile =
      OVER != 0 ? over_o + tile_row * slot_steps * (OVER == 6 && SP24_GROUPED_HALVES ? 512 : 256) : nullptr;

  // The first steps' weights are requested before x is staged, so that the staging's latency hides under theirs.
  // SP24_MULTICAST: x staged unpermuted by multicast bulk copies in clusters (see SP24_MULTICAST)
  constexpr bool kRawX = SP24_MULTICAST > 0 && !NORM && !DENSE && OVER == 0 && !STREAM;
  // OVER 6: x only as its column copy, staged straight from global memory (2), or after the rows with the RMSNorm (1)
  constexpr int kGrouped = OVER == 6 ? (NORM ? 1 : 2) : 0;
  __shared__ __align__(8) uint64_t x_landed;  // kRawX: the mbarrier that counts x's bytes in this CTA
  // SP24_INT4_HYBRID: one register buffer and the warp's slot of shared memory (see copy_step)
  // (not for 32-column scale groups: their slots, 40 KB a CTA, would pass the 48 KB of static shared memory)
  constexpr bool kHybrid =
      SP24_INT4_HYBRID && CODE == 4 && OVER == 0 && !DENSE && !STREAM && SP24_ABLATE == 0 && SPS <= 8;
  constexpr bool kInt4Buffers = CODE == 4 && OVER == 0 && !DENSE &&
                                (SP24_INT4_BUFFERS < 3 || (NT == 1 && !STREAM && !NORM && SPS <= Steps<4>::ks / 4));
  constexpr int NB = kHybrid ? 1 : kInt4Buffers ? SP24_INT4_BUFFERS : kBuffers;
  // SP24_INT4_SLOT3: a warp's third step through its slot of shared memory (see SP24_INT4_SLOT3)
  constexpr bool kSlot3 = SP24_INT4_SLOT3 && CODE == 4 && OVER == 0 && !DENSE && !STREAM && !NORM && NT == 1 &&
                          SP24_ABLATE == 0 && SPS <= Steps<4>::ks / 4 && NB == 2;
  __shared__ __align__(16) char step_slots[kHybrid || kSlot3 ? kWarps * StepSlot<CODE, SPS>::bytes : 16];
  char* slot = step_slots + (kHybrid || kSlot3 ? warp * StepSlot<CODE, SPS>::bytes : 0);
  StepRegs<CODE, SPS> r[NB];
  // STREAM: the next unit to load, `ahead`: step ahead_step of row tile ahead_tile (this warp's tile of the unit's row
  // block; a warp past the last row tile loads that one, and its sums are never written), advanced a unit at a time
  // without a division, and its weights loaded into every warp's registers alike: with a division and a branch
  // around a warp's loads and steps in the loop, ptxas waited for the weight loads in flight before every step, not
  // every NB steps as in the split-K loop, and the stream-K launches ran ~15% slower at the same work
  int ahead = su.u0, ahead_step = STREAM ? su.u0 % steps : 0, ahead_tile = STREAM ? su.u0 / steps * kWarps + warp : 0;
  auto load_ahead = [&](StepRegs<CODE, SPS>& regs) {
    if (ahead < su.u1) {
      const int tile = min(ahead_tile, row_tiles - 1);
      load_step<CODE, SPS, false, false>(regs, a + tile * a_stride, meta + tile * m_stride,
                                         CODE == 4 ? scales + static_cast<size_t>(tile) * groups * 32 : nullptr,
                                         nullptr, nullptr, ahead_step, lane, t, g, gk_shift, groups);
    }
    ++ahead;
    if (++ahead_step == steps) {
      ahead_step = 0;
      ahead_tile += kWarps;
    }
  };
  if constexpr (STREAM) {
#pragma unroll
    for (int b = 0; b < NB; ++b) load_ahead(r[b]);
  } else {
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (active && wstep0 + b < wstep1)
        load_step<CODE, SPS, OVER != 0, DENSE, OVER != 6>(r[b], a_tile, m_tile, s_tile, ov_tile, oc_tile, wstep0 + b,
                                                          lane, t, g, gk_shift, groups);
  }
  if constexpr (kHybrid)
    copy_step<CODE, SPS>(slot, active && wstep0 + 1 < wstep1, a_tile, m_tile, s_tile, wstep0 + 1, lane, t, g,
                         gk_shift);
  if constexpr (kSlot3)
    copy_step<CODE, SPS>(slot, active && wstep0 + 2 < wstep1, a_tile, m_tile, s_tile, wstep0 + 2, lane, t, g,
                         gk_shift);
  if constexpr (kRawX) {  // every CTA's mbarrier ready before any CTA of the cluster multicasts into it
    if (tid == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(&x_landed)) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  }
  // Only the weights (constant) are read before this point. With a programmatic launch (pdl) the CTA may have
  // started while the previous kernel on the stream was still running; the wait holds x, res, y and the split-K
  // buffers back until that kernel has finished and its writes are visible (without one it returns at once).
#if __CUDA_ARCH__ >= 900
#if SP24_EARLY_TRIGGER
  // the next kernel's CTAs may take free room on the multiprocessors now, and request their weights under this
  // grid's whole run (their own wait still holds everything else back until this grid has finished)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

  // Stage x columns [32·ks·step0, 32·ks·step1), permuted, zero past `in`.
  const int col0 = step0 * S::ks * 32, cols = (step1 - step0) * S::ks * 32;
  const int xstride = kRawX ? 2 * cols + 16 : 2 * cols + 64;
  const int units = cols / 8;
  __shared__ float ss_part[NORM ? kWarps : 1][NORM ? 16 : 1];  // NORM: each warp's Σs² per row of x
  if constexpr (NORM) {
    // every row of x at once per unit (their loads in flight together), Σs² per row in registers
    float sq[8 * NT];
#pragma unroll
    for (int n = 0; n < 8 * NT; ++n) sq[n] = 0.f;
    const bool writes_sum = sum_out != nullptr && blockIdx.x == 0;  // row block 0 writes s, each split its range
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int u = tid; u < units; u += kThreads) {
      const int col = col0 + 8 * u;
      const bool inside = col < in;
      const uint4 wv = inside ? *reinterpret_cast<const uint4*>(norm_w + col) : zero;
#pragma unroll
      for (int n = 0; n < 8 * NT; ++n) {
        if (n < batch) {
          uint4 sv, uv = zero;
          if (inside) {
            const size_t at = static_cast<size_t>(n) * in + col;
            const uint4 xv = *reinterpret_cast<const uint4*>(x + at);
            const uint4 rv = res != nullptr ? *reinterpret_cast<const uint4*>(res + at) : zero;
            norm_unit<T>(xv, rv, wv, sv, uv, sq[n]);
            if (writes_sum) *reinterpret_cast<uint4*>(sum_out + at) = sv;
          }
          stage_unit(xs + n * xstride, u, uv);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 8 * NT; ++n) {
      if (n < batch) {  // the same for the whole CTA: the shuffles see every lane
        float v = sq[n];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) ss_part[warp][n] = v;
      }
    }
  } else if constexpr (kRawX) {
    // the CTA's columns of each row of x: those inside `in` by the cluster's multicast copies (this CTA sends the
    // rank-th C-th of every row to all C), zeros past it by this CTA's threads
    const int valid = max(0, min(cols, in - col0));
    const uint32_t row_bytes = 2u * static_cast<uint32_t>(valid);
    const uint32_t bar = shared_address(&x_landed);
    if (tid == 0) {
      uint32_t rank;
      asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                   "r"(row_bytes * static_cast<uint32_t>(batch))
                   : "memory");
      const uint32_t chunk = (row_bytes / SP24_MULTICAST + 15u) & ~15u;
      const uint32_t begin = min(row_bytes, chunk * rank), end = min(row_bytes, begin + chunk);
      if (end > begin) {
        for (int n = 0; n < batch; ++n) {
          const uint32_t dst = shared_address(xs + n * xstride + begin);
          const char* src = reinterpret_cast<const char*>(x + static_cast<size_t>(n) * in + col0) + begin;
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                       " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
                       "l"(src), "r"(end - begin), "r"(bar), "h"(static_cast<uint16_t>((1u << SP24_MULTICAST) - 1u))
                       : "memory");
        }
      }
    }
    for (int idx = tid; idx < batch * (units - valid / 8); idx += kThreads) {
      const int per_row = units - valid / 8, n = idx / per_row, u = valid / 8 + idx % per_row;
      *reinterpret_cast<uint4*>(xs + n * xstride + 16 * u) = make_uint4(0u, 0u, 0u, 0u);
    }
    asm volatile(
        "{\n"
        ".reg .pred landed;\n"
        "wait_x:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 landed, [%0], 0;\n"
        "@!landed bra wait_x;\n"
        "}\n" ::"r"(bar)
        : "memory");
  } else if constexpr (kGrouped == 2) {
    stage_columns_direct<T, NT>(xs, x, col0, in, units, batch, tid);
  } else {
    for (int idx = tid; idx < (SP24_ABLATE == 9 ? 0 : batch * units); idx += kThreads) {
      const int n = idx / units, u = idx % units;
      // STREAM: the staged steps wrap past the last step (see StreamUnits)
      const int col = STREAM ? (step0 + u / (4 * S::ks)) % steps * (32 * S::ks) + 8 * (u % (4 * S::ks)) : col0 + 8 * u;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (DENSE) {  // x's columns col / 2 .. col / 2 + 3 in words 0 and 2 (see the top)
        if (col < in) {
          const uint2 h = *reinterpret_cast<const uint2*>(x + static_cast<size_t>(n) * (in / 2) + col / 2);
          v.x = h.x;
          v.z = h.y;
        }
      } else {
        if (col < in) v = *reinterpret_cast<const uint4*>(x + static_cast<size_t>(n) * in + col);
      }
      stage_unit(xs + n * xstride, u, v);
    }
  }
  __syncthreads();
  if constexpr (OVER == 3 || OVER == 4 || kGrouped == 1) {  // the column-major copy of the staged x (see over_step,
    // over_mma_step, compute_tile's GROUPED)
    stage_columns<NT>(xs, xstride, units, batch, tid);
    __syncthreads();
  }
  // NORM: this CTA's Σs² of row b of x (its columns), warps added in order
  auto cta_ss = [&](int b) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += ss_part[NORM ? w : 0][NORM ? b : 0];
    return total;
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  // SP24_GROUPED_HALVES 2: the second half's products (rows g + 8: entries 2 and 3), added into acc after the loop
  [[maybe_unused]] float acc8[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc8[j][0] = acc8[j][1] = acc8[j][2] = acc8[j][3] = 0.f;
  float p[2][8 * NT];  // OVER 1-3: the slots' partial products (see the top)
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < 8 * NT; ++b) p[h][b] = 0.f;
  __shared__ int stream_last[2];  // STREAM: whether this CTA is the last of its slots' row blocks (see StreamUnits)
  // STREAM: the row blocks whose partial slots this CTA has written (slot 0's, then slot 1's; -1: none)
  int partial0 = -1, partial1 = -1;  // (scalars, not an array a run-time index would put on the stack)
  // STREAM: the end of a segment of row block rb (`whole`: all of its steps, `live`: this warp's tile in the weight):
  // a whole row block's sums go to y, a part's to the CTA's slot; the slots are counted at the CTA's end
  // STREAM: a whole row block rb's sums `v` (this warp's tile of it) into y
  auto stream_store = [&](int rb, const float (&v)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1), row = kRowsPerCta * rb + 16 * warp + g + 8 * (e >> 1);
        if (b < batch && row < out) {
          float value = v[j][e];
          if constexpr (CODE == 8) value *= __bfloat162float(row_scales[row]);
          y[static_cast<size_t>(b) * out + row] = from_float<T>(value);
        }
      }
  };
  auto stream_flush = [&](int rb, bool whole, bool live) {
    if (whole) {
      if (live) stream_store(rb, acc);
      return;
    }
    const int slot = rb == su.u0 / steps ? 0 : 1;
    if (slot == 0) partial0 = rb;
    else partial1 = rb;
    float* mine = (handoff ? hand : partials) + static_cast<size_t>(2 * blockIdx.x + slot) * batch * kRowsPerCta;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1);
        const int local = 16 * warp + g + 8 * (e >> 1);  // the entries of rows inside `out`, which the adder reads
        if (b < batch && kRowsPerCta * rb + local < out) {
          if (handoff) put_entry(mine + b * kRowsPerCta + local, acc[j][e]);
          else mine[b * kRowsPerCta + local] = acc[j][e];
        }
      }
  };
  // STREAM, after the CTA's last unit (not in the middle of the run, where a fence would wait for the next segment's
  // loads in flight): each slot's row block counted by thread 0's acquire-release atomic between two barriers; the
  // last of a row block's CTAs to count adds every contributor's slot, in CTA order, into y
  auto stream_count = [&]() {
    if (partial0 < 0 && partial1 < 0) return;  // the same for the whole CTA
    if constexpr (SP24_ABLATE == 10) return;
#if SP24_STREAM_FENCES
    __threadfence();
#endif
    __syncthreads();  // every warp's slot writes come before thread 0's release (the barrier makes them cumulative)
    if (tid == 0) {
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
        const int rb = slot == 0 ? partial0 : partial1;
        stream_last[slot] = 0;
        if (rb < 0) continue;
        const int first = stream_owner(rb * steps, su.units, gridDim.x);
        const int final_owner = stream_owner(rb * steps + steps - 1, su.units, gridDim.x);
        stream_last[slot] = (SP24_STREAM_FENCES ? atomicAdd(&counters[rb], 1) : atomic_add_acq_rel(&counters[rb], 1))
                            == final_owner - first;
        if (stream_last[slot]) counters[rb] = 0;  // ready for the next launch: every other CTA has counted
      }
    }
    __syncthreads();
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {
      if (!stream_last[slot]) continue;  // thread 0's acquire, then the barrier: the other slots are visible
#if SP24_STREAM_FENCES
      __threadfence();
#endif
      const int rb = slot == 0 ? partial0 : partial1;
      const int first = stream_owner(rb * steps, su.units, gridDim.x);
      const int final_owner = stream_owner(rb * steps + steps - 1, su.units, gridDim.x);
      // the first contributor's slot: 0 where its units start inside rb, else 1; every later one's rb is its first
      const int first_slot = 2 * first + (stream_start(first, su.units, gridDim.x) / steps == rb ? 0 : 1);
      for (int e = tid; e < kRowsPerCta * batch; e += kThreads) {
        const int b = e / kRowsPerCta, local = e % kRowsPerCta, row = kRowsPerCta * rb + local;
        if (row >= out) continue;
        const float* entry = partials + static_cast<size_t>(b) * kRowsPerCta + local;
        float sum = ordered_sum<false>(final_owner - first + 1, [&](int i) {
          return entry + static_cast<size_t>(i == 0 ? first_slot : 2 * (first + i)) * batch * kRowsPerCta;
        });
        if constexpr (CODE == 8) sum *= __bfloat162float(row_scales[row]);
        y[static_cast<size_t>(b) * out + row] = from_float<T>(sum);
      }
    }
  };
  int gather_rb = -1;  // STREAM, handoff: the row block whose parts this CTA adds (see stream_gather)
  bool gather_live = false;
  // STREAM, handoff (every CTA of the grid resident at once): row block rb's first unit is this CTA's; its part is
  // the CTA's last segment, still in acc, and every other contributor's part (its first segment, or its whole run)
  // is in that CTA's slot 0. Their entries are added to this CTA's sums in CTA order, waiting on each until written
  // (see kEmpty), and y written: the same sums, bit for bit, as the counting's, with no fence or atomic in any CTA.
  auto stream_gather = [&](int rb, bool live) {
    const int first = blockIdx.x, others = stream_owner(rb * steps + steps - 1, su.units, gridDim.x) - first;
    float sum[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[j][e] = 0.f + acc[j][e];
    auto entry = [&](int i, int j, int e) {  // contributor first + i's entry of acc[j][e]
      return hand + static_cast<size_t>(2 * (first + i)) * batch * kRowsPerCta +
             (8 * j + 2 * t + (e & 1)) * kRowsPerCta + 16 * warp + g + 8 * (e >> 1);
    };
    auto written = [&](int j, int e) {  // as stream_flush writes them
      return 8 * j + 2 * t + (e & 1) < batch && kRowsPerCta * rb + 16 * warp + g + 8 * (e >> 1) < out;
    };
    // contributors whose entries are in flight together: at two n-tiles two (four spilled, sm_90a -Xptxas -v)
    constexpr int C = SP24_HANDOFF_WAIT_GROUP == 2 ? 4 / NT : 4;
    for (int i0 = 1; i0 <= others; i0 += C) {
      uint32_t v[C * NT * 4];  // contributor i0 + k / (4 NT)'s entry of acc[k / 4 % NT][k % 4]
      auto ok = [&](int k) { return i0 + k / (4 * NT) <= others && written(k / 4 % NT, k % 4); };
      take_entries<wait_group<C * NT * 4, 4 * NT>()>(
          v, [&](int k) { return entry(i0 + k / (4 * NT), k / 4 % NT, k % 4); }, ok);
#pragma unroll
      for (int k = 0; k < C * NT * 4; ++k)
        if (ok(k)) sum[k / 4 % NT][k % 4] += __uint_as_float(v[k]);
    }
    if (live) stream_store(rb, sum);
  };
  if constexpr (STREAM) {
    // buffer b holds units u0 + b + NB·i, refilled NB units on across row blocks; one segment (the units of one row
    // block) a pass, its units in a loop whose buffer order is fixed at compile time by the segment's first buffer
    int local = 0;  // the staged step of unit v (see StreamUnits)
    for (int v = su.u0; v < su.u1;) {
      const int rb = v / steps, end = min(su.u1, (rb + 1) * steps);
      const bool live = rb * kWarps + warp < row_tiles, whole = v == rb * steps && end == (rb + 1) * steps;
      auto segment = [&](auto first) {
        constexpr int P = decltype(first)::value;
        for (; v < end; v += NB) {
#pragma unroll
          for (int i = 0; i < NB; ++i) {
            if (v + i >= end) break;
            compute_step<T, NT, CODE, SPS, false, false, false>(acc, r[(P + i) % NB], xs, xstride, local, g, t, batch);
            load_ahead(r[(P + i) % NB]);  // unit v + i + NB
            local = local + 1 == steps ? 0 : local + 1;
          }
        }
        v = end;
      };
      if (NB == 1 || (v - su.u0) % NB == 0) segment(std::integral_constant<int, 0>{});
      else segment(std::integral_constant<int, 1>{});
      // handoff: the CTA that holds rb's first unit computes its part last (its units end inside rb) and adds the
      // others' parts to its own sums (see stream_gather)
      if (handoff && v >= su.u1 && !whole && stream_owner(rb * steps, su.units, gridDim.x) == blockIdx.x) {
        gather_rb = rb;
        gather_live = live;
        break;
      }
      stream_flush(rb, whole, live);
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    }
  } else if constexpr (kHybrid) {
    if (active) {
      // step wstep0 + 2i from the registers, then wstep0 + 2i + 1 from the slot; each refilled two steps further
      for (int step = wstep0; step < wstep1; step += 2) {
        compute_step<T, NT, CODE, SPS, DENSE, false, kRawX>(acc, r[0], xs, xstride, step - step0, g, t, batch);
        if (step + 2 < wstep1)
          load_step<CODE, SPS, false, DENSE>(r[0], a_tile, m_tile, s_tile, ov_tile, oc_tile, step + 2, lane, t, g,
                                             gk_shift, groups);
        if (step + 1 >= wstep1) break;
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // a lane reads back only the bytes it copied
        StepRegs<CODE, SPS> from_slot;
        read_slot<CODE, SPS>(from_slot, slot, lane);
        compute_step<T, NT, CODE, SPS, DENSE, false, kRawX>(acc, from_slot, xs, xstride, step + 1 - step0, g, t,
                                                            batch);
        copy_step<CODE, SPS>(slot, step + 3 < wstep1, a_tile, m_tile, s_tile, step + 3, lane, t, g, gk_shift);
      }
    }
  } else if (active) {
    // buffer b holds steps wstep0 + b + NB·i: computed, then refilled with the step NB further
    for (int step = wstep0; step < wstep1; step += NB) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (step + b >= wstep1) break;
        compute_step<T, NT, CODE, SPS, DENSE, OVER == 5, kRawX, kGrouped>(acc, r[b], xs, xstride, step + b - step0,
                                                                            g, t, batch, acc8);
        if constexpr (OVER == 5 || OVER == 6) {
          // the quad-placed slots were added inside compute_step, k-tile by k-tile
        } else if constexpr (OVER == 4) {
          static_assert(CODE == 0, "slots on the tensor cores: 16-bit values");
          over_mma_step<T, NT>(acc, r[b].ov[0], r[b].oc[0], xs, xstride, step + b - step0, g, t, lane, batch);
        } else if constexpr (OVER != 0) {
#pragma unroll
          for (int h = 0; h < S::ks / 8; ++h) {
            uint32_t scale[2] = {0u, 0u};  // CODE 4: the scales of slot step h's two groups (see the top)
            if constexpr (CODE == 4) {
              static_assert(SPS == S::ks / 4, "int4 codes with slots: 128 columns a scale");
              scale[0] = r[b].s[2 * h];
              scale[1] = r[b].s[2 * h + 1];
            }
            over_step<T, NT, OVER, CODE>(p, r[b].ov[h], r[b].oc[h], scale, xs, xstride,
                                         (step + b - step0) * (S::ks / 8) + h, (t - g) & 3, batch);
          }
        }
        if (step + b + NB < wstep1) {
          bool from_slot = false;
          if constexpr (kSlot3) {
            if (step == wstep0 && b == 0) {  // step wstep0 + 2: requested before the wait, into the slot
              asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // a lane reads back only the bytes it copied
              read_slot<CODE, SPS>(r[0], slot, lane);
              from_slot = true;
            }
          }
          if (!from_slot)
            load_step<CODE, SPS, OVER != 0, DENSE, OVER != 6>(r[b], a_tile, m_tile, s_tile, ov_tile, oc_tile,
                                                              step + b + NB, lane, t, g, gk_shift, groups);
        }
      }
    }
    if constexpr (OVER != 0 && OVER != 4 && OVER != 5 && OVER != 6) {
      // the quad's four lanes hold partials of the same two rows: sum them (every lane of the warp takes part),
      // then each lane adds the entries of its own accumulators (row of x 8j + 2t + (e & 1), row g + 8·(e / 2))
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int b = 0; b < 8 * NT; ++b) {
          p[h][b] += __shfl_xor_sync(0xffffffffu, p[h][b], 1);
          p[h][b] += __shfl_xor_sync(0xffffffffu, p[h][b], 2);
        }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float add = 0.f;
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (t == q) add = p[e >> 1][8 * j + 2 * q + (e & 1)];
          acc[j][e] += add;
        }
    }
  }
  if constexpr (OVER == 6 && SP24_GROUPED_HALVES == 2) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][2] += acc8[j][2];
      acc[j][3] += acc8[j][3];
    }
  }
  // This CTA's weight stream is done: the next kernel on the stream, if launched programmatically, may start its
  // CTAs (and their weight loads) as SM room frees up, while this grid finishes its reductions and its tail.
#if __CUDA_ARCH__ >= 900 && !SP24_EARLY_TRIGGER
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  if constexpr (STREAM) {  // every other segment was flushed in the loop; the slots are counted now
    if (!handoff) stream_count();
    else if (gather_rb >= 0) stream_gather(gather_rb, gather_live);
    return;
  }
  __shared__ float sums[kWarps][NT * 4][32];  // each warp's sums: for the slices, then (glu) the up tiles'
  if (cta_slices > 1) {  // slice 0's warp of each row tile adds the others' sums, in slice order
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[warp][4 * j + e][lane] = acc[j][e];
    __syncthreads();
    if (slice == 0)
      for (int other = 1; other < cta_slices; ++other)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] += sums[other * cta_tiles + warp][4 * j + e][lane];
  }
  const bool writes = active && slice == 0;

  // acc[j][e]: batch row 8j + 2t + (e & 1), output row 16·tile_row + g + 8·(e >> 1)
  // handoff (every CTA of the grid resident at once): the last split's CTA of each row block adds the others' sums
  // (and Σs²) to its own, waiting on each entry until written (see kEmpty), and ends as without split-K; the others
  // store theirs and leave, with no fence, atomic or barrier. The same sums, bit for bit, as the counting's.
  const bool gathers = handoff && splits > 1 && split == splits - 1;
  if (handoff && splits > 1 && !gathers) {
    if (writes) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int b = 8 * j + 2 * t + (e & 1), row = 16 * tile_row + g + 8 * (e >> 1);
          if (b < batch && row < out)
            put_entry(hand + (static_cast<size_t>(split) * batch + b) * out + row, acc[j][e]);
        }
    }
    if (NORM && tid < batch) put_entry(hand_ss + (blockIdx.x * splits + split) * batch + tid, cta_ss(tid));
    return;
  }
  __shared__ float ss_all[NORM ? 16 : 1];  // gathers, NORM: Σs² of every split, by row of x
  if (gathers) {
    if (writes) {
      float sum[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[j][e] = 0.f;
      auto entry = [&](int s, int j, int e) {
        return hand + (static_cast<size_t>(s) * batch + 8 * j + 2 * t + (e & 1)) * out + 16 * tile_row + g +
               8 * (e >> 1);
      };
      auto written = [&](int j, int e) {
        return 8 * j + 2 * t + (e & 1) < batch && 16 * tile_row + g + 8 * (e >> 1) < out;
      };
      // splits whose entries are in flight together: at two n-tiles two (four spilled, sm_90a -Xptxas -v)
      constexpr int C = SP24_HANDOFF_WAIT_GROUP == 2 ? 4 / NT : NT == 1 && SP24_HANDOFF_WAIT_GROUP == 0 ? 8 : 4;
      for (int s0 = 0; s0 < splits - 1; s0 += C) {
        uint32_t v[C * NT * 4];  // split s0 + k / (4 NT)'s entry of acc[k / 4 % NT][k % 4]
        auto ok = [&](int k) { return s0 + k / (4 * NT) < splits - 1 && written(k / 4 % NT, k % 4); };
        take_entries<wait_group<C * NT * 4, 4 * NT>()>(
            v, [&](int k) { return entry(s0 + k / (4 * NT), k / 4 % NT, k % 4); }, ok);
#pragma unroll
        for (int k = 0; k < C * NT * 4; ++k)
          if (ok(k)) sum[k / 4 % NT][k % 4] += __uint_as_float(v[k]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = sum[j][e] + acc[j][e];
    }
    if constexpr (NORM) {
      if (tid < batch)
        ss_all[tid] = ordered_sum<true>(splits - 1, [&](int s) {
          return hand_ss + (blockIdx.x * splits + s) * batch + tid;
        }) + cta_ss(tid);
      __syncthreads();
    }
  }
  // NORM: Σs² of row b of x (of every split where this CTA adds them)
  auto ss_of = [&](int b) { return gathers ? ss_all[NORM ? b : 0] : cta_ss(b); };
  if (splits == 1 || gathers) {
    if (glu) {
      // slice 0's warps are the CTA's row tiles in order (warp = local tile, of even count): the up tile's warp
      // leaves its sums where the gate tile's reads them (entries of slice 0, which the slices' sums never read)
      if (writes && (warp & 1)) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sums[warp][4 * j + e][lane] = acc[j][e];
      }
      __syncthreads();
      if (warp & 1) return;
    }
    if (!writes) return;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1), row = 16 * tile_row + g + 8 * (e >> 1);
        if (b < batch && row < out) {
          const float norm = NORM ? rsqrtf(ss_of(b) / in + eps) : 1.f;
          float v = acc[j][e] * norm;
          if constexpr (CODE == 8) v *= __bfloat162float(row_scales[row]);
          if (glu) {  // gate row `row`, up row `row + 16`: output row 16·(tile_row / 2) + g + 8·(e >> 1)
            float up = sums[warp + 1][4 * j + e][lane] * norm;
            if constexpr (CODE == 8) up *= __bfloat162float(row_scales[row + 16]);
            y[static_cast<size_t>(b) * (out / 2) + row - 8 * tile_row] = from_float<T>(silu_mul(v, up));
          } else {
            y[static_cast<size_t>(b) * out + row] = from_float<T>(v);
          }
        }
      }
    return;
  }
  if constexpr (SP24_CLUSTER_SPLIT && !NORM && !DENSE && OVER == 0 && !STREAM) {
    if (!glu && cluster_ctas() == static_cast<uint32_t>(splits)) {  // the same for the whole cluster
      const int cta_rows = 16 * cta_tiles;
      float* red = reinterpret_cast<float*>(xs);  // [batch][cta_rows]: the staged x is no longer read
      __syncthreads();
      if (writes) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int b = 8 * j + 2 * t + (e & 1);
            if (b < batch) red[b * cta_rows + 16 * (warp % cta_tiles) + g + 8 * (e >> 1)] = acc[j][e];
          }
      }
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
      const int share = (cta_rows + splits - 1) / splits, r0 = split * share, r1 = min(cta_rows, r0 + share);
      for (int e = tid; e < (r1 - r0) * batch; e += kThreads) {
        const int b = e / (r1 - r0), local = r0 + e % (r1 - r0), row = blockIdx.x * cta_rows + local;
        if (row >= out) continue;
        const uint32_t address = shared_address(red + b * cta_rows + local);
        float v[8];
#pragma unroll
        for (int s = 0; s < 8; ++s) v[s] = s < splits ? cluster_load(address, s) : 0.f;
        float sum = 0.f;  // in split order, as the global path adds them
#pragma unroll
        for (int s = 0; s < 8; ++s)
          if (s < splits) sum += v[s];
        if constexpr (CODE == 8) sum *= __bfloat162float(row_scales[row]);
        y[static_cast<size_t>(b) * out + row] = from_float<T>(sum);
      }
      // no CTA leaves (and frees its shared memory) while another reads it
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
      return;
    }
  }
  if (writes) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int b = 8 * j + 2 * t + (e & 1), row = 16 * tile_row + g + 8 * (e >> 1);
        if (b < batch && row < out) partials[(static_cast<size_t>(split) * batch + b) * out + row] = acc[j][e];
      }
  }
  if (NORM && tid < batch) ss_slots[(blockIdx.x * splits + split) * batch + tid] = cta_ss(tid);
  if constexpr (SP24_ABLATE == 11) return;
#if SP24_STREAM_FENCES
  __threadfence();
#endif
  __syncthreads();  // every thread's partials come before thread 0's release (the barrier makes them cumulative)
  __shared__ int last;
  if (tid == 0) {
    last = (SP24_STREAM_FENCES ? atomicAdd(&counters[blockIdx.x], 1) : atomic_add_acq_rel(&counters[blockIdx.x], 1))
           == splits - 1;
    if (last) counters[blockIdx.x] = 0;  // ready for the next launch; every other CTA of the block has counted
  }
  __syncthreads();  // after thread 0's acquire: the other splits' partials are visible to every thread
  if (!last) return;
#if SP24_STREAM_FENCES
  __threadfence();
#endif
  const int cta_rows = 16 * cta_tiles, row0 = blockIdx.x * cta_rows;
  auto norm_of = [&](int b) {  // NORM: 1/rms of row b of x from every split's Σs²
    if constexpr (!NORM) return 1.f;
    float total = 0.f;
    for (int s = 0; s < splits; ++s) total += __ldcg(ss_slots + (blockIdx.x * splits + s) * batch + b);
    return rsqrtf(total / in + eps);
  };
  if (glu) {  // output q of the CTA: gate row row0 + 32·(q / 16) + q % 16, its up row 16 further
    const int half = cta_rows / 2;
    for (int e = tid; e < half * batch; e += kThreads) {
      const int b = e / half, q = e % half, row = row0 + 32 * (q / 16) + q % 16;
      if (row + 16 >= out) continue;
      float gate = 0.f, up = 0.f;
      for (int s = 0; s < splits; ++s) {
        const float* part = partials + (static_cast<size_t>(s) * batch + b) * out + row;
        gate += __ldcg(part);
        up += __ldcg(part + 16);
      }
      if constexpr (NORM) {
        const float norm = norm_of(b);
        gate *= norm;
        up *= norm;
      }
      if constexpr (CODE == 8) {
        gate *= __bfloat162float(row_scales[row]);
        up *= __bfloat162float(row_scales[row + 16]);
      }
      y[static_cast<size_t>(b) * (out / 2) + row0 / 2 + q] = from_float<T>(silu_mul(gate, up));
    }
    return;
  }
  for (int e = tid; e < cta_rows * batch; e += kThreads) {
    const int b = e / cta_rows, row = row0 + e % cta_rows;
    if (row >= out) continue;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(partials + (static_cast<size_t>(s) * batch + b) * out + row);
    if constexpr (NORM) sum *= norm_of(b);
    if constexpr (CODE == 8) sum *= __bfloat162float(row_scales[row]);
    y[static_cast<size_t>(b) * out + row] = from_float<T>(sum);
  }
}

struct Problem {
  const void *x, *a, *meta, *scales, *row_scales;
  void* y;
  float* partials;
  int* counters;
  int batch, out, in, row_tiles, steps, splits, gk_shift, groups, slices, glu;
  cudaStream_t stream;
  const void *res = nullptr, *norm_w = nullptr;  // NORM (norm_w set): see sp24_kernel
  void* sum_out = nullptr;
  float* ss_slots = nullptr;
  float eps = 0.f;
  int pdl = 0;  // a programmatic launch: see sp24_launch
  const void *over_v = nullptr, *over_o = nullptr;  // OVER (over_v set): the overflow slots, see sp24_kernel
  int over_loop = 1;  // OVER's loop order (1-5; sp24_launch resolves 0)
  int dense = 0;  // DENSE: a dense weight of in / 2 columns (see sp24_kernel)
  int stream_ctas = 0;  // STREAM: the grid's CTAs (0: split-K; see StreamUnits)
  float* hand = nullptr;  // split-K and stream-K: the handoff's slots (see kEmpty), or null: always by counting
  int heavy = 0;  // > 0: a mixed grid, its first `heavy` CTAs at `slices`, one row tile each after (see sp24_launch)
};

// The CTAs of `kernel` (`smem` bytes of dynamic shared memory, clusters of `config`'s cluster attribute, if any) the
// current device holds at once, 0 if the runtime cannot say; remembered in `kept` (the kernel's own: eight entries of
// (device << 40) | (smem << 20) | ctas, 0 for none)
template <typename Kernel>
int resident_ctas(Kernel kernel, int smem, const cudaLaunchConfig_t& config, int cluster,
                  std::atomic<long long>* kept) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  std::atomic<long long>& slot = kept[(device * 7 + smem / 16) % 8];
  const long long key = (static_cast<long long>(device) << 40) | (static_cast<long long>(smem) << 20);
  const long long seen = slot.load(std::memory_order_relaxed);
  if (seen != 0 && (seen & ~0xFFFFFLL) == key) return static_cast<int>(seen & 0xFFFFF);
  int ctas = 0;
  if (cluster > 1) {
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess) ctas = clusters * cluster;
  } else {
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
      ctas = per_sm * sms;
  }
  (void)cudaGetLastError();  // a failed query leaves no error behind for the launch
  ctas = max(0, min(ctas, 0xFFFFF));
  slot.store(key | ctas, std::memory_order_relaxed);
  return ctas;
}

template <typename T, int NT, int CODE, int SPS, bool NORM, int OVER = 0, bool DENSE = false, bool STREAM = false>
cudaError_t launch(const Problem& p) {
  auto kernel = sp24_kernel<T, NT, CODE, SPS, NORM, OVER, DENSE, STREAM>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
  if (err != cudaSuccess) return err;
  const int per_split = STREAM ? p.steps : (p.steps + p.splits - 1) / p.splits;
  const int used = STREAM ? 1 : (p.steps + per_split - 1) / per_split;  // no split without work
  // STREAM: a CTA stages the steps of its units, at most all (see StreamUnits)
  const long long units = static_cast<long long>((p.row_tiles + kWarps - 1) / kWarps) * p.steps;
  if (STREAM && (p.stream_ctas < 1 || p.stream_ctas > units || units > 0x7FFFFFFFLL || p.slices != 1 || p.glu ||
                 p.partials == nullptr || p.counters == nullptr))
    return cudaErrorInvalidValue;
  const int staged = STREAM ? static_cast<int>(min(static_cast<long long>(p.steps),
                                                   (units + p.stream_ctas - 1) / p.stream_ctas))
                            : per_split;
  const int columns = staged * Steps<CODE>::ks * 32;
  // with the column copy
  const int smem = (OVER == 6 && !NORM ? 0 : p.batch * (2 * columns + 64)) +
                   (OVER == 3 || OVER == 4 || OVER == 6 ? columns * 16 * NT : 0);
  if (smem > kMaxSmem) return cudaErrorInvalidValue;
  if (used > 1 && (p.partials == nullptr || p.counters == nullptr || (NORM && p.ss_slots == nullptr)))
    return cudaErrorInvalidValue;
  const int cta_tiles = kWarps / p.slices;
  // a mixed grid: `heavy` CTAs of cta_tiles row tiles, then one row tile a CTA (one split, no GLU, slots or stream-K)
  if (p.heavy < 0 || (p.heavy > 0 && (NT != 1 || STREAM || OVER != 0 || p.glu || used != 1 || p.slices >= kWarps ||
                                      static_cast<long long>(p.heavy) * cta_tiles > p.row_tiles)))
    return cudaErrorInvalidValue;
  const int ctas = p.heavy > 0 ? p.heavy + (p.row_tiles - p.heavy * cta_tiles)
                                : (p.row_tiles + cta_tiles - 1) / cta_tiles;
  constexpr int cluster = SP24_MULTICAST > 0 && !NORM && !DENSE && OVER == 0 && !STREAM ? SP24_MULTICAST : 1;
  cudaLaunchConfig_t config = {};
  // SP24_MULTICAST: whole clusters along the row blocks; the CTAs past the last row block only stage x and exit
  config.gridDim = STREAM ? dim3(p.stream_ctas, 1) : dim3((ctas + cluster - 1) / cluster * cluster, used);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = p.stream;
  cudaLaunchAttribute attribute[2];
  int attributes = 0;
  if (p.pdl) {
    attribute[attributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[attributes++].val.programmaticStreamSerializationAllowed = 1;
  }
  // SP24_CLUSTER_SPLIT: a row block's 2-8 splits as one cluster along y (see sp24_kernel)
  const bool cluster_split = SP24_CLUSTER_SPLIT && !NORM && !DENSE && OVER == 0 && !STREAM && !p.glu && used > 1 &&
                             used <= 8;
  if (cluster > 1 || cluster_split) {
    attribute[attributes].id = cudaLaunchAttributeClusterDimension;
    attribute[attributes].val.clusterDim.x = cluster;
    attribute[attributes].val.clusterDim.y = cluster_split ? used : 1;
    attribute[attributes++].val.clusterDim.z = 1;
  }
  config.attrs = attribute;
  config.numAttrs = attributes;
  // handoff only where every CTA of the grid is resident at once: an adder then waits only on CTAs that are running or
  // will run as the kernels before it finish (a programmatic launch's dependents take room only once every CTA of
  // this grid has started), never on one that waits for the adder's room
  float* hand = nullptr;
  if (p.hand != nullptr && (STREAM || used > 1) && !cluster_split) {
    cudaLaunchConfig_t shape = config;
    shape.attrs = cluster > 1 ? &attribute[attributes - 1] : nullptr;
    shape.numAttrs = cluster > 1 ? 1 : 0;
    const long long grid = static_cast<long long>(config.gridDim.x) * config.gridDim.y;
    static std::atomic<long long> kept[8];  // this kernel's (see resident_ctas)
    if (grid <= resident_ctas(kernel, smem, shape, cluster, kept)) hand = p.hand;
  }
  return cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(p.x), static_cast<const char*>(p.a),
                            static_cast<const char*>(p.meta), static_cast<const char*>(p.scales),
                            static_cast<const __nv_bfloat16*>(p.row_scales), static_cast<T*>(p.y), p.partials,
                            p.counters, p.batch, p.out, p.in, p.row_tiles, p.steps, per_split, p.gk_shift, p.groups,
                            p.slices, p.glu, static_cast<const T*>(p.res), static_cast<const T*>(p.norm_w),
                            static_cast<T*>(p.sum_out), p.ss_slots, p.eps, static_cast<const char*>(p.over_v),
                            static_cast<const char*>(p.over_o), hand, p.heavy > 0 ? p.heavy : INT_MAX);
}

// The dense weight [out][in] (T; codes times their scales, rounded once) from the tiled layout, for prefill: one
// warp per 16-row tile and k-tile, each lane writing its two rows' two 4-column groups (kept values at the
// positions its quad's metadata names, zeros elsewhere), so every element is written once.
template <typename T, int CODE>
__global__ void __launch_bounds__(kThreads) sp24_dense_kernel(const char* __restrict__ a,
                                                              const char* __restrict__ meta,
                                                              const __nv_bfloat16* __restrict__ scales,
                                                              const __nv_bfloat16* __restrict__ row_scales,
                                                              T* __restrict__ dense, int out, int in, int steps,
                                                              int gk_shift, int groups, int dense_weight) {
  using S = Steps<CODE>;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k_tiles = in / 32;
  const long long item = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int tile_row = static_cast<int>(item / k_tiles), s = static_cast<int>(item % k_tiles);
  if (tile_row >= (out + 15) / 16) return;
  const int step = s / S::ks, k = s % S::ks;
  const char* a_tile = a + static_cast<size_t>(tile_row) * steps * S::a_loads * 512;
  const char* m_tile = meta + static_cast<size_t>(tile_row) * steps * 16 * S::ks * 4;
  const char* load = a_tile + (static_cast<size_t>(step) * S::a_loads + k / S::tiles_per_load) * 512 + 16 * lane;
  uint32_t words[4];  // CODE 0: a0..a3; 8: words 0, 1 = rows g, g+8; 4: word 0
  if constexpr (CODE == 0) {
    const uint4 v = *reinterpret_cast<const uint4*>(load);
    words[0] = v.x; words[1] = v.y; words[2] = v.z; words[3] = v.w;
  } else if constexpr (CODE == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(load + 8 * (k % 2));
    words[0] = v.x; words[1] = v.y; words[2] = words[3] = 0u;
  } else {
    words[0] = *reinterpret_cast<const uint32_t*>(load + 4 * (k % 4));
    words[1] = words[2] = words[3] = 0u;
  }
  uint32_t e[2];
#pragma unroll
  for (int q = 0; q < 2; ++q)
    e[q] = dense_weight ? 0x44444444u
                        : *reinterpret_cast<const uint32_t*>(m_tile +
                                                             ((static_cast<size_t>(step) * 16 + 2 * g + q) * S::ks +
                                                              k) * 4);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int h = r & 1, half = r >> 1, group = t + 4 * half;
    const int row = 16 * tile_row + g + 8 * h;
    if (row >= out) continue;
    float v[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if constexpr (CODE == 0) {
        const uint16_t bits = static_cast<uint16_t>(words[r] >> (16 * j));
        v[j] = std::is_same<T, __nv_bfloat16>::value ? __uint_as_float(static_cast<uint32_t>(bits) << 16)
                                                     : __half2float(__ushort_as_half(bits));
      } else if constexpr (CODE == 8) {
        const int code = static_cast<int>((words[h] >> (8 * (2 * half + j))) & 0xFFu) - 128;
        v[j] = static_cast<float>(code) * __bfloat162float(row_scales[row]);
      } else {
        const int code = static_cast<int>((words[0] >> (4 * (r + 4 * j))) & 0xFu) - 8;
        const size_t at = ((static_cast<size_t>(tile_row) * groups + (s >> gk_shift)) * 8 + g) * 2 + h;
        const __nv_bfloat16 scale = scales[at];
        v[j] = static_cast<float>(code) * __bfloat162float(scale);
      }
    }
    const uint32_t nib = (e[half] >> (16 * h + 4 * t)) & 0xFu;
    const int lo = nib & 3, hi = nib >> 2;
    T vals[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) vals[c] = from_float<T>(c == lo ? v[0] : c == hi ? v[1] : 0.f);
    if (dense_weight)  // the group's two values are dense columns 16s + 2·group, + 1 of an [out][in / 2] weight
      *reinterpret_cast<uint32_t*>(dense + static_cast<size_t>(row) * (in / 2) + 16 * s + 2 * group) =
          *reinterpret_cast<const uint32_t*>(vals);
    else
      *reinterpret_cast<uint2*>(dense + static_cast<size_t>(row) * in + 32 * s + 4 * group) =
          *reinterpret_cast<const uint2*>(vals);
  }
}

template <typename T, int CODE>
cudaError_t launch_dense(const Problem& p, void* dense) {
  const long long items = static_cast<long long>(p.row_tiles) * (p.in / 32);
  const long long blocks = (items + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFFLL) return cudaErrorInvalidValue;
  sp24_dense_kernel<T, CODE><<<static_cast<unsigned>(blocks), kThreads, 0, p.stream>>>(
      static_cast<const char*>(p.a), static_cast<const char*>(p.meta), static_cast<const __nv_bfloat16*>(p.scales),
      static_cast<const __nv_bfloat16*>(p.row_scales), static_cast<T*>(dense), p.out, p.in, p.steps, p.gk_shift,
      p.groups, p.dense);
  return cudaGetLastError();
}

// OVER 3 and 4 only in a library built with -DSP24_COLUMNS (sp24.py loads it for those loop orders): instantiated in
// the default build, the staging copy changed how nvcc compiled the other instances' staging loops (the SASS of every
// NORM instance), which the default build must not. OVER 4 takes 16-bit values only.
template <typename T, int CODE, int SPS, bool NORM>
cudaError_t columns(const Problem& p) {
#ifdef SP24_COLUMNS
  if (p.over_loop == 4) {
    if constexpr (CODE != 0) {
      return cudaErrorInvalidValue;
    } else {
      return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 4>(p) : launch<T, 2, CODE, SPS, NORM, 4>(p);
    }
  }
  return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 3>(p) : launch<T, 2, CODE, SPS, NORM, 3>(p);
#else
  (void)p;
  return cudaErrorNotSupported;
#endif
}

// int4 codes with overflow slots: only 128 columns a scale (gk_shift 2, four scale loads a step of 16 k-tiles, two of
// 8), the default group size, so that the slots add 8 kernels for int4 rather than 40.
constexpr int kOverInt4Sps = Steps<4>::ks / 4;

// OVER 5 only in a library built with -DSP24_QUADS (sp24.py loads it for quad-placed weights), for the same reason;
// 16-bit values only.
template <typename T, int CODE, int SPS, bool NORM>
cudaError_t quads(const Problem& p) {
#ifdef SP24_QUADS
  if constexpr (CODE != 0) {
    return cudaErrorInvalidValue;
  } else {
    return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 5>(p) : launch<T, 2, CODE, SPS, NORM, 5>(p);
  }
#else
  (void)p;
  return cudaErrorNotSupported;
#endif
}

// OVER 6 only in a library built with -DSP24_GROUPED (sp24.py loads it for grouped-column weights, `tile_grouped`),
// for the same reason; 16-bit values only: a 2:4 weight whose 32-column words are each permuted per row tile, the
// permutation's places in `over_o` (one byte a lane and k-tile), no slot values.
template <typename T, int CODE, int SPS, bool NORM>
cudaError_t grouped(const Problem& p) {
#ifdef SP24_GROUPED
  if constexpr (CODE != 0) {
    return cudaErrorInvalidValue;
  } else {
    return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 6>(p) : launch<T, 2, CODE, SPS, NORM, 6>(p);
  }
#else
  (void)p;
  return cudaErrorNotSupported;
#endif
}

template <typename T, int CODE, int SPS, bool NORM>
cudaError_t with_slots(const Problem& p) {
  if (p.over_loop == 5) return quads<T, CODE, SPS, NORM>(p);
  if (p.over_loop == 1)
    return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 1>(p) : launch<T, 2, CODE, SPS, NORM, 1>(p);
  if (p.over_loop >= 3) return columns<T, CODE, SPS, NORM>(p);
  return p.batch <= 8 ? launch<T, 1, CODE, SPS, NORM, 2>(p) : launch<T, 2, CODE, SPS, NORM, 2>(p);
}

template <typename T, int CODE, int SPS>
cudaError_t by_batch(const Problem& p) {
  if (p.over_loop == 6) {
    if (p.over_o == nullptr || p.over_v != nullptr || p.dense || p.stream_ctas > 0 || p.heavy != 0)
      return cudaErrorInvalidValue;
    return p.norm_w != nullptr ? grouped<T, CODE, SPS, true>(p) : grouped<T, CODE, SPS, false>(p);
  }
  if (p.stream_ctas > 0) {
    if (p.over_v != nullptr || p.dense || p.norm_w != nullptr) return cudaErrorInvalidValue;
    return p.batch <= 8 ? launch<T, 1, CODE, SPS, false, 0, false, true>(p)
                        : launch<T, 2, CODE, SPS, false, 0, false, true>(p);
  }
  if (p.over_v != nullptr) {
    if (p.over_o == nullptr || p.dense) return cudaErrorInvalidValue;
    if constexpr (CODE == 4 && SPS != kOverInt4Sps) {
      return cudaErrorInvalidValue;
    } else {
      return p.norm_w != nullptr ? with_slots<T, CODE, SPS, true>(p) : with_slots<T, CODE, SPS, false>(p);
    }
  }
  if constexpr (CODE != 0) {
    if (p.dense) {
      if (p.norm_w != nullptr) return cudaErrorInvalidValue;
      return p.batch <= 8 ? launch<T, 1, CODE, SPS, false, 0, true>(p) : launch<T, 2, CODE, SPS, false, 0, true>(p);
    }
  }
  if (p.dense) return cudaErrorInvalidValue;
  if (p.norm_w != nullptr)
    return p.batch <= 8 ? launch<T, 1, CODE, SPS, true>(p) : launch<T, 2, CODE, SPS, true>(p);
  return p.batch <= 8 ? launch<T, 1, CODE, SPS, false>(p) : launch<T, 2, CODE, SPS, false>(p);
}

}  // namespace

extern "C" {

// code_bits 0 (16-bit values, is_bf16 picks bf16 or fp16), 8 (int8, bf16 x, `row_scales` bf16 [out]) or 4 (int4, bf16
// x, `scales` tiled, a group 2^gk_shift k-tiles, `groups` groups a row tile). `steps`: steps of the tiled layout per
// row tile (k-tiles / (8 for 16-bit values, SP24_INT8_KS or SP24_INT4_KS for codes)). `splits` step ranges across CTAs,
// `slices` (1, 2, 4 or 8) warps per row tile inside one. `glu`: a gate|up weight tiled in pairs, y = silu(gate)·up with
// out / 2 columns (out a multiple of 32, slices at most 4). `norm_w` (T [in], or null): y = W·rmsnorm(x + res) (`res`
// [batch][in] or null), the sum x + res into `sum_out` (or not, if null), `ss_slots` (with split-K) one float per row
// block, split and row of x. `pdl`: a programmatic launch (compute capability 9.0), whose CTAs may start and load their
// first weights while the previous kernel on the stream finishes (every sp24 CTA lets its dependents start once its
// weight stream is done). `over_v` and `over_o` (or null): the overflow slots of a 16:32+K weight (16-bit values, int8
// codes, or int4 codes with 128 columns a scale; with or without norm_w; see sp24_kernel), added in loop order
// `over_loop` (see over_step: 1 rows of x outer, 2 slots outer, 3 slots outer on a column-major copy of x, 4 the
// tensor cores (over_mma_step; 16-bit values), 3 and 4 only in a build with SP24_COLUMNS, 5 quad-placed slots (16-bit
// values, a build with SP24_QUADS; compute_tile); 0 the first for batch 1-4
// and the second for 5-16; sp24.py never passes 0 but picks the order per batch itself, sp24.over_loop). `dense`: a
// dense weight (code_bits 8 or 4, no norm_w, no glu, no slots; see
// sp24_kernel), `in` its expanded width (twice x's). `stream_ctas` > 0: a stream-K launch over that many CTAs
// instead of split-K (one slice, no norm_w, glu, slots or dense weight; `partials` two slots of batch · 128 floats a
// CTA, `counters` one a row block of 128 rows; see StreamUnits). `handoff_slots` (or null: always by counting):
// split-K and stream-K launches whose grid the GPU holds at once add their partial sums by handoff through these
// slots (no fence or atomic; see kEmpty): every entry kEmpty before the launch, and again after it; as many floats as
// `partials`, then (16-byte aligned) as many as `ss_slots`. The others count, through `partials` and `ss_slots`.
// `heavy` > 0 (batch 1-8, one split, `slices` below 8, no glu, slots or stream-K): a mixed grid, whose first `heavy`
// CTAs take 8 / slices row tiles each and the rest one row tile each, its steps shared by the CTA's 8 warps; with
// `heavy` such that the grid is one wave, and if the hardware hands out CTAs in order (assumed, not observed), the
// heavy CTAs take the first CTA of as many multiprocessors and the light ones the rest, so that no multiprocessor
// reads more than one heavy CTA's rows and one light CTA's (sp24.py `mixed_heavy`). 0: every CTA at `slices`. Returns 0 or a cudaError_t.
int sp24_launch(const void* x, const void* a, const void* meta, const void* scales, const void* row_scales, void* y,
                float* partials, int* counters, int batch, int out, int in, int steps, int is_bf16, int code_bits,
                int gk_shift, int groups, int splits, int slices, int glu, const void* res, const void* norm_w,
                void* sum_out, float* ss_slots, float eps, int pdl, void* stream, const void* over_v,
                const void* over_o, int over_loop, int dense, int stream_ctas, float* handoff_slots, int heavy) {
  if (batch < 1 || batch > 16 || out < 1 || in < 32 || in % 32 || steps < 1 || splits < 1 || gk_shift < 0 ||
      slices < 1 || slices > kWarps || kWarps % slices || (glu && (out % 32 || slices > kWarps / 2)) ||
      over_loop < 0 || over_loop > 6 || (dense && (glu || code_bits == 0)) || stream_ctas < 0)
    return cudaErrorInvalidValue;
  const int row_tiles = (out + 15) / 16;
  Problem p{x, a, meta, scales, row_scales, y, partials, counters, batch, out, in, row_tiles, steps, splits,
            gk_shift, groups, slices, glu ? 1 : 0, static_cast<cudaStream_t>(stream)};
  p.res = res;
  p.norm_w = norm_w;
  p.sum_out = sum_out;
  p.ss_slots = ss_slots;
  p.eps = eps;
  p.pdl = pdl;
  p.over_v = over_v;
  p.over_o = over_o;
  p.over_loop = over_loop != 0 ? over_loop : (batch <= 4 ? 1 : 2);
  p.dense = dense;
  p.stream_ctas = stream_ctas;
  p.hand = handoff_slots;
  p.heavy = heavy;
  if (code_bits == 0)
    return is_bf16 ? by_batch<__nv_bfloat16, 0, 1>(p) : by_batch<__half, 0, 1>(p);
  if (!is_bf16) return cudaErrorInvalidValue;
  if (code_bits == 8) return by_batch<__nv_bfloat16, 8, 1>(p);
  if (code_bits != 4) return cudaErrorInvalidValue;
  constexpr int k4 = Steps<4>::ks;
  switch (gk_shift) {  // scale loads per step: one per group, at least one
    case 0: return by_batch<__nv_bfloat16, 4, k4>(p);
    case 1: return by_batch<__nv_bfloat16, 4, k4 / 2>(p);
    case 2: return by_batch<__nv_bfloat16, 4, k4 / 4>(p);
    case 3: return by_batch<__nv_bfloat16, 4, k4 / 8>(p);
    default: return by_batch<__nv_bfloat16, 4, (k4 / 16 > 0 ? k4 / 16 : 1)>(p);
  }
}

// sp24_launch's arguments as one struct, field for field in its order (sp24.py's `Sp24Call` mirrors it): an eager
// call through ctypes then converts one pointer rather than 33 arguments, which took about 5 us of a host-bound call.
struct Sp24Call {
  const void* x;
  const void* a;
  const void* meta;
  const void* scales;
  const void* row_scales;
  void* y;
  float* partials;
  int* counters;
  int batch, out, in, steps, is_bf16, code_bits, gk_shift, groups, splits, slices, glu;
  const void* res;
  const void* norm_w;
  void* sum_out;
  float* ss_slots;
  float eps;
  int pdl;
  void* stream;
  const void* over_v;
  const void* over_o;
  int over_loop, dense, stream_ctas;
  float* handoff_slots;
  int heavy;
};

// sp24_launch with the arguments `c` holds. Returns 0 or a cudaError_t.
int sp24_call(const Sp24Call* c) {
  return sp24_launch(c->x, c->a, c->meta, c->scales, c->row_scales, c->y, c->partials, c->counters, c->batch, c->out,
                     c->in, c->steps, c->is_bf16, c->code_bits, c->gk_shift, c->groups, c->splits, c->slices, c->glu,
                     c->res, c->norm_w, c->sum_out, c->ss_slots, c->eps, c->pdl, c->stream, c->over_v, c->over_o,
                     c->over_loop, c->dense, c->stream_ctas, c->handoff_slots, c->heavy);
}

// The dense [out][in] weight of a tiled one into `dense` (T = bf16 when is_bf16, else fp16; codes need bf16); with
// `dense_weight`, of a dense weight (no metadata; `in` its expanded width, `dense` [out][in / 2]).
int sp24_dense_launch(const void* a, const void* meta, const void* scales, const void* row_scales, void* dense,
                      int out, int in, int steps, int is_bf16, int code_bits, int gk_shift, int groups,
                      void* stream, int dense_weight) {
  if (out < 1 || in < 32 || in % 32 || steps < 1 || gk_shift < 0 || (dense_weight && code_bits == 0))
    return cudaErrorInvalidValue;
  Problem p{nullptr, a, meta, scales, row_scales, nullptr, nullptr, nullptr, 1, out, in, (out + 15) / 16,
            steps, 1, gk_shift, groups, 1, 0, static_cast<cudaStream_t>(stream)};
  p.dense = dense_weight;
  if (code_bits == 0) return is_bf16 ? launch_dense<__nv_bfloat16, 0>(p, dense) : launch_dense<__half, 0>(p, dense);
  if (!is_bf16) return cudaErrorInvalidValue;
  if (code_bits == 8) return launch_dense<__nv_bfloat16, 8>(p, dense);
  if (code_bits == 4) return launch_dense<__nv_bfloat16, 4>(p, dense);
  return cudaErrorInvalidValue;
}

const char* sp24_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

int sp24_rows_per_block() { return kRowsPerCta; }

int sp24_max_smem() { return kMaxSmem; }

}  // extern "C"
