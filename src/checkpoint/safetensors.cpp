// Safetensors reading and writing: a mapped file whose header is validated in full before any
// tensor byte is touched, the store that resolves a model directory (index + shards, one file) and
// the `model.` prefix (or holds tensors made in memory), row / column slicing with dtype
// conversion, and an atomic writer.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "core/files.h"
#include "core/strings.h"

namespace tpdraft::model {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// The reference implementation refuses headers above this size; so do we (a corrupt length field
// would otherwise make us parse gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kModelPrefix = "model.";

std::string canonical_name(const std::string& name) {
  return starts_with(name, kModelPrefix) ? name.substr(std::strlen(kModelPrefix)) : name;
}

bool convertible(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
// FP8 converts to the float dtypes (exactly), never from them.
bool convertible(DType from, DType to) { return (convertible(from) || from == DType::F8E4M3) && convertible(to); }

// Converts n elements from src to dst through a small f32 buffer. Either may be unaligned
// (safetensors does not promise that a tensor's bytes are aligned to its dtype): the dtype
// conversions load and store each element bytewise.
void convert_span(const TensorInfo& t, const std::byte* src, DType dst_type, std::byte* dst, size_t n) {
  if (n == 0) return;  // an empty tensor: its buffers may be null
  const size_t ss = dtype_size(t.dtype);
  if (t.dtype == dst_type) {
    std::memcpy(dst, src, n * ss);
    return;
  }
  TPDRAFT_CHECK(convertible(t.dtype, dst_type),
                "{}: tensor '{}' has dtype {}, cannot convert it to {} (float dtypes only)", t.file, t.name,
                dtype_name(t.dtype), dtype_name(dst_type));
  const size_t ds = dtype_size(dst_type);
  constexpr size_t kChunk = 1024;
  float f32[kChunk];
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t m = std::min(kChunk, n - off);
    convert_to_f32(t.dtype, src + off * ss, f32, m);
    std::byte* out = dst + off * ds;
    if (dst_type == DType::F64) {
      for (size_t i = 0; i < m; ++i) {
        const double d = f32[i];
        std::memcpy(out + i * 8, &d, 8);
      }
    } else {
      convert_from_f32(dst_type, f32, out, m);
    }
  }
}

template <typename T>
std::vector<T> to_vector(const TensorInfo& t, DType type) {
  std::vector<T> out(static_cast<size_t>(t.numel()));
  convert_span(t, t.data, type, reinterpret_cast<std::byte*>(out.data()), out.size());
  return out;
}

// Parses JSON whose objects must not repeat a key. The JSON library keeps only the last of two
// equal keys, so a header listing a tensor twice would load silently; its parser callback sees
// every key as it is read. `what` names the document in messages ("header", "index"), which
// also refuse invalid JSON.
template <typename It>
ojson parse_unique_keys(It begin, It end, const std::string& path, const char* what) {
  std::vector<std::pair<std::string, std::set<std::string>>> open;  // per open object: where, keys
  std::string last_key;
  auto check = [&](int /*depth*/, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::object_start) {
      open.emplace_back(open.empty() ? std::string("the top level") : "'" + last_key + "'", std::set<std::string>{});
    } else if (event == ojson::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == ojson::parse_event_t::key) {
      last_key = parsed.get<std::string>();
      TPDRAFT_CHECK(open.back().second.insert(last_key).second, "{}: key '{}' appears twice in {} of the {}", path,
                    last_key, open.back().first, what);
    }
    return true;
  };
  try {
    return ojson::parse(begin, end, check);
  } catch (const nlohmann::json::exception& e) {
    TPDRAFT_FAIL("{}: {} is not valid JSON ({})", path, what, e.what());
  }
}

const ojson& require_key(const ojson& entry, const char* key, const std::string& path, const std::string& name) {
  auto it = entry.find(key);
  TPDRAFT_CHECK(it != entry.end(), "{}: tensor '{}' has no '{}' in the header", path, name, key);
  return *it;
}

}  // namespace

