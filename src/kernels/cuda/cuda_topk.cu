// Exact top-k over rows of logits, in passes, without sorting what cannot win. Each (value, id)
// becomes one 64-bit key whose integer order is the wanted order (kernels/cuda/topk_keys.h); a
// NaN logit becomes the padding key 0 and never wins, as in the CPU twin.
//
// A pass gives each block a chunk of 4096 keys of a row and keeps the chunk's k best: for k = 1
// the largest key (a max reduction), for k > 1 the k largest, unordered, found by selecting the
// k-th largest key digit by digit (eight byte-wide histograms in shared memory) and keeping the
// keys at or above it. Passes repeat until one chunk holds a row's survivors; the last step takes
// the largest (k = 1) or sorts the survivors (bitonic, in shared memory). Values are read back
// from the logits by id, so they equal them bit for bit.
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/topk_keys.h"

namespace tpdraft::kernels::cuda {
namespace {

constexpr int kSortKeys = 4096;  // keys per chunk; 32 KiB in shared memory for the final sort
constexpr int kSortThreads = 1024;
constexpr int kPassThreads = 512;
constexpr int kKeysPerThread = kSortKeys / kPassThreads;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int sort_width(int64_t n) {
  int w = 32;
  while (w < n && w < kSortKeys) w *= 2;
  return w;
}

// Key idx of a row: from its logits (the id is the index) or from a previous pass; 0 past count.
__device__ __forceinline__ uint64_t row_key(const float* lrow, const uint64_t* krow, int64_t idx, int64_t count) {
  if (idx >= count) return 0;
  return lrow != nullptr ? topk_key(lrow[idx], static_cast<uint32_t>(idx)) : krow[idx];
}

__device__ __forceinline__ uint64_t warp_max_key(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// The largest of the block's keys (every thread's `v`), which every thread gets.
__device__ uint64_t block_max_key(uint64_t v) {
  __shared__ uint64_t best[32];
  v = warp_max_key(v);
  if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x + 31) >> 5;
  v = static_cast<int>(threadIdx.x & 31) < warps ? best[threadIdx.x & 31] : 0;
  v = warp_max_key(v);
  __syncthreads();  // best[] may be reused
  return v;
}

// grid (chunks, m): chunk c of row r keeps its best key at out[r * out_stride + c] (k = 1).
// logits != nullptr: the row is logits[r * count ...]; else keys in[r * in_stride ...].
__global__ void argmax_pass_kernel(const float* logits, const uint64_t* in, int64_t in_stride, int64_t count,
                                   uint64_t* out, int64_t out_stride) {
  const int64_t row = blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kSortKeys;
  const float* lrow = logits != nullptr ? logits + row * count : nullptr;
  const uint64_t* krow = logits != nullptr ? nullptr : in + row * in_stride;
  uint64_t best = 0;
  for (int i = threadIdx.x; i < kSortKeys; i += blockDim.x) {
    const uint64_t key = row_key(lrow, krow, first + i, count);
    best = key > best ? key : best;
  }
  best = block_max_key(best);
  if (threadIdx.x == 0) out[row * out_stride + blockIdx.x] = best;
}

// grid (chunks, m): chunk c of row r keeps its k largest keys, in no order, at
// out[r * out_stride + c * k ...] (0 where the chunk has fewer than k real keys).
__global__ void __launch_bounds__(kPassThreads) select_pass_kernel(const float* logits, const uint64_t* in,
                                                                   int64_t in_stride, int64_t count, int k,
                                                                   uint64_t* out, int64_t out_stride) {
  __shared__ uint32_t hist[kTopkBins];
  __shared__ uint64_t chosen;
  __shared__ uint32_t chosen_need;
  __shared__ int kept;
  const int64_t row = blockIdx.y, first = static_cast<int64_t>(blockIdx.x) * kSortKeys;
  const float* lrow = logits != nullptr ? logits + row * count : nullptr;
  const uint64_t* krow = logits != nullptr ? nullptr : in + row * in_stride;
  const int lane = threadIdx.x & 31;
  uint64_t keys[kKeysPerThread];
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) keys[j] = row_key(lrow, krow, first + j * kPassThreads + threadIdx.x, count);

