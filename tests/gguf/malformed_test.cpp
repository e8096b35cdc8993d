// Malformed inputs: every one must raise FormatError naming the field, never
// crash, never over-read (try_parse copies into an exact-size buffer so ASan
// sees over-reads) and never allocate according to a bogus count.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "gguf_test_util.h"

namespace activekv::gguf {
namespace {

using testing::Builder;
using testing::try_parse;

constexpr uint32_t kF32 = 0, kQ4_0 = 2;
constexpr uint64_t kHuge = uint64_t{1} << 60;

/// Expects a FormatError whose field contains `field` and whose message
/// contains `needle` (and the field name).
void expect_error(const std::vector<uint8_t>& bytes, const std::string& field,
                  const std::string& needle = "") {
  const auto err = try_parse(bytes);
  ASSERT_TRUE(err.has_value()) << "parsed without error; expected field " << field;
  const std::string what = err->what();
  EXPECT_NE(err->field().find(field), std::string::npos) << what;
  EXPECT_NE(what.find(field), std::string::npos) << what;
  EXPECT_NE(what.find(needle), std::string::npos) << what;
  EXPECT_LE(err->byte_offset(), bytes.size()) << what;
}

/// A valid file: one kv and one 32-element F32 tensor.
Builder valid_one_tensor(const std::vector<uint64_t>& dims = {32}, uint32_t type = kF32,
                         uint64_t offset = 0, uint64_t data_bytes = 128) {
  Builder b;
  b.header(1, 1).kv_u32("llama.block_count", 1).tensor("w", dims, type, offset);
  b.data(data_bytes);
  return b;
}

TEST(Malformed, BuilderBaselineParses) {
  const auto bytes = valid_one_tensor().bytes;
  const File f = File::from_memory(bytes);
  EXPECT_EQ(f.alignment(), 32u);  // default
  EXPECT_EQ(f.tensors().at(0).n_bytes, 128u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_FALSE(try_parse(bytes).has_value());
}

TEST(Malformed, EmptyArrayAndNoTensorsParse) {
  Builder b;
  b.header(0, 1).str("empty").u32(9).u32(0).u64(0);  // ARRAY of UINT8, length 0
  const File f = File::from_memory(b.bytes);
  EXPECT_TRUE(f.get_array("empty").empty());
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Malformed, TruncatedFixtureAtEveryByte) {
  const auto full = testing::read_bytes(testing::fixture_path("types.gguf"));
  const File f = File::from_memory(full);
  uint64_t data_end = 0;
  for (const auto& t : f.tensors()) data_end = std::max(data_end, t.offset + t.n_bytes);
  // Every cut before the last tensor's end must fail: in the header/metadata
  // /tensor infos by a short read, in the data section by an extent check.
  for (uint64_t cut = 0; cut < data_end; ++cut) {
    std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
    const auto err = try_parse(part);
    ASSERT_TRUE(err.has_value()) << "cut at " << cut << " parsed";
    ASSERT_FALSE(err->field().empty());
  }
}

TEST(Malformed, TruncatedBuilderHasFieldNames) {
  const auto full = valid_one_tensor().bytes;
  expect_error({full.begin(), full.begin() + 2}, "header.magic", "truncated");
  expect_error({full.begin(), full.begin() + 6}, "header.version", "truncated");
  expect_error({full.begin(), full.begin() + 20}, "header.kv_count");
  // kv_count 1 needs >= 13 bytes after the header, so cut 30 fails on the count...
  expect_error({full.begin(), full.begin() + 30}, "header.kv_count", "cannot fit");
  // ...and (with no tensors to reserve room for) cut 40 is inside the 17-byte key.
  Builder kv_only;
  kv_only.header(0, 1).kv_u32("llama.block_count", 1);
  const auto& k = kv_only.bytes;
  expect_error({k.begin(), k.begin() + 40}, "kv[0].key", "string length 17");
  expect_error({k.begin(), k.end() - 1}, "kv['llama.block_count'].value", "truncated");
}

TEST(Malformed, BadMagic) {
  auto bytes = valid_one_tensor().bytes;
  bytes[0] = 'X';
  expect_error(bytes, "header.magic", "magic");
}

TEST(Malformed, BadVersion) {
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    Builder b;
    b.header(0, 0, v);
    expect_error(b.bytes, "header.version", "version " + std::to_string(v));
  }
  Builder v2;
  v2.header(0, 0, 2);
  EXPECT_EQ(File::from_memory(v2.bytes).version(), 2u);
}

TEST(Malformed, HugeCounts) {
  Builder t;
  t.header(kHuge, 0).data(64);
  expect_error(t.bytes, "header.tensor_count", "cannot fit");
  Builder k;
  k.header(0, ~uint64_t{0}).data(64);
  expect_error(k.bytes, "header.kv_count", "cannot fit");
}

TEST(Malformed, HugeStringLength) {
  Builder key;
  key.header(0, 1).u64(uint64_t{1} << 63).raw("abc", 3).data(64);
  expect_error(key.bytes, "kv[0].key", "string length");
  Builder val;
  val.header(0, 1).str("k").u32(8).u64(kHuge).raw("abc", 3).data(64);
  expect_error(val.bytes, "kv['k'].value", "string length");
  Builder name;
  name.header(1, 0).u64(kHuge).data(64);
  expect_error(name.bytes, "tensor_infos[0].name", "string length");
}

TEST(Malformed, HugeArrayLength) {
  for (uint32_t elem_type : {0u /*UINT8*/, 8u /*STRING*/, 9u /*ARRAY*/, 12u /*FLOAT64*/}) {
    Builder b;
    b.header(0, 1).str("arr").u32(9).u32(elem_type).u64(kHuge).data(64);
    expect_error(b.bytes, "kv['arr'].value.array_length", "cannot fit");
  }
  // Nested: the inner array's length is the bogus one.
  Builder n;
  n.header(0, 1).str("arr").u32(9).u32(9).u64(1).u32(4).u64(kHuge).data(64);
  expect_error(n.bytes, "kv['arr'].value[0].array_length", "cannot fit");
}

TEST(Malformed, DeeplyNestedArrays) {
  Builder b;
  b.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 1000; ++i) b.u32(9).u64(1);
  b.u32(0).u64(0);
  expect_error(b.bytes, "kv['deep'].value", "nested");
}

TEST(Malformed, UnknownValueTypeAndBadBool) {
  Builder t;
  t.header(0, 1).str("k").u32(13).u32(0);
  expect_error(t.bytes, "kv['k'].type", "unknown metadata value type 13");
  Builder a;
  a.header(0, 1).str("k").u32(9).u32(77).u64(1).u32(0);
  expect_error(a.bytes, "kv['k'].value.array_type", "77");
  Builder bl;
  bl.header(0, 1).str("k").u32(7).u8(2);
  expect_error(bl.bytes, "kv['k'].value", "bool");
}

TEST(Malformed, DuplicateKeyAndTensorName) {
  Builder k;
  k.header(0, 2).kv_u32("a", 1).kv_u32("a", 2);
  expect_error(k.bytes, "kv['a'].key", "duplicate");
  Builder t;
  t.header(2, 0).tensor("w", {32}, kF32, 0).tensor("w", {32}, kF32, 128).data(256);
  expect_error(t.bytes, "tensor_infos[1].name", "duplicate tensor name 'w'");
}

TEST(Malformed, OffsetOutOfRange) {
  expect_error(valid_one_tensor({32}, kF32, 1 << 20).bytes, "tensor_infos[0].offset",
               "exceeds file size");
  expect_error(valid_one_tensor({32}, kF32, ~uint64_t{0} & ~uint64_t{31}).bytes,
               "tensor_infos[0].offset", "exceeds file size");  // add overflows
  expect_error(valid_one_tensor({32}, kF32, 0, 127).bytes, "tensor_infos[0].offset",
               "exceeds file size");  // one byte short
}

TEST(Malformed, MisalignedOffset) {
  expect_error(valid_one_tensor({32}, kF32, 4, 256).bytes, "tensor_infos[0].offset",
               "not a multiple of the alignment 32");
}

TEST(Malformed, UnknownTensorType) {
  expect_error(valid_one_tensor({32}, 99).bytes, "tensor_infos[0].type", "'w'");
  expect_error(valid_one_tensor({32}, 99).bytes, "tensor_infos[0].type", "type id 99");
  expect_error(valid_one_tensor({32}, 7).bytes, "tensor_infos[0].type", "type id 7");  // Q5_1: not read
}

TEST(Malformed, ZeroDim) {
  expect_error(valid_one_tensor({32, 0}).bytes, "tensor_infos[0].dims[1]", "zero-size dim");
  expect_error(valid_one_tensor({0}).bytes, "tensor_infos[0].dims[0]", "zero-size dim");
}

TEST(Malformed, TooManyOrNoDims) {
  expect_error(valid_one_tensor({32, 1, 1, 1, 1}).bytes, "tensor_infos[0].n_dims", "n_dims 5");
  expect_error(valid_one_tensor({}).bytes, "tensor_infos[0].n_dims", "n_dims 0");
  Builder b;
  b.header(1, 0).str("w").u32(0xffffffffu).data(64);
  expect_error(b.bytes, "tensor_infos[0].n_dims");
  EXPECT_FALSE(try_parse(valid_one_tensor({32, 1, 1, 1}).bytes).has_value());
}

TEST(Malformed, DimProductOverflow) {
  const uint64_t big = uint64_t{1} << 32;
  expect_error(valid_one_tensor({big, big}).bytes, "tensor_infos[0].dims[1]", "overflows");
  // Elements fit but bytes do not: 2^62 F32 elements.
  expect_error(valid_one_tensor({uint64_t{1} << 62}).bytes, "tensor_infos[0].type",
               "overflows");
  // Elements and bytes fit in uint64 but not in the file.
  expect_error(valid_one_tensor({uint64_t{1} << 40}).bytes, "tensor_infos[0].offset",
               "exceeds file size");
}

TEST(Malformed, RowNotWholeBlocks) {
  expect_error(valid_one_tensor({16, 2}, kQ4_0).bytes, "tensor_infos[0].type",
               "not a multiple");
}

TEST(Malformed, BadAlignment) {
  // gguf.md: a multiple of 8; a power of two for the mask arithmetic (as ggml).
  for (uint32_t a : {0u, 1u, 3u, 4u, 48u, 0xffffffffu}) {
    Builder b;
    b.header(0, 1).kv_u32("general.alignment", a);
    expect_error(b.bytes, "kv['general.alignment']",
                 "general.alignment " + std::to_string(a) + " is not a power of two >= 8");
  }
  // gguf.md types it UINT32; llama.cpp reads it with gguf_get_val_u32.
  Builder s;
  s.header(0, 1).kv_str("general.alignment", "64");
  expect_error(s.bytes, "kv['general.alignment'].type", "must be of type UINT32 (gguf.md), not STRING");
  Builder u64;
  u64.header(0, 1).str("general.alignment").u32(10).u64(64);
  expect_error(u64.bytes, "kv['general.alignment'].type", "not UINT64");
  // The largest UINT32 power of two is valid, but the data section cannot start there.
  Builder h;
  h.header(1, 1).kv_u32("general.alignment", 1u << 31);
  h.tensor("w", {32}, kF32, 0).data(128);
  expect_error(h.bytes, "tensor_infos[0].offset", "exceeds file size");
  Builder ok;
  ok.header(0, 1).kv_u32("general.alignment", 8);
  EXPECT_EQ(File::from_memory(ok.bytes).alignment(), 8u);
}

TEST(Malformed, TensorNameLength) {
  // gguf.md: "at most 64 bytes long".
  const std::string name64(64, 'n');
  Builder ok;
  ok.header(1, 0).tensor(name64, {32}, kF32, 0).data(128);
  EXPECT_EQ(File::from_memory(ok.bytes).tensors().at(0).name, name64);
  Builder b;
  b.header(1, 0).tensor(name64 + "x", {32}, kF32, 0).data(128);
  expect_error(b.bytes, "tensor_infos[0].name", "is 65 bytes, more than the 64");
  // A long name in the second info: the field names the right index and offset.
  Builder second;
  second.header(2, 0).tensor("a", {32}, kF32, 0);
  const uint64_t name_at = second.bytes.size();
  second.tensor(std::string(300, 'y'), {32}, kF32, 128).data(256);
  const auto err = try_parse(second.bytes);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->field(), "tensor_infos[1].name");
  EXPECT_EQ(err->byte_offset(), name_at);
}

