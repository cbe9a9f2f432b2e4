// Safetensors checkpoints: a validating, memory-mapped reader (single files and sharded
// `*.safetensors.index.json` sets) that can copy out a 2-D tensor's row or column range without
// touching the rest, and a writer for the checkpoints `tpdraft init` makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tpdraft::model {

// One tensor inside a mapped file. `data` points into the mapping (valid while the file lives).
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path of the file that holds it, for messages
  bool mapped = false;  // data lies in a read-only file mapping (release_pages may drop it)

  int64_t numel() const;
  int64_t rows() const;  // shape[0] of a 2-D tensor (1-D: 1)
  int64_t cols() const;  // shape[1] of a 2-D tensor (1-D: shape[0])
  std::string shape_str() const;  // "[4096, 2048]"
};

// A read-only mapping of one safetensors file. The constructor validates the whole header before
// any tensor data is touched: length sane, JSON well formed, known dtypes, shape x dtype size equal
// to each byte range, every range inside the data area and no two ranges overlapping.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  const std::vector<std::string>& names() const { return names_; }  // header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor that owns its bytes (random checkpoints, in-memory stores).
struct OwnedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// The tensors of one model directory or file: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (only shards that are named are opened), or one explicit file.
// Names may carry a `model.` prefix in the file; lookups accept either spelling.
class TensorStore {
 public:
  // `path` may be a directory (looks for model.safetensors.index.json, then model.safetensors,
  // then a single *.safetensors) or a .safetensors / .index.json file.
  static std::shared_ptr<TensorStore> open(const std::string& path);
  // A store over tensors held in memory (benchmarks on random weights); `label` names it in
  // messages. Names are canonicalised as for files.
  static std::shared_ptr<TensorStore> from_memory(const std::string& label, std::vector<OwnedTensor> tensors);

  const std::string& source() const { return source_; }
  // nullptr when absent under either spelling.
  const TensorInfo* find(const std::string& name) const;
  // Throws naming the tensor, the file or directory and the expected shape when the tensor is
  // missing or shaped otherwise; also rejects non-float dtypes.
  const TensorInfo& require(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;  // canonical names (any `model.` prefix removed)

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;  // canonical name -> info (its name as in the file)
  std::vector<OwnedTensor> owned_;                       // from_memory: the bytes
  std::vector<std::unique_ptr<TensorInfo>> owned_info_;  // from_memory: their descriptions
};

// Copies rows [row0, row0 + nrows) of a 2-D tensor (a 1-D tensor: elements) into dst, converted
// to dst_type (same dtype: plain copy). Only the bytes of those rows are read.
void copy_rows(const TensorInfo& t, int64_t row0, int64_t nrows, DType dst_type, void* dst);
// A view of rows [row0, row0 + n) of a 2-D tensor (no bounds check), for chunked copies.
TensorInfo row_view(const TensorInfo& t, int64_t row0, int64_t n);
// Copies columns [col0, col0 + ncols) of a 2-D tensor, row by row, into a dense
// [rows, ncols] dst of dst_type. Only the bytes of those columns are read.
void copy_cols(const TensorInfo& t, int64_t col0, int64_t ncols, DType dst_type, void* dst);
// Element i of an integer tensor (I64, I32, I16 or U8) as an int64; throws for another dtype.
int64_t integer_at(const TensorInfo& t, size_t i);
// The whole tensor as f32 / f64 (small tensors, tests, the reference).
std::vector<float> to_f32(const TensorInfo& t);
std::vector<double> to_f64(const TensorInfo& t);

// Drops the mapped pages of a tensor from this process (the page cache keeps them): after a
// rank has copied its share out, the file's pages no longer count in its resident memory.
// No-op for tensors held in memory.
void release_pages(const TensorInfo& t);

// Writes a safetensors file: tensors in insertion order, 8-byte aligned data, optional metadata.
// Writes to `path.tmp` and renames, so a failed write leaves nothing half-done behind.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
           size_t nbytes);
  // Converts f32 values to `dtype` (F32, F16 or BF16) and adds them.
  void add_f32(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
               const float* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const;

 private:
  std::vector<OwnedTensor> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tpdraft::model
