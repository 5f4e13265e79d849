#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include "tokenizer/hf_tokenizer.h"

namespace sala {
namespace {

using namespace tokenizer_detail;  // HfTokenizer and the file/JSON helpers
namespace fs = std::filesystem;
using json = nlohmann::json;

// ------------------------------------------------------------------------------------------
// tokenizer.model through libsentencepiece (no tokenizer.json).

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const fs::path& dir) {
    fs::path mp = dir / "tokenizer.model";
    auto st = sp_.Load(mp.string());
    if (!st.ok()) fail("{}: cannot load sentencepiece model: {}", mp.string(), st.ToString());
    json cfg = json::object();
    if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json(dir / "tokenizer_config.json");
    add_bos_ = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean() ? cfg["add_bos_token"].get<bool>() : true;
    add_eos_ = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean() && cfg["add_eos_token"].get<bool>();
    bos_id_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_ids_.push_back(sp_.eos_id());
    if (bos_id_ >= 0) bos_token_ = sp_.IdToPiece(bos_id_);
    if (sp_.eos_id() >= 0) eos_token_ = sp_.IdToPiece(sp_.eos_id());
    for (const char* c : {"a", "e", "x", "A", "0", "."}) {
      int id = sp_.PieceToId(c);
      if (id != sp_.unk_id() && !sp_.IsControl(id) && !sp_.IsByte(id)) {
        ctx_id_ = id;
        break;
      }
    }
    if (ctx_id_ < 0) fail("{}: no plain single-character piece in the model", mp.string());
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::string s = utf8::is_valid(text) ? std::string(text) : utf8::sanitize(text);
    std::vector<int> ids;
    sp_.Encode(s, &ids).IgnoreError();
    std::vector<int32_t> out;
    if (add_special_tokens && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_special_tokens && add_eos_ && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      std::string s;
      sp_.Decode(run, &s).IgnoreError();
      out += s;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (is_special(id)) {
        if (skip_special_tokens) continue;
        flush();
        out += sp_.IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }
  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(token);
    if (id == sp_.unk_id() && token != sp_.IdToPiece(id)) return std::nullopt;
    return id;
  }
  std::string id_to_token(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? sp_.IdToPiece(id) : "";
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (sp_.IsControl(id) || sp_.IsUnknown(id));
  }
  bool is_byte_token(int32_t id) const override { return id >= 0 && id < vocab_size() && sp_.IsByte(id); }
  int32_t context_token_id() const override { return ctx_id_; }
  std::string bos_token() const override { return bos_token_; }
  std::string eos_token() const override { return eos_token_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
  int32_t bos_id_ = -1, ctx_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::string bos_token_, eos_token_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) fail("tokenizer: model directory {} does not exist", model_dir);
  if (fs::exists(dir / "tokenizer.json")) return std::make_unique<HfTokenizer>(dir);
  if (fs::exists(dir / "tokenizer.model")) return std::make_unique<SpmTokenizer>(dir);
  fail("tokenizer: neither {} nor {} exists", (dir / "tokenizer.json").string(), (dir / "tokenizer.model").string());
}

}  // namespace sala
