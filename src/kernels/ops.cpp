// The public side of the ops interface: every op's argument checks, shared by every backend so
// that a bad call fails with the same message whatever runs it, then the backend's do_* function.
#include "kernels/ops.h"

#include <cmath>

#include "core/error.h"

namespace tpdraft::kernels {

namespace {

void check_ring_store(const char* op, int64_t rows, int64_t row_len, int64_t capacity, int64_t first_pos) {
  TPDRAFT_CHECK(capacity > 0, "{}: ring capacity must be > 0, got {}", op, capacity);
  TPDRAFT_CHECK(first_pos >= 0, "{}: first position must be >= 0, got {}", op, first_pos);
  TPDRAFT_CHECK(rows >= 0 && row_len >= 0, "{}: bad shape [{}, {}]", op, rows, row_len);
}

// The head's dtype and its valid rows, for head_logits and head_topk (`op`, in messages).
void check_head(const HeadParams& p, const char* op) {
  TPDRAFT_CHECK(p.head.quantized() || is_float_weight(p.head.dtype), "{}: head dtype {} is not F32, F16 or BF16", op,
                dtype_name(p.head.dtype));
  TPDRAFT_CHECK(p.valid_rows >= 0 && p.valid_rows <= p.head.rows && p.m >= 0 && p.head.cols > 0,
                "{}: valid rows {} must be in [0, {}] (m {}, cols {})", op, p.valid_rows, p.head.rows, p.m,
                p.head.cols);
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  static constexpr const char* kNames[] = {"dense", "int8", "int4"};
  const auto i = static_cast<size_t>(f);
  return i < std::size(kNames) ? kNames[i] : "?";
}

Matrix quantized_matrix(const QuantizedRows& src, const void* packed) {
  return {DType::F32, src.rows, src.cols, packed, quantized_format(src.bits), src.group, src.activation_bits};
}

void Ops::widen_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  TPDRAFT_CHECK(n >= 0, "widen_to_f32: element count must be >= 0, got {}", n);
  TPDRAFT_CHECK(is_float_weight(dtype), "widen_to_f32: {} is not f32, f16 or bf16", dtype_name(dtype));
  do_widen_to_f32(dtype, src, dst, n);
}

void Ops::do_widen_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  convert_to_f32(dtype, src, dst, static_cast<size_t>(n));
}

size_t Ops::quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const {
  TPDRAFT_CHECK(format != WeightFormat::Dense && supports(format, WeightOp::Matmul),
                "backend '{}' has no kernels for {} weights; use the cpu backend or a float checkpoint", name(),
                weight_format_name(format));
  return do_quantized_bytes(format, rows, cols, group);
}

Matrix Ops::upload_quantized(const QuantizedRows& src, void* dst) {
  TPDRAFT_CHECK(src.bits == 4 || src.bits == 8, "quantized weights must have 4 or 8 bits, got {}", src.bits);
  TPDRAFT_CHECK(supports(quantized_format(src.bits), WeightOp::Matmul),
                "backend '{}' has no kernels for int{} weights; use the cpu backend or a float checkpoint", name(),
                src.bits);
  TPDRAFT_CHECK(offers_activation_bits(src.activation_bits),
                "backend '{}' has no kernels for int{} weights with {}-bit activations", name(), src.bits,
                src.activation_bits);
  return do_upload_quantized(src, dst);
}

// Reached only where supports() says yes, which a backend says with these overridden.
size_t Ops::do_quantized_bytes(WeightFormat, int64_t, int64_t, int64_t) const { return 0; }
Matrix Ops::do_upload_quantized(const QuantizedRows& src, void* dst) { return quantized_matrix(src, dst); }

void Ops::matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  TPDRAFT_CHECK(w.quantized() || is_float_weight(w.dtype), "matmul: weight dtype {} is not F32, F16 or BF16",
                dtype_name(w.dtype));
  TPDRAFT_CHECK(w.rows > 0 && w.cols > 0 && w.data != nullptr, "matmul: empty weight matrix [{}, {}]", w.rows, w.cols);
  TPDRAFT_CHECK(m >= 0, "matmul: row count must be >= 0, got {}", m);
  do_matmul(w, x, m, y, bias);
}

void Ops::rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  TPDRAFT_CHECK(rows >= 0 && n > 0, "rms_norm: bad shape [{}, {}] (expected rows >= 0, n > 0)", rows, n);
  do_add_rms_norm(const_cast<float*>(x), nullptr, w, y, rows, n, eps);
}

