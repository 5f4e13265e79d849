// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
// Transformers", 2022) of one linear weight to W4A16 (core/int4.h), and the layer-wise
// reconstruction error it minimises. Pure math on host arrays; model/calibrate.cpp feeds it
// the Hessians of a real model.
#pragma once
#include <cstdint>
#include <vector>

#include "model/quantize.h"

namespace sala {

struct GptqOptions {
  int32_t group = 128;     // input columns per scale
  double damp = 0.01;      // added to H's diagonal, as a fraction of its mean
  int32_t block = 128;     // columns per lazy-update block
  bool act_order = false;  // columns in order of decreasing H[k, k]; scales from the original
                           // W per group ("static groups": no g_idx, compressed-tensors'
                           // actorder "weight")
};

// W4A16 codes of W [N, K] (row-major fp32) for the Hessian H [K, K] (row-major, symmetric,
// H = Σ_t x_t x_tᵀ over the calibration rows x_t [K] of the layer's input; any positive
// multiple gives the same codes up to damping). Per block of `block` columns, each column k is
// quantized with its group's scale, and its error (w_k − q_k) / U[k, k] is spread over the
// columns still to come through U = the upper Cholesky factor of H⁻¹ (H damped). Group scales
// (bf16, as core/int4.h's RTN) are taken from the error-updated weights when a group starts,
// or from the original W with act_order. Columns with H[k, k] == 0 (never active) quantize
// to 0. sala::Error if the damped H is not positive definite.
Int4Codes gptq_quantize(const float* w, int64_t N, int64_t K, std::vector<double> H,
                        const GptqOptions& opts);

// RTN codes (core/int4.h int4_quantize_rtn) of W [N, K] with `group`.
Int4Codes rtn_quantize(const float* w, int64_t N, int64_t K, int32_t group);

// W ≈ q · scale: the dequantized [N, K] fp32 matrix of `codes`.
std::vector<float> int4_dequantize(const Int4Codes& codes, int64_t N, int64_t K);

// Σ_n (W − Q)[n] · H · (W − Q)[n]ᵀ = ‖X Wᵀ − X Qᵀ‖² over the calibration rows: the layer-wise
// output error GPTQ minimises (Q the dequantized codes, H undamped).
double reconstruction_error(const float* w, const Int4Codes& codes, int64_t N, int64_t K,
                            const std::vector<double>& H);

}  // namespace sala
