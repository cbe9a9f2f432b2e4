// The CPU backend of the ops interface: aligned host memory, a thread pool, and kernels picked at
// run time for the widest instruction set present (AVX-512 + BF16, AVX-512, AVX2 + FMA + F16C,
// portable C++). Every variant computes in f32; they agree to within f32 rounding.
// Also declares the dot-product engine shared by matmul and the head.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"

// Function-level targets: the project is built for the baseline ISA, these kernels for more.
#define TPDRAFT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPDRAFT_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define TPDRAFT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TPDRAFT_TARGET_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#define TPDRAFT_TARGET_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
// A kernel's helpers and per-ISA bodies are always inlined into the kernel that calls them.
#define TPDRAFT_INLINE inline __attribute__((always_inline))

namespace tpdraft::kernels::cpu {

// Kernel families, ordered: a level may use every kernel of the levels below it.
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

const char* isa_name(Isa isa);
Isa detected_isa();  // the best level this processor supports
Isa active_isa();    // the level the kernels use now (detected unless forced)
// Makes the kernels use `isa`, clamped to detected_isa(); returns the level now in effect.
// For tests that compare the variants; not meant to be flipped while ops run.
Isa force_isa(Isa isa);

// Body(args...) compiled for `isa`: Body, a TPDRAFT_INLINE function of plain loops, is inlined
// into a function with the level's target attribute, where the compiler vectorises it for that
// level (AVX-512 levels alike; below AVX2 the baseline build).
template <auto Body, class... A>
TPDRAFT_TARGET_AVX512 void on_avx512(A&&... a) { Body(std::forward<A>(a)...); }
template <auto Body, class... A>
TPDRAFT_TARGET_AVX2 void on_avx2(A&&... a) { Body(std::forward<A>(a)...); }
template <auto Body, class... A>
void on_isa(Isa isa, A&&... a) {
  if (isa >= Isa::Avx512) return on_avx512<Body>(std::forward<A>(a)...);
  if (isa == Isa::Avx2) return on_avx2<Body>(std::forward<A>(a)...);
  Body(std::forward<A>(a)...);
}

// Kernels for quantized weights (cpu_qmatmul.cpp): chosen from the active level, AVX-512 VNNI
// when the processor has it and the level is AVX-512 or above, else AVX-VNNI (vpdpbusd on 256-bit
// registers) when the processor has it and the level is AVX2 or above. AvxVnniEmulated is the
// AVX-VNNI kernel with vpdpbusd done by AVX2 instructions (exactly): never chosen, it lets the
// suite run that kernel's code on a processor without AVX-VNNI (force_quant_kernel).
enum class QuantKernel : int { Scalar = 0, Avx2 = 1, Avx512Vnni = 2, AvxVnni = 3, AvxVnniEmulated = 4 };
QuantKernel quant_kernel(Isa isa);
const char* quant_kernel_name(QuantKernel k);
bool cpu_has_avx_vnni();
// Every quantized matmul uses kernel `k` from now on (tests; the processor must run it), or, with
// -1, the kernel of the active level again. Returns the previous setting (-1: none).
int force_quant_kernel(int k);

namespace detail {

// The CPU layout of a quantized matrix: groups of kQuantRows interleaved rows, each holding nb
// blocks of kp (kb rounded up to 8) packed columns and then nb x kQuantRows f32 scales.
// Activations are quantized in the same blocks of kb columns (activation_block,
// kernels/int8_activations.h).
constexpr int64_t kQuantRows = 16;
struct QuantLayout {
  int bits = 8;
  int64_t rows = 0, cols = 0, group = 0;
  int64_t kb = 0;           // columns per block (never spans two scale groups)
  int64_t nb = 0;           // blocks per row
  int64_t kp = 0;           // kb rounded up to a multiple of 8
  int64_t rgroups = 0;      // row groups
  int64_t block_bytes = 0;  // one block of one row group
  int64_t scale_offset = 0; // of the scales inside a row group
  int64_t rg_bytes = 0;     // one row group, 64-byte aligned
  int64_t total = 0;
};
QuantLayout quant_layout(WeightFormat format, int64_t rows, int64_t cols, int64_t group);
// Rows of x [m, l.cols] to int8, per block: xq [m, nb * kp] (zero padded), scale xs [m, nb]
// (amax / 127; x ~ xq * xs) and the sum of the block's int8 values xsum [m, nb].
void quantize_activations(const QuantLayout& l, const float* x, int64_t m, int8_t* xq, float* xs, int32_t* xsum);

// Rows of a matrix in storage dtype: row r starts at data + r * stride elements; rows hold `cols`.
struct WeightRows {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t stride = 0;
  int64_t cols = 0;
};

// Activation rows are repacked once per call into the layout the dot kernels of `isa` read for
// weights of `wtype`: zero padded to packed_cols(cols), and for BF16 weights each 2L-element chunk
// stored as [L even elements][L odd elements] (L = SIMD lanes), so that a bf16 weight vector widens
// with one shift (even) or one mask (odd) instead of a lane-crossing unpack.
int64_t packed_cols(int64_t cols);
void pack_rows(Isa isa, DType wtype, const float* x, int64_t x_stride, int64_t m, int64_t cols, float* packed);

// out[i * out_stride + j] = dot(w row (row0 + j), x row i) for i < m, j < nrows, in f32 arithmetic
// on the f32-widened weights. `packed` holds m rows of packed_cols(w.cols) from pack_rows. Runs on
// the calling thread. For a given isa, the arithmetic of one (row, x) pair does not depend on m,
// nrows or where the pair sits in the tile: any two calls give bit-identical dots for a pair.
void exact_dots(Isa isa, const WeightRows& w, int64_t row0, int64_t nrows, const float* packed, int64_t m, float* out,
                int64_t out_stride);

// x[i] = exp(x[i] - shift) for i < n; returns the f32 sum of the results.
float exp_shifted_sum(Isa isa, float* x, int64_t n, float shift);

}  // namespace detail

// A grow-only, 64-byte aligned buffer (SIMD loads then never straddle cache lines). Growing
// discards the contents: it holds per-call scratch only.
template <typename T>
class Scratch {
 public:
  T* get(size_t n) {
    if (n > capacity_) {
      const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
      data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      TPDRAFT_CHECK(data_ != nullptr, "cpu backend: cannot allocate {} bytes of scratch", bytes);
      capacity_ = bytes / sizeof(T);
    }
    return data_.get();
  }
  T* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t capacity_ = 0;
};

// A capture: the calls recorded between begin_capture and end_capture, in order.
struct CpuGraph final : OpGraph {
  std::vector<std::function<void()>> calls;
  size_t nodes() const override { return calls.size(); }
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads);
  ~CpuOps() override;
  const char* name() const override { return "cpu"; }
  bool host_memory() const override { return true; }

  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void sync() override;

