// Reading, making and packing quantized matrices (compressed-tensors pack-quantized and FP8).
#include "checkpoint/quant_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "core/error.h"

namespace tpdraft::model {

namespace {

int64_t words_per_row(int64_t cols, int bits, const std::string& what) {
  const int64_t total_bits = checked_mul(cols, bits, "{}: packed row bits", what);
  return (total_bits + 31) / 32;
}

// The shape weight_scale must have, given the scheme.
std::vector<std::vector<int64_t>> scale_shapes(const QuantScheme& s, int64_t n, int64_t k) {
  switch (s.strategy) {
    case QuantScheme::Strategy::Group:
      return {{n, k / s.group}};
    case QuantScheme::Strategy::Channel:
      return {{n, 1}, {n}};
    case QuantScheme::Strategy::Tensor:
      return {{1}, {}, {1, 1}};
  }
  return {};
}

const TensorInfo& part(const TensorStore& store, const std::string& weight_name, const char* name,
                       const QuantScheme& s) {
  const std::string full = quant_part(weight_name, name);
  const TensorInfo* t = store.find(full);
  TPDRAFT_CHECK(t != nullptr, "{}: tensor '{}' is missing: quantization_config quantizes '{}' as {}", store.source(),
                full, weight_name, s.describe());
  return *t;
}

void refuse_unsupported(const TensorStore& store, const std::string& weight_name) {
  if (const TensorInfo* zp = store.find(quant_part(weight_name, "zero_point")))
    TPDRAFT_FAIL("{}: tensor '{}': asymmetric quantization (zero points) is not supported; quantize '{}' "
                 "symmetrically", zp->file, zp->name, weight_name);
  if (const TensorInfo* gi = store.find(quant_part(weight_name, "g_idx")))
    TPDRAFT_FAIL("{}: tensor '{}': activation ordering (g_idx) is not supported; quantize '{}' without act-order",
                 gi->file, gi->name, weight_name);
}

// One scale as f32 from a float tensor at element i (convert_to_f32 reads it where it lies,
// aligned or not).
float scale_at(const TensorInfo& t, int64_t i) {
  float f = 0.0f;
  convert_to_f32(t.dtype, t.data + static_cast<size_t>(i) * dtype_size(t.dtype), &f, 1);
  TPDRAFT_CHECK(std::isfinite(f), "{}: tensor '{}' holds a non-finite scale (NaN or Inf) at element {}", t.file,
                t.name, i);
  return f;
}

// The scale of row r, group j of a checked weight_scale tensor.
float row_scale(const TensorInfo& scale, const QuantScheme& s, int64_t r, int64_t j) {
  switch (s.strategy) {
    case QuantScheme::Strategy::Group:
      return scale_at(scale, r * scale.cols() + j);
    case QuantScheme::Strategy::Channel:
      return scale_at(scale, r);
    case QuantScheme::Strategy::Tensor:
      return scale_at(scale, 0);
  }
  return 0.0f;
}

void check_share(const std::string& weight_name, const std::vector<int64_t>& shape, const QuantScheme& s, Range rows,
                 Range cols) {
  TPDRAFT_CHECK(shape.size() == 2 && rows.begin >= 0 && rows.end <= shape[0] && rows.begin <= rows.end &&
                    cols.begin >= 0 && cols.end <= shape[1] && cols.begin < cols.end,
                "tensor '{}' {}: share rows [{}, {}) columns [{}, {}) out of range", weight_name, shape_string(shape),
                rows.begin, rows.end, cols.begin, cols.end);
  if (s.strategy == QuantScheme::Strategy::Group)
    TPDRAFT_CHECK(cols.begin % s.group == 0 && cols.end % s.group == 0,
                  "tensor '{}' is quantized in groups of {} columns; columns [{}, {}) cut a group", weight_name,
                  s.group, cols.begin, cols.end);
}

QuantShare empty_share(const QuantScheme& s, Range rows, Range cols) {
  QuantShare q;
  q.bits = s.bits;
  q.rows = rows.size();
  q.cols = cols.size();
  q.group = s.strategy == QuantScheme::Strategy::Group ? s.group : q.cols;
  q.q.resize(static_cast<size_t>(checked_mul(q.rows, q.cols, "quantized share elements")));
  q.scales.resize(static_cast<size_t>(q.rows * (q.cols / q.group)));
  return q;
}

}  // namespace

std::string quant_part(const std::string& weight_name, const char* name) { return weight_name + "_" + name; }

std::vector<float> QuantShare::dequantized() const {
  std::vector<float> out(q.size());
  const int64_t gpr = cols / group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(r * cols + c)] =
          static_cast<float>(q[static_cast<size_t>(r * cols + c)]) * scales[static_cast<size_t>(r * gpr + c / group)];
  return out;
}

