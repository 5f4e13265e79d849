// CUDA backend, host side of the facade: construction (the owned classes, in dependency
// order), weights and activations, init_caches, transfers to the host and begin_step. The op
// dispatch is in cuda_backend_ops.cpp; the kernels are declared in cuda_kernels.h.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "backend/cuda/cuda_host_util.h"
#include "core/check.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/int4.h"
#include "core/safetensors.h"

namespace sala {
using namespace sala::cuda;
using namespace sala::cuda_host;

namespace {
int max_smem_optin() {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  SALA_CHECK(count > 0, "no CUDA device");
  int dev = 0, smem = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return smem;
}
}  // namespace

// fp32 mode (the correctness contract) runs eagerly: its GEMMs are cuBLASLt at every row
// count, whose kernel choice depends on the rows, so a recording padded to its batch bucket
// would not give the eager step's bits.
CudaBackend::CudaBackend(const BackendOptions& opts)
    : device_(opts.cuda_device),
      bf16_mode_(opts.mode == NumericMode::BF16),
      fp8_(opts.fp8_weights),
      fp8_producer_codes_(opts.fp8_producer_codes),
      kv_fmt_(opts.kv_cache_dtype == KvCacheDtype::FP8_E4M3   ? kKvE4m3
              : opts.kv_cache_dtype == KvCacheDtype::FP8_E5M2 ? kKvE5m2
                                                              : kKvAct),
      int4_group_(opts.int4_group_size),
      max_smem_optin_(max_smem_optin()),
      graphs_(opts.cuda_graphs && bf16_mode_, stream_.get()),
      timer_(opts.profile_ops, stream_.get(), graphs_),
      plan_(stream_.get(), arena_, graphs_),
      gemm_(bf16_mode_, stream_.get(), arena_, plan_, graphs_, timer_, opts.int4_prefill_gemm),
      rope_(stream_.get(), arena_, graphs_),
      sparse_(bf16_mode_, max_smem_optin_, opts.attn_min_blocks, opts.sparse_attn_tma,
              opts.fp8_kv_shadow_tokens, stream_.get(), arena_, plan_, graphs_, timer_),
      lightning_(bf16_mode_, opts.gla_workspace_floats, stream_.get(),
                 arena_, plan_, graphs_, timer_, rope_) {
  device_.restore();  // the caller's thread stays on its device (bind_thread switches it)
}

CudaBackend::~CudaBackend() {
  device_.enter();  // the members are destroyed on this backend's GPU
  cudaStreamSynchronize(stream_.get());
}

Tensor CudaBackend::alloc(int64_t rows, int64_t cols, DType dtype) {
  Tensor t{nullptr, dtype, rows, cols};
  t.data = arena_.device(t.nbytes());
  // Poison-free start: zero, as the CPU backend does.
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, std::max<size_t>(t.nbytes(), 1), stream_.get()));
  // The model allocates its workspaces for max_step_tokens rows: size the per-row
  // workspaces of the attention kernels for that many rows now, not in the step loop, and (with
  // FP8 weights) the FP8 GEMMs' activation codes for inputs as large as this tensor.
  sparse_.ensure_rows(rows, false);
  gemm_.reserve_fp8_input(rows, cols);
  return t;
}

Tensor CudaBackend::upload_weight(const TensorView& src) {
  const int64_t cols = src.shape.empty() ? 1 : src.shape.back();
  if (!bf16_mode_) {  // fp32 mode: the checkpoint's values upcast exactly, as CpuBackend
    Tensor t = alloc(src.numel() / std::max<int64_t>(cols, 1), cols, DType::F32);
    std::vector<float> host(size_t(src.numel()));
    src.to_f32(host.data());
    CUDA_CHECK(cudaMemcpyAsync(t.data, host.data(), host.size() * 4, cudaMemcpyHostToDevice, st()));
    stream_.sync();
    return t;
  }
  Tensor t = alloc(src.numel() / std::max<int64_t>(cols, 1), cols, DType::BF16);
  const size_t n = size_t(src.numel());
  if (src.dtype == DType::BF16) {
    // Straight from the view (the checkpoint's mapped pages), not through a zero-filled host
    // copy made on one thread: the 9B's bf16 load took 15.5-19.6 s with that copy, the FP8 load
    // that reads the view 4.7 s (an H100 machine, session 56); this path's time is not yet
    // measured.
    SALA_CHECK(src.nbytes == n * 2, "{}: {} bytes for {} bf16 values", src.name, src.nbytes, n);
    CUDA_CHECK(cudaMemcpyAsync(t.data, src.data, n * 2, cudaMemcpyHostToDevice, st()));
  } else {
    const auto f = std::make_unique_for_overwrite<float[]>(n);
    src.to_f32(f.get());
    const auto host = std::make_unique_for_overwrite<uint16_t[]>(n);
    for (size_t i = 0; i < n; ++i) host[i] = f32_to_bf16(f[i]);
    CUDA_CHECK(cudaMemcpyAsync(t.data, host.get(), n * 2, cudaMemcpyHostToDevice, st()));
  }
  stream_.sync();  // the view and the staging buffer may go away on return
  return t;
}

