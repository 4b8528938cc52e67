// int8 and int4 weights times int8 activations, on the CPU's VNNI dot products: y[m, n] = sum_k x[m, k] w[n, k]
// (+ bias[n]), the draft products of the precision method's int8 and int4 schemes on CPUs with AVX-512 VNNI.
//
// Why: lowbit.cpp's weight-only products widen every weight to fp32 before its multiply-add (a sign extension,
// a conversion and an FMA for 16 weights). On the AVX-512 Xeon of studies/vnni-draft-cpu.md that work, not the
// memory, bounds them: the int8 product ran at 15 GB/s of weights where fp32 streams at 20-33, and int4 at 10.
// VPDPBUSD multiplies 64 unsigned bytes by 64 signed bytes and adds them, four at a time, into 16 int32 sums:
// one instruction for 64 weights, so the weights stream at the memory's speed.
//
// Activations: each row of x is quantized per block of Q inputs (Q = 32 for int8, the weight group for int4),
// symmetric, as llama.cpp's Q8_0 quantizes the activations its Q8_0 and Q4_0 products take:
//   s = max|x_block| / 127, xq = round-half-even(x / s) in [-127, 127]   (s = 0, xq = 0 for an all-zero block)
// Weights are unsigned in the dot product (the first operand of VPDPBUSD): int8 q is stored as q + 128, int4 q as
// q + 8 (as lowbit.cpp stores it). So a block's integer sum D = sum (q + o) xq is exact, and the product is
//   int8: y = scale[n] * sum_b s_b (D_b - 128 S_b)        int4: y = sum_g scale[g, n] s_g (D_g - 8 S_g)
// with S_b = sum xq over the block, in fp32 block by block with one rounding per block (an FMA). Every path (the
// AVX-512 VNNI one, and plain C++ for tests and for CPUs without it) computes the same integers and the same
// fp32 operations in the same order, so their outputs agree bit for bit.
//
// Layout (packed once, in Python: quant.pack_int8_vnni, pack_int4_vnni): output columns in panels of P = 32; a
// panel is a stream of K / 4 (int8) or K / 8 (int4) steps of 128 bytes, column-major inside a step:
//   int8: step t, byte 4 c + j   = q[c, 4 t + j] + 128                          (uint8)
//   int4: step t, byte 4 c + j   = (q[c, 8 t + j] + 8) | (q[c, 8 t + 4 + j] + 8) << 4   (uint8)
// so the 64 bytes of columns 0..15 (and of 16..31) are one VPDPBUSD operand. int4 scales as lowbit.cpp's:
// [panels, G, 32] fp32.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SKIPSEARCH_VNNI 1
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace skipsearch_dq {

constexpr int P = 32;             // output columns per panel
constexpr int STEP = 128;         // bytes of one step of a panel
constexpr int64_t kInlineBytes = 1 << 16;  // weight bytes per thread below which a call takes fewer threads
constexpr int64_t kInt8Block = 32;         // inputs per activation block of the int8 product
constexpr int MR = 6;  // rows per pass: 2 x MR int32 sums + 2 x MR fp32 sums + operands in 32 zmm registers

// ---- activations: one row's blocks of Q inputs to int8, their scales and offsets --------------------------------
struct QuantizedRows {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M, K / Q]
  std::vector<int32_t> corr;  // [M, K / Q]: offset * sum of the block's q
};