TEST(Malformed, TensorNameNotUtf8) {
  const std::pair<const char*, size_t> bad[] = {
      {"w\xff", 1},          // never a UTF-8 byte
      {"\xc0\xafw", 0},      // overlong '/'
      {"ab\xed\xa0\x80", 2},  // surrogate U+D800
      {"w\xe2\x82", 1},      // truncated 3-byte sequence
      {"\xf4\x90\x80\x80", 0},  // past U+10FFFF
  };
  for (const auto& [name, at] : bad) {
    Builder b;
    b.header(1, 0).tensor(name, {32}, kF32, 0).data(128);
    expect_error(b.bytes, "tensor_infos[0].name",
                 "is not valid UTF-8 (at name byte " + std::to_string(at) + ")");
  }
  Builder ok;  // two-, three- and four-byte characters
  ok.header(1, 0).tensor("caf\xc3\xa9.\xe2\x82\xac.\xf0\x9f\x98\x80", {32}, kF32, 0).data(128);
  EXPECT_FALSE(try_parse(ok.bytes).has_value());
}

TEST(Malformed, OverlappingTensorData) {
  // 64 F32 = 256 bytes at 0, then a tensor at 128: shares bytes [128, 256).
  Builder b;
  b.header(2, 0).tensor("big", {64}, kF32, 0).tensor("small", {32}, kF32, 128).data(384);
  // The data section starts at 96 (24-byte header + 35 + 37 bytes of infos); ranges are absolute.
  expect_error(b.bytes, "tensor_infos[1].offset",
               "tensor 'small' data [224, 352) overlaps tensor 'big' data [96, 352)");
  // Same offset twice.
  Builder same;
  same.header(2, 0).tensor("a", {32}, kF32, 0).tensor("b", {32}, kF32, 0).data(128);
  expect_error(same.bytes, "tensor_infos[1].offset", "overlaps tensor 'a'");
  // Infos out of offset order: the check sorts, and names the later range.
  Builder rev;
  rev.header(2, 0).tensor("late", {32}, kF32, 128).tensor("early", {64}, kF32, 0).data(256);
  expect_error(rev.bytes, "tensor_infos[0].offset", "tensor 'late' data");
  // Adjacent ranges, in either order, and a gap are fine.
  Builder adj;
  adj.header(3, 0).tensor("b", {32}, kF32, 128).tensor("a", {32}, kF32, 0);
  adj.tensor("c", {32}, kF32, 512).data(640);
  EXPECT_FALSE(try_parse(adj.bytes).has_value());
}

