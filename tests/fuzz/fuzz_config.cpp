// libFuzzer harness: a checkpoint's config.json (core/config.cpp, with its
// quantization_config, quant_config.cpp). Any text must parse into a ModelConfig or be refused
// with a sala::Error naming the key; a parsed config's derived constants must be computable
// without UB (the loader calls them right after parsing).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sala::fuzz::expect_clear_error([&] {
    const sala::ModelConfig c = sala::parse_model_config(text, "fuzz/config.json");
    (void)c.residual_scale();
    (void)c.logit_divisor();
    (void)c.attn_scale();
    (void)c.kv_group();
    (void)c.num_sparse_layers();
    (void)c.lightning_slopes();
    for (int i = 0; i < c.num_hidden_layers; ++i) (void)c.kind_index(i);
    (void)c.sparse.total_topk();
  });
  return 0;
}
