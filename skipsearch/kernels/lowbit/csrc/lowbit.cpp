// Weight-only low-bit GEMM for a few rows of fp32 activations: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]),
// with w stored as int8 (one scale per output column) or int4 (one scale per column and group of k); and the same
// product with fp32 weights in the int8 layout (f32_panel_linear: the panel kernel's verify blocks, where a BLAS
// call runs a few rows at compute speed rather than streaming the weights once).
//
// Built by torch.utils.cpp_extension with -O3 -march=native on the machine that runs it, so the #ifdefs below
// pick the widest vector unit that machine has: AVX-512, AVX2 (+FMA), else plain C++. Every compiled path stays
// selectable at run time (skipsearch::lowbit_use_isa), so the tests check each against a reference product.
//
// Layout (packed once, in Python): output columns in panels of P = 32; within a panel, k-major, so one panel
// is one contiguous stream of K rows of 32 weights.
//   int8:  w[panel][k][32]           int8, scale[panel * 32 + j] fp32
//   fp32:  w[panel][k][32]           float, no scale
//   int4:  w[panel][k / 2][32]       uint8: low nibble k even, high nibble k odd, each q + 8 (0..15)
//          scales[panel][g][32]      fp32, g = k / group_size
// A thread takes whole panels (at::parallel_for over panels) and streams each weight byte from memory once
// for all M rows: rows are done in chunks of at most MR (what the registers hold), and a second chunk
// re-reads the panel from L1/L2, not from memory. Accumulation is in fp32. An int4 weight is dequantized as
// fma(q + 8, s, -8 s), which rounds once, exactly as (q * s) does: the products use the same fp32 weights
// as dequantize-then-matmul, only the order of the sums differs.
//
// Exact block codes (coded_panel: the panel kernel's products where a layer's fp32 weights are a GGUF's blocks, as
// smollm2-135m's, converted from a Q4_1 GGUF, are): the same fp32 weights, decoded in registers, in groups of G = 32
// inputs (a GGUF block). d and m are fp16, so each decode rounds at most once and gives back the stored fp32 weight
// bit for bit (the packing checks it), and the sums run as dense_panel's for fp32 panels, in the same order: the
// output equals f32_panel_linear's bit for bit, streaming 5 (q4_1) or 8.5 (q8_0) bits a weight, not 32.
//   q4_1:  codes[panel][k][16]        uint8: byte i holds column i (low nibble) and column i + 16 (high), q in 0..15
//          dm[panel][g][2][32]        fp16: d, then m; w = d q + m (d q is exact: 11 bits by 4)
//   q8_0:  codes[panel][k][32]        int8 q; d[panel][g][32] fp16; w = d q (exact: 11 bits by 8)
//   bf16:  codes[panel][k][32]        bf16 (a bf16 checkpoint's weights): w = the bf16 widened, its bits shifted up

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace skipsearch_lowbit {

constexpr int P = 32;  // output columns per panel
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif

// ---- vector units: the same micro-kernels run on each -------------------------------------------------------
struct Scalar {
  using F = float;
  static constexpr int W = 1;
  static constexpr const char* name = "scalar";
  // rows per chunk (int8, fp32, int4), accumulator sets. MRF is also the rows one pass over a whole panel holds: an
  // int8 chunk of more rows runs the panel in two halves (Rows::dense)
  static constexpr int MR8 = 4, MRF = 4, MR4 = 4, SETS = 1;
  static inline F zero() { return 0.f; }
  static inline F bcast(const float* p) { return *p; }
  static inline F set1(float v) { return v; }
  static inline F fma(F a, F b, F c) { return std::fma(a, b, c); }
  static inline F add(F a, F b) { return a + b; }
  static inline F mul(F a, F b) { return a * b; }
  static inline F loadu(const float* p) { return *p; }
  static inline void storeu(float* p, F v) { *p = v; }
  static inline F i8(const int8_t* p) { return static_cast<float>(*p); }
  static inline F w(const int8_t* p) { return i8(p); }
  static inline F w(const float* p) { return loadu(p); }
  static inline void u4(const uint8_t* p, F& lo, F& hi) {
    lo = static_cast<float>(*p & 15);
    hi = static_cast<float>(*p >> 4);
  }
  static inline F nibble(const uint8_t* p, int hi) { return static_cast<float>((*p >> (4 * hi)) & 15); }
  static inline F h(const uint16_t* p) { return static_cast<float>(c10::Half(*p, c10::Half::from_bits())); }
  static inline F b16(const uint16_t* p) {  // a bf16's bits are an fp32's upper half
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  using F = __m256;
  static constexpr int W = 8;
  static constexpr const char* name = "avx2";
  // 16 ymm registers: 4 blocks x 2 rows of accumulators; or, for int8 weights from 3 rows (MRF + 1), a panel's two
  // halves one after the other with 2 blocks x up to 6 rows, so a verify block of 8 rows converts each weight twice,
  // not four times (fp32 panels, which convert nothing, ran 3-7% slower that way from 4 rows on a Zen 4's AVX2 path)
  static constexpr int MR8 = 6, MRF = 2, MR4 = 2, SETS = 1;
  static inline F zero() { return _mm256_setzero_ps(); }
  static inline F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static inline F set1(float v) { return _mm256_set1_ps(v); }
  static inline F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static inline F add(F a, F b) { return _mm256_add_ps(a, b); }
  static inline F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static inline F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static inline void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static inline F i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline F w(const int8_t* p) { return i8(p); }
  static inline F w(const float* p) { return loadu(p); }
  static inline void u4(const uint8_t* p, F& lo, F& hi) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  }
  static inline F nibble(const uint8_t* p, int hi) {  // 8 bytes' low or high nibbles
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtepi32_ps(hi ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15)));
  }
  static inline F h(const uint16_t* p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    alignas(32) float f[8];
    for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(c10::Half(p[i], c10::Half::from_bits()));
    return _mm256_load_ps(f);
#endif
  }
  static inline F b16(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
};
#endif

