// Exact top-k over rows of logits, in passes. Each (value, id) becomes one 64-bit key whose
// integer order is the wanted order: value descending (-0 as +0), then id ascending; a NaN logit
// becomes the padding key 0 and never wins, as in the CPU twin. A pass sorts chunks of 4096 keys in shared memory (bitonic, one block per chunk)
// and keeps each chunk's k best; passes repeat until one chunk holds a row's survivors, which a
// last sort orders. Values are read back from the logits by id, so they equal them bit for bit.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kSortKeys = 4096;  // 32 KiB of keys in shared memory
constexpr int kSortThreads = 1024;

// Key 0 is padding: a real key's upper word is at least ord(-inf) = 0x007fffff.
__device__ __forceinline__ uint64_t make_key(float v, uint32_t id) {
  if (isnan(v)) return 0;
  if (v == 0.0f) v = 0.0f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(~id);
}

__device__ __forceinline__ uint32_t key_id(uint64_t key) { return ~static_cast<uint32_t>(key); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int sort_width(int64_t n) {
  int w = 32;
  while (w < n && w < kSortKeys) w *= 2;
  return w;
}

// Loads `width` keys of one row chunk into shared memory (padding beyond the row with 0) and
// sorts them descending. Keys come from logits (source ids = index) or from a previous pass.
__device__ void load_and_sort(uint64_t* keys, int width, const float* logits, const uint64_t* in, int64_t first,
                              int64_t count) {
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const int64_t idx = first + i;
    uint64_t key = 0;
    if (idx < count) key = logits != nullptr ? make_key(logits[idx], static_cast<uint32_t>(idx)) : in[idx];
    keys[i] = key;
  }
  __syncthreads();
  for (int size = 2; size <= width; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < width / 2; t += blockDim.x) {
        const int i = 2 * t - (t & (stride - 1));
        const int l = i + stride;
        const bool descending = (i & size) == 0;
        const uint64_t a = keys[i], b = keys[l];
        if ((a < b) == descending) {
          keys[i] = b;
          keys[l] = a;
        }
      }
      __syncthreads();
    }
  }
}

// grid (chunks, m): chunk c of row r keeps its k best keys at out[r * out_stride + c * k ...].
// logits != nullptr: the row is logits[r * count ...]; else keys in[r * in_stride ...].
__global__ void topk_pass_kernel(const float* logits, const uint64_t* in, int64_t in_stride, int64_t count,
                                 int width, int k, uint64_t* out, int64_t out_stride) {
  __shared__ uint64_t keys[kSortKeys];
  const int64_t row = blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kSortKeys;
  const float* lrow = logits != nullptr ? logits + row * count : nullptr;
  const uint64_t* krow = logits != nullptr ? nullptr : in + row * in_stride;
  load_and_sort(keys, width, lrow, krow, first, count);
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    out[row * out_stride + static_cast<int64_t>(blockIdx.x) * k + i] = i < width ? keys[i] : 0;
}

// grid (m): the row's survivors (<= kSortKeys) sorted; the first k become values and ids.
__global__ void topk_final_kernel(const float* logits, int64_t n, const uint64_t* in, int64_t in_stride,
                                  int64_t count, int width, int k, int64_t id_base, float* values, int64_t* ids) {
  __shared__ uint64_t keys[kSortKeys];
  const int64_t row = blockIdx.x;
  const float* lrow = logits + row * n;
  load_and_sort(keys, width, in == nullptr ? lrow : nullptr, in == nullptr ? nullptr : in + row * in_stride, 0,
                count);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const uint64_t key = i < width ? keys[i] : 0;
    if (key == 0) {
      values[row * k + i] = -INFINITY;
      ids[row * k + i] = -1;
    } else {
      const uint32_t id = key_id(key);
      values[row * k + i] = lrow[id];
      ids[row * k + i] = static_cast<int64_t>(id) + id_base;
    }
  }
}

}  // namespace

int64_t topk_key_capacity(int64_t m, int64_t n, int k) {
  if (n <= kSortKeys) return 1;
  return m * ceil_div(n, kSortKeys) * k;  // the first pass writes the most keys
}

void launch_topk(const float* logits, int64_t m, int64_t n, int k, int64_t id_base, uint64_t* keys_a,
                 uint64_t* keys_b, float* values, int64_t* ids, cudaStream_t stream) {
  if (m <= 0) return;
  // Pass over the logits, then over keys, while a row holds more than one chunk. With
  // k <= kSortKeys / 2 every pass at least halves the survivors.
  const uint64_t* in = nullptr;
  int64_t count = n, in_stride = 0;
  uint64_t* bufs[2] = {keys_a, keys_b};
  int next = 0;
  while (count > kSortKeys) {
    const int64_t chunks = ceil_div(count, kSortKeys);
    uint64_t* out = bufs[next];
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(m));
    topk_pass_kernel<<<grid, kSortThreads, 0, stream>>>(in == nullptr ? logits : nullptr, in, in_stride, count,
                                                        kSortKeys, k, out, chunks * k);
    TPDRAFT_CHECK_LAUNCH("head_topk (chunk pass)");
    in = out;
    in_stride = chunks * k;
    count = chunks * k;
    next ^= 1;
  }
  topk_final_kernel<<<static_cast<unsigned>(m), kSortThreads, 0, stream>>>(
      logits, n, in, in_stride, count, sort_width(count), k, id_base, values, ids);
  TPDRAFT_CHECK_LAUNCH("head_topk (final sort)");
}

}  // namespace tpdraft::kernels::cuda
