// The peer communicator group: every rank a CudaBackend (its own stream), on ONE GPU (NCCL
// refuses two ranks on one GPU; this lets a single-GPU machine run --tp-size N's whole CUDA
// path, recorded steps included) or on GPUs with peer access to each other (an A/B against
// NCCL: ModelLimits::tp_peer_comm). Each rank's thread drives its own rank.
//
// Collectives are single kernels (cuda_comm.cu): a rank stages its part in its own buffer,
// meets every rank on device flags (block b with block b), and reads the others' buffers
// directly. Nothing waits on the host, so they are recorded in CUDA graphs like any kernel.
// Two staging halves alternate by call, so a rank may stage its next call while the others
// still read this one; a rank reaches its next call's flags only after every rank has staged
// that call, i.e. finished this one.
//
// Numbers: all_reduce_sum adds the partials in fp32 in rank order and rounds once: for two
// ranks NCCL's bf16 sum, for any number the CPU's bf16 emulation (CpuCommGroup).
//
// The ranks' kernels must run at the same time: a profiler that serialises kernels (ncu)
// makes a block wait for a peer that never comes, and it traps after its poll limit.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_comm.h"
#include "backend/cuda/cuda_comm_host.h"
#include "core/check.h"
#include "core/error.h"

namespace sala::cuda_host {
namespace {

// Device memory of one rank on its GPU, freed there.
struct RankMemory {
  int device = 0;
  char* staging = nullptr;   // [2, half_bytes]
  uint32_t* flags = nullptr;  // [kPeerMaxBlocks], read by every rank
  uint32_t* epochs = nullptr;  // [kPeerMaxBlocks], this rank's
  char* pairs = nullptr;      // argmax: this rank's ids and values [2, max_rows] 4-byte
  char* gathered = nullptr;   // argmax: the root's [2, ranks · max_rows] 4-byte
  size_t half_bytes = 0;
  int64_t max_rows = 0;
};

struct PeerGroup {
  explicit PeerGroup(const std::vector<int>& devices) : mem(devices.size()) {
    for (size_t k = 0; k < devices.size(); ++k) mem[k].device = devices[k];
  }
  ~PeerGroup() {
    int caller = 0;
    cudaGetDevice(&caller);
    for (RankMemory& m : mem) {
      cudaSetDevice(m.device);
      cudaDeviceSynchronize();  // no collective of any stream still reads them
      for (void* p : {static_cast<void*>(m.staging), static_cast<void*>(m.flags),
                      static_cast<void*>(m.epochs), static_cast<void*>(m.pairs),
                      static_cast<void*>(m.gathered)})
        if (p) cudaFree(p);
    }
    cudaSetDevice(caller);
  }
  std::vector<RankMemory> mem;
};

class PeerComm : public Communicator {
 public:
  PeerComm(std::shared_ptr<PeerGroup> g, int rank, CudaBackend& be)
      : g_(std::move(g)), rank_(rank), stream_(be.stream()) {}
  int rank() const override { return rank_; }
  int size() const override { return int(g_->mem.size()); }
  bool capturable() const override { return true; }

  void reserve_scratch(size_t full_bytes, int64_t max_rows) override {
    RankMemory& m = g_->mem[size_t(rank_)];
    SALA_CHECK(m.staging == nullptr, "a peer communicator's buffers reserved twice");
    int caller = 0;
    CUDA_CHECK(cudaGetDevice(&caller));
    CUDA_CHECK(cudaSetDevice(m.device));
    m.half_bytes = (std::max<size_t>(full_bytes, 64) + 255) / 256 * 256;
    m.max_rows = std::max<int64_t>(max_rows, 1);
    CUDA_CHECK(cudaMalloc(&m.staging, 2 * m.half_bytes));
    CUDA_CHECK(cudaMalloc(&m.flags, cuda::kPeerMaxBlocks * 4));
    CUDA_CHECK(cudaMalloc(&m.epochs, cuda::kPeerMaxBlocks * 4));
    CUDA_CHECK(cudaMemset(m.flags, 0, cuda::kPeerMaxBlocks * 4));
    CUDA_CHECK(cudaMemset(m.epochs, 0, cuda::kPeerMaxBlocks * 4));
    CUDA_CHECK(cudaMalloc(&m.pairs, size_t(m.max_rows) * 8));
    CUDA_CHECK(cudaMalloc(&m.gathered, size_t(m.max_rows) * 8 * size()));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaSetDevice(caller));
    host_.reserve(size(), m.max_rows);
  }

  void all_reduce_sum(Tensor& x) override {
    SALA_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "all_reduce_sum of {}",
               dtype_name(x.dtype));
    const cuda::PeerView v = view(x.nbytes());
    cuda::launch_peer_all_reduce(v, x.data, x.numel(), x.dtype == DType::BF16, stream_);
  }