#if defined(__AVX512F__)
struct Avx512 {
  using F = __m512;
  static constexpr int W = 16;
  static constexpr const char* name = "avx512";
  // 32 zmm registers. int8 and fp32: 2 blocks x MR rows of accumulators, in 2 sets (even/odd k: four
  // independent FMA chains even for one row) below 4 rows, in one set from 4 rows (8 rows: 16 accumulators, so
  // a verify block of 8 streams its panel once). int4: 2 blocks x 2 sets x MR rows.
  static constexpr int MR8 = 8, MRF = 8, MR4 = 5, SETS = 2;
  static inline F zero() { return _mm512_setzero_ps(); }
  static inline F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static inline F set1(float v) { return _mm512_set1_ps(v); }
  static inline F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static inline F add(F a, F b) { return _mm512_add_ps(a, b); }
  static inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static inline F loadu(const float* p) { return _mm512_loadu_ps(p); }
  static inline void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static inline F i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline F w(const int8_t* p) { return i8(p); }
  static inline F w(const float* p) { return loadu(p); }
  static inline void u4(const uint8_t* p, F& lo, F& hi) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  static inline F nibble(const uint8_t* p, int hi) {  // 16 bytes' low or high nibbles
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtepi32_ps(hi ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(15)));
  }
  static inline F h(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static inline F b16(const uint16_t* p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
};
#endif

// ---- a micro-kernel's accumulators: S sets (k split by parity) x MR rows x NB vector blocks of a panel ----------
template <class V, int S, int MR, int NB>
inline void zero_sums(typename V::F (&acc)[S][MR][NB]) {
#pragma GCC unroll 64
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 64
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 64
      for (int b = 0; b < NB; ++b) acc[s][m][b] = V::zero();
}

// out[m * P + b W ...] = the sets' sum for row m and block b, set 0 first
template <class V, int S, int MR, int NB>
inline void store_sums(const typename V::F (&acc)[S][MR][NB], float* out) {
#pragma GCC unroll 64
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 64
    for (int b = 0; b < NB; ++b) {
      typename V::F sum = acc[0][m][b];
#pragma GCC unroll 64
      for (int s = 1; s < S; ++s) sum = V::add(sum, acc[s][m][b]);
      V::storeu(out + m * P + b * V::W, sum);
    }
}

// ---- micro-kernels: MR rows x one panel, all of K; out[m * P + j] = the panel's sums ------------------------
// One weight per element, int8 (converted; its scale is applied in the epilogue) or fp32 (as stored). ``NBP``
// vector blocks of the panel's columns at a time: all of them (one pass over K), or half (two passes, each with
// the registers for more rows). Each sum runs over k in the same order either way.
template <class V, int MR, class T, int NBP = P / V::W>
void dense_panel(const float* x, int64_t ldx, const T* w, int64_t K, float* out) {
  using F = typename V::F;
  constexpr int NB = P / V::W;
  static_assert(NB % NBP == 0, "a pass covers a whole number of the panel's blocks");
  // a second set of accumulators only while MR x NBP chains are too few to hide the FMA latency (2 ports x 4
  // cycles): with 4 or more rows on AVX-512, one set leaves the registers for 8 rows in one pass
  constexpr int S = MR * NBP >= 8 ? 1 : V::SETS;
  for (int h = 0; h < NB; h += NBP) {
    F acc[S][MR][NBP];
    zero_sums<V>(acc);
    int64_t k = 0;
    for (; k + S <= K; k += S) {
      if (h == 0) {  // a later pass finds the panel in cache
        const char* ahead = reinterpret_cast<const char*>(w + k * P) + PREFETCH_BYTES;
#pragma GCC unroll 64
        for (int l = 0; l < int(S * P * sizeof(T)); l += 64) __builtin_prefetch(ahead + l);
      }
#pragma GCC unroll 64
      for (int s = 0; s < S; ++s) {
        const T* wk = w + (k + s) * P + h * V::W;
        F wv[NBP];
#pragma GCC unroll 64
        for (int b = 0; b < NBP; ++b) wv[b] = V::w(wk + b * V::W);
#pragma GCC unroll 64
        for (int m = 0; m < MR; ++m) {
          const F xv = V::bcast(x + m * ldx + k + s);
#pragma GCC unroll 64
          for (int b = 0; b < NBP; ++b) acc[s][m][b] = V::fma(xv, wv[b], acc[s][m][b]);
        }
      }
    }
    for (; k < K; ++k) {  // K not a multiple of the sets
      const T* wk = w + k * P + h * V::W;
#pragma GCC unroll 64
      for (int m = 0; m < MR; ++m) {
        const F xv = V::bcast(x + m * ldx + k);
#pragma GCC unroll 64
        for (int b = 0; b < NBP; ++b) acc[0][m][b] = V::fma(xv, V::w(wk + b * V::W), acc[0][m][b]);
      }
    }
    store_sums<V>(acc, out + h * V::W);
  }
}

template <class V, int MR>
void int4_panel(const float* x, int64_t ldx, const uint8_t* w, const float* scales, int64_t K, int64_t group,
                float* out) {
  using F = typename V::F;
  constexpr int NB = P / V::W, S = V::SETS;
  F acc[S][MR][NB];
  zero_sums<V>(acc);
  const F minus8 = V::set1(-8.f);
  for (int64_t g = 0; g < K / group; ++g) {
    F sc[NB], off[NB];  // the group's scales s, and -8 s (exact: a power of two)
#pragma GCC unroll 64
    for (int b = 0; b < NB; ++b) {
      sc[b] = V::loadu(scales + g * P + b * V::W);
      off[b] = V::mul(sc[b], minus8);
    }
    const uint8_t* wk = w + g * (group / 2) * P;
    for (int64_t k = g * group; k < (g + 1) * group; k += 2, wk += P) {
      __builtin_prefetch(reinterpret_cast<const char*>(wk) + PREFETCH_BYTES);  // P bytes a pair of k: half a line
      F lo[NB], hi[NB];
#pragma GCC unroll 64
      for (int b = 0; b < NB; ++b) {
        V::u4(wk + b * V::W, lo[b], hi[b]);
        lo[b] = V::fma(lo[b], sc[b], off[b]);  // (q + 8) s - 8 s = q s, rounded once
        hi[b] = V::fma(hi[b], sc[b], off[b]);
      }
#pragma GCC unroll 64
      for (int m = 0; m < MR; ++m) {
        const F x0 = V::bcast(x + m * ldx + k), x1 = V::bcast(x + m * ldx + k + 1);
#pragma GCC unroll 64
        for (int b = 0; b < NB; ++b) {
          acc[0][m][b] = V::fma(x0, lo[b], acc[0][m][b]);
          acc[S - 1][m][b] = V::fma(x1, hi[b], acc[S - 1][m][b]);
        }
      }
    }
  }
  store_sums<V>(acc, out);
}

// ---- exact block codes: one panel's weights decoded as dense_panel's fp32 panels hold them -----------------------
constexpr int G = 32;  // inputs per block (a GGUF block)

struct Q41 {  // w = d q + m
  const uint8_t* codes;  // this panel's [K][16]
  const uint16_t* dm;    // this panel's [K / G][2][P]
  static constexpr int CODE_BYTES = P / 2;  // a k's codes
  template <class V>
  inline void group(int64_t g, typename V::F* d, typename V::F* m) const {
    for (int b = 0; b < P / V::W; ++b) {
      d[b] = V::h(dm + g * 2 * P + b * V::W);
      m[b] = V::h(dm + g * 2 * P + P + b * V::W);
    }
  }
  template <class V>
  inline void weights(int64_t k, const typename V::F* d, const typename V::F* m, typename V::F* w) const {
    // block b holds columns b W .. b W + W - 1: bytes (b W) mod 16 on, the high nibble from column 16
    for (int b = 0; b < P / V::W; ++b)
      w[b] = V::fma(V::nibble(codes + k * CODE_BYTES + (b * V::W) % (P / 2), (b * V::W) / (P / 2)), d[b], m[b]);
  }
};

struct Q80 {  // w = d q
  const int8_t* codes;  // this panel's [K][P]
  const uint16_t* d;    // this panel's [K / G][P]
  static constexpr int CODE_BYTES = P;
  template <class V>
  inline void group(int64_t g, typename V::F* dv, typename V::F*) const {
    for (int b = 0; b < P / V::W; ++b) dv[b] = V::h(d + g * P + b * V::W);
  }
  template <class V>
  inline void weights(int64_t k, const typename V::F* dv, const typename V::F*, typename V::F* w) const {
    for (int b = 0; b < P / V::W; ++b) w[b] = V::mul(V::i8(codes + k * P + b * V::W), dv[b]);
  }
};

struct B16 {  // w = the bf16 itself, widened (exact)
  const uint16_t* codes;  // this panel's [K][P]
  static constexpr int CODE_BYTES = 2 * P;
  template <class V>
  inline void group(int64_t, typename V::F*, typename V::F*) const {}
  template <class V>
  inline void weights(int64_t k, const typename V::F*, const typename V::F*, typename V::F* w) const {
    for (int b = 0; b < P / V::W; ++b) w[b] = V::b16(codes + k * P + b * V::W);
  }
};

// dense_panel's one pass over a panel of fp32 weights (the same accumulators, the same sums in the same order),
// each weight decoded from its code as it is read: out equals dense_panel<V, MR, float>'s bit for bit
template <class V, int MR, class C>
void coded_panel(const float* x, int64_t ldx, const C& c, int64_t K, float* out) {
  using F = typename V::F;
  constexpr int NB = P / V::W;
  constexpr int S = MR * NB >= 8 ? 1 : V::SETS;  // as dense_panel's, for a whole pass
  static_assert(G % S == 0, "a block holds whole steps of the sets");
  F acc[S][MR][NB];
  zero_sums<V>(acc);
  for (int64_t g = 0; g < K / G; ++g) {
    const char* ahead = reinterpret_cast<const char*>(c.codes + g * G * C::CODE_BYTES) + PREFETCH_BYTES;
#pragma GCC unroll 64
    for (int l = 0; l < G * C::CODE_BYTES; l += 64) __builtin_prefetch(ahead + l);
    F d[NB], m0[NB];
    c.template group<V>(g, d, m0);
    for (int64_t k = g * G; k < (g + 1) * G; k += S) {
#pragma GCC unroll 64
      for (int s = 0; s < S; ++s) {
        F wv[NB];
        c.template weights<V>(k + s, d, m0, wv);
#pragma GCC unroll 64
        for (int m = 0; m < MR; ++m) {
          const F xv = V::bcast(x + m * ldx + k + s);
#pragma GCC unroll 64
          for (int b = 0; b < NB; ++b) acc[s][m][b] = V::fma(xv, wv[b], acc[s][m][b]);
        }
      }
    }
  }
  store_sums<V>(acc, out);
}

// ---- row chunks: a table of the micro-kernel instantiated for 1..MR rows ------------------------------------
template <class V, int... R>
struct Rows {
  template <class T>
  static void dense(int mr, const float* x, int64_t ldx, const T* w, int64_t K, float* out) {
    using Fn = void (*)(const float*, int64_t, const T*, int64_t, float*);
    // int8 weights in more rows than one pass over the whole panel holds (V::MRF): the panel in two halves
    static constexpr Fn table[] = {
        &dense_panel<V, R, T, (std::is_same_v<T, int8_t> && R > V::MRF ? P / V::W / 2 : P / V::W)>...};
    table[mr - 1](x, ldx, w, K, out);
  }
  static void int4(int mr, const float* x, int64_t ldx, const uint8_t* w, const float* sc, int64_t K, int64_t g,
                   float* out) {
    using Fn = void (*)(const float*, int64_t, const uint8_t*, const float*, int64_t, int64_t, float*);
    static constexpr Fn table[] = {&int4_panel<V, R>...};
    table[mr - 1](x, ldx, w, sc, K, g, out);
  }
  template <class C>
  static void coded(int mr, const float* x, int64_t ldx, const C& c, int64_t K, float* out) {
    using Fn = void (*)(const float*, int64_t, const C&, int64_t, float*);
    static constexpr Fn table[] = {&coded_panel<V, R, C>...};
    table[mr - 1](x, ldx, c, K, out);
  }
};
template <class V>
using RowsOf = Rows<V, 1, 2, 3, 4, 5, 6, 7, 8>;  // the tables hold 1..8 rows; each unit uses up to its MR8/MRF/MR4

// Split M rows into the fewest chunks of at most mr rows, as even as possible (8 rows and mr 6: 4 + 4).
inline int chunk_rows(int64_t M, int64_t m0, int mr) {
  const int64_t left = M - m0, chunks = (left + mr - 1) / mr;
  return static_cast<int>((left + chunks - 1) / chunks);
}

// y[m, n0 + j] = acc[m][j] * scale[j] + bias[j], for the panel's real columns only
inline void epilogue(const float* acc, int mr, float* y, int64_t ldy, int64_t n0, int64_t n, const float* colscale,
                     const float* bias) {
  const int64_t cols = std::min<int64_t>(P, n - n0);
  for (int m = 0; m < mr; ++m)
    for (int64_t j = 0; j < cols; ++j) {
      float v = acc[m * P + j];
      if (colscale) v *= colscale[n0 + j];
      if (bias) v += bias[n0 + j];
      y[m * ldy + n0 + j] = v;
    }
}

// int8 weights with one scale per column (``scale``), or fp32 weights (``scale`` null)
template <class V, class T>
void run_dense(const float* x, int64_t M, int64_t K, const T* w, const float* scale, const float* bias,
               int64_t n, float* y) {
  const int64_t panels = (n + P - 1) / P;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float acc[8 * P];
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m0 = 0; m0 < M;) {
        const int mr = chunk_rows(M, m0, std::is_same_v<T, int8_t> ? V::MR8 : V::MRF);
        RowsOf<V>::template dense<T>(mr, x + m0 * K, K, w + p * K * P, K, acc);
        epilogue(acc, mr, y + m0 * n, n, p * P, n, scale, bias);
        m0 += mr;
      }
  });
}

