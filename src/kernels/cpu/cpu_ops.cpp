// CpuOps construction, host memory and the run-time choice of kernel family.
// The ops themselves live one family per file (cpu_matmul.cpp, cpu_attention.cpp, ...).
#include "kernels/cpu/cpu_ops.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tpdraft::kernels::cpu {

namespace {

Isa probe_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  if (avx512) return __builtin_cpu_supports("avx512bf16") ? Isa::Avx512Bf16 : Isa::Avx512;
  // F16C has no __builtin_cpu_supports name in every compiler; every AVX2 + FMA x86 part has it.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
  return Isa::Scalar;
}

std::atomic<int>& active_level() {
  static std::atomic<int> level{static_cast<int>(detected_isa())};
  return level;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Bf16:
      return "avx512-bf16";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa isa = probe_isa();
  return isa;
}

Isa active_isa() { return static_cast<Isa>(active_level().load(std::memory_order_relaxed)); }

Isa force_isa(Isa isa) {
  const int level = std::min(static_cast<int>(isa), static_cast<int>(detected_isa()));
  active_level().store(level, std::memory_order_relaxed);
  return static_cast<Isa>(level);
}

CpuOps::CpuOps(int threads) : pool_(threads) { workers_.resize(static_cast<size_t>(pool_.size())); }

CpuOps::~CpuOps() = default;

void* CpuOps::alloc(size_t bytes) {
  // 64 bytes: one cache line and one AVX-512 vector. Large buffers (weights) are 2 MiB aligned
  // and asked for transparent huge pages: kernels stream 4 KiB weight rows, and without huge
  // pages every row is a new page for the TLB and the prefetchers (the bf16 head scan runs ~7%
  // faster). The rounding wastes under 2 MiB per buffer, on buffers of 4 MiB or more.
  const size_t huge = size_t{2} << 20;
  const bool big = bytes >= 2 * huge;
  const size_t align = big ? huge : 64;
  const size_t rounded = std::max((bytes + align - 1) / align * align, align);
  void* p = std::aligned_alloc(align, rounded);
  TPDRAFT_CHECK(p != nullptr, "cpu backend: cannot allocate {} bytes of host memory", bytes);
#if defined(MADV_HUGEPAGE)
  if (big) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return p;
}

void CpuOps::release(void* p) { std::free(p); }

void CpuOps::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuOps::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

}  // namespace tpdraft::kernels::cpu

namespace tpdraft::kernels {

std::unique_ptr<Ops> make_cpu_ops(int threads) {
  TPDRAFT_CHECK(threads >= 0, "cpu backend: thread count must be >= 0 (0: all cores), got {}", threads);
  return std::make_unique<cpu::CpuOps>(threads);
}

}  // namespace tpdraft::kernels
