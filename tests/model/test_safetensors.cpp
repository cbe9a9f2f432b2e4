// Safetensors reader / writer: round trips, row and column slices against slicing the whole
// tensor by hand, sharded index directories and the `model.` prefix, and one test per corruption
// (files written byte by byte) checking that the error names the file and the problem.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "support/test_support.h"

namespace tpdraft::model {
namespace {

using testing::expect_error;
using testing::TempDir;

// A safetensors file assembled by hand: length field (overridable), header text, data bytes.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               int64_t length_field = -1) {
  const uint64_t n = length_field < 0 ? header.size() : static_cast<uint64_t>(length_field);
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  bytes.append(data.begin(), data.end());
  testing::write_text(path, bytes);
}

// Values exact in f16 and bf16 alike (8 significant bits at most), so every conversion is exact.
float exact_value(int64_t i) { return static_cast<float>((i * 37) % 61 - 30) * 0.25f; }

// Encodes f32 values as `dt` without going through the library's converters for F32 / F64.
std::vector<std::byte> encode(DType dt, const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else if (dt == DType::F64) {
      const double d = v[i];
      std::memcpy(out.data() + 8 * i, &d, 8);
    } else {
      const uint16_t h = dt == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// ---- round trips -----------------------------------------------------------------------------

TEST(Safetensors, RoundTripAllDtypesAndMetadata) {
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");
  std::vector<float> a(12);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 1.5f - 4.0f;
  const std::vector<uint16_t> h = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000};
  const std::vector<uint16_t> b = {0x3f80, 0x4049, 0xff80, 0x0001, 0x1234, 0xbf80};
  const std::vector<int64_t> ids = {-1, 0, 1LL << 40, 7};

  SafetensorsWriter w;
  w.add("z.first", DType::F32, {3, 4}, a.data(), a.size() * 4);
  w.add("a.second", DType::F16, {5}, h.data(), h.size() * 2);
  w.add("model.m.third", DType::BF16, {2, 3}, b.data(), b.size() * 2);
  w.add("ids", DType::I64, {4}, ids.data(), ids.size() * 8);
  w.add("empty", DType::F32, {0, 3}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "tiny");
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // The data area starts on an 8-byte boundary.
  uint8_t raw[8] = {};
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(raw), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[i];
  EXPECT_EQ((8 + n) % 8, 0u);

  SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"z.first", "a.second", "model.m.third", "ids", "empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "tiny");
  EXPECT_EQ(f.metadata().size(), 2u);

  // Each tensor with its dtype and the bytes written.
  const struct {
    const char* name;
    DType dtype;
    const void* data;
    size_t bytes;
  } stored[] = {{"z.first", DType::F32, a.data(), 48},
                {"a.second", DType::F16, h.data(), 10},
                {"model.m.third", DType::BF16, b.data(), 12},
                {"ids", DType::I64, ids.data(), 32}};
  for (const auto& s : stored) {
    const TensorInfo* t = f.find(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(t->dtype, s.dtype) << s.name;
    EXPECT_EQ(std::memcmp(t->data, s.data, s.bytes), 0) << s.name;
  }

  const TensorInfo* t = f.find("z.first");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t->numel(), 12);
  EXPECT_EQ(t->rows(), 3);
  EXPECT_EQ(t->cols(), 4);
  EXPECT_EQ(t->shape_str(), "[3, 4]");
  EXPECT_EQ(t->nbytes, 48u);
  EXPECT_EQ(t->file, path);
  EXPECT_EQ(f.find("a.second")->rows(), 1);
  EXPECT_EQ(f.find("a.second")->cols(), 5);

  t = f.find("empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->numel(), 0);
  EXPECT_EQ(t->nbytes, 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, AddF32ConvertsAndScalarsWork) {
  TempDir dir;
  const std::string path = dir.file("f.safetensors");
  std::vector<float> v = {1.0f, -2.5f, 1.0f + std::ldexp(1.0f, -8), 65519.0f};
  SafetensorsWriter w;
  w.add_f32("h", DType::F16, {4}, v.data());
  w.add_f32("b", DType::BF16, {2, 2}, v.data());
  w.add_f32("f", DType::F32, {4}, v.data());
  const double scalar = 3.25;
  w.add("s", DType::F64, {}, &scalar, 8);
  w.write(path);
  SafetensorsFile f(path);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h, b;
    std::memcpy(&h, f.find("h")->data + 2 * i, 2);
    std::memcpy(&b, f.find("b")->data + 2 * i, 2);
    EXPECT_EQ(h, f32_to_f16(v[i]));
    EXPECT_EQ(b, f32_to_bf16(v[i]));
  }
  EXPECT_EQ(to_f32(*f.find("f")), v);
  const TensorInfo* s = f.find("s");
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(to_f64(*s), std::vector<double>{3.25});
}

TEST(Safetensors, WriterErrors) {
  SafetensorsWriter w;
  float x[4] = {};
  expect_error([&] { w.add("t", DType::F32, {2, 3}, x, 16); }, {"'t'", "[2, 3]", "24", "16"});
  w.add("t", DType::F32, {4}, x, 16);
  expect_error([&] { w.add("t", DType::F32, {4}, x, 16); }, {"'t'", "twice"});
  expect_error([&] { w.add_f32("i", DType::I32, {4}, x); }, {"'i'", "I32"});
  TempDir dir;
  const std::string path = dir.file("no/such/dir/x.safetensors");
  expect_error([&] { w.write(path); }, {path + ".tmp", "No such file or directory"});
}

// ---- slicing ---------------------------------------------------------------------------------

TEST(Safetensors, CopyRowsAndColsMatchSlicingTheWholeTensor) {
  const int64_t R = 7, C = 5;
  std::vector<float> full(R * C);
  for (int64_t i = 0; i < R * C; ++i) full[static_cast<size_t>(i)] = exact_value(i);

  TempDir dir;
  const std::string path = dir.file("s.safetensors");
  SafetensorsWriter w;
  // A 1-element F16 tensor first puts every later tensor at an odd 2-byte offset: unaligned reads.
  const uint16_t pad = 0;
  w.add("pad", DType::F16, {1}, &pad, 2);
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64};
  for (DType dt : dtypes) {
    const auto bytes = encode(dt, full);
    w.add(dtype_name(dt), dt, {R, C}, bytes.data(), bytes.size());
  }
  w.write(path);
  SafetensorsFile f(path);

  for (DType src : dtypes) {
    const TensorInfo& t = *f.find(dtype_name(src));
    for (DType dst : dtypes) {
      SCOPED_TRACE(std::string(dtype_name(src)) + " -> " + dtype_name(dst));
      const size_t ds = dtype_size(dst);
      for (int64_t r0 = 0; r0 <= R; ++r0) {
        for (int64_t nr = 0; r0 + nr <= R; ++nr) {
          const std::vector<float> want(full.begin() + r0 * C, full.begin() + (r0 + nr) * C);
          std::vector<std::byte> got(static_cast<size_t>(nr * C) * ds + 1);
          copy_rows(t, r0, nr, dst, got.data());
          got.pop_back();
          ASSERT_EQ(got, encode(dst, want)) << "rows " << r0 << "+" << nr;
        }
      }
      for (int64_t c0 = 0; c0 <= C; ++c0) {
        for (int64_t nc = 0; c0 + nc <= C; ++nc) {
          std::vector<float> want;
          for (int64_t r = 0; r < R; ++r)
            for (int64_t c = c0; c < c0 + nc; ++c) want.push_back(full[static_cast<size_t>(r * C + c)]);
          std::vector<std::byte> got(static_cast<size_t>(R * nc) * ds + 1);
          copy_cols(t, c0, nc, dst, got.data());
          got.pop_back();
          ASSERT_EQ(got, encode(dst, want)) << "cols " << c0 << "+" << nc;
        }
      }
    }
    EXPECT_EQ(to_f32(t), full);
    const auto d = to_f64(t);
    for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(d[i], static_cast<double>(full[i]));
  }
}

TEST(Safetensors, SlicesOfOtherRanks) {
  TempDir dir;
  const std::string path = dir.file("r.safetensors");
  std::vector<float> v(2 * 3 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = exact_value(static_cast<int64_t>(i));
  SafetensorsWriter w;
  w.add_f32("vec", DType::BF16, {6}, v.data());
  w.add_f32("cube", DType::F16, {2, 3, 4}, v.data());
  w.write(path);
  SafetensorsFile f(path);

  // 1-D: rows are elements; columns are elements too (one row).
  std::vector<float> got(6);
  copy_rows(*f.find("vec"), 2, 3, DType::F32, got.data());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3), std::vector<float>(v.begin() + 2, v.begin() + 5));
  copy_cols(*f.find("vec"), 1, 4, DType::F32, got.data());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 4), std::vector<float>(v.begin() + 1, v.begin() + 5));
  // N-D: a row is a slice along dim 0.
  std::vector<float> cube(12);
  copy_rows(*f.find("cube"), 1, 1, DType::F32, cube.data());
  EXPECT_EQ(cube, std::vector<float>(v.begin() + 12, v.end()));
  expect_error([&] { copy_cols(*f.find("cube"), 0, 1, DType::F32, cube.data()); }, {"'cube'", "[2, 3, 4]"});
}