template <class V>
void run_int4(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* scales, int64_t group,
              const float* bias, int64_t n, float* y) {
  const int64_t panels = (n + P - 1) / P, groups = K / group;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float acc[8 * P];
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m0 = 0; m0 < M;) {
        const int mr = chunk_rows(M, m0, V::MR4);
        RowsOf<V>::int4(mr, x + m0 * K, K, w + p * (K / 2) * P, scales + p * groups * P, K, group, acc);
        epilogue(acc, mr, y + m0 * n, n, p * P, n, nullptr, bias);
        m0 += mr;
      }
  });
}

// One panel's weights decoded into fp32 panels (``out`` [K][P]), as f32_panel_linear reads them
template <class V, class C>
void decode_panel(const C& c, int64_t K, float* out) {
  using F = typename V::F;
  constexpr int NB = P / V::W;
  for (int64_t g = 0; g < K / G; ++g) {
    F d[NB], m[NB], w[NB];
    c.template group<V>(g, d, m);
    for (int64_t k = g * G; k < (g + 1) * G; ++k) {
      c.template weights<V>(k, d, m, w);
#pragma GCC unroll 64
      for (int b = 0; b < NB; ++b) V::storeu(out + k * P + b * V::W, w[b]);
    }
  }
}

// exact block codes: ``decoder(p)`` is panel p's; the rows in fp32 panels' chunks (V::MRF), so every sum is
// f32_panel_linear's. One chunk decodes each weight in registers as it is read; more rows (a prompt) decode the
// panel once into fp32 panels in cache and run f32_panel_linear's own micro-kernel over them, chunk after chunk
template <class V, class D>
void run_coded(const float* x, int64_t M, int64_t K, D decoder, const float* bias, int64_t n, float* y) {
  const int64_t panels = (n + P - 1) / P;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float acc[8 * P];
    std::vector<float> decoded(M > V::MRF ? K * P : 0);
    for (int64_t p = p0; p < p1; ++p) {
      const auto c = decoder(p);
      if (M > V::MRF) decode_panel<V>(c, K, decoded.data());
      for (int64_t m0 = 0; m0 < M;) {
        const int mr = chunk_rows(M, m0, V::MRF);
        if (M > V::MRF)
          RowsOf<V>::template dense<float>(mr, x + m0 * K, K, decoded.data(), K, acc);
        else
          RowsOf<V>::coded(mr, x + m0 * K, K, c, K, acc);
        epilogue(acc, mr, y + m0 * n, n, p * P, n, nullptr, bias);
        m0 += mr;
      }
    }
  });
}

