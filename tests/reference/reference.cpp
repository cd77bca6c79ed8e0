#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace kvattn_test::ref {

double alibi_slope(int head, int num_heads) {
  int n = 1;
  while (2 * n <= num_heads) n *= 2;
  if (head < n) return std::pow(2.0, -8.0 * (head + 1) / n);
  int k = head - n;
  return std::pow(2.0, -4.0 * (2 * k + 1) / n);
}

double rope_frequency(int t, int dim, const kvattn::RopeConfig& cfg) {
  double f = std::pow(double(cfg.rope_theta), -2.0 * t / dim) / double(cfg.rope_scale);
  if (!cfg.llama31) return f;
  const auto& s = *cfg.llama31;
  double wavelength = 2.0 * std::numbers::pi / f;
  double orig = s.original_max_position;
  if (wavelength < orig / s.high_freq_factor) return f;
  if (wavelength > orig / s.low_freq_factor) return f / s.factor;
  double g = (orig / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - g) * f / s.factor + g * f;
}

void apply_rope(double* x, int dim, double pos, const kvattn::RopeConfig& cfg) {
  const int half = dim / 2;
  std::vector<double> y(x, x + dim);
  for (int t = 0; t < half; ++t) {
    double a = pos * rope_frequency(t, dim, cfg);
    int i0 = cfg.interleave ? 2 * t : t;
    int i1 = cfg.interleave ? 2 * t + 1 : t + half;
    y[i0] = x[i0] * std::cos(a) - x[i1] * std::sin(a);
    y[i1] = x[i1] * std::cos(a) + x[i0] * std::sin(a);
  }
  std::copy(y.begin(), y.end(), x);
}

MaskFn custom_mask_bits(const uint8_t* bytes, int64_t kv_len) {
  return [bytes, kv_len](int64_t i, int64_t j) {
    int64_t bit = i * kv_len + j;
    return ((bytes[bit / 8] >> (bit % 8)) & 1) != 0;
  };
}

MaskFn bsr_pattern(std::vector<int32_t> indptr, std::vector<int32_t> indices, int64_t R,
                   int64_t C) {
  return [indptr = std::move(indptr), indices = std::move(indices), R, C](int64_t i, int64_t j) {
    int64_t br = i / R, bc = j / C;
    for (int32_t n = indptr[size_t(br)]; n < indptr[size_t(br) + 1]; ++n)
      if (indices[size_t(n)] == bc) return true;
    return false;
  };
}