void check_quantized_tensor(const TensorStore& store, const std::string& weight_name,
                            const std::vector<int64_t>& shape, const QuantScheme& s) {
  TPDRAFT_CHECK(shape.size() == 2, "tensor '{}': only matrices may be quantized", weight_name);
  const int64_t n = shape[0], k = shape[1];
  if (s.strategy == QuantScheme::Strategy::Group)
    TPDRAFT_CHECK(k % s.group == 0, "{}: '{}' has {} columns, which groups of {} (quantization_config) do not divide",
                  store.source(), weight_name, k, s.group);
  refuse_unsupported(store, weight_name);
  if (s.kind == QuantScheme::Kind::Int) {
    const TensorInfo* plain = store.find(weight_name);
    TPDRAFT_CHECK(plain == nullptr, "{}: tensor '{}' is stored unquantized ({}), but quantization_config quantizes it "
                  "as {} (expected '{}')", plain ? plain->file : store.source(), weight_name,
                  plain ? dtype_name(plain->dtype) : "", s.describe(), quant_part(weight_name, "packed"));
  }
  const TensorInfo& scale = part(store, weight_name, "scale", s);
  TPDRAFT_CHECK(is_float_weight(scale.dtype), "{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", scale.file,
                scale.name, dtype_name(scale.dtype));
  bool scale_ok = false;
  std::string wanted;
  for (const auto& sh : scale_shapes(s, n, k)) {
    scale_ok = scale_ok || scale.shape == sh;
    wanted += (wanted.empty() ? "" : " or ") + shape_string(sh);
  }
  TPDRAFT_CHECK(scale_ok, "{}: tensor '{}' has shape {}, expected {} for {} weights of shape {}", scale.file,
                scale.name, scale.shape_str(), wanted, s.describe(), shape_string(shape));

  if (s.kind == QuantScheme::Kind::Fp8) {
    const TensorInfo* w = store.find(weight_name);
    TPDRAFT_CHECK(w != nullptr, "{}: tensor '{}' is missing (expected FP8 e4m3 {})", store.source(), weight_name,
                  shape_string(shape));
    TPDRAFT_CHECK(w->dtype == DType::F8E4M3, "{}: tensor '{}' has dtype {}, but quantization_config stores it as "
                  "FP8 (F8_E4M3)", w->file, weight_name, dtype_name(w->dtype));
    TPDRAFT_CHECK(w->shape == shape, "{}: tensor '{}' has shape {}, expected {}", w->file, weight_name,
                  w->shape_str(), shape_string(shape));
    return;
  }

  const TensorInfo& packed = part(store, weight_name, "packed", s);
  const std::vector<int64_t> packed_shape{n, words_per_row(k, s.bits, packed.file + ": " + packed.name)};
  TPDRAFT_CHECK(packed.dtype == DType::I32, "{}: tensor '{}' has dtype {}, expected I32 (pack-quantized)", packed.file,
                packed.name, dtype_name(packed.dtype));
  TPDRAFT_CHECK(packed.shape == packed_shape, "{}: tensor '{}' has shape {}, expected {} ({} values of {} bits per "
                "row, 32 per word)", packed.file, packed.name, packed.shape_str(), shape_string(packed_shape), k,
                s.bits);
  const TensorInfo& ws = part(store, weight_name, "shape", s);
  TPDRAFT_CHECK((ws.dtype == DType::I64 || ws.dtype == DType::I32) && ws.shape == std::vector<int64_t>{2},
                "{}: tensor '{}' must be an I64 or I32 vector of 2 elements, found {} {}", ws.file, ws.name,
                dtype_name(ws.dtype), ws.shape_str());
  const int64_t dims[2] = {integer_at(ws, 0), integer_at(ws, 1)};
  TPDRAFT_CHECK(dims[0] == n && dims[1] == k, "{}: tensor '{}' says [{}, {}], but '{}' must be {}", ws.file, ws.name,
                dims[0], dims[1], weight_name, shape_string(shape));
}