// ---- which compiled unit runs: the widest, unless a test asks for another -----------------------------------
enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::vector<std::string> isas() {  // compiled paths, widest first
  std::vector<std::string> out;
#if defined(__AVX512F__)
  out.push_back(Avx512::name);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  out.push_back(Avx2::name);
#endif
  out.push_back(Scalar::name);
  return out;
}

int isa_code(const std::string& name) {
  if (name == "avx512") return kAvx512;
  if (name == "avx2") return kAvx2;
  if (name == "scalar") return kScalar;
  return -1;
}

std::atomic<int> g_isa{isa_code(isas().front())};

std::vector<std::string> lowbit_isas() { return isas(); }

std::string lowbit_use_isa(const std::string& name) {
  const auto have = isas();
  TORCH_CHECK(std::find(have.begin(), have.end(), name) != have.end(), "lowbit: no ", name,
              " path in this build (compiled: ", c10::Join(", ", have), ")");
  const int before = g_isa.exchange(isa_code(name));
  for (const auto& h : have)
    if (isa_code(h) == before) return h;
  return Scalar::name;
}

// ---- the ops ---------------------------------------------------------------------------------------------------
static void check_common(const at::Tensor& x, const std::optional<at::Tensor>& bias, int64_t n, int64_t panels) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "lowbit: x must be a float32 CPU tensor");
  TORCH_CHECK(x.dim() >= 1, "lowbit: x must have a last (input) dimension");
  TORCH_CHECK(n > 0 && (n + P - 1) / P == panels, "lowbit: n = ", n, " does not fit ", panels, " panels of ", P);
  if (bias.has_value()) {
    const auto& b = *bias;
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.dim() == 1 && b.size(0) == n && b.is_contiguous(),
                "lowbit: bias must be a contiguous float32 vector of n = ", n);
  }
}