void Ops::head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                         const int64_t* positions, double theta) {
  TPDRAFT_CHECK(head_dim > 0 && head_dim % 2 == 0, "head_norm_rope: head_dim must be even and > 0, got {}", head_dim);
  TPDRAFT_CHECK(rows >= 0 && heads > 0, "head_norm_rope: bad shape [{}, {}, {}]", rows, heads, head_dim);
  TPDRAFT_CHECK(theta > 0.0, "head_norm_rope: rope theta must be > 0, got {}", theta);
  do_head_norm_rope(x, w, rows, heads, head_dim, eps, positions, theta);
}

void Ops::attention(const AttentionParams& p) {
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
  do_attention(p);
}

void Ops::check_attention_views(const AttentionParams& p) {
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

void Ops::dyn_conv(const ConvParams& p) {
  TPDRAFT_CHECK(p.sessions >= 0 && p.block > 0 && p.hidden > 0, "dyn_conv: bad shape sessions {} block {} hidden {}",
                p.sessions, p.block, p.hidden);
  TPDRAFT_CHECK(p.kernel > 0, "dyn_conv: kernel size must be > 0, got {}", p.kernel);
  TPDRAFT_CHECK(p.group_size > 0 && p.hidden % p.group_size == 0,
                "dyn_conv: group size {} must be > 0 and divide hidden {}", p.group_size, p.hidden);
  TPDRAFT_CHECK(p.delta_offset >= 0 && p.delta_offset + p.kernel * (p.hidden / p.group_size) <= p.delta_stride,
                "dyn_conv: delta offset {} + kernel {} x groups {} exceeds the delta row stride {}", p.delta_offset,
                p.kernel, p.hidden / p.group_size, p.delta_stride);
  TPDRAFT_CHECK(p.in != p.out, "dyn_conv: out must not alias in");
  do_dyn_conv(p);
}

void Ops::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  TPDRAFT_CHECK(n >= 0, "silu_mul: element count must be >= 0, got {}", n);
  do_silu_mul(gate, up, out, n);
}

void Ops::add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  TPDRAFT_CHECK(rows >= 0 && n > 0, "add_rms_norm: bad shape [{}, {}] (expected rows >= 0, n > 0)", rows, n);
  do_add_rms_norm(h, x, w, y, rows, n, eps);
}

void Ops::gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst) {
  TPDRAFT_CHECK(rows >= 0 && row_len >= 0, "gather_rows: bad shape [{}, {}]", rows, row_len);
  TPDRAFT_CHECK(rows == 0 || (src != nullptr && index != nullptr && dst != nullptr), "gather_rows: a buffer is missing");
  do_gather_rows(src, index, rows, row_len, dst);
}

void Ops::store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,
                     int64_t first_pos) {
  check_ring_store("store_rows", rows, row_len, capacity, first_pos);
  do_store_rows(src, rows, row_len, dst, capacity, first_pos);
}

void Ops::store_context_rows(DType dtype, const float* src, int64_t rows, int64_t row_len, void* dst,
                             int64_t capacity, int64_t first_pos) {
  TPDRAFT_CHECK(holds_context(dtype), "store_context_rows: the {} backend holds no {} context", name(),
                dtype_name(dtype));
  if (dtype == DType::F32) return store_rows(src, rows, row_len, static_cast<float*>(dst), capacity, first_pos);
  check_ring_store("store_context_rows", rows, row_len, capacity, first_pos);
  do_store_context_rows(dtype, src, rows, row_len, dst, capacity, first_pos);
}

// Reached only where holds_context() says yes, which a backend says with this overridden.
void Ops::do_store_context_rows(DType, const float*, int64_t, int64_t, void*, int64_t, int64_t) {}

void Ops::head_logits(const HeadParams& p, float* logits) {
  check_head(p, "head_logits");
  do_head_logits(p, logits);
}

void Ops::head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids) {
  check_head(p, "head_topk");
  TPDRAFT_CHECK(k >= 1, "head_topk: k must be >= 1, got {}", k);
  TPDRAFT_CHECK(std::isfinite(p.scale) && p.scale > 0.0f, "head_topk: logit scale must be finite and > 0, got {}",
                p.scale);
  TPDRAFT_CHECK(std::isfinite(p.cap) && p.cap >= 0.0f, "head_topk: soft cap must be finite and >= 0, got {}", p.cap);
  do_head_topk(p, k, id_base, values, ids);
}

}  // namespace tpdraft::kernels