// ---- TensorInfo ------------------------------------------------------------------------------

int64_t TensorInfo::numel() const { return checked_numel(shape, "{}: tensor '{}'", file, name); }

int64_t TensorInfo::rows() const { return shape.size() >= 2 ? shape[0] : 1; }

int64_t TensorInfo::cols() const {
  if (shape.size() == 1) return shape[0];
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n = checked_mul(n, shape[i], "{}: columns of tensor '{}'", file, name);
  return n;
}

std::string TensorInfo::shape_str() const { return shape_string(shape); }

// ---- SafetensorsFile -------------------------------------------------------------------------

namespace {

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// Parses one tensor entry of the header into `info` (data pointer left for the caller).
Range parse_entry(const std::string& path, const std::string& name, const ojson& entry, uint64_t data_size,
                  TensorInfo* info) {
  TPDRAFT_CHECK(entry.is_object(), "{}: header entry '{}' is not an object", path, name);
  const ojson& dt = require_key(entry, "dtype", path, name);
  const ojson& shape = require_key(entry, "shape", path, name);
  const ojson& offs = require_key(entry, "data_offsets", path, name);

  TPDRAFT_CHECK(dt.is_string(), "{}: tensor '{}' has a non-string dtype {}", path, name, dt.dump());
  TPDRAFT_CHECK(parse_dtype(dt.get<std::string>(), &info->dtype), "{}: tensor '{}' has unknown dtype '{}'", path,
                name, dt.get<std::string>());

  TPDRAFT_CHECK(shape.is_array(), "{}: tensor '{}' has a shape that is not a list: {}", path, name, shape.dump());
  for (const auto& d : shape) {
    TPDRAFT_CHECK(d.is_number_integer(), "{}: tensor '{}' has a non-integer dimension in shape {}", path, name,
                  shape.dump());
    TPDRAFT_CHECK(d.get<int64_t>() >= 0, "{}: tensor '{}' has a negative dimension in shape {}", path, name,
                  shape.dump());
    info->shape.push_back(d.get<int64_t>());
  }

  TPDRAFT_CHECK(offs.is_array() && offs.size() == 2 && offs[0].is_number_integer() && offs[1].is_number_integer() &&
                    offs[0].get<int64_t>() >= 0 && offs[1].get<int64_t>() >= 0,
                "{}: tensor '{}' has data_offsets {}, expected [begin, end] with non-negative integers", path, name,
                offs.dump());
  const auto begin = offs[0].get<uint64_t>();
  const auto end = offs[1].get<uint64_t>();
  TPDRAFT_CHECK(begin <= end, "{}: tensor '{}' has data_offsets [{}, {}] with begin > end", path, name, begin, end);
  TPDRAFT_CHECK(end <= data_size,
                "{}: tensor '{}' has data_offsets [{}, {}] past the end of the data area ({} bytes)", path, name,
                begin, end, data_size);

  const uint64_t expected = checked_bytes(info->shape, dtype_size(info->dtype), "{}: tensor '{}'", path, name);
  TPDRAFT_CHECK(expected == end - begin,
                "{}: tensor '{}' with shape {} and dtype {} needs {} bytes, but its data_offsets span {} bytes", path,
                name, shape_string(info->shape), dtype_name(info->dtype), expected, end - begin);
  info->name = name;
  info->nbytes = static_cast<size_t>(expected);
  info->file = path;
  return Range{begin, end, nullptr};
}

void check_no_overlap(const std::string& path, std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Range* last = nullptr;  // the non-empty range reaching furthest so far
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;  // empty tensors occupy no bytes
    if (last && r.begin < last->end)
      TPDRAFT_FAIL("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] have overlapping byte ranges", path, *last->name,
                   last->begin, last->end, *r.name, r.begin, r.end);
    if (!last || r.end > last->end) last = &r;
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // Never blocks: a FIFO or device given as a checkpoint or taps file is refused, not waited on.
  uint64_t file_size = 0;
  const int fd = open_regular_file(path, "safetensors file", &file_size);
  if (file_size < 8) {
    ::close(fd);
    TPDRAFT_FAIL("{}: file is {} bytes, shorter than the 8-byte header length of a safetensors file", path,
                 file_size);
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  TPDRAFT_CHECK(m != MAP_FAILED, "{}: mmap of {} bytes failed ({})", path, file_size, std::strerror(map_errno));
  map_ = m;
  map_size_ = static_cast<size_t>(file_size);

  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
    TPDRAFT_CHECK(header_len > 0, "{}: header length is 0", path);
    TPDRAFT_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} is larger than the {} byte limit", path,
                  header_len, kMaxHeaderBytes);
    TPDRAFT_CHECK(header_len <= file_size - 8, "{}: header length {} runs past the end of the file ({} bytes)", path,
                  header_len, file_size);
    const uint64_t data_size = file_size - 8 - header_len;

