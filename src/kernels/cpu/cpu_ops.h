// The CPU backend of the ops interface: 64-byte aligned host memory, a thread pool, and kernels
// picked at run time for the widest instruction set present (AVX-512 + BF16, AVX-512, AVX2 + FMA +
// F16C, portable C++). Every variant computes in f32; they agree to within f32 rounding.
// Also declares the dot-product engine shared by matmul, attention and the head.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"

// Function-level targets: the project is built for the baseline ISA, these kernels for more.
#define TPDRAFT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TPDRAFT_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define TPDRAFT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tpdraft::kernels::cpu {

// Kernel families, ordered: a level may use every kernel of the levels below it.
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

const char* isa_name(Isa isa);
Isa detected_isa();  // the best level this processor supports
Isa active_isa();    // the level the kernels use now (detected unless forced)
// Makes the kernels use `isa`, clamped to detected_isa(); returns the level now in effect.
// For tests that compare the variants; not meant to be flipped while ops run.
Isa force_isa(Isa isa);

namespace detail {

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
// the calling thread. The arithmetic of one (row, x) pair does not depend on m, nrows or where
// the pair sits in the tile, so any two calls give bit-identical dots for the same pair.
void exact_dots(Isa isa, const WeightRows& w, int64_t row0, int64_t nrows, const float* packed, int64_t m,
                float* out, int64_t out_stride);

// x[i] = exp(x[i] - shift) for i < n; returns the f32 sum of the results.
float exp_shifted_sum(Isa isa, float* x, int64_t n, float shift);
// y[d] += a * x[d] for d < n.
void axpy(Isa isa, float a, const float* x, float* y, int64_t n);

}  // namespace detail

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads);
  ~CpuOps() override;
  const char* name() const override { return "cpu"; }

  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void sync() override {}

  void matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) override;
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override;
  void head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                      const int64_t* positions, double theta) override;
  void attention(const AttentionParams& p) override;
  void dyn_conv(const ConvParams& p) override;
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override;
  void add(float* y, const float* x, int64_t n) override;
  void store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,
                  int64_t first_pos) override;
  void head_logits(const HeadParams& p, float* logits) override;
  void head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids) override;

  ThreadPool& pool() { return pool_; }

 private:
  // Per-call scratch, grown on demand and kept: a draft issues the same shapes every step, so
  // after the first step no op allocates. An instance serves one calling thread at a time.
  float* scratch(std::vector<float>& buf, size_t n);
  // L2 norms of the rows of a head matrix, computed once per (data, rows, cols) and cached.
  const std::vector<float>& head_row_norms(const Matrix& head);
  void head_screen_bf16(const HeadParams& p, int k);
  void head_scan_exact(const HeadParams& p, int k);
  void head_finish(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids);

  ThreadPool pool_;
  std::vector<float> packed_;                   // packed activation rows
  std::vector<std::vector<float>> per_worker_;  // one scratch buffer per pool worker
  std::vector<uint16_t> packed_bf16_;           // head rows rounded to bf16
  std::vector<double> rope_inv_freq_;           // theta^(-2i/D), kept while theta and D repeat
  double rope_theta_ = 0.0;

  // Head top-k state: per worker and output row, the k best lower bounds seen and the candidates.
  struct Candidate {
    int64_t row;
    float upper;
  };
  struct RowScan {
    std::vector<float> best;  // min-heap of the k largest lower bounds
    float cutoff = 0.0f;      // raw value below which a row cannot reach the current k-th logit
    std::vector<Candidate> candidates;
  };
  std::vector<std::vector<RowScan>> scans_;  // [worker][m]
  std::vector<float> bound_scale_;           // per output row: bound = norm(w) * scale + slack
  std::vector<float> bound_slack_;

  std::mutex norms_mutex_;
  std::map<std::tuple<const void*, int64_t, int64_t>, std::vector<float>> norms_;
};

}  // namespace tpdraft::kernels::cpu
