// Rotary position embedding (SEMANTICS.md): rotate-half pairs (t, t + d/2) or interleaved pairs
// (2t, 2t + 1), frequency theta^(-2t/d) / rope_scale, optionally Llama 3.1 scaled.
#pragma once

#include "kernels/variants/params.cuh"

namespace kvattn::kernels {

KVATTN_HD float rope_frequency(const VariantParams& p, int t, int rotary_dim, bool llama31) {
  float f = powf(p.rope_theta, -2.0f * float(t) / float(rotary_dim)) / p.rope_scale;
  if (!llama31) return f;
  const float two_pi = 6.283185307179586f;
  float wavelength = two_pi / f;
  float low_wl = p.llama31_original_max_position / p.llama31_low_freq_factor;
  float high_wl = p.llama31_original_max_position / p.llama31_high_freq_factor;
  if (wavelength < high_wl) return f;
  if (wavelength > low_wl) return f / p.llama31_factor;
  float g = (p.llama31_original_max_position / wavelength - p.llama31_low_freq_factor) /
            (p.llama31_high_freq_factor - p.llama31_low_freq_factor);
  return (1.0f - g) * f / p.llama31_factor + g * f;
}

// Rotates the first rotary_dim elements of x (length dim) in place for position pos.
KVATTN_HD void rope_rotate(const VariantParams& p, float* x, int dim, int rotary_dim, int64_t pos,
                           bool interleave, bool llama31) {
  int half = rotary_dim / 2;
  for (int t = 0; t < half; ++t) {
    float a = float(pos) * rope_frequency(p, t, rotary_dim, llama31);
    float c = cosf(a), s = sinf(a);
    int i0 = interleave ? 2 * t : t;
    int i1 = interleave ? 2 * t + 1 : t + half;
    float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x1 * c + x0 * s;
  }
}

}  // namespace kvattn::kernels