  bool supports(WeightFormat, WeightOp) const override { return true; }
  int quantized_activation_bits() const override { return 8; }
  bool holds_context(DType dtype) const override { return dtype == DType::F32 || dtype == DType::BF16; }

  void begin_capture() override;
  std::unique_ptr<OpGraph> end_capture() override;
  void abort_capture() noexcept override;
  void replay(const OpGraph& graph) override;

 protected:
  size_t do_quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const override;
  Matrix do_upload_quantized(const QuantizedRows& src, void* dst) override;
  TPDRAFT_OPS_DO_FUNCTIONS(override)
  void do_store_context_rows(DType dtype, const float* src, int64_t rows, int64_t row_len, void* dst,
                             int64_t capacity, int64_t first_pos) override;

 private:
  // While a capture runs: appends the call (the op's do_* and a copy of its arguments) to the
  // tape and returns true, so the op returns without running; its argument checks have run
  // already, as a CUDA op's host checks run when it is captured. Otherwise returns false.
  template <typename... Params, typename... Args>
  bool recording(void (CpuOps::*op)(Params...), Args&&... args) {
    if (!tape_) return false;
    tape_->calls.push_back([this, op, saved = std::make_tuple(std::decay_t<Params>(std::forward<Args>(args))...)]() {
      std::apply([this, op](const auto&... a) { (this->*op)(a...); }, saved);
    });
    return true;
  }
  // Memory and copies are not ops a graph may hold (as on the CUDA backend).
  void check_not_capturing(const char* what) const;
  void qmatmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias);

  // L2 norms of the rows of a bf16 head matrix, computed once per (data, rows, cols) and cached.
  const std::vector<float>& head_row_norms(const Matrix& head);
  // head_topk's two passes: every valid row against a running per-row threshold, then the
  // surviving candidates recomputed exactly and sorted.
  // `qdots`: a quantized head's dots [m, head.rows] (quantized_head_dots), read instead of computed.
  void head_scan(const HeadParams& p, int k, bool screen, const float* norms, const float* qdots);
  void head_finish(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids, const float* qdots);
  // A quantized head's raw dots of every row, by the matmul kernels: [m, head.rows] in qhead_.
  const float* quantized_head_dots(const HeadParams& p);

  // Head top-k scan state of one output row: the k largest lower bounds seen (a min-heap), the
  // raw value below which a vocabulary row can no longer reach the k-th logit, the candidates.
  struct Candidate {
    int64_t row;
    float upper;
  };
  struct RowScan {
    std::vector<float> best;
    float cutoff = 0.0f;
    std::vector<Candidate> candidates;
  };
  struct Pick {
    float value;
    int64_t row;
  };
  // Scratch owned by one pool worker (index = the worker argument of parallel_for).
  struct Worker {
    Scratch<float> buf;
    std::vector<RowScan> scans;  // [m]
    std::vector<float> lower;    // merge space
    std::vector<Pick> picks;
  };

  void free_deferred() noexcept;  // frees what was released during the capture

  ThreadPool pool_;
  std::vector<Worker> workers_;
  std::unique_ptr<CpuGraph> tape_;  // the capture in progress, if any
  std::vector<void*> deferred_free_;  // released during the capture
  // Scratch is grown on demand and kept: a draft issues the same shapes every step, so after the
  // first step no op allocates. An instance serves one calling thread at a time.
  Scratch<float> packed_;           // packed activation rows
  Scratch<uint16_t> packed_bf16_;   // head input rows rounded to bf16
  Scratch<int8_t> qx_;              // quantized activation rows (quantized weights)
  Scratch<float> qscale_;           // their block scales
  Scratch<int32_t> qsum_;           // their block sums
  Scratch<float> qhead_;            // a quantized head's dots
  std::vector<int64_t> attn_items_;  // attention's work items: (session, kv head, chunk begin, end)
  std::vector<int64_t> attn_first_;  // [pairs + 1]: each (session, kv head)'s first item
  Scratch<float> attn_state_;        // each item's softmax state (max, sum, output rows)
  std::vector<float> bound_scale_;  // per head input row: bound = norm(w) * scale + slack
  std::vector<float> bound_slack_;
  std::vector<double> rope_inv_freq_;  // theta^(-2i/D), kept while theta and D repeat
  double rope_theta_ = 0.0;

  // Row norms per head matrix, keyed by (data, rows, cols) and checked against a fingerprint of
  // sampled elements, so a different matrix later placed at the same address is not mistaken.
  struct RowNorms {
    uint64_t fingerprint = 0;
    std::vector<float> norms;
  };
  std::mutex norms_mutex_;
  std::map<std::tuple<const void*, int64_t, int64_t>, RowNorms> norms_;
};

}  // namespace tpdraft::kernels::cpu