    const ojson header = parse_unique_keys(bytes + 8, bytes + 8 + header_len, path, "header");
    TPDRAFT_CHECK(header.is_object(), "{}: header is not a JSON object", path);

    std::vector<Range> ranges;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        TPDRAFT_CHECK(entry.is_object(), "{}: '__metadata__' is not an object", path);
        for (const auto& [k, v] : entry.items()) {
          TPDRAFT_CHECK(v.is_string(), "{}: '__metadata__' value for '{}' is not a string", path, k);
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      TensorInfo info;
      Range r = parse_entry(path, name, entry, data_size, &info);
      auto [it, inserted] = tensors_.emplace(name, std::move(info));
      TPDRAFT_CHECK(inserted, "{}: tensor '{}' is listed twice in the header", path, name);
      r.name = &it->first;
      ranges.push_back(r);
      names_.push_back(name);
    }
    check_no_overlap(path, ranges);

    // Only now, with every range known to be inside the file, do we form data pointers.
    const std::byte* data = static_cast<const std::byte*>(map_) + 8 + header_len;
    for (const Range& r : ranges) {
      tensors_[*r.name].data = data + r.begin;
      tensors_[*r.name].mapped = true;
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---- TensorStore -----------------------------------------------------------------------------

namespace {

struct IndexEntry {
  std::string tensor, shard;
};

// Reads weight_map of an index file, in file order.
std::vector<IndexEntry> read_index(const std::string& index_path) {
  const std::string text = read_regular_file(index_path, "index file");
  ojson j = parse_unique_keys(text.begin(), text.end(), index_path, "index");
  TPDRAFT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                "{}: index has no 'weight_map' object", index_path);
  std::vector<IndexEntry> out;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    TPDRAFT_CHECK(shard.is_string(), "{}: weight_map entry for tensor '{}' is not a file name", index_path, tensor);
    out.push_back({tensor, shard.get<std::string>()});
  }
  TPDRAFT_CHECK(!out.empty(), "{}: index has an empty 'weight_map'", index_path);
  return out;
}

// A shard named by an index must lie inside the index's directory: a relative path that never
// climbs out with '..' (a shard elsewhere would let a downloaded index read any file).
void check_shard_inside(const std::string& index_path, const fs::path& dir, const IndexEntry& e) {
  const fs::path shard(e.shard);
  bool inside = !shard.empty() && shard.is_relative() && !shard.has_root_name();
  int depth = 0;
  for (const auto& part : shard.lexically_normal()) {
    if (part == "..") --depth;
    else if (part != "." && !part.empty()) ++depth;
    inside = inside && depth >= 0;
  }
  TPDRAFT_CHECK(inside,
                "{}: shard '{}' (holding tensor '{}') is outside the model directory {}; shards must be named by "
                "paths relative to it, without '..'",
                index_path, e.shard, e.tensor, dir.empty() ? "." : dir.string());
}

// Opens the shards an index names (each once), checking every mapped tensor is really there.
std::vector<std::unique_ptr<SafetensorsFile>> open_index_shards(const std::string& index_path) {
  const std::vector<IndexEntry> entries = read_index(index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> shards;  // shard name as written -> opened file
  for (const auto& e : entries) {
    if (shards.count(e.shard)) continue;
    check_shard_inside(index_path, dir, e);
    const std::string shard_path = (dir / e.shard).string();
    std::error_code ec;
    TPDRAFT_CHECK(fs::exists(shard_path, ec), "{}: shard '{}' (holding tensor '{}') does not exist at {}",
                  index_path, e.shard, e.tensor, shard_path);
    files.push_back(std::make_unique<SafetensorsFile>(shard_path));
    shards[e.shard] = files.back().get();
  }
  for (const auto& e : entries)
    TPDRAFT_CHECK(shards.at(e.shard)->find(e.tensor) != nullptr,
                  "{}: maps tensor '{}' to shard '{}', but that shard has no such tensor", index_path, e.tensor,
                  e.shard);
  return files;
}

// The files a path names: the shards of an index, or one safetensors file.
std::vector<std::unique_ptr<SafetensorsFile>> open_files(const std::string& path) {
  std::error_code ec;
  TPDRAFT_CHECK(fs::exists(path, ec), "{}: no such file or directory (expected a model directory, a .safetensors "
                                      "file or a .safetensors.index.json file)", path);
  std::string file = path;
  if (!fs::is_directory(path, ec)) {
    if (ends_with(path, ".index.json")) return open_index_shards(path);
    TPDRAFT_CHECK(ends_with(path, ".safetensors"),
                  "{}: expected a model directory, a .safetensors file or a .safetensors.index.json file", path);
  } else if (const fs::path dir(path); fs::exists(dir / "model.safetensors.index.json", ec)) {
    return open_index_shards((dir / "model.safetensors.index.json").string());
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    file = (dir / "model.safetensors").string();
  } else {
    std::vector<std::string> names;  // of the *.safetensors files directly inside, sorted
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    TPDRAFT_CHECK(!names.empty(), "{}: no model.safetensors.index.json, model.safetensors or *.safetensors file",
                  path);
    TPDRAFT_CHECK(names.size() == 1, "{}: several .safetensors files ({}) and no model.safetensors.index.json to say "
                  "which to use", path, fmt::join(names, ", "));
    file = (dir / names.front()).string();
  }
  std::vector<std::unique_ptr<SafetensorsFile>> out;
  out.push_back(std::make_unique<SafetensorsFile>(file));
  return out;
}

}  // namespace

std::shared_ptr<TensorStore> TensorStore::open(const std::string& path) {
  auto store = std::make_shared<TensorStore>();
  store->source_ = path;
  store->files_ = open_files(path);
  for (const auto& file : store->files_) {
    for (const auto& name : file->names()) {
      const TensorInfo* info = file->find(name);
      const std::string canon = canonical_name(name);
      auto [it, inserted] = store->by_name_.emplace(canon, info);
      TPDRAFT_CHECK(inserted, "{}: tensor '{}' appears twice: as '{}' in {} and as '{}' in {}", path, canon,
                    it->second->name, it->second->file, name, file->path());
    }
  }
  return store;
}

// The same lookups and checks as for files, so the drafter loads random benchmark weights
// through exactly the path real checkpoints take.
std::shared_ptr<TensorStore> TensorStore::from_memory(const std::string& label, std::vector<OwnedTensor> tensors) {
  auto store = std::make_shared<TensorStore>();
  store->source_ = label;
  store->owned_ = std::move(tensors);
  for (const OwnedTensor& t : store->owned_) {
    auto info =
        std::make_unique<TensorInfo>(TensorInfo{t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size(), label});
    // The loader trusts shape x dtype size as the tensor's extent: it must be these bytes exactly.
    const size_t expected = checked_bytes(t.shape, dtype_size(t.dtype), "{}: tensor '{}'", label, t.name);
    TPDRAFT_CHECK(expected == t.bytes.size(), "{}: tensor '{}' holds {} bytes, expected {} for shape {} of {}", label,
                  t.name, t.bytes.size(), expected, info->shape_str(), dtype_name(t.dtype));
    const std::string canon = canonical_name(t.name);
    TPDRAFT_CHECK(store->by_name_.emplace(canon, info.get()).second, "{}: tensor '{}' appears twice", label, canon);
    store->owned_info_.push_back(std::move(info));
  }
  return store;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  // The spelling stored in the file wins, then a canonical match, then the name without `model.`.
  const std::string canon = canonical_name(name);
  auto it = by_name_.find(canon);
  if (it != by_name_.end() && it->second->name == name) return it->second;
  if (auto exact = by_name_.find(name); exact != by_name_.end()) return exact->second;
  return it != by_name_.end() ? it->second : nullptr;
}

const TensorInfo& TensorStore::require(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = find(name);
  TPDRAFT_CHECK(t != nullptr, "{}: tensor '{}' is missing (expected shape {})", source_, name, shape_string(shape));
  TPDRAFT_CHECK(t->shape == shape, "{}: tensor '{}' has shape {}, expected {}", t->file, name, t->shape_str(),
                shape_string(shape));
  TPDRAFT_CHECK(is_float_weight(t->dtype), "{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", t->file, name,
                dtype_name(t->dtype));
  return *t;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& kv : by_name_) out.push_back(kv.first);
  return out;
}