#if defined(__AVX512F__) && defined(__AVX512BW__)
// One block of Q (a multiple of 16) inputs, 16 at a time: the same max, the same product x * (1 / s) and the same
// rounding (the default MXCSR mode is round half to even, as nearbyint's) as the plain loop below.
inline int32_t quantize_block16(const float* xb, int64_t Q, int8_t* qb, float* scale) {
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t i = 0; i < Q; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(xb + i)));
  const float amax = _mm512_reduce_max_ps(vmax);
  const float s = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(s > 0.f ? 1.f / s : 0.f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t i = 0; i < Q; i += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + i), inv));
    v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
    sum = _mm512_add_epi32(sum, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + i), _mm512_cvtepi32_epi8(v));
  }
  *scale = s;
  return _mm512_reduce_add_epi32(sum);
}
#endif

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, int64_t Q, int32_t offset) {
  const int64_t blocks = K / Q;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(M * blocks), std::vector<int32_t>(M * blocks)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + m * K + b * Q;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      if (Q % 16 == 0) {
        const int32_t sum = quantize_block16(xb, Q, r.q.data() + m * K + b * Q, &r.scale[m * blocks + b]);
        r.corr[m * blocks + b] = offset * sum;
        continue;
      }
#endif
      float amax = 0.f;
      for (int64_t i = 0; i < Q; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float s = amax / 127.f;
      const float inv = s > 0.f ? 1.f / s : 0.f;
      int32_t sum = 0;
      int8_t* qb = r.q.data() + m * K + b * Q;
      for (int64_t i = 0; i < Q; ++i) {
        const float v = std::nearbyint(xb[i] * inv);  // round half to even (the default rounding mode)
        const int32_t iv = static_cast<int32_t>(std::min(127.f, std::max(-127.f, v)));
        qb[i] = static_cast<int8_t>(iv);
        sum += iv;
      }
      r.scale[m * blocks + b] = s;
      r.corr[m * blocks + b] = offset * sum;
    }
  return r;
}

// ---- plain C++: the reference every vector path must equal ------------------------------------------------------
// out[m * P + c]: the panel's fp32 sums (before the column scale), rows m0 .. m0 + mr
void int8_panel_scalar(const QuantizedRows& a, int64_t m0, int mr, int64_t K, const uint8_t* w, float* out) {
  constexpr int64_t Q = kInt8Block;
  const int64_t blocks = K / Q;
  for (int m = 0; m < mr; ++m)
    for (int c = 0; c < P; ++c) {
      float acc = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t d = 0;
        for (int64_t k = b * Q; k < (b + 1) * Q; ++k)
          d += int32_t(w[(k / 4) * STEP + 4 * c + k % 4]) * a.q[(m0 + m) * K + k];
        const int64_t i = (m0 + m) * blocks + b;
        acc = std::fma(float(d - a.corr[i]), a.scale[i], acc);
      }
      out[m * P + c] = acc;
    }
}

void int4_panel_scalar(const QuantizedRows& a, int64_t m0, int mr, int64_t K, int64_t G, const uint8_t* w,
                       const float* scales, float* out) {
  const int64_t groups = K / G;
  for (int m = 0; m < mr; ++m)
    for (int c = 0; c < P; ++c) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t d = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const uint8_t byte = w[(k / 8) * STEP + 4 * c + k % 4];
          const int32_t u = (k % 8) < 4 ? (byte & 15) : (byte >> 4);
          d += u * a.q[(m0 + m) * K + k];
        }
        const int64_t i = (m0 + m) * groups + g;
        acc = std::fma(float(d - a.corr[i]), scales[g * P + c] * a.scale[i], acc);
      }
      out[m * P + c] = acc;
    }
}

