// The NCCL communicator group: one rank per GPU, one thread per rank in one process
// (ncclCommInitAll), each rank's collectives on its backend's stream.
//
// NCCL is loaded at run time (dlopen "libnccl.so.2", the name its packages install, from the
// loader's path: LD_LIBRARY_PATH, or the pip wheel nvidia-nccl-cu13's nvidia/nccl/lib), not
// linked: the binary carries no dependency on its 200+ MB, and a machine without it runs
// everything but --tp-size N over GPUs, which then fails with a message naming the library.
// Only its header (nccl.h, beside the CUDA toolkit's) is needed at build time.
//
// NVLink multicast (NVLS) stays off (NCCL_NVLS_ENABLE=0 unless the environment says otherwise):
// its in-switch reduction is another summation, and on shared machines it can take the
// host's GPUs out of service.
//
// Numbers: all_reduce_sum is NCCL's sum; for two ranks a bf16 sum is one rounding of a + b on
// both ranks, the CPU emulation's and the peer group's (cuda_comm_peer.cpp). For more
// ranks NCCL's ring adds in its own order with a rounding per hop: the same bits on every
// rank, not the CPU emulation's.
#include <cstdlib>

#include "backend/cuda/cuda_comm.h"
#include "backend/cuda/cuda_comm_host.h"
#include "core/check.h"
#include "core/error.h"

#ifdef SALA_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <type_traits>

namespace sala::cuda_host {
namespace {

// The entry points used, resolved from the library once.
struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclCommInitAll) comm_init_all = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static NcclApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = dlerror();
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && error.empty()) error = std::string("no symbol ") + name;
    };
    sym(api.get_version, "ncclGetVersion");
    sym(api.comm_init_all, "ncclCommInitAll");
    sym(api.comm_destroy, "ncclCommDestroy");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.all_gather, "ncclAllGather");
    sym(api.send, "ncclSend");
    sym(api.recv, "ncclRecv");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
    sym(api.error_string, "ncclGetErrorString");
  });
  if (!error.empty())
    fail("tensor parallelism over GPUs needs NCCL: cannot load libnccl.so.2 ({}); install NCCL "
         "or put its lib folder (e.g. the nvidia-nccl-cu13 wheel's nvidia/nccl/lib) on "
         "LD_LIBRARY_PATH", error);
  return api;
}

// A failed collective inside a step is a bug or a broken machine: abort with file:line.
#define NCCL_CHECK(expr)                                                                   \
  do {                                                                                     \
    const ncclResult_t r_ = (expr);                                                        \
    SALA_CHECK(r_ == ncclSuccess, "NCCL error {} ({}) in {}", int(r_),                     \
               nccl().error_string(r_), #expr);                                            \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::BF16: return ncclBfloat16;
    case DType::F32: return ncclFloat32;
    case DType::I32: return ncclInt32;
    default: SALA_CHECK(false, "no NCCL type for {}", dtype_name(t));
  }
  return ncclFloat32;
}

struct NcclGroup {
  std::vector<ncclComm_t> comms;
  ~NcclGroup() {
    for (ncclComm_t c : comms) nccl().comm_destroy(c);
  }
};

class NcclComm : public Communicator {
 public:
  NcclComm(std::shared_ptr<NcclGroup> g, int rank, CudaBackend& be)
      : g_(std::move(g)), comm_(g_->comms[size_t(rank)]), rank_(rank), n_(int(g_->comms.size())),
        stream_(be.stream()), scratch_(be.cuda_device()) {}
  int rank() const override { return rank_; }
  int size() const override { return n_; }
  bool capturable() const override { return true; }

  void reserve_scratch(size_t full_bytes, int64_t max_rows) override {
    // The argmax: ids and values of this rank, then of all ranks ([R] int32 + [R] fp32 each).
    scratch_.reserve(std::max(full_bytes, size_t(n_ + 1) * size_t(max_rows) * 8));
    if (rank_ == 0) host_.reserve(n_, max_rows);  // the root of the model's argmax
  }

