// Quantized matrices in checkpoints: compressed-tensors `pack-quantized` int4 / int8 (a module's
// weight_packed int32 [N, ceil(K * bits / 32)], values offset by 2^(bits-1) and packed least
// significant bits first along K; weight_scale [N, K / group], [N, 1] or [1]; weight_shape [N, K])
// and FP8 e4m3 (weight as F8_E4M3 with weight_scale [N, 1] or [1]); reading a rank's share of
// one, quantizing float weights to nearest (symmetric) and packing them for writing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/quant_config.h"
#include "checkpoint/safetensors.h"
#include "core/range.h"

namespace tpdraft::model {

// A rank's share of an int4 / int8 matrix, unpacked on the host.
struct QuantShare {
  int bits = 8;
  int64_t rows = 0, cols = 0;
  int64_t group = 0;          // columns per scale within the share (cols: one scale per row)
  std::vector<int8_t> q;      // [rows, cols]
  std::vector<float> scales;  // [rows, cols / group]

  std::vector<float> dequantized() const;  // [rows, cols] q * scale, for tests and tools
};

// The name of a quantized module's companion tensor: ("layers.0.mlp.up_proj.weight", "scale")
// -> "layers.0.mlp.up_proj.weight_scale".
std::string quant_part(const std::string& weight_name, const char* part);

// Checks the stored form of `weight_name` (full shape `shape`, [N, K]) against `scheme`: every
// companion tensor present and shaped, dtypes right, weight_shape equal to `shape`; refuses zero
// points (asymmetric) and g_idx (activation order). Errors name the tensor and its file.
void check_quantized_tensor(const TensorStore& store, const std::string& weight_name,
                            const std::vector<int64_t>& shape, const QuantScheme& scheme);

// Rows `rows` x columns `cols` of a pack-quantized matrix (cols at group boundaries). Reads only
// the words and scales of the share.
QuantShare read_packed_share(const TensorStore& store, const std::string& weight_name,
                             const std::vector<int64_t>& shape, const QuantScheme& scheme, Range rows, Range cols);

// Rows x columns of an FP8 matrix, dequantized to f32 (exact: e4m3 times an f32 scale).
std::vector<float> read_fp8_share(const TensorStore& store, const std::string& weight_name,
                                  const std::vector<int64_t>& shape, const QuantScheme& scheme, Range rows,
                                  Range cols);

// Round to nearest, symmetric: per row and group (Group) or per row (Channel, over the whole row,
// even for a share of its columns), scale = max |w| / (2^(bits-1) - 1) rounded to the tensor's
// own dtype (the dtype `tpdraft quantize` stores it in), q = clamp(round(w / scale)). With
// `row_map`, share row r is the tensor's row (*row_map)[rows.begin + r] (a draft vocabulary's head).
QuantShare quantize_share(const TensorInfo& t, const QuantScheme& scheme, Range rows, Range cols,
                          const std::vector<int64_t>* row_map = nullptr);

// compressed-tensors packing of q [rows, cols] into int32 words [rows, ceil(cols * bits / 32)].
std::vector<int32_t> pack_words(const int8_t* q, int64_t rows, int64_t cols, int bits);

// Bytes a share of `rows` x `cols` takes at `scheme` (packed values and f32 scales), for sizes
// reported before loading.
size_t quantized_share_bytes(const QuantScheme& scheme, int64_t rows, int64_t cols);

}  // namespace tpdraft::model