// ---- AVX-512 VNNI -----------------------------------------------------------------------------------------------
// The int8 product prefetches the weights 4 KB ahead into L2 (prefetcht1), not L1: one dot product takes 64 weights.
// On a Zen 4, into L2, a pass over smollm2-135m's linears took 13-17% less time at 1-8 rows than into L1, and the
// shipped hybrid profile (int8 drafts on a lookup's miss) 8-9% less a token, both builds timed in one process. The
// int4 product, which unpacks each byte twice, keeps L1: into L2 it ran 8-14% slower from 2 rows there
// (studies/int8-target.md, section 14).
#if SKIPSEARCH_VNNI
template <int R>
void int8_panel_vnni(const QuantizedRows& a, int64_t m0, int64_t K, const uint8_t* w, float* out) {
  constexpr int64_t Q = kInt8Block;
  const int64_t blocks = K / Q;
  __m512 acc[R][2];
  for (int m = 0; m < R; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  const int8_t* xq = a.q.data() + m0 * K;
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i d[R][2];
    for (int m = 0; m < R; ++m) d[m][0] = d[m][1] = _mm512_setzero_si512();
    const uint8_t* wb = w + b * (Q / 4) * STEP;
#pragma GCC unroll 8
    for (int t = 0; t < Q / 4; ++t) {
      const uint8_t* ws = wb + t * STEP;
      _mm_prefetch(reinterpret_cast<const char*>(ws) + 4096, _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(ws) + 4096 + 64, _MM_HINT_T1);
      const __m512i w0 = _mm512_loadu_si512(ws), w1 = _mm512_loadu_si512(ws + 64);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) {
        int32_t four;
        std::memcpy(&four, xq + m * K + b * Q + 4 * t, 4);
        const __m512i xv = _mm512_set1_epi32(four);
        d[m][0] = _mm512_dpbusd_epi32(d[m][0], w0, xv);
        d[m][1] = _mm512_dpbusd_epi32(d[m][1], w1, xv);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      const int64_t i = (m0 + m) * blocks + b;
      const __m512i corr = _mm512_set1_epi32(a.corr[i]);
      const __m512 s = _mm512_set1_ps(a.scale[i]);
      acc[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d[m][0], corr)), s, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d[m][1], corr)), s, acc[m][1]);
    }
  }
  for (int m = 0; m < R; ++m) {
    _mm512_storeu_ps(out + m * P, acc[m][0]);
    _mm512_storeu_ps(out + m * P + 16, acc[m][1]);
  }
}

template <int R>
void int4_panel_vnni(const QuantizedRows& a, int64_t m0, int64_t K, int64_t G, const uint8_t* w,
                     const float* scales, float* out) {
  const int64_t groups = K / G;
  const __m512i low = _mm512_set1_epi8(15);
  __m512 acc[R][2];
  for (int m = 0; m < R; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  const int8_t* xq = a.q.data() + m0 * K;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i d[R][2];
    for (int m = 0; m < R; ++m) d[m][0] = d[m][1] = _mm512_setzero_si512();
    const uint8_t* wg = w + g * (G / 8) * STEP;
    for (int64_t t = 0; t < G / 8; ++t) {
      const uint8_t* ws = wg + t * STEP;
      _mm_prefetch(reinterpret_cast<const char*>(ws) + 4096, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(ws) + 4096 + 64, _MM_HINT_T0);
      const __m512i r0 = _mm512_loadu_si512(ws), r1 = _mm512_loadu_si512(ws + 64);
      const __m512i lo0 = _mm512_and_si512(r0, low), lo1 = _mm512_and_si512(r1, low);
      const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(r0, 4), low);
      const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(r1, 4), low);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) {
        int32_t four_lo, four_hi;
        const int8_t* xk = xq + m * K + g * G + 8 * t;
        std::memcpy(&four_lo, xk, 4);
        std::memcpy(&four_hi, xk + 4, 4);
        const __m512i xl = _mm512_set1_epi32(four_lo), xh = _mm512_set1_epi32(four_hi);
        d[m][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d[m][0], lo0, xl), hi0, xh);
        d[m][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d[m][1], lo1, xl), hi1, xh);
      }
    }
    const __m512 s0 = _mm512_loadu_ps(scales + g * P), s1 = _mm512_loadu_ps(scales + g * P + 16);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      const int64_t i = (m0 + m) * groups + g;
      const __m512i corr = _mm512_set1_epi32(a.corr[i]);
      const __m512 sx = _mm512_set1_ps(a.scale[i]);
      acc[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d[m][0], corr)), _mm512_mul_ps(s0, sx),
                                  acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d[m][1], corr)), _mm512_mul_ps(s1, sx),
                                  acc[m][1]);
    }
  }
  for (int m = 0; m < R; ++m) {
    _mm512_storeu_ps(out + m * P, acc[m][0]);
    _mm512_storeu_ps(out + m * P + 16, acc[m][1]);
  }
}

