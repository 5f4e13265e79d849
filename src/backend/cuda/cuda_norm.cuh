// Device code shared by kernels of more than one file, so that a fused kernel computes the
// numbers of the kernels it replaces with the very same code (bit for bit, for T = bf16 and
// T = float):
//   MulSigmoid  the output gate: mul_sigmoid (cuda_ops.cu), rmsnorm_mul_sigmoid (cuda_norm.cu)
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace sala::cuda {

template <typename T>
struct MulSigmoid {  // T(a * T(sigmoid(gate)))
  __device__ float operator()(float gate, float a) const {
    return a * rnd<T>(1.f / (1.f + expf(-gate)));
  }
};

}  // namespace sala::cuda
