#include "engine/model/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokenselect::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/safetensors_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // Writes a file from a raw header (unpadded) and data buffer.
  std::string WriteRaw(const std::string& name, const std::string& header, const std::string& data,
                       int64_t header_len = -1) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = header_len >= 0 ? header_len : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << data;
    return path;
  }

  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  absl::Status OpenError(const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    EXPECT_FALSE(file.ok()) << path;
    return file.ok() ? absl::OkStatus() : file.status();
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripAllDtypes) {
  std::vector<float> values(2 * 3 * 5);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : values) v = normal(rng);
  values[0] = 65504.0f;
  values[1] = -std::ldexp(1.0f, -24);
  values[2] = 1.0f + std::ldexp(1.0f, -8);  // a bf16 tie
  const std::vector<float> bias = {0.5f, -0.25f, 2.0f};
  std::vector<TensorToWrite> tensors;
  tensors.push_back({"w.f32", DType::kF32, {2, 3, 5}, values.data(), nullptr});
  tensors.push_back({"w.f16", DType::kF16, {6, 5}, values.data(), nullptr});
  tensors.push_back({"w.bf16", DType::kBF16, {30}, values.data(), nullptr});
  tensors.push_back({"bias", DType::kF32, {3}, bias.data(), nullptr});
  tensors.push_back({"scalar", DType::kF32, {}, bias.data(), nullptr});
  tensors.push_back({"empty", DType::kBF16, {0, 4}, bias.data(), nullptr});
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const std::string bytes = ReadAll(path);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + 30 * 4 + 30 * 2 + 30 * 2 + 3 * 4 + 4);

  auto file = SafetensorsFile::Open(path).value();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), 6u);
  EXPECT_EQ(file->tensors()[0].name, "bias");  // sorted by name
  EXPECT_EQ(file->Find("missing"), nullptr);
  const TensorInfo* f32 = file->Find("w.f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_THAT(f32->shape, ElementsAre(2, 3, 5));
  EXPECT_EQ(f32->num_elements, 30);
  EXPECT_EQ(f32->offset, 0);
  std::vector<float> out(30);
  ASSERT_TRUE(file->ReadFloat32(*f32, out.data()).ok());
  EXPECT_EQ(out, values);
  ASSERT_TRUE(file->ReadFloat32(*file->Find("w.f16"), out.data()).ok());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(out[i], Fp16ToFloat(FloatToFp16(values[i]))) << i;
  EXPECT_EQ(out[0], 65504.0f);
  EXPECT_EQ(out[1], -std::ldexp(1.0f, -24));
  ASSERT_TRUE(file->ReadFloat32(*file->Find("w.bf16"), out.data()).ok());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(out[i], Bf16ToFloat(FloatToBf16(values[i]))) << i;
  EXPECT_EQ(out[2], 1.0f);
  const TensorInfo* scalar = file->Find("scalar");
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->num_elements, 1);
  ASSERT_TRUE(file->ReadFloat32(*scalar, out.data()).ok());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(file->Find("empty")->num_elements, 0);
}

TEST_F(SafetensorsTest, FillCallbackStreamsLargeTensors) {
  const int64_t n = (int64_t{1} << 20) + 17;  // more than one writer chunk
  TensorToWrite t{"big", DType::kBF16, {n}, nullptr, [](int64_t begin, int64_t count, float* out) {
                    for (int64_t i = 0; i < count; ++i)
                      out[i] = static_cast<float>((begin + i) % 256);
                  }};
  const std::string path = dir_ + "/big.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {t}, {}).ok());
  auto file = SafetensorsFile::Open(path).value();
  std::vector<float> out(n);
  ASSERT_TRUE(file->ReadFloat32(*file->Find("big"), out.data()).ok());
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(out[i], static_cast<float>(i % 256));
  EXPECT_EQ(out[n - 1], static_cast<float>((n - 1) % 256));
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const float x = 1.0f;
  const std::string path = dir_ + "/bad.safetensors";
  EXPECT_THAT(
      WriteSafetensors(
          path, {{"a", DType::kF32, {1}, &x, nullptr}, {"a", DType::kF32, {1}, &x, nullptr}}, {})
          .message(),
      HasSubstr("'a' is empty, reserved or repeated"));
  EXPECT_THAT(WriteSafetensors(path, {{"a", DType::kI32, {1}, &x, nullptr}}, {}).message(),
              HasSubstr("tensor 'a': cannot write I32"));
  EXPECT_THAT(WriteSafetensors(path, {{"a", DType::kF32, {-1}, &x, nullptr}}, {}).message(),
              HasSubstr("bad shape [-1]"));
  EXPECT_THAT(WriteSafetensors(path, {{"a", DType::kF32, {1}, nullptr, nullptr}}, {}).message(),
              HasSubstr("neither data nor fill"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(WriteSafetensors(dir_ + "/no/such/dir/x.safetensors",
                             {{"a", DType::kF32, {1}, &x, nullptr}}, {})
                .code(),
            absl::StatusCode::kInternal);
}

TEST_F(SafetensorsTest, RejectsEveryTruncation) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const std::string path = dir_ + "/full.safetensors";
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", DType::kF32, {2, 2}, values.data(), nullptr},
                                {"b", DType::kBF16, {2}, values.data(), nullptr}},
                               {{"format", "pt"}})
                  .ok());
  const std::string bytes = ReadAll(path);
  for (size_t len = 0; len < bytes.size(); ++len) {
    const std::string cut = dir_ + "/cut.safetensors";
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, len);
    auto file = SafetensorsFile::Open(cut);
    ASSERT_FALSE(file.ok()) << "length " << len;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(file.status().message(), HasSubstr(cut));
  }
}

