// Native CPU kernels.
//
// 1. The planner's decode step: one new token for every row (beam) through the model.
// At a few dozen rows, eager PyTorch spends more time calling operators than computing. Here a
// step is one call (`Decoder.step`): the matrix products go to ATen (MKL), and the rest is
// fused loops. The attention (`decode_attention`) lets each row attend over its group's shared
// prefix (the environment's context, cached once per group) and over its own planned
// positions, in one pass per (row, head) that also writes the new key and value at the row's
// own position `t`; in PyTorch that is a dozen small operators per layer. Which prefix a row
// continues comes from the cache (`group_of_row`, by its RowLayout in kv_cache.py); the
// kernel knows no row order of its own. Results equal the model's modules
// (`trajectory_transformer.model`) up to float rounding.
//
// 2. Training dropout (`dropout`): on the CPU, torch's `bernoulli_` is a large part of a
// training step, most of it in the attention's dropout over every (batch, head, query, key)
// weight. Here the keep mask comes from a counter-based hash (splitmix64 of seed + index) in
// the same pass that applies it: parallel, and the same for one seed whatever the thread count.
//
// Built without -ffast-math, so IEEE semantics hold everywhere; the few places that need
// vector code the compiler would not write under strict rules say so themselves: the AVX2
// intrinsics below (dot products, weighted sums, exp and erf) and `omp simd` reductions, which
// allow reordering a sum for that loop only.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

// A check whose message carries numbers: formatted here with snprintf and handed to torch as a
// plain C string. On one machine (PyTorch 2.11 with its kernels built by GCC 13.3), a failed
// TORCH_CHECK whose message c10::str formatted from numbers crashed the process instead of
// raising, while one with a fixed message raised.
#define TT_CHECK(cond, ...)                                         \
  do {                                                              \
    if (!(cond)) {                                                  \
      char tt_message_[256];                                        \
      std::snprintf(tt_message_, sizeof(tt_message_), __VA_ARGS__); \
      TORCH_CHECK(false, static_cast<const char*>(tt_message_));    \
    }                                                               \
  } while (0)

namespace {

constexpr int64_t kMaxHeadSize = 256;

#if defined(__AVX2__) && defined(__FMA__)
// e^x for x <= 0, eight at a time, within a few ulp: x = n ln2 + r with |r| <= ln2 / 2, e^r by
// Cephes' expf polynomial, 2^n from the exponent bits. Inputs below -87 give e^-87, so that
// 2^n stays a normal float; NaN stays NaN. (glibc vectorises expf only under -ffast-math.)
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // the second operand where either is NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// erf(x), eight at a time, by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7):
// the formula of ATen's vectorised erf, which nn.GELU uses.
inline __m256 erf_approx(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.f));
  const __m256 a = _mm256_xor_ps(x, sign);  // |x|
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a)));
  const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(p, t), e, one);  // 1 - p t e^(-x^2)
  return _mm256_xor_ps(y, sign);
}
#endif

// s[i] = exp(s[i] - top) for n scores no larger than `top`.
inline void exp_shifted(float* __restrict__ s, int64_t n, float top) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 shift = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(s + i, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), shift)));
#endif
  for (; i < n; ++i) s[i] = std::exp(s[i] - top);
}

// s[i] = scale * (q . keys[i]) for n keys of `hs` floats each.
template <int64_t HS>
inline void score_keys(const float* __restrict__ q, const float* __restrict__ keys, int64_t n,
                       int64_t hs, float scale, float* __restrict__ s) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (HS > 0 && HS % 8 == 0) {
    // Eight keys at a time: eight vector dot products, then one transposing reduction, so
    // the horizontal sums cost a few instructions per eight keys instead of per key.
    __m256 qv[HS / 8];
    for (int64_t c = 0; c < HS / 8; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
    for (; i + 8 <= n; i += 8) {
      __m256 acc[8];
      for (int p = 0; p < 8; ++p) {
        const float* k = keys + (i + p) * HS;
        acc[p] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k));
        for (int64_t c = 1; c < HS / 8; ++c)
          acc[p] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + 8 * c), acc[p]);
      }
      // hadd pairs: lanes 0-3 then hold the low-half sums of keys 0..3 (4..7), lanes 4-7 the
      // high-half sums; adding the 128-bit halves gives the eight dot products in order.
      const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
                                      _mm256_hadd_ps(acc[2], acc[3]));
      const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
                                      _mm256_hadd_ps(acc[6], acc[7]));
      const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                        _mm256_permute2f128_ps(a, b, 0x31));
      _mm256_storeu_ps(s + i, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
    }
  }
