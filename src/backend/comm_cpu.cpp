#include <barrier>
#include <cstring>
#include <vector>

#include "backend/comm.h"
#include "core/check.h"
#include "core/dtype.h"

namespace sala {

struct CpuCommGroup::State {
  State(int n, bool round_bf16)
      : n(n), round_bf16(round_bf16), bar(n), ptr(size_t(n)), ids(size_t(n)), vals(size_t(n)) {}
  int n;
  bool round_bf16;
  std::barrier<> bar;
  std::vector<const void*> ptr;           // each rank's published tensor
  std::vector<std::vector<int32_t>> ids;  // argmax_rows: each rank's local best ids
  std::vector<std::vector<float>> vals;   // ... and their values
};

namespace {

class CpuComm : public Communicator {
 public:
  CpuComm(std::shared_ptr<CpuCommGroup::State> state, int rank)
      : state_(std::move(state)), s_(*state_), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.n; }
  void barrier() override { s_.bar.arrive_and_wait(); }

  void all_gather_cols(const Tensor& local, Tensor& full) override {
    SALA_CHECK(full.cols == s_.n * local.cols, "all-gather of [{}, {}] into [{}, {}]: {} ranks",
               local.rows, local.cols, full.rows, full.cols, s_.n);
    gather(local, full, -1);
  }
  void gather_cols(const Tensor& local, Tensor& full, int root) override {
    SALA_CHECK(root >= 0 && root < s_.n, "root {} of {} ranks", root, s_.n);
    gather(local, full, root);
  }

  void all_reduce_sum(Tensor& x) override { sum(x, s_.round_bf16); }
  void all_reduce_sum_f32(Tensor& x) override { sum(x, false); }

  void sum(Tensor& x, bool round_bf16) {
    SALA_CHECK(x.dtype == DType::F32, "all_reduce_sum of {}", dtype_name(x.dtype));
    s_.ptr[size_t(rank_)] = x.data;
    barrier();
    // Every rank computes the same sum, in rank order, into scratch; writes after all read.
    const size_t n = size_t(x.numel());
    scratch_.assign(static_cast<const float*>(s_.ptr[0]), static_cast<const float*>(s_.ptr[0]) + n);
    for (int r = 1; r < s_.n; ++r) {
      const float* p = static_cast<const float*>(s_.ptr[size_t(r)]);
      for (size_t i = 0; i < n; ++i) scratch_[i] += p[i];
    }
    if (round_bf16)
      for (float& v : scratch_) v = sala::round_bf16(v);
    barrier();
    std::memcpy(x.data, scratch_.data(), n * sizeof(float));
  }

  void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) override {
    SALA_CHECK(local.dtype == DType::F32, "argmax_rows of {}", dtype_name(local.dtype));
    auto& ids = s_.ids[size_t(rank_)];
    auto& vals = s_.vals[size_t(rank_)];
    ids.resize(size_t(local.rows));
    vals.resize(size_t(local.rows));
    for (int64_t r = 0; r < local.rows; ++r) {
      const float* row = static_cast<const float*>(local.data) + r * local.cols;
      int64_t best = 0;  // the first maximum of the slice (NaN never wins, as std::max_element)
      for (int64_t j = 1; j < local.cols; ++j)
        if (row[best] < row[j]) best = j;
      ids[size_t(r)] = int32_t(vocab_offset + best);
      vals[size_t(r)] = row[best];
    }
    barrier();
    if (rank_ == root)
      for (int64_t r = 0; r < local.rows; ++r) {
        // Ranks hold ascending vocab slices: a later rank wins only with a strictly larger
        // value, so ties go to the lowest id.
        int best = 0;
        for (int k = 1; k < s_.n; ++k)
          if (s_.vals[size_t(best)][size_t(r)] < s_.vals[size_t(k)][size_t(r)]) best = k;
        out[r] = s_.ids[size_t(best)][size_t(r)];
      }
    barrier();
  }

 private:
  // Rank r's local at the columns after ranks 0..r-1's, on every rank (root < 0) or on root.
  void gather(const Tensor& local, Tensor& full, int root) {
    SALA_CHECK(local.dtype == DType::F32, "gather of {}", dtype_name(local.dtype));
    s_.ptr[size_t(rank_)] = &local;
    barrier();
    if (root < 0 || root == rank_) {
      SALA_CHECK(full.dtype == DType::F32 && full.rows == local.rows, "gather of {} rows into [{}, {}]",
                 local.rows, full.rows, full.cols);
      int64_t c0 = 0;
      for (int k = 0; k < s_.n; ++k) {
        const Tensor& src = *static_cast<const Tensor*>(s_.ptr[size_t(k)]);
        const int64_t C = src.cols;
        // The widths a device communicator assumes (it sends no widths).
        SALA_CHECK(C == gather_col(full.cols, s_.n, k + 1) - gather_col(full.cols, s_.n, k),
                   "rank {}'s {} columns of {} over {} ranks", k, C, full.cols, s_.n);
        SALA_CHECK(src.rows == local.rows && c0 + C <= full.cols,
                   "rank {}'s [{}, {}] does not fit columns {}.. of [{}, {}]", k, src.rows, C, c0,
                   full.rows, full.cols);
        for (int64_t t = 0; t < src.rows; ++t)
          std::memcpy(static_cast<float*>(full.data) + t * full.cols + c0,
                      static_cast<const float*>(src.data) + t * C, size_t(C) * sizeof(float));
        c0 += C;
      }
      SALA_CHECK(c0 == full.cols, "ranks' {} columns gathered into {}", c0, full.cols);
    }
    barrier();
  }

  std::shared_ptr<CpuCommGroup::State> state_;
  CpuCommGroup::State& s_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

CpuCommGroup::CpuCommGroup(int size, bool round_bf16) {
  SALA_CHECK(size >= 1, "a communicator group of {} ranks", size);
  s_ = std::make_shared<State>(size, round_bf16);
}
CpuCommGroup::~CpuCommGroup() = default;
int CpuCommGroup::size() const { return s_->n; }

std::unique_ptr<Communicator> CpuCommGroup::comm(int rank) {
  SALA_CHECK(rank >= 0 && rank < s_->n, "rank {} of {}", rank, s_->n);
  return std::make_unique<CpuComm>(s_, rank);
}

}  // namespace sala