static std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return shape;
}

// x as rows of K inputs, an [M, n] output, and ``run(unit, xp, M, bias, yp)`` with the selected vector unit's
// (empty) struct, so that one dispatch serves every op; the caller has checked the operands
template <class Run>
at::Tensor on_selected_unit(const at::Tensor& x, int64_t K, const std::optional<at::Tensor>& bias, int64_t n,
                            Run run) {
  TORCH_CHECK(x.size(-1) == K, "lowbit: x has ", x.size(-1), " input features, the weight ", K);
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, n}, x.options());
  if (M > 0) {
    const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    const float* xp = x2.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    switch (g_isa.load()) {
#if defined(__AVX512F__)
      case kAvx512: run(Avx512{}, xp, M, b, yp); break;
#endif
#if defined(__AVX2__) && defined(__FMA__)
      case kAvx2: run(Avx2{}, xp, M, b, yp); break;
#endif
      default: run(Scalar{}, xp, M, b, yp);
    }
  }
  return y.view(out_shape(x, n));
}

// int8 weights and their per-column scales (``scale``), or fp32 weights (no scale)
template <class T>
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w, const float* scale,
                        const std::optional<at::Tensor>& bias, int64_t n) {
  const int64_t K = w.size(1);
  const T* wp = w.data_ptr<T>();
  return on_selected_unit(x, K, bias, n, [&](auto unit, const float* xp, int64_t M, const float* b, float* yp) {
    run_dense<decltype(unit), T>(xp, M, K, wp, scale, b, n, yp);
  });
}

