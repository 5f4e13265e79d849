// A kernel timeline of any CUDA program, without nsys (not installed on the GPU machines):
// a CUDA injection library (the driver loads it from CUDA_INJECTION64_PATH at cuInit and
// calls InitializeInjection) that records every kernel's GPU start and end through CUPTI's
// activity API, graph-launched kernels included, and writes them as CSV at exit. Unlike ncu
// it does not serialize kernels: programmatic dependent launch and graph replay run as they
// do untraced, so the gaps and overlaps between a decode step's kernels are the real ones.
//
//   KTRACE_OUT=trace.csv CUDA_INJECTION64_PATH=$PWD/libsala_ktrace.so sala bench offline ...
//   scripts/ktrace/ktrace_summary.py trace.csv --graph-launches 4
//
// CSV columns: start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,
// registers,dyn_smem,name (times: the GPU's timestamps; name last, it may contain commas).
// Developer tooling only: nothing in the engine links it.
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

struct Row {
  uint64_t start, end, graph_node;
  uint32_t graph, correlation, stream, registers;
  int32_t gx, gy, gz, bx, by, bz, dyn_smem;
  std::string name;
};

std::mutex g_mu;
std::vector<Row>* g_rows = nullptr;  // leaked on purpose: read in the atexit handler
std::atomic<uint64_t> g_dropped{0};

#define KTRACE_CHECK(call)                                                        \
  do {                                                                            \
    const CUptiResult r_ = (call);                                                \
    if (r_ != CUPTI_SUCCESS) {                                                    \
      const char* m_ = nullptr;                                                   \
      cuptiGetResultString(r_, &m_);                                              \
      std::fprintf(stderr, "ktrace: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,  \
                   m_ ? m_ : "?");                                                \
      return;                                                                     \
    }                                                                             \
  } while (0)

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Row> rows;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    rows.push_back(Row{k->start, k->end, k->graphNodeId, k->graphId, k->correlationId,
                       k->streamId, k->registersPerThread, k->gridX, k->gridY, k->gridZ,
                       k->blockX, k->blockY, k->blockZ, k->dynamicSharedMemory,
                       k->name ? k->name : "?"});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  g_dropped += dropped;
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_rows->insert(g_rows->end(), rows.begin(), rows.end());
}

void write_csv() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("KTRACE_OUT");
  std::FILE* f = std::fopen(path && *path ? path : "ktrace.csv", "w");
  if (!f) {
    std::fprintf(stderr, "ktrace: cannot write %s\n", path ? path : "ktrace.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,"
                  "registers,dyn_smem,name\n");
  for (const Row& r : *g_rows)
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%u,%dx%dx%d,%dx%dx%d,%u,%d,%s\n",
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 r.graph, static_cast<unsigned long long>(r.graph_node), r.correlation, r.stream,
                 r.gx, r.gy, r.gz, r.bx, r.by, r.bz, r.registers, r.dyn_smem, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "ktrace: %zu kernels written, %llu records dropped\n", g_rows->size(),
               static_cast<unsigned long long>(g_dropped.load()));
}

void start() {
  g_rows = new std::vector<Row>();
  g_rows->reserve(size_t(1) << 20);
  KTRACE_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  // CONCURRENT_KERNEL: kernels are not serialized (KIND_KERNEL would serialize them).
  KTRACE_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::atexit(write_csv);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::once_flag once;
  std::call_once(once, start);
  return 1;
}
