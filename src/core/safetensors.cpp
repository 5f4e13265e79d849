#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/parallel.h"

namespace sala {
namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

float TensorView::get_f32(int64_t i) const {
  switch (dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t b;
      std::memcpy(&b, data + 2 * i, 2);
      return bf16_to_f32(b);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      return float(v);
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, data + 8 * i, 8);
      return float(v);
    }
    case DType::F8_E4M3: return fp8_e4m3_to_f32(data[i]);  // the code's value, unscaled
  }
  return 0.f;
}

void TensorView::to_f32(float* out) const {
  parallel_parts(numel(), 1, [&](int64_t i0, int64_t i1) {
    if (dtype == DType::F32) {
      std::memcpy(out + i0, data + 4 * i0, size_t(i1 - i0) * 4);
    } else if (dtype == DType::BF16) {
      // Byte copies: data offsets need not be even (the format has no alignment rule).
      for (int64_t i = i0; i < i1; ++i) {
        uint16_t b;
        std::memcpy(&b, data + 2 * i, 2);
        out[i] = bf16_to_f32(b);
      }
    } else {
      for (int64_t i = i0; i < i1; ++i) out[i] = get_f32(i);
    }
  });
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(errno));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("{}: mmap failed: {}", path, std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

static DType parse_dtype(const std::string& s, const std::string& file, const std::string& name) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  fail("{}: tensor '{}' has unsupported dtype '{}' (supported: F32, BF16, F16, I32, I64, F8_E4M3)",
       file, name,
       s);
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_unique<MappedFile>(path)) {
  const size_t size = file_->size();
  if (size < 8) fail("{}: file is {} bytes, too short for a safetensors header", path, size);
  uint64_t header_len;
  std::memcpy(&header_len, file_->data(), 8);
  if (header_len > size - 8)
    fail("{}: header length {} exceeds the file size {} (truncated or not safetensors)", path,
         header_len, size);
  const char* hdr = reinterpret_cast<const char*>(file_->data() + 8);
  json j = json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail("{}: header is not a valid JSON object", path);
  const uint8_t* base = file_->data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto& [k, m] : v.items())
          if (m.is_string()) metadata_[k] = m.get<std::string>();
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      fail("{}: tensor '{}' has a malformed header entry", path, name);
    TensorView t;
    t.name = name;
    t.file = path;
    t.dtype = parse_dtype(v["dtype"].get<std::string>(), path, name);
    // The byte count is computed with overflow checks: a shape whose product wraps (e.g.
    // [2^62 + 1, 4] F32 "needs" 16 bytes) would pass the size check below and describe a
    // tensor far larger than its data (and numel() would overflow: UB).
    uint64_t want = dtype_size(t.dtype);
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
          __builtin_mul_overflow(want, d.get<uint64_t>(), &want) || want > uint64_t(INT64_MAX))
        fail("{}: tensor '{}' has an invalid shape {}", path, name, v["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor '{}' has invalid data_offsets", path, name);
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      fail("{}: tensor '{}' data [{}, {}) lies outside the {} data bytes (truncated file?)", path,
           name, b, e, data_size);
    if (e - b != want)
      fail("{}: tensor '{}' {} {} needs {} bytes but its offsets span {}", path, name,
           dtype_name(t.dtype), t.shape_str(), want, e - b);
    t.data = base + b;
    t.nbytes = size_t(e - b);
    tensors_.emplace(name, std::move(t));
  }
}

Checkpoint::Checkpoint(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      fail("{}: not a valid safetensors index (missing 'weight_map')", index.string());
    std::map<std::string, std::string> weight_map;
    for (auto& [name, f] : j["weight_map"].items()) {
      if (!f.is_string()) fail("{}: weight_map['{}'] is not a file name", index.string(), name);
      weight_map[name] = f.get<std::string>();
      if (std::find(shard_names.begin(), shard_names.end(), weight_map[name]) ==
          shard_names.end())
        shard_names.push_back(weight_map[name]);
    }
    for (auto& s : shard_names) files_.push_back(std::make_unique<SafetensorsFile>((dir / s).string()));
    for (auto& [name, f] : weight_map) {
      const TensorView* found = nullptr;
      for (auto& file : files_)
        if (fs::path(file->path()).filename() == f) {
          auto it = file->tensors().find(name);
          if (it != file->tensors().end()) found = &it->second;
        }
      if (!found) fail("{}: tensor '{}' is listed in the index but missing from shard {}",
                       index.string(), name, f);
      index_[name] = found;
    }
    // Tensors present in shards but absent from the index are still reported by the loader.
    for (auto& file : files_)
      for (auto& [name, t] : file->tensors()) index_.try_emplace(name, &t);
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (auto& [name, t] : files_[0]->tensors()) index_[name] = &t;
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", model_dir);
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) fail("checkpoint has no tensor '{}'", name);
  return *t;
}

static uint64_t spec_bytes(const TensorToWrite& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= uint64_t(d);
  return n;
}

void write_safetensors_streaming(
    const std::string& path, const std::vector<TensorToWrite>& specs,
    const std::function<void(size_t, std::vector<uint8_t>&)>& fill,
    const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (auto& t : specs) {
    const uint64_t n = spec_bytes(t);
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot write", path);
  uint64_t n = hs.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(hs.data(), std::streamsize(hs.size()));
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < specs.size(); ++i) {
    fill(i, buf);
    SALA_CHECK(buf.size() == spec_bytes(specs[i]), "tensor {} has {} bytes, shape needs {}",
               specs[i].name, buf.size(), spec_bytes(specs[i]));
    out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
  }
  if (!out) fail("{}: write failed", path);
}

void write_safetensors_streaming(
    const std::string& path, const std::vector<TensorToWrite>& specs,
    const std::function<void(size_t, std::vector<uint8_t>&)>& fill) {
  write_safetensors_streaming(path, specs, fill, {});
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors_streaming(
      path, tensors, [&](size_t i, std::vector<uint8_t>& b) { b = tensors[i].bytes; }, metadata);
}

}  // namespace sala