TEST(Safetensors, SliceBoundsAndConversionErrors) {
  TempDir dir;
  const std::string path = dir.file("b.safetensors");
  std::vector<float> v(12, 1.0f);
  const std::vector<int64_t> ids = {1, 2, 3};
  SafetensorsWriter w;
  w.add_f32("w", DType::F32, {3, 4}, v.data());
  w.add("ids", DType::I64, {3}, ids.data(), 24);
  w.write(path);
  SafetensorsFile f(path);
  const TensorInfo& t = *f.find("w");
  std::vector<float> out(64);
  expect_error([&] { copy_rows(t, 2, 2, DType::F32, out.data()); }, {path, "'w'", "[2, 4)", "[0, 3)"});
  expect_error([&] { copy_rows(t, -1, 1, DType::F32, out.data()); }, {"'w'", "rows"});
  expect_error([&] { copy_cols(t, 3, 2, DType::F32, out.data()); }, {path, "'w'", "[3, 5)", "[0, 4)"});
  expect_error([&] { copy_cols(t, 0, -1, DType::F32, out.data()); }, {"'w'", "columns"});
  expect_error([&] { to_f32(*f.find("ids")); }, {path, "'ids'", "I64"});
  expect_error([&] { copy_rows(t, 0, 1, DType::I32, out.data()); }, {"'w'", "I32"});
  // Same dtype is a plain copy, whatever the dtype.
  std::vector<int64_t> got(3);
  copy_rows(*f.find("ids"), 0, 3, DType::I64, got.data());
  EXPECT_EQ(got, ids);
}