#endif
  const int64_t size = HS > 0 ? HS : hs;
  for (; i < n; ++i) {
    float dot = 0.f;
    for (int64_t d = 0; d < size; ++d) dot += q[d] * keys[i * size + d];
    s[i] = dot * scale;
  }
}

// acc += sum_i w[i] * values[i] for n values of `hs` floats each.
template <int64_t HS>
inline void accumulate_values(const float* __restrict__ w, const float* __restrict__ values,
                              int64_t n, int64_t hs, float* __restrict__ acc) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (HS > 0 && HS % 8 == 0) {
    // Two interleaved accumulator sets keep enough independent FMAs in flight.
    __m256 even[HS / 8], odd[HS / 8];
    for (int64_t c = 0; c < HS / 8; ++c) {
      even[c] = _mm256_loadu_ps(acc + 8 * c);
      odd[c] = _mm256_setzero_ps();
    }
    for (; i + 2 <= n; i += 2) {
      const __m256 w0 = _mm256_set1_ps(w[i]), w1 = _mm256_set1_ps(w[i + 1]);
      const float* v0 = values + i * HS;
      for (int64_t c = 0; c < HS / 8; ++c) {
        even[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8 * c), even[c]);
        odd[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v0 + HS + 8 * c), odd[c]);
      }
    }
    for (int64_t c = 0; c < HS / 8; ++c)
      _mm256_storeu_ps(acc + 8 * c, _mm256_add_ps(even[c], odd[c]));
  }
#endif
  const int64_t size = HS > 0 ? HS : hs;
  for (; i < n; ++i)
    for (int64_t d = 0; d < size; ++d) acc[d] += w[i] * values[i * size + d];
}

// HS > 0: head size known at compile time (unrolled, vectorised); HS == 0: any head size.
template <int64_t HS>
void attend_rows(const float* qkv, const float* prefix_k, const float* prefix_v, float* own_k,
                 float* own_v, float* out, int64_t rows, int64_t heads, int64_t head_size,
                 int64_t prefix_capacity, int64_t own_capacity, const int64_t* group_of_row,
                 int64_t prefix_len, int64_t t, int64_t transition_dim) {
  const int64_t hs = HS > 0 ? HS : head_size;
  const int64_t C = heads * hs, P = prefix_len, T = transition_dim, n = P + t + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // The query sits at absolute position P + t; a key is hidden when it is the value token of
  // an earlier transition (position % T == T - 1, before the query). Hidden keys are scored
  // like the others, left out of the maximum, and get weight exactly 0 after the exp.
  const float lowest = std::numeric_limits<float>::lowest();
  at::parallel_for(0, rows * heads, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(n);
    float* __restrict__ s = buffer.data();
    float acc[kMaxHeadSize];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / heads, h = task % heads;
      const int64_t g = group_of_row[r];
      const float* __restrict__ q = qkv + r * 3 * C + h * hs;
      float* __restrict__ keys = own_k + (r * heads + h) * own_capacity * hs;
      float* __restrict__ values = own_v + (r * heads + h) * own_capacity * hs;
      for (int64_t d = 0; d < hs; ++d) {
        keys[t * hs + d] = q[C + d];
        values[t * hs + d] = q[2 * C + d];
      }
      const float* __restrict__ pk = prefix_k + (g * heads + h) * prefix_capacity * hs;
      const float* __restrict__ pv = prefix_v + (g * heads + h) * prefix_capacity * hs;

      score_keys<HS>(q, pk, P, hs, scale, s);
      score_keys<HS>(q, keys, t + 1, hs, scale, s + P);
      for (int64_t j = T - 1; j < n - 1; j += T) s[j] = lowest;
      float top = lowest;
#pragma omp simd reduction(max : top)
      for (int64_t j = 0; j < n; ++j) top = std::max(top, s[j]);
      // Hidden keys get exp(0) here and exactly 0 just after, whatever the exp does far
      // below the maximum.
      for (int64_t j = T - 1; j < n - 1; j += T) s[j] = top;
      exp_shifted(s, n, top);
      for (int64_t j = T - 1; j < n - 1; j += T) s[j] = 0.f;
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < n; ++j) total += s[j];

      std::fill(acc, acc + hs, 0.f);
      accumulate_values<HS>(s, pv, P, hs, acc);
      accumulate_values<HS>(s + P, values, t + 1, hs, acc);
      float* __restrict__ o = out + r * C + h * hs;
      const float inv = 1.f / total;
      for (int64_t d = 0; d < hs; ++d) o[d] = acc[d] * inv;
    }
  });
}

