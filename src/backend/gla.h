// Constants of the lightning layers' simple GLA (SPEC §8.3-8.4) that every backend shares.
// Plain constexpr, no other includes: CPU and CUDA sources (host and device) both use it.
#pragma once

namespace sala {

// Chunk length of the chunked GLA form: the HF reference's chunk, which the CPU backend
// uses for calls of >= kGlaChunk tokens and the CUDA kernels tile by (decay tables
// [nh][kGlaChunk + 1]).
inline constexpr int kGlaChunk = 64;

}  // namespace sala