TEST(Malformed, BadKeys) {
  Builder empty;
  empty.header(0, 1).kv_u32("", 1);
  expect_error(empty.bytes, "kv[0].key", "empty metadata key");
  for (const std::string& key :
       {std::string("a b"), std::string("caf\xc3\xa9"), std::string("a\nb"), std::string("a\0b", 3),
        std::string("a\x7f")}) {
    Builder b;
    b.header(0, 2).kv_u32("ok", 1).kv_u32(key, 1);
    expect_error(b.bytes, "kv[1].key", "outside printable ASCII");
  }
  Builder huge;
  huge.header(0, 1).kv_u32(std::string(65536, 'k'), 1);
  expect_error(huge.bytes, "kv[0].key", "65536 bytes is longer than the 65535");
  Builder ok;  // digits, underscores, upper case (not lower_snake_case, but ASCII)
  ok.header(0, 2).kv_u32("general.base_model.0.name", 1).kv_u32("X.Y_z", 2);
  EXPECT_FALSE(try_parse(ok.bytes).has_value());
}

TEST(Malformed, SpecTypedKeys) {
  // general.architecture as an integer: rejected here, at open, instead of
  // surfacing later as a confusing error of whatever reads it first.
  Builder arch;
  arch.header(0, 1).kv_u32("general.architecture", 7);
  expect_error(arch.bytes, "kv['general.architecture'].type",
               "general.architecture must be of type STRING (gguf.md), not UINT32");
  Builder name;
  name.header(0, 1).str("general.name").u32(9).u32(8).u64(0);
  expect_error(name.bytes, "kv['general.name'].type", "not ARRAY");
  Builder qv;
  qv.header(0, 1).kv_str("general.quantization_version", "2");
  expect_error(qv.bytes, "kv['general.quantization_version'].type", "must be of type UINT32");
  Builder ok;
  ok.header(0, 3).kv_str("general.architecture", "llama").kv_u32("general.quantization_version", 2);
  ok.kv_str("general.name", "x");
  EXPECT_FALSE(try_parse(ok.bytes).has_value());
}

