// Grouped-query attention of a few query rows against a static KV cache, over the cache positions the mask lets
// them see: the `panel` kernel's attention for one-token steps, drafts and verify blocks (kernels/panel.py).
//
// Why: on the AVX-512 Xeon of studies/attention-cpu.md, ATen's flash attention for CPU, called from a compiled
// one-token graph, cost 50-60 us a layer for 3 key/value heads of 3 query rows each: it reads the whole static
// cache (every slot, most of them masked), splits 3 rows over the threads and allocates its buffers on every call.
// The rows here read only the keys up to the last one their mask keeps, on one thread when that is little work.
//
//   q    [B, Hkv, R, D]  fp32: the R query rows that share key/value head h (a group's heads stacked, (r, t))
//   k, v [B, Hkv, S, D]  fp32, last dimension contiguous (the cache as it is)
//   mask [B or 1, 1, M, S], M dividing R: row i of a head reads mask row i mod M; bool (true: attend) or
//        additive float (-inf: not attended)
//   out  [B, Hkv, R, D] = softmax(q k^T * scale + mask) v, each row over the keys its mask keeps; a row that may
//        attend to nothing gets zeros.
//
// The scores and the softmax are in fp32 with ATen's vectorized exp (exp_u20, the one ATen's own flash attention
// for CPU uses); only the order of the sums differs from SDPA's. Built in the same extension as lowbit.cpp, for
// the widest vector unit -march=native gives (ATen's Vectorized<float>, as inductor's generated kernels use it).

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace skipsearch_attention {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kInlineWork = 1 << 17;  // multiply-adds below which a call stays on one thread (no fork/join)

// The mask rows as additive biases over the positions each may see: 0 (or the float mask's value) where it
// attends, -inf where not; built once per call for the [B or 1, M] mask rows, read by every query row.
struct Bias {
  std::vector<float> bias;  // [rows][S]
  std::vector<int64_t> ends;  // one past the last position each row attends to
  Bias(const at::Tensor& mask, int64_t S) {
    const int64_t B = mask.size(0), M = mask.size(2), sb = mask.stride(0), sr = mask.stride(2), ss = mask.stride(3);
    const bool* keep = mask.scalar_type() == at::kBool ? mask.data_ptr<bool>() : nullptr;
    const float* add = keep ? nullptr : mask.data_ptr<float>();
    bias.resize(B * M * S);
    ends.resize(B * M);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t m = 0; m < M; ++m) {
        float* row = bias.data() + (b * M + m) * S;
        int64_t end = 0;
        for (int64_t j = 0; j < S; ++j) {
          const int64_t o = b * sb + m * sr + j * ss;
          row[j] = keep ? (keep[o] ? 0.f : kNegInf) : add[o];
          if (row[j] != kNegInf) end = j + 1;
        }
        ends[b * M + m] = end;
      }
  }
};

// RB query rows of one key/value head, D = NV vectors: scores over keys [0, n) (n: the furthest any of them sees),
// softmax per row, then the weighted sum of values, the rows' outputs kept in registers.
template <int NV, int RB>
static void attend_rows(const float* q, int64_t rows, const float* k, const float* v, int64_t sk, int64_t sv,
                        const float* const* bias, int64_t n, float scale, float* s, float* out) {
  constexpr int64_t W = Vec::size(), D = NV * W;
  Vec qv[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NV; ++c) qv[r][c] = r < rows ? Vec::loadu(q + r * D + c * W) : Vec(0.f);
  float mx[RB];
  for (int r = 0; r < RB; ++r) mx[r] = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    Vec kv[NV];
    for (int c = 0; c < NV; ++c) kv[c] = Vec::loadu(k + j * sk + c * W);
    for (int r = 0; r < RB; ++r) {
      if (r >= rows) break;
      Vec acc = qv[r][0] * kv[0];
      for (int c = 1; c < NV; ++c) acc = at::vec::fmadd(qv[r][c], kv[c], acc);
      const float x = acc.reduce_add() * scale + bias[r][j];
      s[r * n + j] = x;
      mx[r] = std::max(mx[r], x);
    }
  }
  float inv[RB];
  for (int r = 0; r < rows; ++r) {
    float* sr = s + r * n;
    if (mx[r] == kNegInf) {  // nothing to attend to: zeros
      std::fill(sr, sr + n, 0.f);
      inv[r] = 0.f;
      continue;
    }
    const Vec vmx(mx[r]);
    Vec vsum(0.f);
    int64_t j = 0;
    for (; j + W <= n; j += W) {
      const Vec e = (Vec::loadu(sr + j) - vmx).exp_u20();
      e.store(sr + j);
      vsum = vsum + e;
    }
    float sum = vsum.reduce_add();
    for (; j < n; ++j) {
      sr[j] = sr[j] == kNegInf ? 0.f : std::exp(sr[j] - mx[r]);
      sum += sr[j];
    }
    inv[r] = 1.f / sum;
  }
  Vec o[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NV; ++c) o[r][c] = Vec(0.f);
  for (int64_t j = 0; j < n; ++j) {
    Vec vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = Vec::loadu(v + j * sv + c * W);
    for (int r = 0; r < RB; ++r) {
      if (r >= rows) break;
      const Vec p(s[r * n + j]);
      for (int c = 0; c < NV; ++c) o[r][c] = at::vec::fmadd(p, vv[c], o[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const Vec vi(inv[r]);
    for (int c = 0; c < NV; ++c) (o[r][c] * vi).store(out + r * D + c * W);
  }
}

// any head size: one row at a time, plain loops
static void attend_rows_any(const float* q, int64_t rows, int64_t D, const float* k, const float* v, int64_t sk,
                            int64_t sv, const float* const* bias, int64_t n, float scale, float* s, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + r * D;
    float mx = kNegInf;
    for (int64_t j = 0; j < n; ++j) {
      float x = 0.f;
      for (int64_t d = 0; d < D; ++d) x += qr[d] * k[j * sk + d];
      s[j] = x * scale + bias[r][j];
      mx = std::max(mx, s[j]);
    }
    float* o = out + r * D;
    std::fill(o, o + D, 0.f);
    if (mx == kNegInf) continue;
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = s[j] == kNegInf ? 0.f : std::exp(s[j] - mx);
      sum += s[j];
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < D; ++d) o[d] += s[j] * v[j * sv + d];
    for (int64_t d = 0; d < D; ++d) o[d] /= sum;
  }
}