Result attention(const Request& r, const kvattn::Variant& var) {
  const int hq = r.num_qo_heads, hkv = r.num_kv_heads, dqk = r.head_dim_qk, dvo = r.head_dim_vo;
  const int group = hq / hkv;
  const UserHooks* user = r.user;
  const double ninf = -std::numeric_limits<double>::infinity();
  const double sm_scale = var.sm_scale ? double(*var.sm_scale) : 1.0 / std::sqrt(double(dqk));
  const double logit_scale = sm_scale * double(var.q_scale) * double(var.k_scale);

  // Rotated copies of q and k (RoPE: query i at q_pos0 + i, key j at j).
  std::vector<double> q(r.q, r.q + r.qo_len * hq * dqk), k(r.k, r.k + r.kv_len * hkv * dqk);
  if (var.rope) {
    for (int64_t i = 0; i < r.qo_len; ++i)
      for (int h = 0; h < hq; ++h)
        apply_rope(&q[size_t((i * hq + h) * dqk)], dqk, double(r.q_pos0 + i), *var.rope);
    for (int64_t j = 0; j < r.kv_len; ++j)
      for (int h = 0; h < hkv; ++h)
        apply_rope(&k[size_t((j * hkv + h) * dqk)], dqk, double(j), *var.rope);
  }

  Result out;
  out.o.assign(size_t(r.qo_len * hq * dvo), 0.0);
  out.o_mag.assign(out.o.size(), 0.0);
  out.lse.assign(size_t(r.qo_len * hq), ninf);
  std::vector<double> s(size_t(r.kv_len));
  for (int64_t i = 0; i < r.qo_len; ++i) {
    const int64_t pos_i = r.q_pos0 + i;
    for (int h = 0; h < hq; ++h) {
      const int hk = h / group;
      const double* qi = &q[size_t((i * hq + h) * dqk)];
      double m = ninf;
      for (int64_t j = 0; j < r.kv_len; ++j) {
        bool visible = true;
        if (var.causal && j > pos_i) visible = false;
        if (var.window_left >= 0 && j < pos_i - var.window_left) visible = false;
        if (r.mask && !r.mask(i, j)) visible = false;
        if (user && user->logits_mask && !user->logits_mask(r.batch, pos_i, j, h, hk)) visible = false;
        if (!visible) {
          s[size_t(j)] = ninf;
          continue;
        }
        const double* kj = &k[size_t((j * hkv + hk) * dqk)];
        double dot = 0;
        for (int e = 0; e < dqk; ++e) dot += qi[e] * kj[e];
        double x = logit_scale * dot;
        if (var.logits_soft_cap > 0) {
          double c = var.logits_soft_cap;
          x = c * std::tanh(x / c);
        }
        if (var.alibi) x += alibi_slope(h, hq) * double(j - pos_i);
        if (user && user->logits_transform) x = user->logits_transform(x, r.batch, pos_i, j, h, hk);
        s[size_t(j)] = x;
        m = std::max(m, x);
      }
      // Weights: sigmoid(s + bias), a user variant's transformed logits, or exp(s - m) / sum (a
      // user sink's e^sink joins the sum).
      const bool softmax = !var.sigmoid && (!user || user->use_softmax);
      const bool sink = softmax && user && user->sink_logit;
      const double sink_logit = sink ? user->sink_logit(r.batch, h) : ninf;
      if (sink) m = std::max(m, sink_logit);
      std::vector<double> w(size_t(r.kv_len), 0.0);
      double sum = sink ? std::exp(sink_logit - m) : 0.0;
      for (int64_t j = 0; j < r.kv_len; ++j) {
        if (s[size_t(j)] == ninf) continue;
        w[size_t(j)] = var.sigmoid ? 1.0 / (1.0 + std::exp(-(s[size_t(j)] + var.sigmoid_bias)))
                       : softmax   ? std::exp(s[size_t(j)] - m)
                                   : s[size_t(j)];
        sum += w[size_t(j)];
      }
      if (softmax && sum > 0) {
        for (double& x : w) x /= sum;
        out.lse[size_t(i * hq + h)] = (m + std::log(sum)) / std::numbers::ln2;
      }
      double* o = &out.o[size_t((i * hq + h) * dvo)];
      double* mag = &out.o_mag[size_t((i * hq + h) * dvo)];
      for (int64_t j = 0; j < r.kv_len; ++j) {
        if (w[size_t(j)] == 0) continue;
        const double* vj = &r.v[size_t((j * hkv + hk) * dvo)];
        for (int e = 0; e < dvo; ++e) {
          o[e] += w[size_t(j)] * vj[e] * double(var.v_scale);
          mag[e] += std::abs(w[size_t(j)] * vj[e] * double(var.v_scale));
        }
      }
      if (user && user->output_transform)
        for (int e = 0; e < dvo; ++e) {
          // The transform's local slope scales the accumulated rounding error (compare.h).
          const double eps = 1e-6 * std::max(1.0, std::abs(o[e]));
          const double slope = std::abs(user->output_transform(o[e] + eps, r.batch, pos_i, h, e) -
                                        user->output_transform(o[e] - eps, r.batch, pos_i, h, e)) / (2 * eps);
          o[e] = user->output_transform(o[e], r.batch, pos_i, h, e);
          mag[e] *= std::max(slope, 1.0);
        }
    }
  }
  return out;
}

Result merge_states(const std::vector<std::vector<double>>& o, const std::vector<double>& lse) {
  const double inf = std::numeric_limits<double>::infinity();
  const size_t D = o.empty() ? 0 : o[0].size();
  Result out;
  out.o.assign(D, 0.0);
  out.o_mag.assign(D, 0.0);
  out.lse.assign(1, -inf);
  double m = -inf;
  for (double l : lse) m = std::max(m, l);
  if (m == -inf) return out;
  double sum = 0;
  for (double l : lse)
    if (l != -inf) sum += std::exp2(l - m);
  out.lse[0] = m + std::log2(sum);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (lse[i] == -inf) continue;
    const double w = std::exp2(lse[i] - out.lse[0]);
    for (size_t e = 0; e < D; ++e) {
      out.o[e] += w * o[i][e];
      out.o_mag[e] = std::max(out.o_mag[e], std::abs(o[i][e]));
    }
  }
  return out;
}

}  // namespace kvattn_test::ref