at::Tensor int8_wo_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                          const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 3 && w.size(2) == P && w.is_contiguous(),
              "lowbit: int8 weight must be packed [panels, K, ", P, "] int8");
  check_common(x, bias, n, w.size(0));
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() >= n && scale.is_contiguous(),
              "lowbit: int8 scale must be a contiguous float32 vector of at least n");
  return dense_linear<int8_t>(x, w, scale.data_ptr<float>(), bias, n);
}

at::Tensor f32_panel_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                            int64_t n) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 3 && w.size(2) == P && w.is_contiguous(),
              "lowbit: fp32 panel weight must be packed [panels, K, ", P, "] float32");
  check_common(x, bias, n, w.size(0));
  return dense_linear<float>(x, w, nullptr, bias, n);
}

at::Tensor int4_wo_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                          const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.size(2) == P && w.is_contiguous(),
              "lowbit: int4 weight must be packed [panels, K / 2, ", P, "] uint8");
  check_common(x, bias, n, w.size(0));
  const int64_t K = 2 * w.size(1);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 3 && scales.size(0) == w.size(0) &&
                  scales.size(2) == P && scales.size(1) > 0 && K % scales.size(1) == 0 && scales.is_contiguous(),
              "lowbit: int4 scales must be packed [panels, groups, ", P, "] float32, the groups dividing K");
  const int64_t group = K / scales.size(1);
  TORCH_CHECK(group % 2 == 0, "lowbit: the int4 group size must be even, got ", group);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  return on_selected_unit(x, K, bias, n, [&](auto unit, const float* xp, int64_t M, const float* b, float* yp) {
    run_int4<decltype(unit)>(xp, M, K, wp, sp, group, b, n, yp);
  });
}