// qkv (R, 3C): the new token's query, key and value of every row. prefix_k/v (Gcap, nh, Pcap,
// hs) and own_k/v (Rcap, nh, Lcap, hs): one layer of the cache, written at own position t.
// group_of_row (>= R,) int64: the prefix row each row attends. Returns (R, C): the attention
// output, heads side by side.
torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& prefix_k,
                               const torch::Tensor& prefix_v, torch::Tensor own_k,
                               torch::Tensor own_v, const torch::Tensor& group_of_row,
                               int64_t prefix_len, int64_t t, int64_t transition_dim) {
  const std::initializer_list<const torch::Tensor*> tensors = {&qkv, &prefix_k, &prefix_v, &own_k,
                                                                &own_v};
  for (const torch::Tensor* x : tensors) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == torch::kFloat32 &&
                    x->is_contiguous(),
                "decode_attention takes contiguous float32 CPU tensors");
  }
  TORCH_CHECK(prefix_k.dim() == 4 && own_k.dim() == 4 && qkv.dim() == 2, "bad tensor ranks");
  TORCH_CHECK(prefix_v.sizes() == prefix_k.sizes() && own_v.sizes() == own_k.sizes(),
              "keys and values differ in shape");
  const int64_t rows = qkv.size(0), heads = own_k.size(1), hs = own_k.size(3);
  TT_CHECK(qkv.size(1) == 3 * heads * hs, "qkv has %lld columns, not 3 x %lld x %lld",
           static_cast<long long>(qkv.size(1)), static_cast<long long>(heads),
           static_cast<long long>(hs));
  TT_CHECK(hs <= kMaxHeadSize, "head size %lld exceeds %lld", static_cast<long long>(hs),
           static_cast<long long>(kMaxHeadSize));
  TORCH_CHECK(prefix_k.size(1) == heads && prefix_k.size(3) == hs, "prefix shape mismatch");
  TORCH_CHECK(rows <= own_k.size(0), "more rows than the cache holds");
  TORCH_CHECK(group_of_row.device().is_cpu() && group_of_row.scalar_type() == torch::kInt64 &&
                  group_of_row.is_contiguous() && group_of_row.dim() == 1 &&
                  group_of_row.size(0) >= rows,
              "group_of_row must be a contiguous int64 CPU tensor with a group for every row");
  const int64_t* group = group_of_row.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TT_CHECK(group[r] >= 0 && group[r] < prefix_k.size(0),
             "row %lld names prefix row %lld, outside the cache's %lld", static_cast<long long>(r),
             static_cast<long long>(group[r]), static_cast<long long>(prefix_k.size(0)));
  }
  TORCH_CHECK(prefix_len >= 1 && prefix_len <= prefix_k.size(2), "bad prefix length");
  TT_CHECK(t >= 0 && t < own_k.size(2), "position %lld outside the cache",
           static_cast<long long>(t));
  TORCH_CHECK(transition_dim >= 1, "bad transition_dim");
  auto out = torch::empty({rows, heads * hs}, qkv.options());
  const auto run = [&](auto kernel) {
    kernel(qkv.data_ptr<float>(), prefix_k.data_ptr<float>(), prefix_v.data_ptr<float>(),
           own_k.data_ptr<float>(), own_v.data_ptr<float>(), out.data_ptr<float>(), rows, heads,
           hs, prefix_k.size(2), own_k.size(2), group, prefix_len, t, transition_dim);
  };
  switch (hs) {
    case 16: run(attend_rows<16>); break;
    case 32: run(attend_rows<32>); break;
    case 64: run(attend_rows<64>); break;
    default: run(attend_rows<0>);
  }
  return out;
}