Weight CudaBackend::upload_linear(const TensorView& src, WeightFormat format) {
  if (format != WeightFormat::FP8_E4M3 && format != WeightFormat::INT4_GROUPED)
    return Backend::upload_linear(src, format);
  if (src.shape.size() != 2)
    fail("{}: a {} weight must be 2-D, not {}", src.name, weight_format_name(format),
         src.shape_str());
  const int64_t rows = src.shape[0], cols = src.shape[1];
  if (format == WeightFormat::FP8_E4M3 && src.dtype == DType::BF16)
    return quantize_fp8_on_device(src);
  // Host buffers left uninitialized: the conversion and the quantization write every element,
  // on all cores (zeroing a 9B model's 37 GB of fp32 on one thread took ~16 s of a load).
  const auto w = std::make_unique_for_overwrite<float[]>(size_t(rows * cols));
  src.to_f32(w.get());
  if (format == WeightFormat::INT4_GROUPED) {  // RTN, core/int4.h (CpuBackend::int4_weight_rtn)
    const int32_t group = int4_group_;
    if (group <= 0 || cols % group != 0 || cols % kInt4PerWord != 0)
      fail("{}: W4A16 needs the input width {} to be a multiple of the group size {} and of 8",
           src.name, cols, group);
    const size_t nwords = size_t(rows * cols / kInt4PerWord);
    const auto words = std::make_unique_for_overwrite<uint32_t[]>(nwords);
    std::vector<float> scales(size_t(rows * (cols / group)));
    int4_quantize_rtn(w.get(), rows, cols, group, words.get(), scales.data());
    return upload_int4_words(src.name, rows, cols, group, words.get(), scales.data());
  }
  const auto codes = std::make_unique_for_overwrite<uint8_t[]>(size_t(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows));
  fp8_quantize_rows(w.get(), rows, cols, codes.get(), scales.data());
  return upload_fp8_codes(src.name, rows, cols, codes.get(), scales.data());
}

// A bf16 weight to FP8 on the device: its rows are what launch_quantize_rows_fp8 quantizes per
// token, so the codes and scales are core/fp8.h's fp8_quantize_rows of the weight bit for bit
// (per output channel), as the host path gives them, without converting the weight to fp32
// and quantizing it on the host (the 9B's FP8 load on an H100 machine: 4.7-5.4 s, against
// 20.2-28.0 s with the host's quantization; session 56). The bf16 copy is freed after.
Weight CudaBackend::quantize_fp8_on_device(const TensorView& src) {
  const int64_t rows = src.shape[0], cols = src.shape[1];
  const size_t n = size_t(rows) * size_t(cols);
  SALA_CHECK(src.nbytes == n * 2, "{}: {} bytes for a bf16 [{}, {}]", src.name, src.nbytes, rows,
             cols);
  const Weight w = alloc_fp8_weight(src.name, rows, cols);
  void* values = arena_.device(n * 2);
  CUDA_CHECK(cudaMemcpyAsync(values, src.data, n * 2, cudaMemcpyHostToDevice, st()));
  launch_quantize_rows_fp8(static_cast<const bf16*>(values), rows, cols, cols,
                           static_cast<uint8_t*>(w.data), w.scales, st());
  stream_.sync();  // the host view may go away; the bf16 copy is no longer read
  arena_.release(values);
  gemm_.note_fp8_weights();
  return w;
}