// ---- stores: directories, shards, prefixes ---------------------------------------------------

void write_f32(const std::string& path, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
               float base = 0) {
  SafetensorsWriter w;
  for (const auto& [name, shape] : tensors) {
    std::vector<float> v(static_cast<size_t>(checked_numel(shape, "tensor '{}'", name)));
    std::iota(v.begin(), v.end(), base);
    w.add_f32(name, DType::F32, shape, v.data());
  }
  w.write(path);
}

TEST(TensorStore, ShardedIndexDirectory) {
  TempDir dir;
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  write_f32(dir.file(s1), {{"model.embed_tokens.weight", {4, 2}}, {"layers.0.w", {2}}}, 100);
  write_f32(dir.file(s2), {{"lm_head.weight", {4, 2}}, {"model.norm.weight", {2}}}, 200);
  // A file the index does not name must not be opened (it is not even a safetensors file).
  testing::write_text(dir.file("junk.safetensors"), "not a checkpoint");
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"metadata": {"total_size": 96}, "weight_map": {
                           "model.embed_tokens.weight": ")" + s1 + R"(", "layers.0.w": ")" + s1 + R"(",
                           "lm_head.weight": ")" + s2 + R"(", "model.norm.weight": ")" + s2 + R"("}})");

  for (const std::string& open_path : {dir.path(), dir.file("model.safetensors.index.json")}) {
    SCOPED_TRACE(open_path);
    auto store = TensorStore::open(open_path);
    EXPECT_EQ(store->source(), open_path);
    EXPECT_EQ(store->names(),
              (std::vector<std::string>{"embed_tokens.weight", "layers.0.w", "lm_head.weight", "norm.weight"}));
    const TensorInfo* e1 = store->find("embed_tokens.weight");
    const TensorInfo* e2 = store->find("model.embed_tokens.weight");
    ASSERT_NE(e1, nullptr);
    EXPECT_EQ(e1, e2);
    EXPECT_EQ(e1->name, "model.embed_tokens.weight");
    EXPECT_EQ(e1->file, dir.file(s1));
    EXPECT_EQ(to_f32(*e1)[3], 103.0f);
    const TensorInfo* head = store->find("lm_head.weight");
    ASSERT_NE(head, nullptr);
    EXPECT_EQ(head, store->find("model.lm_head.weight"));  // a prefix the file does not carry
    EXPECT_EQ(head->file, dir.file(s2));
    EXPECT_EQ(to_f32(*head)[0], 200.0f);
    EXPECT_EQ(store->find("norm.weight"), store->find("model.norm.weight"));
    EXPECT_NE(store->find("layers.0.w"), nullptr);
    EXPECT_EQ(store->find("missing"), nullptr);
    EXPECT_EQ(store->find("model.missing"), nullptr);
    EXPECT_EQ(&store->require("model.norm.weight", {2}), store->find("norm.weight"));
  }
}

