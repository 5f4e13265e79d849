// Structured output parameters of every route, mapped onto one grammar::GrammarSpec per
// request (Sampling::grammar), and their compilation on the HTTP thread:
//   OpenAI   response_format {type: json_object} | {type: json_schema, json_schema: {schema}}
//   vLLM     guided_json, guided_regex, guided_grammar (EBNF), guided_choice, and
//            structured_outputs {json | regex | grammar | choice | json_object}
//   SGLang   /generate sampling_params regex, ebnf, json_schema (also top-level fields of the
//            OpenAI routes, as SGLang's)
// At most one constraint per request (400 naming the second). A schema, regex or grammar that
// does not compile is a 400 naming the parameter it came from.
#pragma once
#include <memory>

#include "grammar/grammar.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

// Sets the request's one output constraint (400 naming `param` if it already has one).
void set_request_grammar(Sampling& s, grammar::GrammarSpec::Kind kind, std::string text,
                         const std::string& param);

// The OpenAI routes' constraints (chat and completions, as vLLM) into s.grammar.
void parse_openai_grammar(const json& body, Sampling& s);
// /generate's sampling_params constraints into s.grammar (pointer_prefix: where the object is in
// the body, "/sampling_params").
void parse_generate_grammar(const json& sampling_params, Sampling& s, const std::string& pointer_prefix);

// The request JSON is parsed with sorted keys (nlohmann::json); a JSON schema's property order
// (the order of the generated fields) and the tools (as the template shows them; the order of
// the arguments) must be the client's: they are re-read from the raw body here, after parsing
// validated it. tools may be null.
void restore_client_order(const std::string& raw_body, Sampling& s, ToolRequest* tools);

// The request's compiled grammar (nullptr: unconstrained). compiler null: this server has no
// grammar engine for its tokenizer, and a constrained request is a 400.
std::shared_ptr<const grammar::CompiledGrammar> compile_request_grammar(
    grammar::GrammarCompiler* compiler, const Sampling& s);

// The vocabulary as the grammar engine sees it for this tokenizer and the model's logits width
// (ids past the tokenizer's: empty, never allowed); stop tokens: eos_ids and the tokenizer's.
// Throws sala::Error where the tokenizer's token bytes cannot be told.
grammar::VocabInfo grammar_vocab(const Tokenizer& tok, int32_t vocab_size, std::vector<int32_t> eos_ids);

// The server's grammar compiler for this tokenizer and the model's logits width; the stop
// tokens are the model's EOS ids. nullptr (with the reason on stderr) where the tokenizer's
// token bytes cannot be told: the server then refuses constrained requests.
std::unique_ptr<grammar::GrammarCompiler> make_grammar_compiler(const Tokenizer& tok, int32_t vocab_size,
                                                                std::vector<int32_t> eos_ids);

// A regular expression that matches exactly the given strings (guided_choice).
std::string choice_regex(const std::vector<std::string>& choices);

}  // namespace sala::server
