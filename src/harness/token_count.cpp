#include "harness/token_count.h"

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace sala::harness {

namespace {
class EngineTokenCounter final : public TokenCounter {
 public:
  explicit EngineTokenCounter(std::unique_ptr<sala::Tokenizer> tok) : tok_(std::move(tok)) {}
  int64_t count(std::string_view text) const override {
    return static_cast<int64_t>(tok_->encode(text, /*add_special_tokens=*/true).size());
  }

 private:
  std::unique_ptr<sala::Tokenizer> tok_;
};
}  // namespace

std::unique_ptr<TokenCounter> TokenCounter::load(const std::string& model_dir) {
  try {
    return std::make_unique<EngineTokenCounter>(sala::Tokenizer::load(model_dir));
  } catch (const sala::Error& e) {
    fail("cannot load the tokenizer of '{}' (pass --tokenizer DIR if the served model id is "
         "not a local directory): {}",
         model_dir, e.what());
  }
}

}  // namespace sala::harness
