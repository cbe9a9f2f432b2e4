#include "kernels/ceilings.h"

#include <cstdio>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "core/timing.h"
#include "kernels/buffer.h"

namespace tpdraft::kernels {
namespace {

// The best rate, `work` / seconds / 1e9, of `reps` runs of f between two syncs of `ops`; the first
// `skip` runs only warm up.
double best_rate(Ops& ops, int reps, int skip, double work, const std::function<void()>& f) {
  ops.sync();
  return work / time_runs(skip, reps - skip, [&](int64_t) {
           f();
           ops.sync();
         }).min() / 1e9;
}

int64_t gemm_rows(const Ops& ops) { return ops.host_memory() ? 256 : 4096; }

// The rate of `mat` ([dim, dim]) times gemm_rows(ops) rows of activations.
double matmul_rate(Ops& ops, const Matrix& mat, int64_t dim) {
  const int64_t m = gemm_rows(ops);
  Buffer x(ops, static_cast<size_t>(m * dim) * 4), y(ops, static_cast<size_t>(m * dim) * 4);
  const std::vector<float> xf(static_cast<size_t>(m * dim), 0.5f);
  ops.to_device(x.get(), xf.data(), xf.size() * 4);
  return best_rate(ops, 5, 0, 2.0 * static_cast<double>(m * dim * dim), [&] { ops.matmul(mat, x.f32(), m, y.f32()); });
}

}  // namespace

double measure_read_gbps(int threads) {
  const size_t n = size_t{1} << 27;  // 512 MiB of floats
  std::vector<float> buf(n, 1.0f);
  ThreadPool pool(threads);
  std::vector<double> sums(static_cast<size_t>(pool.size()), 0.0);
  const SampleSummary s = time_runs(0, 4, [&](int64_t) {
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int w) {
      float acc[16] = {0};
      for (int64_t i = b; i + 16 <= e; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += buf[static_cast<size_t>(i + j)];
      double sum = 0;
      for (float a : acc) sum += a;
      sums[static_cast<size_t>(w)] = sum;
    }, 4096);
  });
  if (sums[0] < 0) std::printf(" ");  // keep the sums alive
  return static_cast<double>(n * sizeof(float)) / s.min() / 1e9;
}

double measure_copy_gbps(Ops& ops) {
  const int64_t n = int64_t{1} << 28;  // floats
  Buffer a(ops, static_cast<size_t>(n) * 4), b(ops, static_cast<size_t>(n) * 4);
  // store_rows of one row is a plain copy.
  return best_rate(ops, 5, 1, 2.0 * static_cast<double>(n) * 4, [&] { ops.store_rows(a.f32(), 1, n, b.f32(), 1, 0); });
}

double measure_gemm_gflops(Ops& ops, DType dtype, int64_t dim) {
  const std::vector<float> wf(static_cast<size_t>(dim * dim), 0.01f);
  std::vector<std::byte> wbytes(wf.size() * dtype_size(dtype));
  convert_from_f32(dtype, wf.data(), wbytes.data(), wf.size());
  Buffer w(ops, wbytes.size());
  ops.to_device(w.get(), wbytes.data(), wbytes.size());
  return matmul_rate(ops, {dtype, dim, dim, w.get()}, dim);
}

double measure_qgemm_gops(Ops& ops, int bits, int64_t dim) {
  const int64_t group = dim % 128 == 0 ? 128 : dim;
  std::vector<int8_t> q(static_cast<size_t>(dim * dim));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i * 7 % 15) - 7);
  const std::vector<float> scales(static_cast<size_t>(dim * (dim / group)), 0.01f);
  Buffer w(ops, ops.quantized_bytes(quantized_format(bits), dim, dim, group));
  return matmul_rate(ops, ops.upload_quantized({bits, dim, dim, group, q.data(), scales.data()}, w.get()), dim);
}

}  // namespace tpdraft::kernels