QuantShare read_packed_share(const TensorStore& store, const std::string& weight_name,
                             const std::vector<int64_t>& shape, const QuantScheme& s, Range rows, Range cols) {
  check_quantized_tensor(store, weight_name, shape, s);
  check_share(weight_name, shape, s, rows, cols);
  const TensorInfo& packed = part(store, weight_name, "packed", s);
  const TensorInfo& scale = part(store, weight_name, "scale", s);
  QuantShare q = empty_share(s, rows, cols);
  const int64_t wpr = packed.shape[1];
  const int per_word = 32 / s.bits;
  const uint32_t mask = (1u << s.bits) - 1u;
  const int offset = 1 << (s.bits - 1);
  // Only the words holding columns [cols.begin, cols.end) of each row are read.
  const int64_t w0 = cols.begin / per_word, w1 = (cols.end + per_word - 1) / per_word;
  std::vector<uint32_t> words(static_cast<size_t>(w1 - w0));
  const int64_t gpr = q.cols / q.group;
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t row = rows.begin + r;
    std::memcpy(words.data(), packed.data + static_cast<size_t>(row * wpr + w0) * 4, words.size() * 4);
    int8_t* dst = q.q.data() + r * q.cols;
    for (int64_t c = cols.begin; c < cols.end; ++c) {
      const uint32_t word = words[static_cast<size_t>(c / per_word - w0)];
      const auto u = static_cast<int>((word >> ((c % per_word) * s.bits)) & mask);
      dst[c - cols.begin] = static_cast<int8_t>(u - offset);
    }
    for (int64_t j = 0; j < gpr; ++j)
      q.scales[static_cast<size_t>(r * gpr + j)] =
          row_scale(scale, s, row, s.strategy == QuantScheme::Strategy::Group ? cols.begin / s.group + j : 0);
  }
  release_pages(packed);
  return q;
}

std::vector<float> read_fp8_share(const TensorStore& store, const std::string& weight_name,
                                  const std::vector<int64_t>& shape, const QuantScheme& s, Range rows, Range cols) {
  check_quantized_tensor(store, weight_name, shape, s);
  check_share(weight_name, shape, s, rows, cols);
  const TensorInfo& w = *store.find(weight_name);
  const TensorInfo& scale = part(store, weight_name, "scale", s);
  const int64_t nr = rows.size(), nc = cols.size();
  std::vector<float> out(static_cast<size_t>(checked_mul(nr, nc, "FP8 share elements")));
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t row = rows.begin + r;
    const float sc = row_scale(scale, s, row, 0);
    const auto* src = reinterpret_cast<const uint8_t*>(w.data) + row * shape[1] + cols.begin;
    for (int64_t c = 0; c < nc; ++c) {
      const float v = f8e4m3_to_f32(src[c]);
      TPDRAFT_CHECK(!std::isnan(v), "{}: tensor '{}' holds NaN at row {}, column {}; weights must be finite", w.file,
                    w.name, row, cols.begin + c);
      out[static_cast<size_t>(r * nc + c)] = v * sc;
    }
  }
  release_pages(w);
  return out;
}

