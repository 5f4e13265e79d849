// The same-GPU communicator group: every rank a CudaBackend (its own stream) on ONE GPU, each
// driven by its own thread (TensorParallel). NCCL refuses two ranks on one GPU; this group
// lets a single-GPU machine run --tp-size N's whole CUDA path (shards, collectives in the
// forward, vocab-parallel argmax) against TP=1, eagerly (its host barrier cannot be recorded
// in a CUDA graph).
//
// A collective: each rank publishes a device pointer and an event recorded after the work
// that produced it, meets the others at a host barrier, and makes its stream wait for their
// events (publish); then reads the others' data on its own stream; then records a second
// event, meets them again and waits for theirs (finish), so that no rank overwrites its data
// before every rank has read it. An event is re-recorded only after a barrier that every
// rank passes after its waits on the previous recording were queued.
//
// Numbers: all_reduce_sum adds the partials in fp32 in rank order and rounds once
// (cuda_comm.h launch_sum_ranks): for two ranks NCCL's bf16 sum, for any number the CPU
// backend's bf16 emulation (CpuCommGroup), so TP=N on one GPU is TP=N on N GPUs.
#include <algorithm>
#include <barrier>
#include <vector>

#include "backend/cuda/cuda_comm.h"
#include "backend/cuda/cuda_comm_host.h"
#include "core/check.h"

namespace sala::cuda_host {
namespace {

struct SameGpuGroup {
  explicit SameGpuGroup(int n, int device)
      : n(n), device(device), bar(n), ptr(size_t(n)), ready(size_t(n)), done(size_t(n)) {
    for (int k = 0; k < n; ++k) {
      CUDA_CHECK(cudaEventCreateWithFlags(&ready[size_t(k)], cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&done[size_t(k)], cudaEventDisableTiming));
    }
  }
  ~SameGpuGroup() {
    for (int k = 0; k < n; ++k) {
      cudaEventDestroy(ready[size_t(k)]);
      cudaEventDestroy(done[size_t(k)]);
    }
  }
  int n, device;
  std::barrier<> bar;
  std::vector<const void*> ptr;  // each rank's published data
  std::vector<cudaEvent_t> ready, done;
};

class SameGpuComm : public Communicator {
 public:
  SameGpuComm(std::shared_ptr<SameGpuGroup> g, int rank, CudaBackend& be)
      : g_(std::move(g)), rank_(rank), stream_(be.stream()), scratch_(be.cuda_device()) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }

  void reserve_scratch(size_t full_bytes, int64_t max_rows) override {
    scratch_.reserve(std::max(full_bytes, size_t(max_rows) * 8));
  }

  void all_reduce_sum(Tensor& x) override {
    SALA_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "all_reduce_sum of {}",
               dtype_name(x.dtype));
    SALA_CHECK(g_->n <= cuda::kMaxCommRanks, "{} ranks", g_->n);
    char* sum = scratch_.get(x.nbytes());
    publish(x.data);
    cuda::RankParts parts{};
    for (int k = 0; k < g_->n; ++k) parts.p[k] = g_->ptr[size_t(k)];
    cuda::launch_sum_ranks(parts, g_->n, x.numel(), x.dtype == DType::BF16, sum, stream_);
    finish();  // every rank has read x: now it may be overwritten
    CUDA_CHECK(cudaMemcpyAsync(x.data, sum, x.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void all_gather_cols(const Tensor& local, Tensor& full) override {
    SALA_CHECK(full.cols == g_->n * local.cols && full.rows == local.rows &&
                   full.dtype == local.dtype,
               "all-gather of [{}, {}] into [{}, {}]: {} ranks", local.rows, local.cols, full.rows,
               full.cols, g_->n);
    publish(local.data);
    std::vector<int64_t> col0;
    for (int k = 0; k <= g_->n; ++k) col0.push_back(k * local.cols);
    copy_parts_into_cols(g_->ptr, col0, full, stream_);
    finish();
  }

  void gather_cols(const Tensor& local, Tensor& full, int root) override {
    SALA_CHECK(root >= 0 && root < g_->n, "root {} of {} ranks", root, g_->n);
    publish(local.data);
    if (rank_ == root) {
      SALA_CHECK(full.rows == local.rows && full.dtype == local.dtype, "gather of [{}, {}] into "
                 "[{}, {}]", local.rows, local.cols, full.rows, full.cols);
      copy_parts_into_cols(g_->ptr, gather_bounds(full.cols, g_->n), full, stream_);
    }
    finish();
  }

  void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) override {
    SALA_CHECK(local.dtype == DType::F32, "argmax_rows of {}", dtype_name(local.dtype));
    const int64_t R = local.rows;
    char* pairs = scratch_.get(size_t(R) * 8);  // ids [R] int32, then vals [R] fp32
    auto* ids = reinterpret_cast<int32_t*>(pairs);
    auto* vals = reinterpret_cast<float*>(pairs + size_t(R) * 4);
    cuda::launch_argmax_pairs(static_cast<const float*>(local.data), R, local.cols,
                              vocab_offset, ids, vals, stream_);
    publish(pairs);
    if (rank_ == root) {
      const int n = g_->n;
      std::vector<int32_t> all_ids(size_t(n * R));
      std::vector<float> all_vals(size_t(n * R));
      for (int k = 0; k < n; ++k) {
        const char* p = static_cast<const char*>(g_->ptr[size_t(k)]);
        CUDA_CHECK(cudaMemcpyAsync(all_ids.data() + k * R, p, size_t(R) * 4,
                                   cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaMemcpyAsync(all_vals.data() + k * R, p + size_t(R) * 4, size_t(R) * 4,
                                   cudaMemcpyDeviceToHost, stream_));
      }
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      combine_argmax(all_ids.data(), all_vals.data(), n, R, out);
    }
    finish();
  }

  void barrier() override {
    publish(nullptr);
    finish();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void publish(const void* p) {
    g_->ptr[size_t(rank_)] = p;
    CUDA_CHECK(cudaEventRecord(g_->ready[size_t(rank_)], stream_));
    g_->bar.arrive_and_wait();
    for (int k = 0; k < g_->n; ++k)
      if (k != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream_, g_->ready[size_t(k)], 0));
  }
  void finish() {
    CUDA_CHECK(cudaEventRecord(g_->done[size_t(rank_)], stream_));
    g_->bar.arrive_and_wait();
    for (int k = 0; k < g_->n; ++k)
      if (k != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream_, g_->done[size_t(k)], 0));
  }

  std::shared_ptr<SameGpuGroup> g_;
  int rank_;
  cudaStream_t stream_;
  CommScratch scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_same_gpu_comms(
    const std::vector<CudaBackend*>& ranks) {
  const int n = int(ranks.size());
  SALA_CHECK(n >= 1 && n <= cuda::kMaxCommRanks, "a same-GPU group of {} ranks", n);
  const int device = ranks[0]->cuda_device();
  int caller = 0;
  CUDA_CHECK(cudaGetDevice(&caller));
  CUDA_CHECK(cudaSetDevice(device));  // the events belong to the group's GPU
  auto g = std::make_shared<SameGpuGroup>(n, device);
  CUDA_CHECK(cudaSetDevice(caller));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<SameGpuComm>(g, r, *ranks[size_t(r)]));
  return comms;
}

}  // namespace sala::cuda_host
