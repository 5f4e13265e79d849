// The one place that turns a device name into a backend (every command, the server, the
// golden runner and the tests that do not need a specific backend go through it).

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/check.h"
#include "core/error.h"

namespace sala {

std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& opts) {
  if (device == "cpu") return make_cpu_backend(opts);
  if (device == "cuda") {
#ifdef SALA_HAVE_CUDA
    return make_cuda_backend(opts);
#else
    fail("device 'cuda' is not available: this build has no CUDA backend (configure with "
         "-DSALA_CUDA=ON where nvcc is installed)");
#endif
  }
  std::string known;
  for (const std::string& d : backend_devices()) known += (known.empty() ? "" : ", ") + d;
  fail("device '{}' is unknown (devices: {})", device, known);
}

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              bool prefer_peer) {
  SALA_CHECK(!ranks.empty(), "a communicator group of no ranks");
  const std::string kind = ranks[0]->name();
  for (Backend* b : ranks)
    SALA_CHECK(b->name() == kind, "one group of {} and {} backends", kind, b->name());
  std::vector<std::unique_ptr<Communicator>> comms;
  if (kind.rfind("cpu", 0) == 0) {
    CpuCommGroup group(int(ranks.size()), kind == "cpu-bf16");
    for (size_t r = 0; r < ranks.size(); ++r) comms.push_back(group.comm(int(r)));
    return comms;
  }
#ifdef SALA_HAVE_CUDA
  if (kind == "cuda") return make_cuda_communicators(ranks, prefer_peer);
#else
  (void)prefer_peer;
#endif
  fail("tensor parallelism: the {} backend has no communicator", kind);
}

KvCacheDtype parse_kv_cache_dtype(const std::string& s, const std::string& what) {
  if (s == "auto") return KvCacheDtype::Auto;
  if (s == "fp8_e4m3" || s == "fp8") return KvCacheDtype::FP8_E4M3;
  if (s == "fp8_e5m2") return KvCacheDtype::FP8_E5M2;
  fail("{} '{}' is not supported (auto, fp8_e4m3, fp8_e5m2; fp8 means fp8_e4m3)", what, s);
}

std::vector<std::string> backend_devices() {
#ifdef SALA_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

}  // namespace sala