// ---- slicing ---------------------------------------------------------------------------------

void copy_rows(const TensorInfo& t, int64_t row0, int64_t nrows, DType dst_type, void* dst) {
  TPDRAFT_CHECK(!t.shape.empty(), "{}: tensor '{}' is a scalar; it has no rows to copy", t.file, t.name);
  // A 1-D tensor's rows are its elements; an N-D tensor's rows are its slices along dim 0.
  const int64_t total = t.shape[0];
  const int64_t width = t.shape.size() == 1 ? 1 : t.cols();
  TPDRAFT_CHECK(row0 >= 0 && nrows >= 0 && row0 <= total && nrows <= total - row0,
                "{}: tensor '{}' with shape {}: rows [{}, {}) are out of range [0, {})", t.file, t.name,
                t.shape_str(), row0, row0 + nrows, total);
  const size_t ss = dtype_size(t.dtype);
  const auto first = static_cast<size_t>(row0 * width);
  convert_span(t, t.data + first * ss, dst_type, static_cast<std::byte*>(dst), static_cast<size_t>(nrows * width));
}

TensorInfo row_view(const TensorInfo& t, int64_t row0, int64_t n) {
  TensorInfo v = t;
  const size_t row_bytes = static_cast<size_t>(t.cols()) * dtype_size(t.dtype);
  v.data = t.data + static_cast<size_t>(row0) * row_bytes;
  v.shape = {n, t.cols()};
  v.nbytes = static_cast<size_t>(n) * row_bytes;
  return v;
}