Weight CudaBackend::upload_fp8(const TensorView& codes, const std::vector<float>& scales) {
  if (codes.dtype != DType::F8_E4M3 || codes.shape.size() != 2)
    fail("{}: not a 2-D F8_E4M3 tensor ({} {})", codes.name, dtype_name(codes.dtype),
         codes.shape_str());
  const int64_t rows = codes.shape[0], cols = codes.shape[1];
  if (int64_t(scales.size()) != rows)
    fail("{}: {} scales for {} output channels", codes.name, scales.size(), rows);
  return upload_fp8_codes(codes.name, rows, cols, codes.data, scales.data());
}

Weight CudaBackend::alloc_fp8_weight(const std::string& name, int64_t rows, int64_t cols) {
  // fp32 mode is refused with fp8_weights (make_cuda_backend); a pre-quantized checkpoint
  // reaches here without the flag.
  if (!bf16_mode_)
    fail("{}: FP8 weights run on the CUDA backend in bf16 mode only (this checkpoint is FP8)",
         name);
  // cuBLASLt's FP8 GEMM reads code rows of 16-byte multiples (cuda_gemm_fp8.cpp).
  if (cols % 16 != 0)
    fail("{}: an FP8 weight [{}, {}] needs a multiple of 16 input columns on the CUDA backend",
         name, rows, cols);
  Weight w{nullptr, WeightFormat::FP8_E4M3, rows, cols, nullptr, int32_t(cols)};
  w.data = arena_.device(size_t(rows) * size_t(cols));
  w.scales = static_cast<float*>(arena_.device(size_t(rows) * sizeof(float)));
  return w;
}

Weight CudaBackend::upload_fp8_codes(const std::string& name, int64_t rows, int64_t cols,
                                     const uint8_t* codes, const float* scales) {
  const Weight w = alloc_fp8_weight(name, rows, cols);
  const size_t n = size_t(rows) * size_t(cols);
  CUDA_CHECK(cudaMemcpyAsync(w.data, codes, n, cudaMemcpyHostToDevice, st()));
  CUDA_CHECK(cudaMemcpyAsync(w.scales, scales, size_t(rows) * sizeof(float),
                             cudaMemcpyHostToDevice, st()));
  stream_.sync();  // the host buffers may go away
  gemm_.note_fp8_weights();
  return w;
}

Weight CudaBackend::upload_int4(const TensorView& packed, const std::vector<float>& scales,
                                int32_t group) {
  if (packed.dtype != DType::I32 || packed.shape.size() != 2)
    fail("{}: not a 2-D I32 tensor ({} {})", packed.name, dtype_name(packed.dtype),
         packed.shape_str());
  const int64_t rows = packed.shape[0], cols = packed.shape[1] * kInt4PerWord;
  if (group <= 0 || cols % group != 0)
    fail("{}: group size {} does not divide the input width {}", packed.name, group, cols);
  if (int64_t(scales.size()) != rows * (cols / group))
    fail("{}: {} scales for {} rows of {} groups", packed.name, scales.size(), rows, cols / group);
  return upload_int4_words(packed.name, rows, cols, group,
                           packed.data, scales.data());
}

Weight CudaBackend::upload_int4_words(const std::string& name, int64_t rows, int64_t cols,
                                      int32_t group, const void* words, const float* scales) {
  SALA_CHECK(group > 0 && cols % group == 0 && cols % kInt4PerWord == 0, "{}: [{}, {}] group {}",
             name, rows, cols, group);
  Weight w{nullptr, WeightFormat::INT4_GROUPED, rows, cols, nullptr, group};
  const int64_t n_words = rows * (cols / kInt4PerWord), n_scales = rows * (cols / group);
  w.data = arena_.device(size_t(n_words) * 4);
  w.scales = static_cast<float*>(arena_.device(size_t(n_scales) * sizeof(float)));
  CUDA_CHECK(cudaMemcpyAsync(w.data, words, size_t(n_words) * 4, cudaMemcpyHostToDevice, st()));
  CUDA_CHECK(cudaMemcpyAsync(w.scales, scales, size_t(n_scales) * sizeof(float),
                             cudaMemcpyHostToDevice, st()));
  launch_int4_repack(static_cast<uint32_t*>(w.data), n_words, st());
  const bool scales_bf16 = std::all_of(scales, scales + n_scales, [](float s) {
    return round_bf16(s) == s;
  });
  gemm_.note_int4_weight(w, scales_bf16);
  stream_.sync();  // the host buffers may go away
  return w;
}

