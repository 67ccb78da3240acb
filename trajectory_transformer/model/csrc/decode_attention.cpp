// One decode step of attention over a shared-prefix KV cache, on the CPU.
//
// The planner decodes one token for every row (beam) at a time. Each row attends over its
// group's shared prefix (the environment's context, cached once per group) and over its own
// planned positions. In eager PyTorch that is a dozen small operators per layer (permutes, two
// batched matmuls, a concatenation, a softmax); here it is one pass per (row, head) that also
// writes the new key and value into the cache. The result equals
// `trajectory_transformer.model.gpt.shared_prefix_attention` up to float rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kMaxHeadSize = 256;

// HS > 0: head size known at compile time (unrolled, vectorised); HS == 0: any head size.
template <int64_t HS>
void attend_rows(const float* qkv, const float* prefix_k, const float* prefix_v, float* own_k,
                 float* own_v, float* out, int64_t rows, int64_t heads, int64_t head_size,
                 int64_t prefix_capacity, int64_t own_capacity, int64_t groups, int64_t members,
                 int64_t prefix_len, int64_t t, int64_t transition_dim) {
  const int64_t hs = HS > 0 ? HS : head_size;
  const int64_t C = heads * hs, P = prefix_len, T = transition_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // The query sits at absolute position P + t; a key is hidden when it is the value token of
  // an earlier transition (position % T == T - 1, before the query). Built with -ffast-math
  // (vectorised exp and sums), so no infinities anywhere: hidden keys are skipped when scoring
  // and get weight exactly 0 after the exp.
  const float lowest = std::numeric_limits<float>::lowest();
  at::parallel_for(0, rows * heads, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(P + t + 1);
    float* __restrict__ s = buffer.data();
    float acc[kMaxHeadSize];  // a local array: no aliasing, so it lives in registers
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / heads, h = task % heads;
      const int64_t g = (r / members) % groups;  // rows are ordered (copy, group, member)
      const float* __restrict__ q = qkv + r * 3 * C + h * hs;
      float* __restrict__ keys = own_k + (r * heads + h) * own_capacity * hs;
      float* __restrict__ values = own_v + (r * heads + h) * own_capacity * hs;
      for (int64_t d = 0; d < hs; ++d) {
        keys[t * hs + d] = q[C + d];
        values[t * hs + d] = q[2 * C + d];
      }
      const float* __restrict__ pk = prefix_k + (g * heads + h) * prefix_capacity * hs;
      const float* __restrict__ pv = prefix_v + (g * heads + h) * prefix_capacity * hs;

      float top = lowest;
      int64_t phase = 0;  // position % T, kept without a division per key
      for (int64_t j = 0; j < P; ++j) {
        if (phase != T - 1) {
          float dot = 0.f;
          for (int64_t d = 0; d < hs; ++d) dot += q[d] * pk[j * hs + d];
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        if (++phase == T) phase = 0;
      }
      for (int64_t i = 0; i <= t; ++i) {
        if (phase != T - 1 || i == t) {
          float dot = 0.f;
          for (int64_t d = 0; d < hs; ++d) dot += q[d] * keys[i * hs + d];
          s[P + i] = dot * scale;
          top = std::max(top, s[P + i]);
        }
        if (++phase == T) phase = 0;
      }

      // Hidden keys get exp(0) here and exactly 0 below (a very negative score instead would
      // send the vectorised exp down its slow path for out-of-range inputs).
      for (int64_t j = T - 1; j < P + t; j += T) s[j] = top;
      for (int64_t j = 0; j <= P + t; ++j) s[j] = std::exp(s[j] - top);
      for (int64_t j = T - 1; j < P + t; j += T) s[j] = 0.f;
      float total = 0.f;
      for (int64_t j = 0; j <= P + t; ++j) total += s[j];
      for (int64_t d = 0; d < hs; ++d) acc[d] = 0.f;
      for (int64_t j = 0; j < P; ++j) {
        const float w = s[j];
        for (int64_t d = 0; d < hs; ++d) acc[d] += w * pv[j * hs + d];
      }
      for (int64_t i = 0; i <= t; ++i) {
        const float w = s[P + i];
        for (int64_t d = 0; d < hs; ++d) acc[d] += w * values[i * hs + d];
      }
      float* __restrict__ o = out + r * C + h * hs;
      const float inv = 1.f / total;
      for (int64_t d = 0; d < hs; ++d) o[d] = acc[d] * inv;
    }
  });
}

// qkv (R, 3C): the new token's query, key and value of every row. prefix_k/v (Gcap, nh, Pcap,
// hs) and own_k/v (Rcap, nh, Lcap, hs): one layer of the cache, written at own position t.
// Returns (R, C): the attention output, heads side by side.
torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& prefix_k,
                               const torch::Tensor& prefix_v, torch::Tensor own_k,
                               torch::Tensor own_v, int64_t groups, int64_t members,
                               int64_t prefix_len, int64_t t, int64_t transition_dim) {
  for (const torch::Tensor* x : {&qkv, &prefix_k, &prefix_v, static_cast<const torch::Tensor*>(&own_k), static_cast<const torch::Tensor*>(&own_v)}) {
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == torch::kFloat32 &&
                    x->is_contiguous(),
                "decode_attention takes contiguous float32 CPU tensors");
  }
  TORCH_CHECK(prefix_k.dim() == 4 && own_k.dim() == 4 && qkv.dim() == 2, "bad tensor ranks");
  TORCH_CHECK(prefix_v.sizes() == prefix_k.sizes() && own_v.sizes() == own_k.sizes(),
              "keys and values differ in shape");
  const int64_t rows = qkv.size(0), heads = own_k.size(1), hs = own_k.size(3);
  TORCH_CHECK(qkv.size(1) == 3 * heads * hs, "qkv has ", qkv.size(1), " columns, not 3 x ",
              heads, " x ", hs);
  TORCH_CHECK(hs <= kMaxHeadSize, "head size ", hs, " exceeds ", kMaxHeadSize);
  TORCH_CHECK(prefix_k.size(1) == heads && prefix_k.size(3) == hs, "prefix shape mismatch");
  TORCH_CHECK(groups >= 1 && groups <= prefix_k.size(0) && members >= 1, "bad groups/members");
  TORCH_CHECK(rows <= own_k.size(0) && rows % (groups * members) == 0,
              "rows must be whole copies of groups x members and fit the cache");
  TORCH_CHECK(prefix_len >= 1 && prefix_len <= prefix_k.size(2), "bad prefix length");
  TORCH_CHECK(t >= 0 && t < own_k.size(2), "position ", t, " outside the cache");
  TORCH_CHECK(transition_dim >= 1, "bad transition_dim");
  auto out = torch::empty({rows, heads * hs}, qkv.options());
  const auto run = [&](auto kernel) {
    kernel(qkv.data_ptr<float>(), prefix_k.data_ptr<float>(), prefix_v.data_ptr<float>(),
           own_k.data_ptr<float>(), own_v.data_ptr<float>(), out.data_ptr<float>(), rows, heads,
           hs, prefix_k.size(2), own_k.size(2), groups, members, prefix_len, t, transition_dim);
  };
  switch (hs) {
    case 16: run(attend_rows<16>); break;
    case 32: run(attend_rows<32>); break;
    case 64: run(attend_rows<64>); break;
    default: run(attend_rows<0>);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention,
        "One decode step of attention over a shared-prefix KV cache (CPU, float32)");
}