void copy_cols(const TensorInfo& t, int64_t col0, int64_t ncols, DType dst_type, void* dst) {
  TPDRAFT_CHECK(t.shape.size() == 1 || t.shape.size() == 2,
                "{}: tensor '{}' has shape {}; column slices need a 1-D or 2-D tensor", t.file, t.name, t.shape_str());
  const int64_t rows = t.rows();
  const int64_t cols = t.cols();
  TPDRAFT_CHECK(col0 >= 0 && ncols >= 0 && col0 <= cols && ncols <= cols - col0,
                "{}: tensor '{}' with shape {}: columns [{}, {}) are out of range [0, {})", t.file, t.name,
                t.shape_str(), col0, col0 + ncols, cols);
  const size_t ss = dtype_size(t.dtype);
  const size_t ds = dtype_size(dst_type);
  auto* out = static_cast<std::byte*>(dst);
  // One strided read per row: only ncols * ss bytes of each row are touched.
  for (int64_t r = 0; r < rows; ++r) {
    const std::byte* src = t.data + static_cast<size_t>(r * cols + col0) * ss;
    convert_span(t, src, dst_type, out + static_cast<size_t>(r * ncols) * ds, static_cast<size_t>(ncols));
  }
}

int64_t integer_at(const TensorInfo& t, size_t i) {
  auto at = [&](auto v) {
    std::memcpy(&v, t.data + i * sizeof(v), sizeof(v));
    return static_cast<int64_t>(v);
  };
  switch (t.dtype) {
    case DType::I64: return at(int64_t{});
    case DType::I32: return at(int32_t{});
    case DType::I16: return at(int16_t{});
    case DType::U8: return at(uint8_t{});
    default: TPDRAFT_FAIL("{}: tensor '{}' is {}, not integers", t.file, t.name, dtype_name(t.dtype));
  }
}