// The allocation order of the former single class: sparse caches and selection workspaces,
// lightning states, the stacked-GEMM workspace, the per-row workspaces, the decay tables and
// the RoPE table.
void CudaBackend::init_caches(const ModelConfig& cfg, const CacheShape& shape) {
  sparse_.init(cfg, shape, kv_fmt_, kv_scales_);
  lightning_.init_states(cfg, shape);
  gemm_.plan_stack_workspace(cfg);
  sparse_.start_rows();
  lightning_.init_tables();
  // The RoPE table of the model's lightning layers.
  if (cfg.lightning_head_dim > 0) rope_.add(cfg.lightning_head_dim, cfg.rope_theta);
  stream_.sync();
}

void CudaBackend::download_f32(const Tensor& src, float* dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  cudaStream_t st = stream_.get();
  if (src.dtype == DType::F32 && n >= (int64_t(1) << 18) && !graphs_.capturing()) {
    // Large downloads (batched logits): through a pinned staging buffer, which the copy
    // engine writes at full speed, then one host memcpy.
    const size_t bytes = size_t(n) * 4;
    if (bytes > pinned_dl_bytes_) {
      arena_.release_pinned(pinned_dl_);
      pinned_dl_ = nullptr;
      pinned_dl_bytes_ = 0;
      pinned_dl_ = arena_.pinned(bytes);
      pinned_dl_bytes_ = bytes;
    }
    CUDA_CHECK(cudaMemcpyAsync(pinned_dl_, src.data, bytes, cudaMemcpyDeviceToHost, st));
    stream_.sync();
    std::memcpy(dst, pinned_dl_, bytes);
  } else if (src.dtype == DType::F32) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data, size_t(n) * 4, cudaMemcpyDeviceToHost, st));
  } else {
    SALA_CHECK(is_bf16(src), "download_f32 of {}", dtype_name(src.dtype));
    std::vector<uint16_t> tmp(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpyAsync(tmp.data(), src.data, size_t(n) * 2, cudaMemcpyDeviceToHost, st));
    stream_.sync();
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(tmp[size_t(i)]);
  }
  stream_.sync();
  if (timer_.enabled()) timer_.resolve();
}

void CudaBackend::report_op_profile(const std::string& label) {
  stream_.sync();
  timer_.report(label.c_str());
}

void CudaBackend::synchronize() { stream_.sync(); }

void CudaBackend::begin_step(const StepMeta& meta) {
  sparse_.ensure_rows(meta.num_tokens(), true);
  plan_.begin(meta, sparse_.sparse_config());
  sparse_.check_step();
  timer_.begin_step(meta.num_tokens());
  gemm_.forget_fp8_input();
}

// FP8 weights run in bf16 mode only: fp32 mode is the correctness contract (fp32 arithmetic,
// compared with the CPU at the fp32 level), and cuBLASLt's FP8 tensor-core GEMMs do not sum in
// full fp32 precision, so the contract would not hold.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  if (opts.fp8_weights && opts.mode != NumericMode::BF16)
    fail("FP8 weights (--quantization fp8) run on the CUDA backend in bf16 mode only (fp32 mode "
         "is the fp32 correctness contract, which FP8 tensor-core GEMMs do not keep)");
  // Like FP8 weights: the FP8 KV kernels feed code values to the bf16 tensor cores; fp32 mode
  // (the fp32 contract, whose InfLLM-v2 rows run on other kernels) keeps its fp32 caches.
  if (kv_is_fp8(opts.kv_cache_dtype) && opts.mode != NumericMode::BF16)
    fail("an FP8 KV cache (--kv-cache-dtype {}) runs on the CUDA backend in bf16 mode only "
         "(fp32 mode is the fp32 correctness contract); the CPU backend runs it in both modes",
         kv_cache_dtype_name(opts.kv_cache_dtype));
  return std::make_unique<CudaBackend>(opts);
}

size_t CudaBackend::device_memory_total() const {
  // This backend's GPU whatever the calling thread's current device.
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_.device()));
  return prop.totalGlobalMem;
}

}  // namespace sala
