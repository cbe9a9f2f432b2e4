// `tpdraft quantize`: a float drafter checkpoint rewritten with its selected matrices quantized
// (round to nearest, symmetric) in the compressed-tensors pack-quantized layout, and the plan in
// config.json's quantization_config, so that other tools read it too. docs/quantization.md.
#pragma once

#include <string>

#include "checkpoint/quant_config.h"

namespace tpdraft::model {

struct QuantizeSummary {
  size_t tensors = 0;        // tensors written
  size_t quantized = 0;      // of them, matrices quantized
  size_t bytes_before = 0;   // tensor bytes read
  size_t bytes_after = 0;    // tensor bytes written
};

// Reads DRAFTER/config.json and its tensors, writes OUT/config.json (the input's keys plus
// quantization_config) and OUT/model.safetensors. Refuses a checkpoint that is quantized already
// and an OUT that holds a model.safetensors.
QuantizeSummary quantize_checkpoint(const std::string& drafter_dir, const std::string& out_dir,
                                    const QuantRequest& request);

}  // namespace tpdraft::model