// the exact block codes' ops: ``decoder(p)`` is panel p's, on the selected unit
template <class D>
at::Tensor coded_linear(const at::Tensor& x, int64_t K, D decoder, const std::optional<at::Tensor>& bias,
                        int64_t n) {
  return on_selected_unit(x, K, bias, n, [&](auto unit, const float* xp, int64_t M, const float* b, float* yp) {
    run_coded<decltype(unit)>(xp, M, K, decoder, b, n, yp);
  });
}

static void check_codes(const at::Tensor& codes, at::ScalarType type, int64_t per_k, const char* what) {
  TORCH_CHECK(codes.scalar_type() == type && codes.dim() == 3 && codes.size(2) == per_k && codes.is_contiguous() &&
                  codes.size(1) > 0 && codes.size(1) % G == 0,
              "lowbit: ", what, " codes must be packed [panels, K, ", per_k, "], K a multiple of ", G);
}

static void check_codes(const at::Tensor& codes, at::ScalarType type, int64_t per_k, const at::Tensor& scales,
                        int64_t per_group, const char* what) {
  check_codes(codes, type, per_k, what);
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == codes.size(0) &&
                  scales.numel() == codes.size(0) * (codes.size(1) / G) * per_group,
              "lowbit: ", what, " scales must be packed [panels, K / ", G, ", ...] float16, ", per_group,
              " a block");
}

