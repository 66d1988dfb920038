#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tokenselect::engine {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::Status FileError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status TensorError(absl::string_view path, absl::string_view tensor, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", tensor, "': ", what));
}

absl::StatusOr<Json> ParseJson(absl::string_view path, absl::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded()) return json;
  // Parse again with exceptions for the position of the error; nothing escapes this function.
  try {
    const Json reparsed = Json::parse(text.begin(), text.end());
    (void)reparsed;
  } catch (const Json::exception& e) {
    return FileError(path, absl::StrCat("invalid JSON header: ", e.what()));
  }
  return FileError(path, "invalid JSON header");
}

// A non-negative JSON integer, or nullopt.
std::optional<int64_t> NonNegativeInt(const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
  } else if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return value.get<int64_t>();
  }
  return std::nullopt;
}

absl::StatusOr<TensorInfo> ParseTensorEntry(absl::string_view path, const std::string& name,
                                            const Json& entry, int64_t buffer_size) {
  if (!entry.is_object()) return TensorError(path, name, "header entry is not an object");
  TensorInfo info;
  info.name = name;
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(path, name, "missing or non-string dtype");
  }
  const std::optional<DType> dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.has_value()) {
    return TensorError(path, name, absl::StrCat("unknown dtype ", dtype_it->dump()));
  }
  info.dtype = *dtype;
  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return TensorError(path, name, "missing or non-list shape");
  }
  int64_t elements = 1;
  for (const Json& dim : *shape_it) {
    const std::optional<int64_t> d = NonNegativeInt(dim);
    if (!d.has_value()) {
      return TensorError(path, name, absl::StrCat("bad shape ", shape_it->dump()));
    }
    if (*d != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / *d) {
      return TensorError(path, name, absl::StrCat("shape ", shape_it->dump(), " is too large"));
    }
    elements *= *d;
    info.shape.push_back(*d);
  }
  info.num_elements = elements;
  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return TensorError(path, name, "data_offsets must be a list [begin, end]");
  }
  const std::optional<int64_t> begin = NonNegativeInt((*offsets_it)[0]);
  const std::optional<int64_t> end = NonNegativeInt((*offsets_it)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end) {
    return TensorError(path, name, absl::StrCat("bad data_offsets ", offsets_it->dump()));
  }
  if (*end > buffer_size) {
    return TensorError(
        path, name,
        absl::StrCat("data_offsets ", offsets_it->dump(), " run past the end of the data buffer (",
                     buffer_size, " bytes; file truncated?)"));
  }
  info.offset = *begin;
  info.num_bytes = *end - *begin;
  const int64_t expected = elements * DTypeSize(info.dtype);
  if (info.num_bytes != expected) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets ", offsets_it->dump(), " span ", info.num_bytes,
                                    " bytes but shape ", ShapeString(info.shape), " of ",
                                    DTypeName(info.dtype), " needs ", expected));
  }
  return info;
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return FileError(path, "not a regular file");
  }
  const int64_t size = st.st_size;
  const unsigned char* map = nullptr;
  if (size > 0) {
    void* addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
    map = static_cast<const unsigned char*>(addr);
  }
  ::close(fd);  // the mapping keeps the file alive
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, map, size));
  RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

SafetensorsFile::SafetensorsFile(std::string path, const unsigned char* map, int64_t size)
    : path_(std::move(path)), map_(map), size_(size) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), static_cast<size_t>(size_));
}