template <int... R>
struct VnniRows {
  static void int8(int mr, const QuantizedRows& a, int64_t m0, int64_t K, const uint8_t* w, float* out) {
    using Fn = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, float*);
    static constexpr Fn table[] = {&int8_panel_vnni<R>...};
    table[mr - 1](a, m0, K, w, out);
  }
  static void int4(int mr, const QuantizedRows& a, int64_t m0, int64_t K, int64_t G, const uint8_t* w,
                   const float* scales, float* out) {
    using Fn = void (*)(const QuantizedRows&, int64_t, int64_t, int64_t, const uint8_t*, const float*, float*);
    static constexpr Fn table[] = {&int4_panel_vnni<R>...};
    table[mr - 1](a, m0, K, G, w, scales, out);
  }
};
using Vnni = VnniRows<1, 2, 3, 4, 5, 6>;  // 1..MR rows
#endif

// ---- which path runs: VNNI where compiled, unless a test asks for plain C++ -----------------------------------
std::vector<std::string> paths() {
  std::vector<std::string> out;
#if SKIPSEARCH_VNNI
  out.push_back("avx512-vnni");
#endif
  out.push_back("scalar");
  return out;
}

std::atomic<bool> g_vnni{paths().front() != "scalar"};

std::vector<std::string> dq_paths() { return paths(); }

std::string dq_use_path(const std::string& name) {
  const auto have = paths();
  TORCH_CHECK(std::find(have.begin(), have.end(), name) != have.end(), "dq: no ", name,
              " path in this build (compiled: ", c10::Join(", ", have), ")");
  const bool before = g_vnni.exchange(name != "scalar");
  return before ? "avx512-vnni" : "scalar";
}

// ---- the ops ------------------------------------------------------------------------------------------------------
inline int chunk_rows(int64_t M, int64_t m0) {  // the fewest passes of at most MR rows, as even as possible
  const int64_t left = M - m0, chunks = (left + MR - 1) / MR;
  return static_cast<int>((left + chunks - 1) / chunks);
}

static void check_operands(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                           int64_t n, int64_t K, int64_t per_step) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "dq: x must be a float32 CPU tensor");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.size(2) == STEP && w.is_contiguous(),
              "dq: the weight must be packed [panels, K / ", per_step, ", ", STEP, "] uint8");
  TORCH_CHECK(n > 0 && (n + P - 1) / P == w.size(0), "dq: n = ", n, " does not fit ", w.size(0), " panels of ", P);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "dq: x has ", x.dim() ? x.size(-1) : 0, " input features, the weight ",
              K);
  if (bias.has_value()) {
    const auto& b = *bias;
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.dim() == 1 && b.size(0) == n && b.is_contiguous(),
                "dq: bias must be a contiguous float32 vector of n = ", n);
  }
}

static std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return shape;
}

// y[m, p * P + c] = out[m * P + c] * colscale (int8) + bias, for the panel's real columns
inline void epilogue(const float* out, int mr, float* y, int64_t n, int64_t n0, const float* colscale,
                     const float* bias) {
  const int64_t cols = std::min<int64_t>(P, n - n0);
  for (int m = 0; m < mr; ++m)
    for (int64_t c = 0; c < cols; ++c) {
      float v = out[m * P + c];
      if (colscale) v *= colscale[n0 + c];
      if (bias) v += bias[n0 + c];
      y[m * n + n0 + c] = v;
    }
}

