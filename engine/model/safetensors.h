// Safetensors checkpoints: reading (memory-mapped, fully validated) and writing.
//
// File format: an 8-byte little-endian header length N, then N bytes of JSON (padded with
// spaces), then the data buffer. The JSON maps each tensor name to
//   {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}
// with offsets relative to the start of the data buffer, plus an optional "__metadata__" object
// of string values. The tensors must tile the data buffer exactly: no overlaps, no gaps, and
// end - begin == product(shape) * dtype size.
//
// A checkpoint directory holds either model.safetensors, or shards listed in
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: shard file}}).
//
// Every error names the file and, where there is one, the tensor; a failed Open leaves nothing
// behind (no mapping, no partial object).
#ifndef TOKENSELECT_ENGINE_MODEL_SAFETENSORS_H_
#define TOKENSELECT_ENGINE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/dtype.h"

namespace tokenselect::engine {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  int64_t offset = 0;  // of the first byte, within the data buffer
  int64_t num_bytes = 0;
};

// "[4096, 1024]".
std::string ShapeString(const std::vector<int64_t>& shape);

// One memory-mapped .safetensors file. Thread-compatible: const methods may run concurrently.
class SafetensorsFile {
 public:
  // Maps and validates `path`. NotFound when it cannot be opened; InvalidArgument naming the
  // file (and tensor) for a truncated file, a header length beyond the file, bad JSON, an
  // unknown dtype, bad shapes or offsets (out of range, overlapping, gaps, or inconsistent with
  // shape * dtype size) and non-string metadata.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Raw little-endian bytes of `tensor` (num_bytes of them; no alignment guarantee).
  const unsigned char* Data(const TensorInfo& tensor) const;

  // Converts `tensor` (F32, F16 or BF16) to fp32 into out[tensor.num_elements].
  // InvalidArgument naming the file and tensor for any other dtype.
  absl::Status ReadFloat32(const TensorInfo& tensor, float* out) const;

 private:
  SafetensorsFile(std::string path, const unsigned char* map, int64_t size);
  absl::Status ParseHeader();

  std::string path_;
  const unsigned char* map_;  // nullptr when size_ == 0
  int64_t size_;
  const unsigned char* data_ = nullptr;  // start of the data buffer
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a checkpoint directory across its files.
class SafetensorsCheckpoint {
 public:
  // Opens <dir>/model.safetensors.index.json and its shards, else <dir>/model.safetensors,
  // else every *.safetensors in `dir`. NotFound when there is none; InvalidArgument when the
  // index is malformed, names a shard outside `dir`, or maps a tensor to a shard that does not
  // hold it, or when a tensor appears in two files without an index.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  // Sorted tensor names.
  std::vector<std::string> Names() const;
  // nullptr when absent; `file` (when not null) receives the file that holds it.
  const TensorInfo* Find(absl::string_view name, const SafetensorsFile** file = nullptr) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Tensor name -> index into files_.
  std::map<std::string, size_t, std::less<>> location_;
};

// One tensor for WriteSafetensors: either `data` (num_elements floats) or, for tensors too
// large to hold at once, `fill`, called for consecutive chunks (begin, count, out[count]).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;  // F32, F16 or BF16; values are rounded to nearest even
  std::vector<int64_t> shape;
  const float* data = nullptr;
  std::function<void(int64_t begin, int64_t count, float* out)> fill;
};

// Writes a .safetensors file (tensors in the given order, header padded to a multiple of 8
// bytes) through a temporary file renamed into place, so `path` is either complete or absent.
// InvalidArgument for empty or duplicate names, a negative dimension, a dtype other than
// F32/F16/BF16, or neither data nor fill; Internal for I/O errors.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace tokenselect::engine

#endif  // TOKENSELECT_ENGINE_MODEL_SAFETENSORS_H_