TEST(TensorStore, ExactSpellingWinsOverStrippedOne) {
  // "model.model.x" is canonically "model.x"; "model.x" is canonically "x". A lookup of
  // "model.x" must return the tensor stored under exactly that name.
  TempDir dir;
  write_f32(dir.file("model.safetensors"), {{"model.model.x", {1}}, {"model.x", {2}}});
  auto store = TensorStore::open(dir.path());
  ASSERT_NE(store->find("model.x"), nullptr);
  EXPECT_EQ(store->find("model.x")->name, "model.x");
  EXPECT_EQ(store->find("x")->name, "model.x");
  EXPECT_EQ(store->find("model.model.x")->name, "model.model.x");
}

TEST(TensorStore, DirectoryResolution) {
  TempDir dir;
  // model.safetensors is preferred over other files.
  write_f32(dir.file("model.safetensors"), {{"a", {1}}});
  write_f32(dir.file("other.safetensors"), {{"b", {1}}});
  auto store = TensorStore::open(dir.path());
  EXPECT_NE(store->find("a"), nullptr);
  EXPECT_EQ(store->find("b"), nullptr);
  // An explicit file opens that file.
  store = TensorStore::open(dir.file("other.safetensors"));
  EXPECT_NE(store->find("b"), nullptr);
  // Without model.safetensors, several files and no index: refuse, naming them.
  std::filesystem::remove(dir.file("model.safetensors"));
  write_f32(dir.file("third.safetensors"), {{"c", {1}}});
  expect_error([&] { TensorStore::open(dir.path()); }, {dir.path(), "other.safetensors", "third.safetensors", "index"});
  // Exactly one: use it.
  std::filesystem::remove(dir.file("third.safetensors"));
  store = TensorStore::open(dir.path());
  EXPECT_NE(store->find("b"), nullptr);
}

TEST(TensorStore, OpenErrors) {
  TempDir dir;
  expect_error([&] { TensorStore::open(dir.path()); }, {dir.path(), "no model.safetensors"});
  const std::string missing = dir.file("nowhere");
  expect_error([&] { TensorStore::open(missing); }, {missing, "no such file"});
  testing::write_text(dir.file("weights.bin"), "x");
  expect_error([&] { TensorStore::open(dir.file("weights.bin")); }, {"weights.bin", ".safetensors"});
}

