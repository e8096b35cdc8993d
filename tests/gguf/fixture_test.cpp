// Reads tests/fixtures/gguf/types.gguf (written by tools/make_gguf_fixtures.py)
// and checks the header, every metadata value type and the tensor infos.
#include <gtest/gtest.h>

#include <cmath>

#include "gguf_test_util.h"

namespace activekv::gguf {
namespace {

using testing::fixture_path;

class FixtureTest : public ::testing::Test {
 protected:
  File file = File::open(fixture_path("types.gguf"));
};

TEST_F(FixtureTest, Header) {
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 64u);  // the fixture sets general.alignment = 64
  EXPECT_EQ(file.data_offset() % 64, 0u);
  EXPECT_EQ(file.data_offset(), 1216u);  // as reported by gguf-py's GGUFReader
  EXPECT_EQ(file.file_size(), testing::read_bytes(fixture_path("types.gguf")).size());
}

TEST_F(FixtureTest, ScalarMetadata) {
  EXPECT_EQ(file.get_string("general.architecture"), "llama");
  EXPECT_EQ(file.get_u64("test.u8"), 200u);
  EXPECT_EQ(file.find("test.i8")->as_i64(), -100);
  EXPECT_EQ(file.get_u64("test.u16"), 60000u);
  EXPECT_EQ(file.find("test.i16")->as_i64(), -30000);
  EXPECT_EQ(file.get_u64("test.u32"), 4000000000u);
  EXPECT_EQ(file.find("test.i32")->as_i64(), -2000000000);
  EXPECT_EQ(file.get_f64("test.f32"), static_cast<double>(0.1f));
  EXPECT_TRUE(file.get_bool("test.bool_true"));
  EXPECT_FALSE(file.get_bool("test.bool_false"));
  EXPECT_EQ(file.get_string("test.string"), "h\xc3\xa9llo GGUF");
  EXPECT_EQ(file.get_u64("test.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(file.find("test.i64")->as_i64(), -(int64_t{1} << 62));
  EXPECT_EQ(file.get_f64("test.f64"), 2.718281828459045);
  EXPECT_EQ(file.get_u64("llama.block_count"), 2u);
}

TEST_F(FixtureTest, ValueTypesAreRecorded) {
  const std::pair<const char*, ValueType> expected[] = {
      {"test.u8", ValueType::UINT8},     {"test.i8", ValueType::INT8},
      {"test.u16", ValueType::UINT16},   {"test.i16", ValueType::INT16},
      {"test.u32", ValueType::UINT32},   {"test.i32", ValueType::INT32},
      {"test.f32", ValueType::FLOAT32},  {"test.bool_true", ValueType::BOOL},
      {"test.string", ValueType::STRING}, {"test.array_str", ValueType::ARRAY},
      {"test.u64", ValueType::UINT64},   {"test.i64", ValueType::INT64},
      {"test.f64", ValueType::FLOAT64},
  };
  for (const auto& [key, type] : expected) {
    ASSERT_NE(file.find(key), nullptr) << key;
    EXPECT_EQ(file.find(key)->type, type) << key;
  }
}

TEST_F(FixtureTest, Arrays) {
  const auto& strs = file.get_array("test.array_str");
  EXPECT_EQ(file.find("test.array_str")->array_type, ValueType::STRING);
  ASSERT_EQ(strs.size(), 4u);
  EXPECT_EQ(strs[0].as_string(), "a");
  EXPECT_EQ(strs[1].as_string(), "bc");
  EXPECT_EQ(strs[2].as_string(), "");
  EXPECT_EQ(strs[3].as_string(), "d\xc3\xa9" "f");

  const auto& ints = file.get_array("test.array_i32");
  ASSERT_EQ(ints.size(), 3u);
  EXPECT_EQ(ints[1].as_i64(), -2);
  const auto& floats = file.get_array("test.array_f32");
  ASSERT_EQ(floats.size(), 2u);
  EXPECT_EQ(floats[1].as_f64(), -1.25);

  const Value* nested = file.find("test.array_nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->array_type, ValueType::ARRAY);
  const auto& outer = nested->as_array();
  ASSERT_EQ(outer.size(), 3u);
  EXPECT_EQ(outer[0].array_type, ValueType::INT32);
  ASSERT_EQ(outer[2].as_array().size(), 3u);
  EXPECT_EQ(outer[2].as_array()[2].as_i64(), 6);
  EXPECT_EQ(nested->to_string(), "[[1, 2], [3], [4, 5, 6]]");
}

TEST_F(FixtureTest, MetadataInFileOrder) {
  const auto& md = file.metadata();
  ASSERT_GE(md.size(), 3u);
  EXPECT_EQ(md[0].first, "general.architecture");
  EXPECT_EQ(md[1].first, "general.alignment");
  EXPECT_EQ(md[2].first, "test.u8");
}

TEST_F(FixtureTest, TypedGettersNameTheKey) {
  EXPECT_THROW(file.get_u64("no.such.key"), Error);
  try {
    file.get_u64("test.string");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(file.get_string("test.u8"), Error);
  EXPECT_THROW(file.get_bool("test.u8"), Error);
  EXPECT_THROW(file.find("test.i8")->as_u64(), Error);  // negative
  EXPECT_THROW(file.find("test.u64")->as_i64(), Error);  // > INT64_MAX
  EXPECT_EQ(file.get_u64_or("absent", 7), 7u);
  EXPECT_EQ(file.get_u64_or("test.u8", 7), 200u);
  EXPECT_EQ(file.get_f64_or("absent", 1.5), 1.5);
  EXPECT_TRUE(file.get_bool_or("absent", true));
  EXPECT_EQ(file.get_string_or("absent", "x"), "x");
  EXPECT_THROW(file.get_u64_or("test.string", 7), Error);  // present, wrong type
}

TEST_F(FixtureTest, TensorInfos) {
  const char* names[] = {"t.f32", "t.f16", "t.bf16", "t.q8_0", "t.q4_0",
                         "t.q4_1", "t.q4_k", "t.q5_k", "t.q6_k"};
  const TensorType types[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16,
                              TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
                              TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
  ASSERT_EQ(file.tensors().size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    const TensorInfo& t = file.tensors()[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.type, types[i]) << t.name;
    EXPECT_EQ(t.dims, (std::vector<uint64_t>{512, 2})) << t.name;
    EXPECT_EQ(t.n_elements, 1024u);
    EXPECT_EQ(t.n_bytes, 2 * row_bytes(t.type, 512)) << t.name;
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_GE(t.offset, file.data_offset());
    EXPECT_LE(t.offset + t.n_bytes, file.file_size());
    EXPECT_EQ(&file.tensor(t.name), &t);
  }
  EXPECT_EQ(file.tensors()[0].offset, file.data_offset());
  EXPECT_EQ(file.find_tensor("absent"), nullptr);
  EXPECT_THROW(file.tensor("absent"), Error);
}

TEST(FixtureMemory, FromMemoryMatchesOpen) {
  const auto bytes = testing::read_bytes(fixture_path("types.gguf"));
  const File f = File::from_memory(bytes);
  const File g = File::open(fixture_path("types.gguf"));
  ASSERT_EQ(f.tensors().size(), g.tensors().size());
  EXPECT_EQ(f.metadata().size(), g.metadata().size());
  EXPECT_EQ(f.data_offset(), g.data_offset());
  EXPECT_EQ(f.tensors()[3].data, bytes.data() + f.tensors()[3].offset);
}

TEST(FixtureMemory, MoveKeepsDataPointersValid) {
  File a = File::open(fixture_path("types.gguf"));
  const uint8_t* p = a.tensors()[0].data;
  File b = std::move(a);
  EXPECT_EQ(b.tensors()[0].data, p);
  float first;
  std::memcpy(&first, p, 4);
  EXPECT_TRUE(std::isinf(first));  // the fixture's F32 tensor starts with +inf
}

TEST(FixtureOpen, MissingAndEmptyFiles) {
  EXPECT_THROW(File::open("/nonexistent/definitely/not.gguf"), Error);
  const std::string empty = ::testing::TempDir() + "/empty.gguf";
  { std::ofstream(empty, std::ios::binary); }
  EXPECT_THROW(File::open(empty), Error);
  EXPECT_THROW(File::open(::testing::TempDir()), Error);  // a directory
  EXPECT_THROW(File::from_memory({}), FormatError);
}

}  // namespace
}  // namespace activekv::gguf