template <class PanelFn>
static void run(int64_t M, int64_t n, int64_t panel_bytes, const float* colscale, const float* bias, float* y,
                PanelFn panel) {
  const int64_t panels = (n + P - 1) / P;
  const int64_t grain = std::max<int64_t>(1, kInlineBytes / std::max<int64_t>(1, panel_bytes));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    alignas(64) float out[MR * P];
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m0 = 0; m0 < M;) {
        const int mr = chunk_rows(M, m0);
        panel(p, m0, mr, out);
        epilogue(out, mr, y + m0 * n, n, p * P, colscale, bias);
        m0 += mr;
      }
  });
}

at::Tensor int8_dq_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                          const std::optional<at::Tensor>& bias, int64_t n) {
  const int64_t K = 4 * w.size(1);
  check_operands(x, w, bias, n, K, 4);
  TORCH_CHECK(K % kInt8Block == 0, "dq: int8 needs the inputs in blocks of ", kInt8Block, ", got ", K);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() >= n && scale.is_contiguous(),
              "dq: the int8 scale must be a contiguous float32 vector of at least n");
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, n}, x.options());
  if (M == 0) return y.view(out_shape(x, n));
  const QuantizedRows a = quantize_rows(x2.data_ptr<float>(), M, K, kInt8Block, 128);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t panel_bytes = K * P;
  const bool vnni = g_vnni.load();
  run(M, n, panel_bytes, scale.data_ptr<float>(), bias.has_value() ? bias->data_ptr<float>() : nullptr,
      y.data_ptr<float>(), [&](int64_t p, int64_t m0, int mr, float* out) {
#if SKIPSEARCH_VNNI
        if (vnni) return Vnni::int8(mr, a, m0, K, wp + p * panel_bytes, out);
#endif
        (void)vnni;
        int8_panel_scalar(a, m0, mr, K, wp + p * panel_bytes, out);
      });
  return y.view(out_shape(x, n));
}

at::Tensor int4_dq_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                          const std::optional<at::Tensor>& bias, int64_t n) {
  const int64_t K = 8 * w.size(1);
  check_operands(x, w, bias, n, K, 8);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 3 && scales.size(0) == w.size(0) &&
                  scales.size(2) == P && scales.size(1) > 0 && K % scales.size(1) == 0 && scales.is_contiguous(),
              "dq: int4 scales must be packed [panels, groups, ", P, "] float32, the groups dividing K");
  const int64_t groups = scales.size(1), G = K / groups;
  TORCH_CHECK(G % 8 == 0, "dq: the int4 group size must be a multiple of 8, got ", G);
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, n}, x.options());
  if (M == 0) return y.view(out_shape(x, n));
  const QuantizedRows a = quantize_rows(x2.data_ptr<float>(), M, K, G, 8);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t panel_bytes = (K / 2) * P;
  const bool vnni = g_vnni.load();
  run(M, n, panel_bytes, nullptr, bias.has_value() ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>(),
      [&](int64_t p, int64_t m0, int mr, float* out) {
#if SKIPSEARCH_VNNI
        if (vnni) return Vnni::int4(mr, a, m0, K, G, wp + p * panel_bytes, sp + p * groups * P, out);
#endif
        (void)vnni;
        int4_panel_scalar(a, m0, mr, K, G, wp + p * panel_bytes, sp + p * groups * P, out);
      });
  return y.view(out_shape(x, n));
}

}  // namespace skipsearch_dq

TORCH_LIBRARY_FRAGMENT(skipsearch, m) {
  m.def("int8_dq_linear(Tensor x, Tensor w, Tensor scale, Tensor? bias, int n) -> Tensor");
  m.def("int4_dq_linear(Tensor x, Tensor w, Tensor scales, Tensor? bias, int n) -> Tensor");
  m.def("dq_paths() -> str[]", &skipsearch_dq::dq_paths);
  m.def("dq_use_path(str name) -> str", &skipsearch_dq::dq_use_path);
}

TORCH_LIBRARY_IMPL(skipsearch, CPU, m) {
  m.impl("int8_dq_linear", &skipsearch_dq::int8_dq_linear);
  m.impl("int4_dq_linear", &skipsearch_dq::int4_dq_linear);
}