// Rows of C columns that a pointwise pass (norm, bias, GELU) runs on one thread: a few
// microseconds of work. Each parallel region costs a hand-off to the other threads and a wait
// for the slowest; with idle cores that is cheap, but on a machine whose cores are busy every
// region waits for a thread to be scheduled. So a decode step of a few dozen rows keeps its
// parallel regions for the matrix products and the attention.
inline int64_t serial_rows(int64_t C) { return std::max<int64_t>(1, (int64_t{1} << 15) / C); }

// x += bias (per column), then out = LayerNorm(x) over the C columns of each row.
void add_bias_layer_norm(torch::Tensor& x, const torch::Tensor* bias, const torch::Tensor& weight,
                         const torch::Tensor& shift, double eps, torch::Tensor& out) {
  const int64_t rows = x.size(0), C = x.size(1);
  float* xs = x.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  const float* w = weight.data_ptr<float>();
  const float* sh = shift.data_ptr<float>();
  at::parallel_for(0, rows, serial_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* __restrict__ row = xs + r * C;
      float* __restrict__ o = os + r * C;
      if (b)
        for (int64_t c = 0; c < C; ++c) row[c] += b[c];
      float mean = 0.f;
#pragma omp simd reduction(+ : mean)
      for (int64_t c = 0; c < C; ++c) mean += row[c];
      mean /= C;
      float var = 0.f;
#pragma omp simd reduction(+ : var)
      for (int64_t c = 0; c < C; ++c) var += (row[c] - mean) * (row[c] - mean);
      const float inv = 1.f / std::sqrt(var / C + static_cast<float>(eps));
      for (int64_t c = 0; c < C; ++c) o[c] = (row[c] - mean) * inv * w[c] + sh[c];
    }
  });
}

// x = GELU(x + bias) in place, the exact (erf) form of nn.GELU.
void add_bias_gelu(torch::Tensor& x, const torch::Tensor& bias) {
  const int64_t rows = x.size(0), C = x.size(1);
  float* xs = x.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  const float root_half = static_cast<float>(M_SQRT1_2);
  at::parallel_for(0, rows, serial_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* __restrict__ row = xs + r * C;
      int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
      for (; c + 8 <= C; c += 8) {
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(b + c));
        const __m256 e = erf_approx(_mm256_mul_ps(v, _mm256_set1_ps(root_half)));
        const __m256 half_v = _mm256_mul_ps(v, _mm256_set1_ps(0.5f));
        _mm256_storeu_ps(row + c, _mm256_fmadd_ps(half_v, e, half_v));
      }
#endif
      for (; c < C; ++c) {
        const float v = row[c] + b[c];
        row[c] = 0.5f * v * (1.f + std::erf(v * root_half));
      }
    }
  });
}