TEST(Malformed, OpenNamesThePath) {
  const std::string path = ::testing::TempDir() + "/akv_not_a_gguf.txt";
  {
    std::ofstream out(path, std::ios::binary);
    out << "root:x:0:0:root:/root:/bin/bash\n";
  }
  try {
    File::open(path);
    FAIL() << "parsed a text file";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "GGUF: " + path + ": bad magic, not a GGUF file (field header.magic at byte 0)");
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.field(), "header.magic");
  }
  // Truncated after a valid header: the path is named too.
  const auto good = valid_one_tensor().bytes;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(good.data()), 30);
  }
  try {
    File::open(path);
    FAIL() << "parsed a truncated file";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("GGUF: " + path + ": "), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  // from_memory has no file to name.
  const auto err = try_parse({'X', 'G', 'U', 'F', 3, 0, 0, 0});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(err->file().empty());
  // I/O errors name it as well.
  try {
    File::open(path);
    FAIL() << "opened a removed file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Malformed, StringValuesNeedNotBeUtf8) {
  // Values are kept as bytes (gguf.h says why); `inspect` escapes control bytes.
  Builder b;
  b.header(0, 2).kv_str("tok", "\xff\xfe").kv_str("tmpl", "a\nb\tc");
  const File f = File::from_memory(b.bytes);
  EXPECT_EQ(f.get_string("tok"), "\xff\xfe");
  EXPECT_EQ(f.find("tmpl")->to_string(), "\"a\\nb\\x09c\"");
  // Long strings are cut on a UTF-8 boundary: 79 ASCII bytes, then a 2-byte char.
  Builder l;
  l.header(0, 1).kv_str("s", std::string(79, 'a') + "\xc3\xa9" + "tail");
  EXPECT_EQ(File::from_memory(l.bytes).find("s")->to_string(), "\"" + std::string(79, 'a') + "...\"");
}

TEST(Malformed, CustomAlignmentIsUsed) {
  Builder b;
  b.header(1, 1).kv_u32("general.alignment", 256).tensor("w", {32}, kF32, 0).data(128, 256);
  const File f = File::from_memory(b.bytes);
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset(), 256u);
  EXPECT_EQ(f.tensors()[0].offset, 256u);
}

TEST(Malformed, ErrorMessageFormat) {
  const auto err = try_parse(valid_one_tensor({32}, kF32, 1 << 20).bytes);
  ASSERT_TRUE(err.has_value());
  const std::string what = err->what();
  EXPECT_EQ(what.rfind("GGUF: ", 0), 0u) << what;
  EXPECT_NE(what.find("(field tensor_infos[0].offset at byte " +
                      std::to_string(err->byte_offset()) + ")"),
            std::string::npos)
      << what;
}

}  // namespace
}  // namespace activekv::gguf
