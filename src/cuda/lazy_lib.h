// cuBLAS and NCCL are opened on first use (dlopen) instead of at program start: a CPU-only run
// of a CUDA-enabled build then never maps them (they are hundreds of MB and, mapped, count in
// every rank's resident memory), and a machine without them still runs the CPU backend.
// TPDRAFT_LAZY(cublas, cublasCreate)(&handle) calls the library's function through a pointer
// resolved once; the declaration comes from the library's own header, so types are checked.
#pragma once

namespace tpdraft::lazy {

// The opened library (throws tpdraft::Error naming the files tried when it cannot be opened).
void* cublas();
void* nccl();
// The named symbol of `lib` (throws tpdraft::Error naming the symbol when it is missing).
void* symbol(void* lib, const char* name);

}  // namespace tpdraft::lazy

#define TPDRAFT_LAZY_STR2(x) #x
#define TPDRAFT_LAZY_STR(x) TPDRAFT_LAZY_STR2(x)
// Headers map some names to versioned symbols (cublasCreate -> cublasCreate_v2); the two-level
// stringizing resolves the name the library really exports.
#define TPDRAFT_LAZY(lib, fn)                                                                         \
  ([]() {                                                                                             \
    static const auto resolved = reinterpret_cast<decltype(&fn)>(                                     \
        ::tpdraft::lazy::symbol(::tpdraft::lazy::lib(), TPDRAFT_LAZY_STR(fn)));                       \
    return resolved;                                                                                  \
  }())
// The same for an overloaded name: T is the function pointer type of the exported overload.
#define TPDRAFT_LAZY_T(lib, fn, T)                                                                    \
  ([]() {                                                                                             \
    static const auto resolved =                                                                      \
        reinterpret_cast<T>(::tpdraft::lazy::symbol(::tpdraft::lazy::lib(), TPDRAFT_LAZY_STR(fn)));   \
    return resolved;                                                                                  \
  }())