QuantShare quantize_share(const TensorInfo& t, const QuantScheme& s, Range rows, Range cols,
                          const std::vector<int64_t>* row_map) {
  TPDRAFT_CHECK(s.kind == QuantScheme::Kind::Int && (s.bits == 4 || s.bits == 8) &&
                    s.strategy != QuantScheme::Strategy::Tensor,
                "quantizing '{}': only int4 / int8 per group or per channel", t.name);
  TPDRAFT_CHECK(is_float_weight(t.dtype), "{}: tensor '{}' has dtype {}; only F32, F16 or BF16 weights can be "
                "quantized", t.file, t.name, dtype_name(t.dtype));
  if (s.strategy == QuantScheme::Strategy::Group)
    TPDRAFT_CHECK(t.shape.size() == 2 && t.shape[1] % s.group == 0,
                  "{}: tensor '{}' has {} columns, which groups of {} do not divide", t.file, t.name, t.cols(),
                  s.group);
  check_share(t.name, row_map ? std::vector<int64_t>{static_cast<int64_t>(row_map->size()), t.cols()} : t.shape, s,
              rows, cols);
  QuantShare q = empty_share(s, rows, cols);
  const int64_t k = t.shape[1];
  const bool whole_row = s.strategy == QuantScheme::Strategy::Channel;
  const float qmax = static_cast<float>((1 << (s.bits - 1)) - 1);
  std::vector<float> row(static_cast<size_t>(whole_row ? k : cols.size()));
  const int64_t gpr = q.cols / q.group;
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t src_row = row_map ? (*row_map)[static_cast<size_t>(rows.begin + r)] : rows.begin + r;
    TPDRAFT_CHECK(src_row >= 0 && src_row < t.rows(), "tensor '{}': row {} outside its {} rows", t.name, src_row,
                  t.rows());
    const TensorInfo one = row_view(t, src_row, 1);
    if (whole_row) copy_rows(one, 0, 1, DType::F32, row.data());
    else copy_cols(one, cols.begin, cols.size(), DType::F32, row.data());
    const int64_t bad = find_non_finite(DType::F32, row.data(), row.size());
    TPDRAFT_CHECK(bad < 0, "{}: tensor '{}' holds a non-finite value (NaN or Inf) at row {}; weights must be finite",
                  t.file, t.name, src_row);
    const float* share = whole_row ? row.data() + cols.begin : row.data();
    for (int64_t j = 0; j < gpr; ++j) {
      // Channel: the scale of the whole row; Group: of the group's columns.
      const float* g = whole_row ? row.data() : share + j * q.group;
      const int64_t glen = whole_row ? k : q.group;
      float amax = 0.0f;
      for (int64_t c = 0; c < glen; ++c) amax = std::max(amax, std::fabs(g[c]));
      float scale = amax / qmax;
      // Stored in the tensor's dtype: round it there, so that q * scale is what a reader gets.
      alignas(4) std::byte tmp[4];
      convert_from_f32(t.dtype, &scale, tmp, 1);
      convert_to_f32(t.dtype, tmp, &scale, 1);
      q.scales[static_cast<size_t>(r * gpr + j)] = scale;
      int8_t* dst = q.q.data() + r * q.cols + j * q.group;
      const float* src = share + j * q.group;
      for (int64_t c = 0; c < q.group; ++c) {
        const float v = scale > 0.0f ? std::nearbyint(src[c] / scale) : 0.0f;
        dst[c] = static_cast<int8_t>(std::min(qmax, std::max(-qmax - 1.0f, v)));
      }
    }
  }
  return q;
}

std::vector<int32_t> pack_words(const int8_t* q, int64_t rows, int64_t cols, int bits) {
  TPDRAFT_CHECK(bits == 4 || bits == 8, "packing: {} bits (4 or 8)", bits);
  const int64_t wpr = words_per_row(cols, bits, "packing");
  std::vector<uint32_t> words(static_cast<size_t>(checked_mul(rows, wpr, "packed words")), 0u);
  const int per_word = 32 / bits;
  const int offset = 1 << (bits - 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto u = static_cast<uint32_t>(q[r * cols + c] + offset);
      words[static_cast<size_t>(r * wpr + c / per_word)] |= u << ((c % per_word) * bits);
    }
  std::vector<int32_t> out(words.size());
  std::memcpy(out.data(), words.data(), words.size() * 4);
  return out;
}

size_t quantized_share_bytes(const QuantScheme& s, int64_t rows, int64_t cols) {
  if (s.kind == QuantScheme::Kind::Fp8) return static_cast<size_t>(rows * cols) * sizeof(float);  // held as f32
  const int64_t group = s.strategy == QuantScheme::Strategy::Group ? s.group : cols;
  const int64_t values = checked_mul(rows, cols, "quantized share");
  return static_cast<size_t>(values * s.bits / 8 + rows * (cols / group) * static_cast<int64_t>(sizeof(float)));
}

}  // namespace tpdraft::model
