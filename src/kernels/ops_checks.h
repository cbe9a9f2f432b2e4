// Argument checks shared by every backend, so that a bad call fails with the same message
// whatever runs it (backends add only their own limits).
#pragma once

#include "kernels/ops.h"

namespace tpdraft::kernels {

// The shape and scalars, which every backend can check when the op is issued.
void check_attention_params(const AttentionParams& p);
// The session tables (anchors and context views): only for backends that can read them on the
// host when the op runs.
void check_attention_views(const AttentionParams& p);
void check_conv_params(const ConvParams& p);

}  // namespace tpdraft::kernels