at::Tensor q4_1_panel_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& dm,
                             const std::optional<at::Tensor>& bias, int64_t n) {
  check_codes(codes, at::kByte, P / 2, dm, 2 * P, "q4_1");
  check_common(x, bias, n, codes.size(0));
  const int64_t K = codes.size(1);
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(dm.data_ptr<at::Half>());
  return coded_linear(x, K, [=](int64_t p) { return Q41{cp + p * K * (P / 2), sp + p * (K / G) * 2 * P}; }, bias,
                      n);
}

at::Tensor q8_0_panel_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d,
                             const std::optional<at::Tensor>& bias, int64_t n) {
  check_codes(codes, at::kChar, P, d, P, "q8_0");
  check_common(x, bias, n, codes.size(0));
  const int64_t K = codes.size(1);
  const int8_t* cp = codes.data_ptr<int8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  return coded_linear(x, K, [=](int64_t p) { return Q80{cp + p * K * P, sp + p * (K / G) * P}; }, bias, n);
}

at::Tensor bf16_panel_linear(const at::Tensor& x, const at::Tensor& codes, const std::optional<at::Tensor>& bias,
                             int64_t n) {
  check_codes(codes, at::kBFloat16, P, "bf16");
  check_common(x, bias, n, codes.size(0));
  const int64_t K = codes.size(1);
  const uint16_t* cp = reinterpret_cast<const uint16_t*>(codes.data_ptr<at::BFloat16>());
  return coded_linear(x, K, [=](int64_t p) { return B16{cp + p * K * P}; }, bias, n);
}

}  // namespace skipsearch_lowbit

// A fragment: skipsearch's Python ops (skipsearch::fp16_linear) share the namespace.
TORCH_LIBRARY_FRAGMENT(skipsearch, m) {
  m.def("int8_wo_linear(Tensor x, Tensor w, Tensor scale, Tensor? bias, int n) -> Tensor");
  m.def("int4_wo_linear(Tensor x, Tensor w, Tensor scales, Tensor? bias, int n) -> Tensor");
  m.def("f32_panel_linear(Tensor x, Tensor w, Tensor? bias, int n) -> Tensor");
  m.def("q4_1_panel_linear(Tensor x, Tensor codes, Tensor dm, Tensor? bias, int n) -> Tensor");
  m.def("q8_0_panel_linear(Tensor x, Tensor codes, Tensor d, Tensor? bias, int n) -> Tensor");
  m.def("bf16_panel_linear(Tensor x, Tensor codes, Tensor? bias, int n) -> Tensor");
  m.def("lowbit_isas() -> str[]", &skipsearch_lowbit::lowbit_isas);
  m.def("lowbit_use_isa(str name) -> str", &skipsearch_lowbit::lowbit_use_isa);
}

TORCH_LIBRARY_IMPL(skipsearch, CPU, m) {
  m.impl("int8_wo_linear", &skipsearch_lowbit::int8_wo_linear);
  m.impl("int4_wo_linear", &skipsearch_lowbit::int4_wo_linear);
  m.impl("f32_panel_linear", &skipsearch_lowbit::f32_panel_linear);
  m.impl("q4_1_panel_linear", &skipsearch_lowbit::q4_1_panel_linear);
  m.impl("q8_0_panel_linear", &skipsearch_lowbit::q8_0_panel_linear);
  m.impl("bf16_panel_linear", &skipsearch_lowbit::bf16_panel_linear);
}
