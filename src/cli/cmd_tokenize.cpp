// `sala tokenize` / `sala detokenize`: the model directory's tokenizer from the command line.
// requires: sala_tokenizer
//   sala tokenize --model-path DIR [--no-special] TEXT     prints the ids, space-separated
//   sala detokenize --model-path DIR [--skip-special] IDS  IDS: "1 2 3", "1,2,3" or "[1, 2, 3]"
// TEXT / IDS "-" reads standard input.
#include <fmt/core.h>

#include <climits>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ' || c == ',' || c == '[' || c == ']' || c == '\n' || c == '\t' || c == '\r') {
      ++i;
      continue;
    }
    size_t j = i;
    if (s[j] == '-') ++j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i || (j == i + 1 && s[i] == '-')) sala::fail("detokenize: '{}' is not a list of token ids", s);
    long long v = std::stoll(s.substr(i, j - i));
    if (v < 0 || v > INT32_MAX) sala::fail("detokenize: token id {} out of range", v);
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

struct TokenizeOpts {
  std::string model_path, text;
  bool no_special = false;
};
struct DetokenizeOpts {
  std::string model_path, ids;
  bool skip_special = false;
};

sala::cli::Registrar tokenize_reg("tokenize", "Print the token ids of TEXT", [](CLI::App& app) {
  auto o = std::make_shared<TokenizeOpts>();
  app.add_option("--model-path", o->model_path, "Model directory (tokenizer.json / tokenizer.model)")->required();
  app.add_flag("--no-special", o->no_special, "Do not add special tokens (BOS)");
  app.add_option("text", o->text, "Text to tokenize ('-' reads stdin)")->required();
  return sala::cli::Run([o] {
    auto tok = sala::Tokenizer::load(o->model_path);
    std::string text = o->text == "-" ? read_stdin() : o->text;
    auto ids = tok->encode(text, !o->no_special);
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
    fmt::print("{}\n", out);
    return 0;
  });
});

sala::cli::Registrar detokenize_reg("detokenize", "Print the text of token IDS", [](CLI::App& app) {
  auto o = std::make_shared<DetokenizeOpts>();
  app.add_option("--model-path", o->model_path, "Model directory (tokenizer.json / tokenizer.model)")->required();
  app.add_flag("--skip-special", o->skip_special, "Leave special tokens out of the text");
  app.add_option("ids", o->ids, "Token ids: '1 2 3', '1,2,3' or '[1, 2, 3]' ('-' reads stdin)")->required();
  return sala::cli::Run([o] {
    auto tok = sala::Tokenizer::load(o->model_path);
    auto ids = parse_ids(o->ids == "-" ? read_stdin() : o->ids);
    for (int32_t id : ids)
      if (id >= tok->vocab_size()) sala::fail("detokenize: token id {} >= vocabulary size {}", id, tok->vocab_size());
    fmt::print("{}\n", tok->decode(ids, o->skip_special));
    return 0;
  });
});

}  // namespace