// One transformer block (GPT-2 pre-norm, eval mode) for one new token per row, with the
// attention above: x (R, C) -> x + attn(ln_1(x)) -> that + mlp(ln_2(that)). The matrix
// products go to ATen (MKL); norms, bias, GELU and attention are fused loops here, which at a
// few dozen rows cost less than the operator calls they replace. The weight matrices come transposed, (in, out) and contiguous: MKL packs them for
// each product, and copies this layout faster than nn.Linear's (out, in).
torch::Tensor decode_block(const torch::Tensor& x, const torch::Tensor& ln_1_weight,
                           const torch::Tensor& ln_1_bias, double ln_1_eps,
                           const torch::Tensor& attn_weight, const torch::Tensor& attn_bias,
                           const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                           const torch::Tensor& ln_2_weight, const torch::Tensor& ln_2_bias,
                           double ln_2_eps, const torch::Tensor& fc_weight,
                           const torch::Tensor& fc_bias, const torch::Tensor& out_weight,
                           const torch::Tensor& out_bias, const torch::Tensor& prefix_k,
                           const torch::Tensor& prefix_v, torch::Tensor own_k,
                           torch::Tensor own_v, const torch::Tensor& group_of_row,
                           int64_t prefix_len, int64_t t, int64_t transition_dim) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat32 &&
                  x.device().is_cpu(),
              "decode_block takes x as a contiguous float32 CPU tensor (rows, C)");
  const int64_t C = x.size(1);
  for (const torch::Tensor* p : {&ln_1_weight, &ln_1_bias, &proj_bias, &ln_2_weight,
                                 &ln_2_bias, &out_bias}) {
    TORCH_CHECK(p->numel() == C && p->is_contiguous(), "a norm or bias has the wrong size");
  }
  TORCH_CHECK(fc_bias.numel() == fc_weight.size(1) && fc_bias.is_contiguous(),
              "fc bias has the wrong size");
  auto h = torch::empty_like(x);
  auto residual = x.clone();
  add_bias_layer_norm(residual, nullptr, ln_1_weight, ln_1_bias, ln_1_eps, h);
  const auto qkv = at::addmm(attn_bias, h, attn_weight);  // (R, 3C)
  const auto y = decode_attention(qkv, prefix_k, prefix_v, own_k, own_v, group_of_row,
                                  prefix_len, t, transition_dim);
  residual.addmm_(y, proj_weight);  // x + y W; its bias joins in the norm's pass
  add_bias_layer_norm(residual, &proj_bias, ln_2_weight, ln_2_bias, ln_2_eps, h);
  auto hidden = at::mm(h, fc_weight);  // (R, 4C)
  add_bias_gelu(hidden, fc_bias);
  residual.addmm_(hidden, out_weight);
  residual.add_(out_bias);
  return residual;
}

// A TrajectoryGPT's decode step bound to its parameters and one cache's buffers, so a step is
// one call: embedding, every block, final norm and the position's head.
class Decoder {
 public:
  static constexpr size_t kPerLayer = 16;  // 12 parameters, then the 4 cache buffers

  Decoder(std::vector<torch::Tensor> layers, std::vector<double> eps, torch::Tensor tok_emb,
          torch::Tensor pos_emb, torch::Tensor ln_f_weight, torch::Tensor ln_f_bias,
          double ln_f_eps, torch::Tensor head_weight, torch::Tensor head_bias,
          int64_t transition_dim)
      : layers_(std::move(layers)), eps_(std::move(eps)), tok_emb_(std::move(tok_emb)),
        pos_emb_(std::move(pos_emb)), ln_f_weight_(std::move(ln_f_weight)),
        ln_f_bias_(std::move(ln_f_bias)), ln_f_eps_(ln_f_eps),
        head_weight_(std::move(head_weight)), head_bias_(std::move(head_bias)),
        T_(transition_dim), n_bins_(head_bias_.size(1)) {
    TT_CHECK(layers_.size() % kPerLayer == 0 && eps_.size() == 2 * layers_.size() / kPerLayer,
             "Decoder: %lld tensors and 2 eps per layer", static_cast<long long>(kPerLayer));
  }

