// The kernel launchers of the CUDA backend, one family per .cu file. Every pointer is device
// memory; every launcher enqueues on `stream`, returns at once and checks the launch by name.
// CudaOps (cuda_ops.h) checks the backend's own limits (Ops the rest) and stages host-side parameters first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/qtile_layout.h"

namespace tpdraft::kernels::cuda {

// ---- cuda_elementwise.cu ----------------------------------------------------------------------
void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// dst [n] f32 = src [n] of 16-bit floats: bf16 (bf16 true) or IEEE f16.
void launch_widen_to_f32(const void* src, bool bf16, float* dst, int64_t n, cudaStream_t stream);
// dst[r] = src[index[r]], rows of row_len floats; index on the device.
void launch_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst,
                        cudaStream_t stream);

// ---- cuda_norm_rope.cu ------------------------------------------------------------------------
// h += add where add is not null (h is then only read), then y = rms_norm(h).
void launch_rms_norm(float* h, const float* add, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream);
// positions [rows] and inv_freq [head_dim / 2] (theta^(-2i/D), computed in double) on the device.
void launch_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                           const int64_t* positions, const double* inv_freq, cudaStream_t stream);

// ---- cuda_conv.cu -----------------------------------------------------------------------------
void launch_dyn_conv(const ConvParams& p, cudaStream_t stream);

// ---- cuda_gemm.cu: the element-wise stages around the cuBLAS GEMMs ----------------------------
// Activations x [m, cols] f32 -> `parts` stacked copies in the weight dtype (BF16 or F16):
// rows [0, m) = round(x); with parts == 2 also rows [m, 2m) = round(x - round(x)).
void launch_split_activations(const float* x, int64_t m, int64_t cols, DType wtype, int parts, void* out,
                              cudaStream_t stream);
// y[i][n] = sum_{p < parts} part[p * m + i][n] (+ bias[n]); y may alias part 0. parts is 1 or 2
// (what gemm_parts makes); the kernels read no further part.
void launch_sum_parts(const float* parts_buf, int parts, int64_t m, int64_t n, const float* bias, float* y,
                      cudaStream_t stream);
// logits[i][v] = post(scale * sum_p part[p * m + i][v]), post(x) = cap > 0 ? cap * tanh(x / cap) : x.
// parts is 1 or 2, as above.
void launch_head_post(const float* parts_buf, int parts, int64_t m, int64_t n, float scale, float cap,
                      float* logits, cudaStream_t stream);

// ---- cuda_qgemm.cu: weight-only int8 / int4 matmul ---------------------------------------------
// A quantized matrix in device memory, in the tiled layout of kernels/qtile_layout.h.
struct QuantTiles {
  qtile::Layout l;                // W [l.rows, l.cols], a scale per l.group inputs
  const void* tiles = nullptr;     // l.tiles_n * l.tiles_k tiles of 512 bytes
  const float* scales = nullptr;   // [l.groups][l.rows_padded]
};
// How the tensor-core kernel splits K over the grid (qtile::split_k); splits > 1 needs
// splits * m * n floats of partial sums.
using QTcPlan = qtile::Split;
// Tensor cores, for 1 <= m <= kQgemmTcMaxRows: y[i][n] = sum_k x[i][k] * w[n][k] (+ bias[n]),
// x and the dequantized weights rounded to bf16, f32 sums.
constexpr int64_t kQgemmTcMaxRows = 64;
void launch_qgemm_tc(const QuantTiles& w, const QTcPlan& plan, const float* x, int64_t m, float* y,
                     const float* bias, float* partials, cudaStream_t stream);
// Blocks of the tensor-core kernel for `bits`, m rows and uniform steps (qtile::step_uniform) one
// multiprocessor holds, from cudaOccupancyMaxActiveBlocksPerMultiprocessor.
int qgemm_tc_blocks_per_sm(int bits, int64_t m, bool uniform);
// out [rows, k] bf16 = rows [n0, n0 + rows) of the dequantized matrix (q * scale rounded to bf16).
void launch_qdequant(const QuantTiles& w, int64_t n0, int64_t rows, void* out, cudaStream_t stream);

// y [m, n] = the sum of partial sums [splits, m, n] in split order (+ bias[n]).
void launch_sum_splits(const float* partials, int splits, int64_t m, int64_t n, const float* bias, float* y,
                       cudaStream_t stream);

