// The ops interface: every computation the drafter performs, on buffers owned by one backend
// (host memory for the CPU backend, device memory for CUDA). The model is written once against
// this interface; cpu/ and cuda/ implement it, one op family per file.
//
// Conventions: activations are f32, row-major; weight matrices keep their checkpoint dtype and use
// PyTorch's Linear layout [out, in]; "rows" of a block are session-major (S sessions x B rows).
// Every pointer an op takes, tables of positions and sessions included, is memory of the backend:
// ops may be captured once and replayed (see OpGraph), so whatever changes from one call to the
// next is read from memory when the op runs, never taken from the host when it is issued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace tpdraft::kernels {

// How a weight matrix is held. Dense: `dtype` elements (F32, F16 or BF16), row-major. Int8 /
// Int4: symmetric integers, w[r][c] = q[r][c] * scale[r][c / group], in the backend's own packed
// layout (made by Ops::upload_quantized; `data` points to it, scales included).
enum class WeightFormat : uint8_t { Dense, Int8, Int4 };

const char* weight_format_name(WeightFormat f);  // "dense", "int8", "int4"
inline WeightFormat quantized_format(int bits) { return bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8; }

// A weight matrix [rows, cols].
struct Matrix {
  DType dtype = DType::F32;  // Dense only
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  WeightFormat format = WeightFormat::Dense;
  int64_t group = 0;  // Int8 / Int4: columns per scale (divides cols; cols: one scale per row)
  // Int8 / Int4: the activations the backend multiplies it with (8: int8, 16: bf16), 0 for the
  // backend's own (Ops::quantized_activation_bits).
  int activation_bits = 0;

  bool quantized() const { return format != WeightFormat::Dense; }
};

// A quantized matrix on the host, as read from a checkpoint or made while loading:
// q[r * cols + c] in [-2^(bits-1), 2^(bits-1)), scales[r * (cols / group) + c / group] (finite).
struct QuantizedRows {
  int bits = 8;  // 4 or 8
  int64_t rows = 0, cols = 0, group = 0;
  const int8_t* q = nullptr;
  const float* scales = nullptr;
  int activation_bits = 0;  // asked of the backend: Matrix::activation_bits
};

// One session's context for one layer and the local kv heads: a ring of `capacity` slots,
// position p in slot p % capacity, valid positions [begin, end). Rows are [n_kv, head_dim] of
// AttentionParams::kv_dtype: f32, or bf16 (k and v then point to the rings' uint16 values).
struct ContextView {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t capacity = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// Attention of the block's queries over [the session's context positions < anchor] U [block rows].
// Query row r of session s sits at position anchor[s] + r. Query head h reads kv head
// h / (n_q / n_kv). Visibility (docs/model.md): causal -> key pos <= query pos; window W > 0 ->
// q - k < W, and when not causal also k - q < W.
struct AttentionParams {
  const float* q = nullptr;  // [S*B, n_q, D]   (normed, rotated)
  const float* k = nullptr;  // [S*B, n_kv, D]  block keys (normed, rotated)
  const float* v = nullptr;  // [S*B, n_kv, D]
  float* out = nullptr;      // [S*B, n_q, D]
  int64_t sessions = 0, block = 0, n_q = 0, n_kv = 0, head_dim = 0;
  const int64_t* anchor = nullptr;       // [S] backend memory: position of row 0
  const ContextView* context = nullptr;  // [S] backend memory
  // Every view's end - begin is at most this. It only sizes how the work is split (the CUDA
  // backend cannot read the views when it issues the op); results do not depend on it.
  int64_t max_context = 0;
  bool causal = false;
  int64_t window = 0;  // 0: no window
  float scale = 1.0f;
  DType kv_dtype = DType::F32;  // of every context ring (F32, or BF16 where holds_context); k, v are f32
};

// DFlash 2 grouped dynamic causal convolution along the B rows of each session's block:
// out_t[c] = sum_{j<K} (base[j][c] + delta_t[j][c / group_size]) * in_{t-j}[c], in_{t-j} = 0 for t-j < 0.
// delta_t[j][g] = delta[t * delta_stride + delta_offset + j * G + g], G = hidden / group_size.
struct ConvParams {
  const float* in = nullptr;  // [S*B, H]
  float* out = nullptr;       // [S*B, H], must not alias in
  const float* base = nullptr;   // [K, H]
  const float* delta = nullptr;  // [S*B, delta_stride]
  int64_t delta_stride = 0, delta_offset = 0;
  int64_t sessions = 0, block = 0, hidden = 0, kernel = 0, group_size = 0;
};

// Head over a vocabulary slice: logit[m][v] = post(scale * dot(head[v], g[m])) with
// post(x) = cap > 0 ? cap * tanh(x / cap) : x.
struct HeadParams {
  Matrix head;                // [Vs, H] slice of the target head
  const float* g = nullptr;   // [m, H] final-normed rows
  int64_t m = 0;
  int64_t valid_rows = 0;     // rows of the slice tokens may take (<= head.rows); others never win
  float scale = 1.0f;
  float cap = 0.0f;
};

// A recorded sequence of ops of one backend (a CUDA graph; on the CPU, a list of calls).
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  // What it runs: kernels and copies of a CUDA graph, calls of a CPU tape.
  virtual size_t nodes() const = 0;
};