  void all_gather_cols(const Tensor& local, Tensor& full) override {
    SALA_CHECK(full.cols == size() * local.cols && full.rows == local.rows &&
                   full.dtype == local.dtype,
               "all-gather of [{}, {}] into [{}, {}]: {} ranks", local.rows, local.cols, full.rows,
               full.cols, size());
    cuda::GatherCols g{};
    for (int k = 0; k <= size(); ++k) g.col0[k] = k * local.cols;
    g.rows = local.rows;
    gather(local, g, full.data, true);
  }

  void gather_cols(const Tensor& local, Tensor& full, int root) override {
    SALA_CHECK(root >= 0 && root < size(), "root {} of {} ranks", root, size());
    cuda::GatherCols g{};
    gather_bounds(full.cols, size(), g.col0);
    g.rows = local.rows;
    SALA_CHECK(local.cols == g.col0[rank_ + 1] - g.col0[rank_] &&
                   (rank_ != root || (full.rows == local.rows && full.dtype == local.dtype)),
               "gather of [{}, {}] into [{}, {}]", local.rows, local.cols, full.rows, full.cols);
    gather(local, g, full.data, rank_ == root);
  }

  // Each rank's (id, value) per row gathered to the root ([2, ranks · R]: ids, then values),
  // which combines them on the host.
  void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) override {
    SALA_CHECK(local.dtype == DType::F32, "argmax_rows of {}", dtype_name(local.dtype));
    const RankMemory& m = g_->mem[size_t(rank_)];
    const int64_t R = local.rows, n = size();
    SALA_CHECK(R <= m.max_rows, "argmax of {} rows; {} reserved", R, m.max_rows);
    auto* ids = reinterpret_cast<int32_t*>(m.pairs);
    cuda::launch_argmax_pairs(static_cast<const float*>(local.data), R, local.cols, vocab_offset,
                              ids, reinterpret_cast<float*>(m.pairs + size_t(R) * 4), stream_);
    cuda::GatherCols g{};
    for (int k = 0; k <= n; ++k) g.col0[k] = k * R;
    g.rows = 2;
    const Tensor pairs{m.pairs, DType::F32, 2, R};
    gather(pairs, g, m.gathered, rank_ == root);
    if (rank_ != root) return;
    host_.fetch(m.gathered, m.gathered + size_t(n * R) * 4, int(n), R, stream_);
    combine_argmax(host_.ids.data(), host_.vals.data(), int(n), R, out);
  }

  void barrier() override {
    float* one = reinterpret_cast<float*>(g_->mem[size_t(rank_)].pairs);
    cuda::launch_peer_all_reduce(view(4), one, 1, false, stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // The group's buffers as this rank sees them, for a collective staging `bytes`.
  cuda::PeerView view(size_t bytes) const {
    cuda::PeerView v{};
    for (int k = 0; k < size(); ++k) {
      const RankMemory& m = g_->mem[size_t(k)];
      SALA_CHECK(m.staging != nullptr, "rank {}'s peer buffers not reserved", k);
      v.staging[k] = m.staging;
      v.flags[k] = m.flags;
    }
    const RankMemory& me = g_->mem[size_t(rank_)];
    SALA_CHECK(bytes <= me.half_bytes, "a collective stages {} bytes; {} reserved", bytes,
               me.half_bytes);
    v.epochs = me.epochs;
    v.half_bytes = me.half_bytes;
    v.ranks = size();
    v.rank = rank_;
    return v;
  }
  void gather(const Tensor& local, const cuda::GatherCols& g, void* full, bool receive) {
    const size_t es = dtype_size(local.dtype);
    SALA_CHECK(es == 2 || es == 4, "gather of {}", dtype_name(local.dtype));
    const cuda::PeerView v = view(local.nbytes());
    cuda::launch_peer_gather(v, local.data, g, int(es), full, receive, stream_);
  }

  std::shared_ptr<PeerGroup> g_;
  int rank_;
  cudaStream_t stream_;
  ArgmaxHost host_;  // as the root
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_peer_comms(const std::vector<CudaBackend*>& ranks) {
  const int n = int(ranks.size());
  SALA_CHECK(n >= 1 && n <= cuda::kMaxCommRanks, "a peer group of {} ranks", n);
  std::vector<int> devices;
  for (CudaBackend* b : ranks) devices.push_back(b->cuda_device());
  // Distinct GPUs read each other's buffers: peer access both ways, or no peer group.
  int caller = 0;
  CUDA_CHECK(cudaGetDevice(&caller));
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) {
        CUDA_CHECK(cudaSetDevice(caller));
        fail("GPU {} cannot access GPU {}'s memory (no peer access): use NCCL", a, b);
      }
      CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();  // clears it
      else CUDA_CHECK(e);
    }
  CUDA_CHECK(cudaSetDevice(caller));
  auto g = std::make_shared<PeerGroup>(devices);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<PeerComm>(g, r, *ranks[size_t(r)]));
  return comms;
}

}  // namespace sala::cuda_host