TEST_F(SafetensorsTest, CorruptedBytesNeverCrash) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const std::string path = dir_ + "/full.safetensors";
  ASSERT_TRUE(
      WriteSafetensors(path, {{"a", DType::kF32, {2, 3}, values.data(), nullptr}}, {}).ok());
  const std::string bytes = ReadAll(path);
  std::mt19937 rng(1);
  for (int trial = 0; trial < 400; ++trial) {
    std::string corrupt = bytes;
    const size_t pos = rng() % corrupt.size();
    corrupt[pos] = static_cast<char>(rng());
    const std::string cut = dir_ + "/corrupt.safetensors";
    std::ofstream(cut, std::ios::binary) << corrupt;
    auto file = SafetensorsFile::Open(cut);
    if (file.ok()) {
      // Whatever it parsed must be readable within the mapping.
      for (const TensorInfo& t : (*file)->tensors()) {
        std::vector<float> out(t.num_elements);
        (void)(*file)->ReadFloat32(t, out.data());
      }
    }
  }
}

TEST_F(SafetensorsTest, HeaderErrors) {
  EXPECT_EQ(SafetensorsFile::Open(dir_ + "/missing.safetensors").status().code(),
            absl::StatusCode::kNotFound);
  std::string path = WriteRaw("short", "", "", -1).substr(0);
  { std::ofstream(path, std::ios::binary) << "abc"; }
  EXPECT_EQ(OpenError(path).message(),
            path + ": file is 3 bytes, too short for the 8-byte header length");
  path = WriteRaw("beyond", "{}", "", 100);
  EXPECT_EQ(OpenError(path).message(),
            path + ": header length 100 runs past the end of the file (10 bytes; truncated?)");
  path = WriteRaw("huge", "{}", "", int64_t{1} << 40);
  EXPECT_THAT(OpenError(path).message(), HasSubstr("exceeds the limit"));
  path = WriteRaw("json", "{\"a\": ", "");
  EXPECT_THAT(OpenError(path).message(), HasSubstr(path + ": invalid JSON header: "));
  path = WriteRaw("array", "[1]", "");
  EXPECT_EQ(OpenError(path).message(), path + ": header is not a JSON object");
  path = WriteRaw("meta", R"({"__metadata__": {"format": 1}})", "");
  EXPECT_EQ(OpenError(path).message(), path + ": __metadata__ value for 'format' is not a string");
  path = WriteRaw("empty_ok", "{}", "");
  EXPECT_TRUE(SafetensorsFile::Open(path).ok());
}

TEST_F(SafetensorsTest, TensorEntryErrors) {
  const std::string data(16, '\0');
  struct Case {
    std::string header;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"w": 1})", "tensor 'w': header entry is not an object"},
      {R"({"w": {"shape": [4], "data_offsets": [0, 16]}})",
       "tensor 'w': missing or non-string dtype"},
      {R"({"w": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}})",
       "tensor 'w': unknown dtype \"F33\""},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})",
       "tensor 'w': missing or non-list shape"},
      {R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})",
       "tensor 'w': bad shape [-4]"},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})",
       "tensor 'w': shape [4294967296,4294967296] is too large"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})",
       "tensor 'w': data_offsets must be a list [begin, end]"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})",
       "tensor 'w': bad data_offsets [16,0]"},
      {R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})",
       "tensor 'w': data_offsets [0,32] run past the end of the data buffer (16 bytes; file "
       "truncated?)"},
      {R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})",
       "tensor 'w': data_offsets [0,16] span 16 bytes but shape [2, 3] of F32 needs 24"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}})",
       "tensor 'b': data at [8, 16) overlaps tensor 'a'"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F16", "shape": [2], "data_offsets": [12, 16]}})",
       "tensor 'b': data starts at 12, leaving a gap after byte 8"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       "the tensors cover 8 bytes of a 16-byte data buffer"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteRaw("case.safetensors", c.header, data);
    EXPECT_EQ(OpenError(path).message(), path + ": " + c.message) << c.header;
  }
}