// The matrix over `packed`, a backend's packed copy of `src` (what upload_quantized returns).
Matrix quantized_matrix(const QuantizedRows& src, const void* packed);

// What supports() is asked about: the ops that take weight matrices.
enum class WeightOp : uint8_t { Matmul, Head };

// The do_* functions every backend implements, listed once: Ops declares them with `= 0`, each
// backend with `override`. do_add_rms_norm serves rms_norm too, with x null (no add; h only read).
#define TPDRAFT_OPS_DO_FUNCTIONS(tail)                                                                             \
  virtual void do_matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) tail;            \
  virtual void do_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim,          \
                                 float eps, const int64_t* positions, double theta) tail;                          \
  virtual void do_attention(const AttentionParams& p) tail;                                                        \
  virtual void do_dyn_conv(const ConvParams& p) tail;                                                              \
  virtual void do_silu_mul(const float* gate, const float* up, float* out, int64_t n) tail;                        \
  virtual void do_add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n,        \
                               float eps) tail;                                                                    \
  virtual void do_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len,               \
                              float* dst) tail;                                                                    \
  virtual void do_store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,        \
                             int64_t first_pos) tail;                                                              \
  virtual void do_head_logits(const HeadParams& p, float* logits) tail;                                            \
  virtual void do_head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids) tail;