absl::Status SafetensorsFile::ParseHeader() {
  if (size_ < 8) {
    return FileError(
        path_, absl::StrCat("file is ", size_, " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len;
  std::memcpy(&header_len, map_, sizeof(header_len));  // little-endian host (dtype.cc checks)
  if (header_len > kMaxHeaderBytes) {
    return FileError(path_, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                         kMaxHeaderBytes, " bytes"));
  }
  if (header_len > static_cast<uint64_t>(size_ - 8)) {
    return FileError(
        path_, absl::StrCat("header length ", header_len, " runs past the end of the file (", size_,
                            " bytes; truncated?)"));
  }
  const absl::string_view text(reinterpret_cast<const char*>(map_ + 8), header_len);
  ASSIGN_OR_RETURN(Json header, ParseJson(path_, text));
  if (!header.is_object()) return FileError(path_, "header is not a JSON object");
  data_ = map_ + 8 + header_len;
  const int64_t buffer_size = size_ - 8 - static_cast<int64_t>(header_len);

  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return FileError(path_, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return FileError(path_,
                           absl::StrCat("__metadata__ value for '", m.key(), "' is not a string"));
        }
        metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info, ParseTensorEntry(path_, it.key(), *it, buffer_size));
    tensors.push_back(std::move(info));
  }
  // The tensors must tile the data buffer: sorted by offset, each starts where the last ended.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::make_pair(a->offset, a->num_bytes) < std::make_pair(b->offset, b->num_bytes);
  });
  int64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->offset < covered) {
      return TensorError(path_, t->name,
                         absl::StrCat("data at [", t->offset, ", ", t->offset + t->num_bytes,
                                      ") overlaps tensor '", previous->name, "'"));
    }
    if (t->offset > covered) {
      return TensorError(
          path_, t->name,
          absl::StrCat("data starts at ", t->offset, ", leaving a gap after byte ", covered));
    }
    covered = t->offset + t->num_bytes;
    previous = t;
  }
  if (covered != buffer_size) {
    return FileError(path_, absl::StrCat("the tensors cover ", covered, " bytes of a ", buffer_size,
                                         "-byte data buffer"));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  tensors_ = std::move(tensors);
  metadata_ = std::move(metadata);
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, absl::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const unsigned char* SafetensorsFile::Data(const TensorInfo& tensor) const {
  return data_ + tensor.offset;
}

absl::Status SafetensorsFile::ReadFloat32(const TensorInfo& tensor, float* out) const {
  if (!IsFloat32Convertible(tensor.dtype)) {
    return TensorError(
        path_, tensor.name,
        absl::StrCat("dtype ", DTypeName(tensor.dtype), " is not supported (F32, F16 or BF16)"));
  }
  ConvertToFloat32(tensor.dtype, Data(tensor), tensor.num_elements, out);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  namespace fs = std::filesystem;
  auto checkpoint = std::make_unique<SafetensorsCheckpoint>();
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return FileError(index_path, "cannot read");
    ASSIGN_OR_RETURN(Json index, ParseJson(index_path, text.str()));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return FileError(index_path, "has no weight_map object");
    }
    std::map<std::string, size_t> file_index;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string()) {
        return FileError(index_path,
                         absl::StrCat("weight_map entry for '", it.key(), "' is not a file name"));
      }
      const std::string shard = it->get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        return FileError(index_path, absl::StrCat("tensor '", it.key(), "' is mapped to '", shard,
                                                  "', which is not a file in ", dir));
      }
      auto [pos, inserted] = file_index.emplace(shard, checkpoint->files_.size());
      if (inserted) {
        ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(dir + "/" + shard),
                         _.WithPrefix(absl::StrCat(index_path, ": shard of '", it.key(), "': ")));
        checkpoint->files_.push_back(std::move(file));
      }
      if (checkpoint->files_[pos->second]->Find(it.key()) == nullptr) {
        return FileError(index_path, absl::StrCat("tensor '", it.key(), "' is mapped to ", shard,
                                                  ", which does not hold it"));
      }
      checkpoint->location_[it.key()] = pos->second;
    }
    return checkpoint;
  }
  std::vector<std::string> paths;
  if (fs::exists(dir + "/model.safetensors", ec)) {
    paths.push_back(dir + "/model.safetensors");
  } else {
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
    }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no model.safetensors, model.safetensors.index.json or *.safetensors in ", dir));
  }
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const TensorInfo& t : file->tensors()) {
      auto [it, inserted] = checkpoint->location_.emplace(t.name, checkpoint->files_.size());
      if (!inserted) {
        return FileError(path, absl::StrCat("tensor '", t.name, "' is also in ",
                                            checkpoint->files_[it->second]->path(),
                                            " and there is no index to choose"));
      }
    }
    checkpoint->files_.push_back(std::move(file));
  }
  return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(location_.size());
  for (const auto& [name, file] : location_) names.push_back(name);
  return names;
}

const TensorInfo* SafetensorsCheckpoint::Find(absl::string_view name,
                                              const SafetensorsFile** file) const {
  auto it = location_.find(name);
  if (it == location_.end()) return nullptr;
  const SafetensorsFile* holder = files_[it->second].get();
  if (file != nullptr) *file = holder;
  return holder->Find(name);
}

// ---------------------------------------------------------------------------------------------
// Writing

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Header first: validates every tensor before a byte is written.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  }
  std::set<std::string> names;
  std::vector<int64_t> counts;
  int64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is empty, reserved or repeated"));
    }
    if (!IsFloat32Convertible(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "': cannot write ", DTypeName(t.dtype)));
    }
    if (t.data == nullptr && !t.fill) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' has neither data nor fill"));
    }
    int64_t count = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", t.name, "': bad shape ", ShapeString(t.shape)));
      }
      count *= d;
    }
    counts.push_back(count);
    const int64_t bytes = count * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = true;
  const uint64_t header_len = text.size();
  ok = ok && std::fwrite(&header_len, sizeof(header_len), 1, f) == 1;
  ok = ok && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  // Convert in chunks so that large tensors never need a second full-size copy.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> staging;
  std::vector<unsigned char> bytes;
  for (size_t i = 0; i < tensors.size() && ok; ++i) {
    const TensorToWrite& t = tensors[i];
    const int64_t size = DTypeSize(t.dtype);
    for (int64_t begin = 0; begin < counts[i] && ok; begin += kChunk) {
      const int64_t n = std::min(kChunk, counts[i] - begin);
      const float* src = t.data != nullptr ? t.data + begin : nullptr;
      if (src == nullptr) {
        staging.resize(n);
        t.fill(begin, n, staging.data());
        src = staging.data();
      }
      bytes.resize(n * size);
      ConvertFromFloat32(t.dtype, src, n, bytes.data());
      ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    }
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace tokenselect::engine
