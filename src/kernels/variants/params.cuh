// The flat parameter block of every variant: plain data, identical on host and device.
#pragma once

#include "kernels/common/host_device.cuh"

namespace kvattn::kernels {

// Built-in feature bits. A kernel compiled for a fixed set bakes them in as a constant; the CPU
// backend reads them from VariantParams::features at run time (kDynamicFeatures).
enum VariantFeature : uint32_t {
  kCausal = 1u << 0,
  kSlidingWindow = 1u << 1,
  kSoftCap = 1u << 2,
  kAlibi = 1u << 3,
  kCustomMask = 1u << 4,
  kSigmoid = 1u << 5,
  kRope = 1u << 6,
  kRopeLlama31 = 1u << 7,
  kRopeInterleave = 1u << 8,
};
constexpr uint32_t kDynamicFeatures = 0xffffffffu;

struct VariantParams {
  uint32_t features = 0;
  float sm_scale = 1.0f;  // softmax scale with q_scale * k_scale folded in
  float v_scale = 1.0f;
  float soft_cap = 0.0f;
  int32_t window_left = -1;
  float sigmoid_bias = 0.0f;
  int32_t num_qo_heads = 1;  // for the ALiBi slopes
  // RoPE
  float rope_scale = 1.0f;
  float rope_theta = 1.0e4f;
  float llama31_factor = 8.0f, llama31_low_freq_factor = 1.0f, llama31_high_freq_factor = 4.0f,
        llama31_original_max_position = 8192.0f;
  // Custom mask: request b's bits start at byte mask_indptr[b].
  const uint8_t* custom_mask = nullptr;
  const int32_t* mask_indptr = nullptr;
  // A user variant's Params block (kernels/variants/custom.cuh), null without one; and what its
  // hooks are told: the KV head of a query head, and whether every request is one sequence
  // (block-sparse: block rows are parts of sequence 0).
  const void* user_params = nullptr;
  int32_t num_kv_heads = 1;
  int32_t one_sequence = 0;
};

// Where one logit sits: request, head, local indices and absolute positions.
struct LogitCoord {
  int32_t request;
  int32_t qo_head;
  int64_t q_idx;   // query row within the request
  int64_t kv_idx;  // key within the request (custom-mask column)
  int64_t q_pos;   // absolute positions (causal, window, ALiBi)
  int64_t kv_pos;
  int64_t kv_len;
};

}  // namespace kvattn::kernels