  uint64_t prefix = 0, mask = 0;
  uint32_t need = static_cast<uint32_t>(k);
  for (int shift = 64 - kTopkDigitBits; shift >= 0; shift -= kTopkDigitBits) {
    for (int i = threadIdx.x; i < kTopkBins; i += kPassThreads) hist[i] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      // Lanes with the same bin add once (most keys share the leading bytes).
      const bool match = (keys[j] & mask) == prefix;
      const int bin = match ? static_cast<int>((keys[j] >> shift) & (kTopkBins - 1)) : kTopkBins;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (match && (__ffs(peers) - 1) == lane) atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins [248 - 8 l, 256 - 8 l): the counts above each lane's bins by a scan.
      constexpr int kPer = kTopkBins / 32;
      const int lo = kTopkBins - kPer * (lane + 1);
      uint32_t sum = 0;
      for (int d = lo; d < lo + kPer; ++d) sum += hist[d];
      uint32_t incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      const uint32_t above = incl - sum;
      if (above < need && incl >= need) {  // exactly one lane
        const DigitPick p = topk_pick_digit(hist, lo, lo + kPer, above, need);
        chosen = prefix | (static_cast<uint64_t>(p.digit) << shift);
        chosen_need = p.need;
      }
    }
    __syncthreads();
    prefix = chosen;
    need = chosen_need;
    mask |= static_cast<uint64_t>(kTopkBins - 1) << shift;
  }
  // prefix is the k-th largest key: real keys are distinct, so k - 1 keys lie above it; when it
  // is the padding key, fewer real keys than k lie above and the rest is padding.
  if (threadIdx.x == 0) kept = 0;
  __syncthreads();
  uint64_t* o = out + row * out_stride + static_cast<int64_t>(blockIdx.x) * k;
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j)
    if (keys[j] > prefix) o[atomicAdd(&kept, 1)] = keys[j];
  __syncthreads();
  for (int i = kept + static_cast<int>(threadIdx.x); i < k; i += kPassThreads) o[i] = prefix;
}

// Sorts `width` keys of shared memory descending.
__device__ void bitonic_sort(uint64_t* keys, int width) {
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

// The row's place i from its key: the value read back from the logits, or -inf / -1 for padding.
__device__ __forceinline__ void write_place(const float* lrow, uint64_t key, int64_t id_base, float* value,
                                            int64_t* id) {
  if (key == 0) {
    *value = -INFINITY;
    *id = -1;
  } else {
    const uint32_t i = topk_key_id(key);
    *value = lrow[i];
    *id = static_cast<int64_t>(i) + id_base;
  }
}

// grid (m): the row's survivors (<= kSortKeys) sorted; the first k become values and ids.
__global__ void topk_final_kernel(const float* logits, int64_t n, const uint64_t* in, int64_t in_stride,
                                  int64_t count, int width, int k, int64_t id_base, float* values, int64_t* ids) {
  __shared__ uint64_t keys[kSortKeys];
  const int64_t row = blockIdx.x;
  const float* lrow = logits + row * n;
  const uint64_t* krow = in == nullptr ? nullptr : in + row * in_stride;
  for (int i = threadIdx.x; i < width; i += blockDim.x) keys[i] = row_key(in == nullptr ? lrow : nullptr, krow, i, count);
  __syncthreads();
  bitonic_sort(keys, width);
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    write_place(lrow, i < width ? keys[i] : 0, id_base, values + row * k + i, ids + row * k + i);
}

// grid (m): the largest of the row's survivors (k = 1).
__global__ void argmax_final_kernel(const float* logits, int64_t n, const uint64_t* in, int64_t in_stride,
                                    int64_t count, int64_t id_base, float* values, int64_t* ids) {
  const int64_t row = blockIdx.x;
  const float* lrow = logits + row * n;
  const uint64_t* krow = in == nullptr ? nullptr : in + row * in_stride;
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const uint64_t key = row_key(in == nullptr ? lrow : nullptr, krow, i, count);
    best = key > best ? key : best;
  }
  best = block_max_key(best);
  if (threadIdx.x == 0) write_place(lrow, best, id_base, values + row, ids + row);
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
    const float* src = in == nullptr ? logits : nullptr;
    if (k == 1)
      argmax_pass_kernel<<<grid, kPassThreads, 0, stream>>>(src, in, in_stride, count, out, chunks);
    else
      select_pass_kernel<<<grid, kPassThreads, 0, stream>>>(src, in, in_stride, count, k, out, chunks * k);
    TPDRAFT_CHECK_LAUNCH(k == 1 ? "head_topk (argmax pass)" : "head_topk (select pass)");
    in = out;
    in_stride = chunks * k;
    count = chunks * k;
    next ^= 1;
  }
  if (k == 1)
    argmax_final_kernel<<<static_cast<unsigned>(m), kSortThreads, 0, stream>>>(logits, n, in, in_stride, count,
                                                                               id_base, values, ids);
  else
    topk_final_kernel<<<static_cast<unsigned>(m), kSortThreads, 0, stream>>>(
        logits, n, in, in_stride, count, sort_width(count), k, id_base, values, ids);
  TPDRAFT_CHECK_LAUNCH(k == 1 ? "head_topk (argmax)" : "head_topk (final sort)");
}

}  // namespace tpdraft::kernels::cuda