TEST(TensorStore, DuplicateCanonicalNames) {
  TempDir dir;
  write_f32(dir.file("a.safetensors"), {{"model.x", {1}}});
  write_f32(dir.file("b.safetensors"), {{"x", {1}}});
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map": {"model.x": "a.safetensors", "x": "b.safetensors"}})");
  expect_error([&] { TensorStore::open(dir.path()); }, {"'x'", "twice", "a.safetensors", "b.safetensors"});
  // Within one file too.
  write_f32(dir.file("c.safetensors"), {{"model.y", {1}}, {"y", {1}}});
  expect_error([&] { TensorStore::open(dir.file("c.safetensors")); }, {"'y'", "twice"});
}

TEST(TensorStore, IndexErrors) {
  TempDir dir;
  write_f32(dir.file("s1.safetensors"), {{"a", {1}}});
  const std::string index = dir.file("model.safetensors.index.json");
  // Opening the directory with `text` as its index fails naming the index and `parts`.
  auto expect_refused = [&](const std::string& text, std::vector<std::string> parts) {
    testing::write_text(index, text);
    parts.insert(parts.begin(), index);
    expect_error([&] { TensorStore::open(dir.path()); }, parts);
  };
  expect_refused(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})",
                 {"s2.safetensors", "'b'", "does not exist"});
  expect_refused(R"({"weight_map": {"a": "s1.safetensors", "zz": "s1.safetensors"}})",
                 {"'zz'", "s1.safetensors", "no such tensor"});
  expect_refused(R"({"weight_map": )", {"not valid JSON"});
  expect_refused(R"({"metadata": {}})", {"weight_map"});
  expect_refused(R"({"weight_map": {"a": 3}})", {"'a'"});
}

TEST(TensorStore, IndexShardsMustStayInsideTheModelDirectory) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("model/sub"));
  write_f32(dir.file("outside.safetensors"), {{"a", {1}}});
  write_f32(dir.file("model/sub/inside.safetensors"), {{"a", {1}}});
  const std::string index = dir.file("model/model.safetensors.index.json");
  for (const std::string& shard :
       {std::string("../outside.safetensors"), dir.file("outside.safetensors"), std::string("../../etc/passwd"),
        std::string("sub/../../outside.safetensors"), std::string("/etc/passwd")}) {
    SCOPED_TRACE(shard);
    testing::write_text(index, R"({"weight_map": {"a": ")" + shard + R"("}})");
    expect_error([&] { TensorStore::open(dir.file("model")); },
                 {index, "'" + shard + "'", "'a'", "outside the model directory"});
  }
  // A shard in a subdirectory of the model directory is inside it.
  testing::write_text(index, R"({"weight_map": {"a": "sub/inside.safetensors"}})");
  EXPECT_EQ(TensorStore::open(dir.file("model"))->find("a")->file, dir.file("model/sub/inside.safetensors"));
}

TEST(TensorStore, IndexKeysListedTwice) {
  TempDir dir;
  write_f32(dir.file("s1.safetensors"), {{"a", {1}}, {"b", {1}}});
  const std::string index = dir.file("model.safetensors.index.json");
  testing::write_text(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "a": "s2.safetensors"}})");
  expect_error([&] { TensorStore::open(dir.path()); }, {index, "'a'", "twice", "'weight_map'"});
  testing::write_text(index, R"({"weight_map": {"a": "s1.safetensors"}, "weight_map": {"b": "s1.safetensors"}})");
  expect_error([&] { TensorStore::open(dir.path()); }, {index, "'weight_map'", "twice"});
}

TEST(TensorStore, NonRegularFilesAreRefusedWithoutBlocking) {
  TempDir dir;
  // model.safetensors, an explicit .safetensors path, an index and a shard: each a FIFO in turn.
  const std::string fifo = dir.file("model.safetensors");
  testing::make_fifo(fifo);
  EXPECT_TRUE(testing::finishes_without_blocking(fifo, [&] {
    expect_error([&] { TensorStore::open(dir.path()); }, {fifo, "FIFO", "regular file"});
    expect_error([&] { TensorStore::open(fifo); }, {fifo, "FIFO"});
    expect_error([&] { SafetensorsFile f(fifo); }, {fifo, "FIFO"});
  }));
  std::filesystem::remove(fifo);
  const std::string index = dir.file("model.safetensors.index.json");
  testing::make_fifo(index);
  EXPECT_TRUE(testing::finishes_without_blocking(
      index, [&] { expect_error([&] { TensorStore::open(dir.path()); }, {index, "FIFO", "regular file"}); }));
  std::filesystem::remove(index);
  testing::write_text(index, R"({"weight_map": {"a": "shard.safetensors"}})");
  const std::string shard = dir.file("shard.safetensors");
  testing::make_fifo(shard);
  EXPECT_TRUE(testing::finishes_without_blocking(
      shard, [&] { expect_error([&] { TensorStore::open(dir.path()); }, {shard, "FIFO"}); }));
  // A directory named like a safetensors file.
  std::filesystem::create_directory(dir.file("d.safetensors"));
  expect_error([&] { SafetensorsFile f(dir.file("d.safetensors")); }, {dir.file("d.safetensors"), "is a directory"});
}

