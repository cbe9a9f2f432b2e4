// Argument checks shared by every backend, so that a bad call fails with the same message
// whatever runs it (backends add only their own limits).
#pragma once

#include "kernels/ops.h"

namespace tpdraft::kernels {

void check_attention_params(const AttentionParams& p);
void check_conv_params(const ConvParams& p);

}  // namespace tpdraft::kernels
