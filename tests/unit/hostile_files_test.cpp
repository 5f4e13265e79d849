// config.json and safetensors inputs that the fuzzers (tests/fuzz) showed to crash or hit UB,
// and their neighbours: each is now refused with a sala::Error naming the file. Under the
// ASan/UBSan build (.ci/run) the old code fails these with a sanitizer report; in a plain
// build the json / regex cases threw exceptions that are not sala::Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace {
using json = nlohmann::json;

json tiny_config() {
  std::ifstream in(std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat/config.json");
  return json::parse(in);
}

json fp8_quant() {
  json args = {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}};
  json in = args;
  in["strategy"] = "token";
  in["dynamic"] = true;
  return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", args}, {"input_activations", in}}}}},
          {"ignore", {"lm_head"}}};
}

// "" when parse_model_config accepts j, else the sala::Error message (any other exception
// type fails the test: it would not reach the user as a clear error).
std::string config_error(const json& j) {
  try {
    sala::parse_model_config(j.dump(), "cfg.json");
    return "";
  } catch (const sala::Error& e) {
    return e.what();
  }
}

TEST(HostileConfig, QuantizationGroupIsReadSafely) {
  // The fuzzer's first finding: the config group was bound through a dead temporary
  // (stack-use-after-scope under ASan) on every FP8 config, the valid one included.
  json j = tiny_config();
  j["quantization_config"] = fp8_quant();
  EXPECT_EQ(config_error(j), "");
  EXPECT_TRUE(sala::parse_model_config(j.dump(), "cfg.json").quantization.any());
}

TEST(HostileConfig, WrongJsonTypesAreClearErrors) {
  json j = tiny_config();
  j["quantization_config"] = fp8_quant();
  j["quantization_config"]["config_groups"]["group_0"] = 7;  // was json::type_error
  EXPECT_NE(config_error(j).find("cfg.json"), std::string::npos);
  j["quantization_config"] = fp8_quant();
  j["quantization_config"]["quant_method"] = 5;  // was json::type_error
  EXPECT_NE(config_error(j).find("cfg.json"), std::string::npos);
}

TEST(HostileConfig, BadIgnoreRegexIsRefusedAtParse) {
  json j = tiny_config();
  j["quantization_config"] = fp8_quant();
  j["quantization_config"]["ignore"] = {"re:(unclosed"};  // was std::regex_error at load
  EXPECT_NE(config_error(j).find("not a valid regex"), std::string::npos);
}

TEST(HostileConfig, IntegersOutOfRangeAreRefusedNotTruncated) {
  json j = tiny_config();
  j["hidden_size"] = int64_t(1) << 32 | 256;  // truncated to 256 (a valid value) before
  EXPECT_NE(config_error(j).find("'hidden_size' is out of range"), std::string::npos);
  j = tiny_config();
  j["eos_token_id"] = {2, int64_t(1) << 40};
  EXPECT_NE(config_error(j).find("eos_token_id"), std::string::npos);
  j = tiny_config();  // heads * head_dim overflowed int (UB) before the comparison
  j["num_attention_heads"] = 1 << 20;
  j["lightning_nh"] = 1 << 20;
  j["lightning_nkv"] = 1 << 20;
  j["head_dim"] = 1 << 12;
  j["lightning_head_dim"] = 1 << 12;
  j["num_key_value_heads"] = 1 << 16;
  EXPECT_NE(config_error(j).find("must equal hidden_size"), std::string::npos);
}

std::string write_st(const std::string& header, size_t data_bytes,
                     const std::string& data = "") {
  const std::string path = testing::TempDir() + "/hostile-" + std::to_string(::getpid()) + ".safetensors";
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << (data.empty() ? std::string(data_bytes, '\0') : data);
  return path;
}

TEST(HostileSafetensors, Bf16AtAnOddOffsetReadsByBytes) {
  // fuzz_safetensors (session 34): a BF16 tensor at data offset 15 was read through a
  // misaligned uint16_t pointer (UB) by TensorView::to_f32. The format allows any offset.
  std::string data(21, '\0');
  const uint16_t bits[3] = {0x3f80, 0xc000, 0x4040};  // 1, -2, 3
  std::memcpy(&data[15], bits, 6);
  const std::string p = write_st(
      R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[15,21]}})", 0, data);
  sala::SafetensorsFile f(p);
  float got[3];
  f.tensors().at("b").to_f32(got);
  EXPECT_EQ(got[0], 1.f);
  EXPECT_EQ(got[1], -2.f);
  EXPECT_EQ(got[2], 3.f);
  std::remove(p.c_str());
}

TEST(HostileSafetensors, ShapeWhoseProductWrapsIsRefused) {
  // [2^62 + 1, 4] F32 "needs" 16 bytes when the product wraps: accepted before, with
  // numel() overflowing (UB) and a view claiming 2^64 bytes.
  const std::string big = std::to_string((uint64_t(1) << 62) + 1);
  const std::string p =
      write_st(R"({"w":{"dtype":"F32","shape":[)" + big + R"(,4],"data_offsets":[0,16]}})", 16);
  try {
    sala::SafetensorsFile f(p);
    ADD_FAILURE() << "accepted a wrapped shape";
  } catch (const sala::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid shape"), std::string::npos) << e.what();
  }
  // The same file with its real shape loads.
  const std::string ok = write_st(R"({"w":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]}})", 16);
  EXPECT_EQ(sala::SafetensorsFile(ok).tensors().at("w").numel(), 4);
  std::remove(p.c_str());
}

}  // namespace
