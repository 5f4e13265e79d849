// Helpers for model tests: load a golden case's tiny model and run sequences.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/minicpm_sala.h"

namespace sala::test {

// The vendored golden cases and eval set (tests/fixtures/README.md).
inline std::string fixtures_dir() { return std::string(SALA_SOURCE_DIR) + "/tests/fixtures"; }
inline std::string tiny_chat_dir() { return std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat"; }

// A model over `dir` with room for `pages` pages and `slots` state slots, its sparse layers'
// KV cache in `kv` (BackendOptions::kv_cache_dtype).
std::unique_ptr<Model> load_tiny(const std::string& dir, int32_t max_tokens, int32_t pages,
                                 int32_t slots, NumericMode mode = NumericMode::F32,
                                 const ModelConfig* override_cfg = nullptr,
                                 KvCacheDtype kv = KvCacheDtype::Auto, int tp_size = 1);

// A quantized (or dense) checkpoint directory on the CPU backend in bf16 mode with `bo`'s
// load-time quantization, room for one 320-token call and 24 pages: the quantize tests' model.
std::unique_ptr<Model> load_bf16_cpu(const std::string& dir, BackendOptions bo);

// A fresh directory sala_<name>_<pid> under the system's temporary directory, removed with
// the object.
struct TempDir {
  std::filesystem::path p;
  explicit TempDir(const std::string& name)
      : p(std::filesystem::temp_directory_path() /
          ("sala_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(p);
  }
  ~TempDir() { std::filesystem::remove_all(p); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return p.string(); }
};

// Page list [first, first + n).
std::vector<int32_t> page_range(int32_t first, int32_t n);

// Deterministic pseudo-random token ids in [3, vocab - 9).
std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed);

// Runs `ids` through one sequence in calls of the given sizes (a size of 1 repeated is
// decode); returns the logits of every position, [n, vocab].
std::vector<float> run_calls(Model& m, const std::vector<int32_t>& ids,
                             const std::vector<int32_t>& calls, int32_t slot,
                             const std::vector<int32_t>& pages, bool dense_as_sparse = false);

// The message of the sala::Error that f throws; "" when it throws none.
std::string error_of(const std::function<void()>& f);

// max_j |a_j - b_j| / max_j |b_j| over all rows.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace sala::test