  void all_reduce_sum(Tensor& x) override {
    NCCL_CHECK(nccl().all_reduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), ncclSum,
                                 comm_, stream_));
  }

  // NCCL gathers whole buffers ([n, T, C] in rank order): staged, then copied into columns.
  void all_gather_cols(const Tensor& local, Tensor& full) override {
    SALA_CHECK(full.cols == n_ * local.cols && full.rows == local.rows &&
                   full.dtype == local.dtype,
               "all-gather of [{}, {}] into [{}, {}]: {} ranks", local.rows, local.cols, full.rows,
               full.cols, n_);
    char* stage = scratch_.get(full.nbytes());
    NCCL_CHECK(nccl().all_gather(local.data, stage, size_t(local.numel()), nccl_type(local.dtype),
                                 comm_, stream_));
    const void* parts[cuda::kMaxCommRanks];
    int64_t col0[cuda::kMaxCommRanks + 1];
    for (int k = 0; k <= n_; ++k) col0[k] = k * local.cols;
    for (int k = 0; k < n_; ++k) parts[k] = stage + size_t(k) * local.nbytes();
    copy_parts_into_cols(parts, col0, n_, full, stream_);
  }

  // Point to point: every rank sends its [T, w_r] to the root, which stages them in rank
  // order and copies them into columns.
  void gather_cols(const Tensor& local, Tensor& full, int root) override {
    SALA_CHECK(root >= 0 && root < n_, "root {} of {} ranks", root, n_);
    const ncclDataType_t type = nccl_type(local.dtype);
    if (rank_ != root) {
      NCCL_CHECK(nccl().send(local.data, size_t(local.numel()), type, root, comm_, stream_));
      return;
    }
    SALA_CHECK(full.rows == local.rows && full.dtype == local.dtype,
               "gather of [{}, {}] into [{}, {}]", local.rows, local.cols, full.rows, full.cols);
    int64_t col0[cuda::kMaxCommRanks + 1];
    gather_bounds(full.cols, n_, col0);
    SALA_CHECK(local.cols == col0[rank_ + 1] - col0[rank_], "root's {} columns of {}",
               local.cols, full.cols);
    char* stage = scratch_.get(full.nbytes());
    const size_t es = dtype_size(full.dtype);
    const void* parts[cuda::kMaxCommRanks];
    NCCL_CHECK(nccl().group_start());
    for (int k = 0; k < n_; ++k) {
      char* p = stage + size_t(col0[k]) * size_t(full.rows) * es;
      const size_t count = size_t(col0[k + 1] - col0[k]) * size_t(full.rows);
      if (k == root) {
        parts[k] = local.data;
      } else {
        NCCL_CHECK(nccl().recv(p, count, type, k, comm_, stream_));
        parts[k] = p;
      }
    }
    NCCL_CHECK(nccl().group_end());
    copy_parts_into_cols(parts, col0, n_, full, stream_);
  }

  // Each rank's (id, value) per row, all-gathered; the root combines them on the host.
  void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) override {
    SALA_CHECK(local.dtype == DType::F32, "argmax_rows of {}", dtype_name(local.dtype));
    const int64_t R = local.rows;
    const size_t rb = size_t(R) * 4;  // one rank's ids (or values)
    char* s = scratch_.get(2 * rb + 2 * size_t(n_) * rb);
    auto* ids = reinterpret_cast<int32_t*>(s);
    auto* vals = reinterpret_cast<float*>(s + rb);
    char* all_ids = s + 2 * rb;
    char* all_vals = all_ids + size_t(n_) * rb;
    cuda::launch_argmax_pairs(static_cast<const float*>(local.data), R, local.cols, vocab_offset,
                              ids, vals, stream_);
    NCCL_CHECK(nccl().group_start());
    NCCL_CHECK(nccl().all_gather(ids, all_ids, size_t(R), ncclInt32, comm_, stream_));
    NCCL_CHECK(nccl().all_gather(vals, all_vals, size_t(R), ncclFloat32, comm_, stream_));
    NCCL_CHECK(nccl().group_end());
    if (rank_ != root) return;
    if (host_.ids.size() < size_t(n_) * size_t(R)) host_.reserve(n_, R);  // a root other than 0
    host_.fetch(all_ids, all_vals, n_, R, stream_);
    combine_argmax(host_.ids.data(), host_.vals.data(), n_, R, out);
  }

  void barrier() override {
    float* one = reinterpret_cast<float*>(scratch_.get(4));
    NCCL_CHECK(nccl().all_reduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  std::shared_ptr<NcclGroup> g_;
  ncclComm_t comm_;
  int rank_, n_;
  cudaStream_t stream_;
  CommScratch scratch_;
  ArgmaxHost host_;
};

}  // namespace

int nccl_version() {
  int version = 0;
  const ncclResult_t r = nccl().get_version(&version);
  if (r != ncclSuccess) fail("ncclGetVersion failed: {}", nccl().error_string(r));
  return version;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<CudaBackend*>& ranks) {
  SALA_CHECK(!ranks.empty() && ranks.size() <= size_t(cuda::kMaxCommRanks),
             "an NCCL group of {} ranks", ranks.size());
  const NcclApi& api = nccl();
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // (not overwritten where the environment sets it)
  std::vector<int> devices;
  for (CudaBackend* b : ranks) devices.push_back(b->cuda_device());
  auto g = std::make_shared<NcclGroup>();
  g->comms.resize(ranks.size());
  int caller = 0;
  CUDA_CHECK(cudaGetDevice(&caller));
  const ncclResult_t r = api.comm_init_all(g->comms.data(), int(devices.size()), devices.data());
  CUDA_CHECK(cudaSetDevice(caller));
  if (r != ncclSuccess) {
    g->comms.clear();
    fail("NCCL could not make a communicator over {} GPUs: {}", devices.size(),
         api.error_string(r));
  }
  std::fprintf(stderr, "tensor parallelism: NCCL %d over %zu GPUs\n", nccl_version(),
               devices.size());
  std::vector<std::unique_ptr<Communicator>> comms;
  for (size_t k = 0; k < ranks.size(); ++k)
    comms.push_back(std::make_unique<NcclComm>(g, int(k), *ranks[k]));
  return comms;
}

}  // namespace sala::cuda_host

#else  // no nccl.h at build time

namespace sala::cuda_host {

std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<CudaBackend*>& ranks) {
  fail("tensor parallelism over {} GPUs needs NCCL, and this build found no nccl.h (configure "
       "with SALA_NCCL_INCLUDE_DIR set to NCCL's include folder)", ranks.size());
}

int nccl_version() {
  fail("this build found no nccl.h (configure with SALA_NCCL_INCLUDE_DIR set to NCCL's include "
       "folder)");
}

}  // namespace sala::cuda_host

#endif
