// safetensors checkpoints as Hugging Face ships them: one `model.safetensors`, or a
// `model.safetensors.index.json` naming shards. Files are mmap'ed read-only; tensors are
// views into the mapping. Every header is validated before use, so a truncated or corrupt
// file is refused with sala::Error naming the file and the tensor.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sala {

struct TensorView {
  std::string name;
  std::string file;  // which file holds it (for messages)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;
  // Element i converted to fp32 (bf16/fp16/fp32 only).
  float get_f32(int64_t i) const;
  // The whole tensor converted to fp32, split over the machine's cores when it is large (the
  // first writes of a fresh buffer, its page faults, are split with it).
  void to_f32(float* out) const;
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory (single file or sharded with an index).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& model_dir);
  const TensorView* find(const std::string& name) const;
  const TensorView& get(const std::string& name) const;  // sala::Error if missing
  const std::map<std::string, const TensorView*>& all() const { return index_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// Writer used by `sala make-random`, tests and tools.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Streaming writer for checkpoints too large to hold twice in memory: the header is
// written from the specs (bytes left empty), then fill(i, buffer) produces tensor i's bytes
// in order.
void write_safetensors_streaming(
    const std::string& path, const std::vector<TensorToWrite>& specs,
    const std::function<void(size_t, std::vector<uint8_t>&)>& fill);

}  // namespace sala