TEST_F(SafetensorsTest, UnsupportedDtypeErrorNamesTensor) {
  const std::string path = WriteRaw(
      "int.safetensors",
      R"({"model.layers.0.mlp.up_proj.weight": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
      std::string(8, '\0'));
  auto file = SafetensorsFile::Open(path).value();
  std::vector<float> out(2);
  absl::Status s = file->ReadFloat32(file->tensors()[0], out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), path +
                             ": tensor 'model.layers.0.mlp.up_proj.weight': dtype I32 is not "
                             "supported (F32, F16 or BF16)");
}

TEST_F(SafetensorsTest, ShardedCheckpointThroughIndex) {
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<float> b = {5, 6};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors",
                               {{"a", DType::kF32, {2, 2}, a.data(), nullptr},
                                {"unlisted", DType::kF32, {1}, a.data(), nullptr}},
                               {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors",
                               {{"b", DType::kBF16, {2}, b.data(), nullptr}}, {{"format", "pt"}})
                  .ok());
  auto write_index = [&](const std::string& text) {
    std::ofstream(dir_ + "/model.safetensors.index.json") << text;
  };
  write_index(R"({"metadata": {"total_size": 20}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::Open(dir_).value();
  EXPECT_THAT(checkpoint->Names(), ElementsAre("a", "b"));  // "unlisted" is not mapped
  EXPECT_EQ(checkpoint->files().size(), 2u);
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = checkpoint->Find("b", &file);
  ASSERT_NE(info, nullptr);
  EXPECT_THAT(file->path(), HasSubstr("model-00002-of-00002"));
  std::vector<float> out(2);
  ASSERT_TRUE(file->ReadFloat32(*info, out.data()).ok());
  EXPECT_EQ(out, b);
  EXPECT_EQ(checkpoint->Find("unlisted"), nullptr);

  const std::string index_path = dir_ + "/model.safetensors.index.json";
  write_index(R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_).status().message(),
            index_path +
                ": tensor 'a' is mapped to model-00002-of-00002.safetensors, which "
                "does not hold it");
  write_index(R"({"weight_map": {"a": "../model.safetensors"}})");
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_).status().message(),
            index_path +
                ": tensor 'a' is mapped to '../model.safetensors', which is not a file "
                "in " +
                dir_);
  write_index(R"({"weight_map": {"a": "model-00003-of-00002.safetensors"}})");
  absl::Status missing = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(index_path + ": shard of 'a': cannot open "));
  write_index(R"({"metadata": {}})");
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_).status().message(),
            index_path + ": has no weight_map object");
  write_index(R"({"weight_map": {"a": 3}})");
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_).status().message(),
            index_path + ": weight_map entry for 'a' is not a file name");
  write_index("{");
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_).status().message(),
              HasSubstr(index_path + ": invalid JSON header"));

  // Without an index every *.safetensors is read; a tensor in two files is ambiguous.
  std::filesystem::remove(index_path);
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_).value()->Names(),
              ElementsAre("a", "b", "unlisted"));
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-extra.safetensors",
                               {{"b", DType::kF32, {2}, b.data(), nullptr}}, {})
                  .ok());
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_).status().message(),
              HasSubstr("tensor 'b' is also in"));
}

TEST_F(SafetensorsTest, SingleFileCheckpointWinsAndEmptyDirIsNotFound) {
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir_).status().code(), absl::StatusCode::kNotFound);
  const std::vector<float> a = {1, 2};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors",
                               {{"a", DType::kF32, {2}, a.data(), nullptr}}, {})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir_ + "/other.safetensors",
                               {{"a", DType::kF32, {2}, a.data(), nullptr}}, {})
                  .ok());
  EXPECT_THAT(SafetensorsCheckpoint::Open(dir_).value()->Names(), ElementsAre("a"));
}

}  // namespace
}  // namespace tokenselect::engine
