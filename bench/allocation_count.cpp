// The process's operator new, replaced to count allocations: step_overhead reports how many each
// path makes per step (libtpdraft.so's allocations bind to this operator too). In a file of its
// own, where no call site can inline it against a mismatched delete.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace {
std::atomic<uint64_t> g_allocations{0};
}

uint64_t allocations_so_far() { return g_allocations.load(std::memory_order_relaxed); }

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
