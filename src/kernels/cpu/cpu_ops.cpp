// CpuOps construction, host memory and the run-time choice of kernel family.
// The ops themselves live one family per file (cpu_matmul.cpp, cpu_attention.cpp, ...).
#include "kernels/cpu/cpu_ops.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

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

// TPDRAFT_CPU_ISA=scalar|avx2|avx512|avx512-bf16 caps the level (benchmarks of what a smaller
// processor would run); unset: the detected level. An unknown name is an error.
int initial_level() {
  const int detected = static_cast<int>(detected_isa());
  const char* env = std::getenv("TPDRAFT_CPU_ISA");
  if (env == nullptr || *env == '\0') return detected;
  for (int i = 0; i <= static_cast<int>(Isa::Avx512Bf16); ++i)
    if (std::string(env) == isa_name(static_cast<Isa>(i))) return std::min(i, detected);
  TPDRAFT_FAIL("TPDRAFT_CPU_ISA is '{}': expected scalar, avx2, avx512 or avx512-bf16", env);
}

std::atomic<int>& active_level() {
  static std::atomic<int> level{initial_level()};
  return level;
}

}  // namespace

const char* isa_name(Isa isa) {
  static constexpr const char* kNames[] = {"scalar", "avx2", "avx512", "avx512-bf16"};
  const auto i = static_cast<size_t>(isa);
  return i < std::size(kNames) ? kNames[i] : "?";
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

CpuOps::~CpuOps() { free_deferred(); }

void* CpuOps::alloc(size_t bytes) {
  check_not_capturing("alloc");
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

void CpuOps::release(void* p) {
  // Buffers may die while a capture unwinds from an error: their memory goes when it ends.
  if (tape_) {
    deferred_free_.push_back(p);
    return;
  }
  std::free(p);
}

void CpuOps::to_device(void* dst, const void* src, size_t bytes) {
  check_not_capturing("to_device");
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuOps::to_host(void* dst, const void* src, size_t bytes) {
  check_not_capturing("to_host");
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuOps::sync() { check_not_capturing("sync"); }

// ---- capture: a tape of calls -------------------------------------------------------------------

void CpuOps::check_not_capturing(const char* what) const {
  TPDRAFT_CHECK(!tape_, "cpu backend: {} during a capture (only compute ops may be captured)", what);
}

void CpuOps::begin_capture() {
  TPDRAFT_CHECK(!tape_, "cpu backend: a capture is already running");
  tape_ = std::make_unique<CpuGraph>();
}

std::unique_ptr<OpGraph> CpuOps::end_capture() {
  TPDRAFT_CHECK(tape_, "cpu backend: end_capture without begin_capture");
  std::unique_ptr<OpGraph> graph = std::move(tape_);
  free_deferred();
  return graph;
}

void CpuOps::abort_capture() noexcept {
  tape_.reset();
  free_deferred();
}

void CpuOps::free_deferred() noexcept {
  for (void* p : deferred_free_) std::free(p);
  deferred_free_.clear();
}

void CpuOps::replay(const OpGraph& graph) {
  check_not_capturing("replay");
  const auto* g = dynamic_cast<const CpuGraph*>(&graph);
  TPDRAFT_CHECK(g != nullptr, "cpu backend: replay of a graph captured by another backend");
  for (const auto& call : g->calls) call();
}

}  // namespace tpdraft::kernels::cpu

namespace tpdraft::kernels {

std::unique_ptr<Ops> make_cpu_ops(int threads) {
  TPDRAFT_CHECK(threads >= 0, "cpu backend: thread count must be >= 0 (0: all cores), got {}", threads);
  return std::make_unique<cpu::CpuOps>(threads);
}

}  // namespace tpdraft::kernels