std::vector<float> to_f32(const TensorInfo& t) { return to_vector<float>(t, DType::F32); }
std::vector<double> to_f64(const TensorInfo& t) { return to_vector<double>(t, DType::F64); }

// ---- SafetensorsWriter -----------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, size_t nbytes) {
  TPDRAFT_CHECK(!name.empty() && name != "__metadata__", "safetensors writer: invalid tensor name '{}'", name);
  for (const auto& e : entries_) TPDRAFT_CHECK(e.name != name, "safetensors writer: tensor '{}' added twice", name);
  for (int64_t d : shape)
    TPDRAFT_CHECK(d >= 0, "safetensors writer: tensor '{}' has a negative dimension in {}", name, shape_string(shape));
  const size_t expected = checked_bytes(shape, dtype_size(dtype), "safetensors writer: tensor '{}'", name);
  TPDRAFT_CHECK(expected == nbytes,
                "safetensors writer: tensor '{}' with shape {} and dtype {} needs {} bytes, got {}", name,
                shape_string(shape), dtype_name(dtype), expected, nbytes);
  OwnedTensor e{name, dtype, shape, std::vector<std::byte>(nbytes)};
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                const float* data) {
  TPDRAFT_CHECK(is_float_weight(dtype), "safetensors writer: tensor '{}': cannot store f32 values as {}", name,
                dtype_name(dtype));
  const int64_t n = checked_numel(shape, "safetensors writer: tensor '{}'", name);
  std::vector<std::byte> bytes(checked_bytes(shape, dtype_size(dtype), "safetensors writer: tensor '{}'", name));
  convert_from_f32(dtype, data, bytes.data(), static_cast<size_t>(n));
  add(name, dtype, shape, bytes.data(), bytes.size());
}

void SafetensorsWriter::write(const std::string& path) const {
  ojson header = ojson::object();
  if (!metadata_.empty()) {
    ojson meta = ojson::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data area starts at a multiple of 8
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TPDRAFT_CHECK(f != nullptr, "{}: cannot create file for writing ({})", tmp, std::strerror(errno));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& e : entries_) {
    if (!ok) break;
    ok = e.bytes.empty() || std::fwrite(e.bytes.data(), 1, e.bytes.size(), f) == e.bytes.size();
  }
  const int write_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    TPDRAFT_FAIL("{}: writing failed ({})", tmp, std::strerror(write_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(tmp.c_str());
    TPDRAFT_FAIL("{}: cannot rename {} into place ({})", path, tmp, std::strerror(rename_errno));
  }
}

void release_pages(const TensorInfo& t) {
  if (!t.mapped || t.nbytes == 0) return;
  // Only whole pages inside the tensor: a neighbour sharing an edge page keeps it.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace tpdraft::model