// Shaped like parallel::Communicator: the ops are public and non-virtual; they check their
// arguments here, once for every backend (with the same messages whatever runs them), and hand
// the work to the backend's do_* function, which adds only its own limits.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  // Whether this backend's buffers are host memory, which host code and host communicators may
  // read and write directly (false for a device's memory: it must be copied or carried by a
  // device communicator).
  virtual bool host_memory() const = 0;
  // A device backend's device and the stream its ops run on (a cudaStream_t), for communicators
  // that must order their work with the ops' kernels; -1 and nullptr for host backends.
  virtual int device() const { return -1; }
  virtual void* stream() const { return nullptr; }

  // Memory of this backend.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;
  // Orders this backend's later work after the work queued so far on a caller's `stream` (a
  // cudaStream_t for the CUDA backend, whose memory the caller wrote there). Host backends have
  // no streams: nothing to wait for.
  virtual void wait_for(void* stream) { (void)stream; }
  // dst [n] f32 = src [n] of `dtype` (F32, F16 or BF16), both memory of this backend: hidden
  // states a caller left in it in their own dtype.
  void widen_to_f32(DType dtype, const void* src, float* dst, int64_t n);
  // Why a caller's pointer is not memory this backend's device may read ("" when it is): host
  // memory, or another device's.
  virtual std::string foreign_memory(const void* p) const { (void)p; return ""; }

  // Whether this backend has kernels for weights of `format` in `op` (every backend: Dense).
  virtual bool supports(WeightFormat format, WeightOp op) const { (void)op; return format == WeightFormat::Dense; }
  // The activations this backend's quantized kernels multiply the weights with: 8 (rounded to
  // int8 per block, the CPU backend), 16 (rounded to bf16, the CUDA backend), 0 (no quantized
  // kernels). QuantConfig::activation_bits asks for one of them.
  virtual int quantized_activation_bits() const { return 0; }
  // Whether upload_quantized takes QuantizedRows::activation_bits = bits (0: the backend's own).
  // The CUDA backend offers both 16 and 8; the CPU backend its own 8 only.
  virtual bool offers_activation_bits(int bits) const { return bits == 0 || bits == quantized_activation_bits(); }
  // Quantized weights (where supports(format, WeightOp::Matmul)). Bytes of backend memory a
  // quantized matrix takes in this backend's layout.
  size_t quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const;
  // Packs `src` into `dst` (quantized_bytes(...) of backend memory) and returns the matrix over it.
  Matrix upload_quantized(const QuantizedRows& src, void* dst);

  // y[m, N] = x[m, K] . W^T (+ bias[N]); W is [N, K]. Quantized W: the backend's kernels may
  // quantize x too (the CPU backend: to int8 per row, in blocks; the CUDA backend rounds x and
  // the dequantized weights to bf16; docs/quantization.md).
  void matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias = nullptr);
  // y[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), rows of length n; y may alias x.
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);
  // In place on x [rows, heads, D]: per-head RMSNorm with w[D], then NeoX rotate-half RoPE at
  // positions[row] (backend memory) with base theta.
  void head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                      const int64_t* positions, double theta);
  void attention(const AttentionParams& p);
  void dyn_conv(const ConvParams& p);
  // out[i] = silu(gate[i]) * up[i]
  void silu_mul(const float* gate, const float* up, float* out, int64_t n);
  // h[r] += x[r], then y[r] = w * h[r] / sqrt(mean(h[r]^2) + eps): a residual add and the norm that
  // follows it as one op, the same arithmetic as the add then rms_norm(h, w, y).
  void add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);
  // dst[r] = src[index[r]] for r < rows, rows of row_len floats; index [rows] in backend memory
  // (so a captured graph reads each draft's table). src and dst must not overlap.
  void gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst);
  // Writes rows src[j] (row_len floats) to ring slot (first_pos + j) % capacity of dst.
  void store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity, int64_t first_pos);
  // Whether attention reads context rings of `dtype` on this backend (every backend: F32).
  virtual bool holds_context(DType dtype) const { return dtype == DType::F32; }
  // store_rows into a ring of `dtype` rows (where holds_context(dtype); BF16 rounds to nearest even).
  void store_context_rows(DType dtype, const float* src, int64_t rows, int64_t row_len, void* dst, int64_t capacity,
                          int64_t first_pos);

  // Every logit of the slice: logits [m, valid_rows]. A quantized head (where
  // supports(format, WeightOp::Head)) runs through matmul's kernels: its logits are those of
  // matmul on the same weights.
  void head_logits(const HeadParams& p, float* logits);
  // The k best logits of each row over the slice's valid rows, ordered by value descending then
  // id ascending; ids are slice row + id_base. Exact: equal to sorting head_logits' output.
  void head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids);

  // Capture: the compute ops issued between begin_capture() and end_capture() are recorded, not
  // run; replay() runs the recording, as often as wanted. Arguments are fixed at capture (shapes,
  // scalars, pointers); the memory they point to is read when the graph runs. Between the two
  // calls only compute ops may be issued: no alloc, copies or sync (release is put off until the
  // capture ends, so buffers may still die on an error path). abort_capture()
  // ends a capture that went wrong and drops what it recorded; it is harmless when none runs.
  virtual void begin_capture() = 0;
  virtual std::unique_ptr<OpGraph> end_capture() = 0;
  virtual void abort_capture() noexcept = 0;
  virtual void replay(const OpGraph& graph) = 0;

 protected:
  // The work of the public op of the same name, on arguments already checked. The defaults:
  // widen_to_f32 on host memory; a backend with quantized or non-f32 context kernels overrides
  // the rest (supports, holds_context say which).
  virtual void do_widen_to_f32(DType dtype, const void* src, float* dst, int64_t n);
  virtual size_t do_quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const;
  virtual Matrix do_upload_quantized(const QuantizedRows& src, void* dst);
  // A ring of a dtype other than F32 (store_context_rows hands F32 to do_store_rows).
  virtual void do_store_context_rows(DType dtype, const float* src, int64_t rows, int64_t row_len, void* dst,
                                     int64_t capacity, int64_t first_pos);
  TPDRAFT_OPS_DO_FUNCTIONS(= 0)

  // The session tables of attention (anchors and context views): checked by backends that can
  // read them on the host when the op runs.
  static void check_attention_views(const AttentionParams& p);
};

// The CPU backend with `threads` worker threads (0: all cores).
std::unique_ptr<Ops> make_cpu_ops(int threads);

}  // namespace tpdraft::kernels