TEST(TensorStore, RequireMessages) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  SafetensorsWriter w;
  std::vector<float> v(8);
  w.add_f32("model.fc.weight", DType::BF16, {4, 2}, v.data());
  const int64_t ids[2] = {0, 1};
  w.add("ids", DType::I64, {2}, ids, 16);
  w.write(path);
  auto store = TensorStore::open(dir.path());

  const TensorInfo& t = store->require("fc.weight", {4, 2});
  EXPECT_EQ(t.dtype, DType::BF16);
  expect_error([&] { store->require("norm.weight", {64}); }, {dir.path(), "'norm.weight'", "missing", "[64]"});
  expect_error([&] { store->require("fc.weight", {2, 4}); }, {path, "'fc.weight'", "[4, 2]", "expected [2, 4]"});
  expect_error([&] { store->require("ids", {2}); }, {path, "'ids'", "I64", "F32"});
}

TEST(TensorStore, FromMemoryChecksBytesAgainstShape) {
  using Bytes = std::vector<std::byte>;
  const OwnedTensor ok{"model.w", DType::F32, {3, 2}, Bytes(24)};
  EXPECT_EQ(TensorStore::from_memory("random weights", {ok})->require("w", {3, 2}).nbytes, 24u);

  const OwnedTensor short_one{"w", DType::F32, {3, 2}, Bytes(20)};
  expect_error([&] { TensorStore::from_memory("random weights", {short_one}); },
               {"random weights", "'w'", "20 bytes", "24", "[3, 2]"});
  // 2^58 + 1 rows of 64 bf16 values wrap to 128 bytes in unchecked int64 arithmetic.
  const OwnedTensor wrapped{"lm_head.weight", DType::BF16, {(int64_t{1} << 58) + 1, 64}, Bytes(128)};
  expect_error([&] { TensorStore::from_memory("bench (target)", {wrapped}); },
               {"bench (target)", "'lm_head.weight'", "[288230376151711745, 64]", "64-bit"});
  const OwnedTensor negative{"n", DType::F32, {-2, 3}, {}};
  expect_error([&] { TensorStore::from_memory("mem", {negative}); }, {"'n'", "negative"});
}

// ---- corrupted files -------------------------------------------------------------------------

