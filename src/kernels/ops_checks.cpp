// The shared argument checks of the ops interface.
#include "kernels/ops_checks.h"

#include "core/error.h"

namespace tpdraft::kernels {

void check_attention_params(const AttentionParams& p) {
  TPDRAFT_CHECK(p.sessions >= 0 && p.block > 0 && p.head_dim > 0 && p.n_q > 0 && p.n_kv > 0,
                "attention: bad shape sessions {} block {} n_q {} n_kv {} head_dim {}", p.sessions, p.block, p.n_q,
                p.n_kv, p.head_dim);
  TPDRAFT_CHECK(p.n_q % p.n_kv == 0, "attention: n_q {} is not a multiple of n_kv {}", p.n_q, p.n_kv);
  TPDRAFT_CHECK(p.window >= 0, "attention: window must be >= 0, got {}", p.window);
  TPDRAFT_CHECK(p.max_context >= 0, "attention: max_context must be >= 0, got {}", p.max_context);
  TPDRAFT_CHECK(p.kv_dtype == DType::F32 || p.kv_dtype == DType::BF16, "attention: context dtype {} is not f32 or bf16",
                dtype_name(p.kv_dtype));
  TPDRAFT_CHECK(p.sessions == 0 || (p.anchor != nullptr && p.context != nullptr),
                "attention: {} sessions but no anchor or context table", p.sessions);
}

void check_attention_views(const AttentionParams& p) {
  for (int64_t s = 0; s < p.sessions; ++s) {
    const ContextView& c = p.context[s];
    TPDRAFT_CHECK(c.begin >= 0 && c.begin <= c.end && c.end - c.begin <= c.capacity,
                  "attention: session {} context [{}, {}) does not fit its ring of {} slots", s, c.begin, c.end,
                  c.capacity);
    TPDRAFT_CHECK(c.end - c.begin <= p.max_context,
                  "attention: session {} holds {} context positions, more than max_context {}", s, c.end - c.begin,
                  p.max_context);
    TPDRAFT_CHECK(p.anchor[s] >= 0, "attention: session {} anchor {} is negative", s, p.anchor[s]);
  }
}

void check_conv_params(const ConvParams& p) {
  TPDRAFT_CHECK(p.sessions >= 0 && p.block > 0 && p.hidden > 0, "dyn_conv: bad shape sessions {} block {} hidden {}",
                p.sessions, p.block, p.hidden);
  TPDRAFT_CHECK(p.kernel > 0, "dyn_conv: kernel size must be > 0, got {}", p.kernel);
  TPDRAFT_CHECK(p.group_size > 0 && p.hidden % p.group_size == 0,
                "dyn_conv: group size {} must be > 0 and divide hidden {}", p.group_size, p.hidden);
  TPDRAFT_CHECK(p.delta_offset >= 0 && p.delta_offset + p.kernel * (p.hidden / p.group_size) <= p.delta_stride,
                "dyn_conv: delta offset {} + kernel {} x groups {} exceeds the delta row stride {}", p.delta_offset,
                p.kernel, p.hidden / p.group_size, p.delta_stride);
  TPDRAFT_CHECK(p.in != p.out, "dyn_conv: out must not alias in");
}

void check_matmul_params(const Matrix& w, int64_t m) {
  TPDRAFT_CHECK(w.quantized() || is_float_weight(w.dtype),
                "matmul: weight dtype {} is not F32, F16 or BF16", dtype_name(w.dtype));
  TPDRAFT_CHECK(w.rows > 0 && w.cols > 0 && w.data != nullptr, "matmul: empty weight matrix [{}, {}]", w.rows, w.cols);
  TPDRAFT_CHECK(m >= 0, "matmul: row count must be >= 0, got {}", m);
}

void check_head_params(const HeadParams& p, const char* op) {
  TPDRAFT_CHECK(p.head.quantized() || is_float_weight(p.head.dtype),
                "{}: head dtype {} is not F32, F16 or BF16", op, dtype_name(p.head.dtype));
  TPDRAFT_CHECK(p.valid_rows >= 0 && p.valid_rows <= p.head.rows && p.m >= 0 && p.head.cols > 0,
                "{}: valid rows {} must be in [0, {}] (m {}, cols {})", op, p.valid_rows, p.head.rows, p.m,
                p.head.cols);
}

}  // namespace tpdraft::kernels