  // Logits (R, N) of one new token per row at absolute `position`, whose keys and values go to
  // the rows' own position `own_position` (after a shared prefix of `prefix_len`). `extra`
  // (R, C), or empty, is one more input per row (a model's observation vector).
  torch::Tensor step(const torch::Tensor& tokens, int64_t position, int64_t prefix_len,
                     int64_t own_position, const torch::Tensor& group_of_row,
                     const torch::Tensor& extra) {
    const int64_t dim = position % T_;
    auto x = tok_emb_.index_select(0, tokens + dim * n_bins_);  // the dimension's own table
    x.add_(pos_emb_[position]);
    if (extra.numel() > 0) x.add_(extra);
    const auto* p = layers_.data();
    for (size_t layer = 0; layer < layers_.size() / kPerLayer; ++layer, p += kPerLayer) {
      x = decode_block(x, p[0], p[1], eps_[2 * layer], p[2], p[3], p[4], p[5], p[6], p[7],
                       eps_[2 * layer + 1], p[8], p[9], p[10], p[11], p[12], p[13], p[14],
                       p[15], group_of_row, prefix_len, own_position, T_);
    }
    auto h = torch::empty_like(x);
    add_bias_layer_norm(x, nullptr, ln_f_weight_, ln_f_bias_, ln_f_eps_, h);
    return at::addmm(head_bias_[dim], h, head_weight_[dim]);
  }

 private:
  std::vector<torch::Tensor> layers_;
  std::vector<double> eps_;
  torch::Tensor tok_emb_, pos_emb_, ln_f_weight_, ln_f_bias_;
  double ln_f_eps_;
  torch::Tensor head_weight_, head_bias_;
  int64_t T_, n_bins_;
};

}  // namespace

namespace {

// splitmix64's output function: a bijective mix of a 64-bit counter into 64 random bits.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Dropout of `input` with probability p: returns (input * scale where kept, else 0; the keep
// mask). Element i is kept when its 32-bit draw, half of splitmix64(seed + i / 2), is at least
// p * 2^32.
std::vector<torch::Tensor> dropout(const torch::Tensor& input, double p, int64_t seed,
                                   double scale) {
  TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == torch::kFloat32 &&
                  input.is_contiguous(),
              "dropout: a contiguous float32 CPU tensor");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout: 0 <= p < 1");
  auto output = torch::empty_like(input);
  auto keep = torch::empty(input.sizes(), input.options().dtype(torch::kBool));
  const float* in = input.data_ptr<float>();
  float* out = output.data_ptr<float>();
  bool* kept = keep.data_ptr<bool>();
  const int64_t n = input.numel();
  const uint64_t threshold = static_cast<uint64_t>(std::llround(p * 4294967296.0));
  const uint64_t base = static_cast<uint64_t>(seed);
  const float factor = static_cast<float>(scale);
  at::parallel_for(0, (n + 1) / 2, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const uint64_t draw = splitmix64(base + static_cast<uint64_t>(pair));
      const int64_t i = 2 * pair;
      const bool k0 = (draw & 0xffffffffULL) >= threshold;
      kept[i] = k0;
      out[i] = k0 ? in[i] * factor : 0.0f;
      if (i + 1 < n) {
        const bool k1 = (draw >> 32) >= threshold;
        kept[i + 1] = k1;
        out[i + 1] = k1 ? in[i + 1] * factor : 0.0f;
      }
    }
  });
  return {output, keep};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dropout", &dropout,
        "Training dropout: (input * scale where kept, else 0; keep mask) (CPU, float32)");
  m.def("decode_attention", &decode_attention,
        "One decode step of attention over a shared-prefix KV cache (CPU, float32)");
  pybind11::class_<Decoder>(m, "Decoder")
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<double>, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, double, torch::Tensor,
                          torch::Tensor, int64_t>())
      .def("step", &Decoder::step, "logits of one new token per row");
}