class Corrupt : public ::testing::Test {
 protected:
  // Writes the file (`header`, then `data_bytes` zero bytes) and expects opening it to fail with a
  // message holding the path and `parts`.
  void expect_rejected(const std::string& header, size_t data_bytes, const std::vector<std::string>& parts,
                       int64_t length_field = -1) {
    write_raw(path_, header, std::vector<uint8_t>(data_bytes), length_field);
    std::vector<std::string> all = parts;
    all.push_back(path_);
    expect_error([&] { SafetensorsFile f(path_); }, all);
    expect_error([&] { TensorStore::open(path_); }, all);
  }
  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(Corrupt, TruncatedFile) {
  std::ofstream(path_, std::ios::binary).write("\x10\x00\x00", 3);
  expect_error([&] { SafetensorsFile f(path_); }, {path_, "3 bytes", "shorter"});
  std::ofstream(path_, std::ios::binary).flush();
  expect_error([&] { SafetensorsFile f(path_); }, {path_, "0 bytes"});
}

TEST_F(Corrupt, HeaderLength) {
  expect_rejected("{}", 0, {"header length is 0"}, 0);
  expect_rejected("{}", 0, {"header length 1000", "past the end"}, 1000);
  expect_rejected("{}", 0, {"header length 200000000", "larger"}, 200000000);
  expect_rejected("{}", 0, {"larger"}, static_cast<int64_t>(1) << 62);
}

TEST_F(Corrupt, BadJson) {
  expect_rejected(R"({"a": {"dtype": "F32", )", 0, {"not valid JSON"});
  expect_rejected(R"([1, 2])", 0, {"not a JSON object"});
  expect_rejected(R"({"a": 3})", 0, {"'a'", "not an object"});
}

TEST_F(Corrupt, MissingFields) {
  expect_rejected(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'a'", "'dtype'"});
  expect_rejected(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"'a'", "'shape'"});
  expect_rejected(R"({"a": {"dtype": "F32", "shape": [1]}})", 4, {"'a'", "'data_offsets'"});
  expect_rejected(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, {"'a'", "data_offsets"});
  expect_rejected(R"({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4, {"'a'", "shape"});
}

TEST_F(Corrupt, UnknownDtype) {
  expect_rejected(R"({"a": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", 4,
                  {"'a'", "unknown dtype", "F8_E5M2"});
}

TEST_F(Corrupt, NegativeOrOverflowingShape) {
  expect_rejected(R"({"a": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 4]}})", 4, {"'a'", "negative"});
  expect_rejected(
      R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 4]}})",
      4, {"'a'", "overflows"});
}

TEST_F(Corrupt, ShapeSizeMismatch) {
  expect_rejected(R"({"w": {"dtype": "BF16", "shape": [3, 2], "data_offsets": [0, 10]}})", 10,
                  {"'w'", "[3, 2]", "BF16", "12 bytes", "10 bytes"});
}

TEST_F(Corrupt, BeginAfterEnd) {
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8,
                  {"'w'", "[8, 4]", "begin > end"});
}

TEST_F(Corrupt, OffsetsPastEnd) {
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 8,
                  {"'w'", "[4, 12]", "past the end", "8 bytes"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-4, 4]}})", 8, {"'w'", "data_offsets"});
}

TEST_F(Corrupt, OverlappingRanges) {
  expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  12, {"'a'", "'b'", "overlapping"});
  // A range nested inside an earlier, longer one.
  expect_rejected(R"({"big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "mid": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
                      "end": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})",
                  16, {"'big'", "overlapping"});
  // Empty tensors overlap nothing; touching ranges are fine.
  write_raw(path_, R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "c": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            std::vector<uint8_t>(8));
  SafetensorsFile f(path_);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(Corrupt, KeysListedTwice) {
  // The JSON parser keeps the last of two equal keys: without a check the first entry vanishes.
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                  8, {"'w'", "twice", "top level"});
  expect_rejected(R"({"w": {"dtype": "F16", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                  4, {"'dtype'", "twice", "'w'"});
  expect_rejected(R"({"__metadata__": {"k": "v", "k": "u"}})", 0, {"'k'", "twice", "'__metadata__'"});
  // Equal keys in different objects are fine.
  write_raw(path_, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            std::vector<uint8_t>(8));
  EXPECT_EQ(SafetensorsFile(path_).names(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(Corrupt, BadMetadata) {
  expect_rejected(R"({"__metadata__": {"format": 1}})", 0, {"__metadata__", "'format'"});
  expect_rejected(R"({"__metadata__": [1]})", 0, {"__metadata__"});
}

TEST_F(Corrupt, HandWrittenValidFileReadsBack) {
  // The byte layout written here by hand, with unpadded header and trailing spaces, is accepted.
  const float vals[2] = {1.5f, -3.0f};
  std::vector<uint8_t> data(8);
  std::memcpy(data.data(), vals, 8);
  write_raw(path_, R"({"__metadata__": {"k": "v"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}  )",
            data);
  SafetensorsFile f(path_);
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(to_f32(*f.find("w")), (std::vector<float>{1.5f, -3.0f}));
}

}  // namespace
}  // namespace tpdraft::model