constexpr int kRows = 4;  // query rows per pass over the keys (their outputs stay in registers)

at::Tensor gqa_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const at::Tensor& attn_mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "gqa_attention: q, k, v must be 4-d");
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                  value.scalar_type() == at::kFloat, "gqa_attention: q, k, v must be float32");
  const at::Tensor q = query.contiguous();
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), D = q.size(3), S = key.size(2);
  TORCH_CHECK(key.size(0) == B && key.size(1) == H && key.size(3) == D && value.sizes() == key.sizes(),
              "gqa_attention: k and v must be [B, Hkv, S, D] with q's B, Hkv and D");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "gqa_attention: k and v need a contiguous last dim");
  TORCH_CHECK(attn_mask.dim() == 4 && attn_mask.size(1) == 1 && attn_mask.size(3) == S &&
                  (attn_mask.size(0) == 1 || attn_mask.size(0) == B) && attn_mask.size(2) > 0 &&
                  R % attn_mask.size(2) == 0,
              "gqa_attention: the mask must be [B or 1, 1, M, S] with M dividing q's rows");
  TORCH_CHECK(attn_mask.scalar_type() == at::kBool || attn_mask.scalar_type() == at::kFloat,
              "gqa_attention: the mask must be bool or float32");
  at::Tensor out = at::empty({B, H, R, D}, q.options());
  if (out.numel() == 0) return out;
  const Bias bias(attn_mask, S);
  const int64_t M = attn_mask.size(2), MB = attn_mask.size(0);
  const int64_t longest = std::max<int64_t>(1, *std::max_element(bias.ends.begin(), bias.ends.end()));

  const float* qp = q.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ksb = key.stride(0), ksh = key.stride(1), ksj = key.stride(2);
  const int64_t vsb = value.stride(0), vsh = value.stride(1), vsj = value.stride(2);
  const float sc = static_cast<float>(scale);
  const int64_t blocks = (R + kRows - 1) / kRows, tasks = B * H * blocks;
  auto run = [&](int64_t t0, int64_t t1) {
    std::vector<float> s(kRows * longest);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * blocks), h = (t / blocks) % H, r0 = (t % blocks) * kRows;
      const int64_t rows = std::min<int64_t>(kRows, R - r0);
      const float* rb[kRows];
      int64_t n = 0;
      for (int64_t r = 0; r < rows; ++r) {  // row i of the head reads mask row i mod M
        const int64_t m = (MB == 1 ? 0 : b * M) + (r0 + r) % M;
        rb[r] = bias.bias.data() + m * S;
        n = std::max(n, bias.ends[m]);
      }
      const float* qr = qp + ((b * H + h) * R + r0) * D;
      const float* kh = kp + b * ksb + h * ksh;
      const float* vh = vp + b * vsb + h * vsh;
      float* orow = op + ((b * H + h) * R + r0) * D;
      if (D == 4 * Vec::size())
        attend_rows<4, kRows>(qr, rows, kh, vh, ksj, vsj, rb, n, sc, s.data(), orow);
      else if (D == 8 * Vec::size())
        attend_rows<8, kRows>(qr, rows, kh, vh, ksj, vsj, rb, n, sc, s.data(), orow);
      else if (D == 2 * Vec::size())
        attend_rows<2, kRows>(qr, rows, kh, vh, ksj, vsj, rb, n, sc, s.data(), orow);
      else
        attend_rows_any(qr, rows, D, kh, vh, ksj, vsj, rb, n, sc, s.data(), orow);
    }
  };
  const int64_t work = B * H * R * longest * D;
  if (work < kInlineWork || at::get_num_threads() == 1 || tasks == 1) {
    run(0, tasks);
  } else {
    at::parallel_for(0, tasks, 1, run);
  }
  return out;
}

}  // namespace skipsearch_attention

TORCH_LIBRARY_FRAGMENT(skipsearch, m) {
  m.def("gqa_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(skipsearch, CPU, m) { m.impl("gqa_attention", &skipsearch_attention::gqa_attention); }
