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
// A weight matrix in a float dtype or quantized, not empty, and m >= 0 activation rows.
void check_matmul_params(const Matrix& w, int64_t m);
// The head's dtype and its valid rows, for head_logits and head_topk (`op`, in messages).
void check_head_params(const HeadParams& p, const char* op);

}  // namespace tpdraft::kernels