// ---- cuda_qgemm_a8.cu: int8 activations (W8A8 / W4A8) ------------------------------------------
// Rows of x [m, cols] to int8 in activation blocks of kb inputs (kernels/int8_activations.h):
// xq [m rounded up to 16, qtile::a8_row_bytes(cols)] in the tiles' input order (qtile::a8_pos),
// xs [m rounded up to 16, ceil(cols / kb)] the blocks' scales; the padding written as zeros.
void launch_quantize_a8(const float* x, int64_t m, int64_t cols, int64_t kb, int8_t* xq, float* xs,
                        cudaStream_t stream);
// y[i][n] = sum over blocks of the exact int32 block sums times weight scale x activation scale
// (+ bias[n]), for any m >= 1 (64 rows per launch, one plan for all); where plan.splits > 1,
// partials holds plan.splits * min(m, 64) * n floats. Needs qtile::a8_blocks_fit(kb, cols).
void launch_qgemm_a8(const QuantTiles& w, const QTcPlan& plan, int64_t kb, const int8_t* xq, const float* xs,
                     int64_t m, float* y, const float* bias, float* partials, cudaStream_t stream);
// Blocks of the int8-activation kernel for `bits` one multiprocessor holds, asked of its 16-row
// instantiation for every row count (the plan must not depend on the rows): a draft's 16 rows
// fill the device in one wave, more rows take more waves (sm_90: 80 to 120 registers a thread
// at 16 rows, 212 to 228 at 64).
int qgemm_a8_blocks_per_sm(int bits);

// ---- cuda_topk.cu -----------------------------------------------------------------------------
// Per row of logits [m, n]: the k best (value desc, id asc), values copied bit for bit from
// logits, ids + id_base; NaN logits never win; -inf / -1 past the last candidate. keys_a / keys_b hold
// topk_key_capacity(m, n, k) keys each. k <= kMaxTopK.
constexpr int kMaxTopK = 2048;
int64_t topk_key_capacity(int64_t m, int64_t n, int k);
void launch_topk(const float* logits, int64_t m, int64_t n, int k, int64_t id_base, uint64_t* keys_a,
                 uint64_t* keys_b, float* values, int64_t* ids, cudaStream_t stream);

// ---- cuda_attention.cu ------------------------------------------------------------------------
// The session tables stay in device memory and are read by the kernels: the context positions a
// session's rows may see, [lo, lo + count), are cut into `splits` equal chunks (at least 64
// positions each, so short contexts leave the later chunks empty); slot `splits` is the block's
// own keys. The grid depends only on the shapes and `splits`, so a captured launch stays right
// as contexts grow.
struct AttnArgs {
  AttentionParams p;  // as the op got it: the tables (context, anchor) are device memory
  float* part_acc = nullptr;  // [S, n_q, B, splits + 1, D] unnormalised weighted V per chunk
  float* part_ml = nullptr;   // [S, n_q, B, splits + 1, 2] running max and denominator per chunk
  int64_t splits = 1;  // context chunks per session
};

constexpr int kAttnMaxHeadDim = 256;
// The partial kernels: `simt` on f32 CUDA cores, 16 query rows per block, any head dim (the
// fallback); `mma` on tensor cores (bf16 q, k, p, v; f32 sums), the 64 query rows of up to four
// q heads per block, so a kv head's tiles are read once for all its q heads (head dim 64 or 128).
enum class AttnKernel { simt, mma };
constexpr int kAttnRowsPerBlock = 16;
constexpr int kAttnMmaRowsPerBlock = 64;
bool attention_mma_supports(int64_t head_dim);
inline int attention_rows_per_block(AttnKernel kernel) {
  return kernel == AttnKernel::mma ? kAttnMmaRowsPerBlock : kAttnRowsPerBlock;
}
// Blocks of the partial kernel for head_dim (and the rings' element type) one multiprocessor
// holds, from cudaOccupancyMaxActiveBlocksPerMultiprocessor.
int attention_blocks_per_sm(AttnKernel kernel, int64_t head_dim, bool kv_bf16);
// Grid: (splits + 1, n_kv x ceil(ratio B / rows per block), S) partial blocks, then the merge.
void launch_attention(const AttnArgs& a, AttnKernel kernel, cudaStream_t stream);

}  // namespace tpdraft::kernels::cuda
