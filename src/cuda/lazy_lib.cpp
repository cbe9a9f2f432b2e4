// dlopen / dlsym behind TPDRAFT_LAZY: the library file found at configure time first, then its
// soname on the loader's path.
#include "cuda/lazy_lib.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace tpdraft::lazy {

namespace {

void* open_first(const char* what, const std::vector<std::string>& names) {
  std::string tried;
  for (const std::string& n : names) {
    if (n.empty()) continue;
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    const char* err = dlerror();
    tried += (tried.empty() ? "" : "; ") + n + (err ? std::string(" (") + err + ")" : "");
  }
  TPDRAFT_FAIL("cannot load {}: tried {}", what, tried);
}

}  // namespace

void* cublas() {
  static void* handle = open_first("cuBLAS", {TPDRAFT_CUBLAS_FILE, "libcublas.so.13", "libcublas.so.12", "libcublas.so"});
  return handle;
}

void* nccl() {
#ifdef TPDRAFT_NCCL_FILE
  static void* handle = open_first("NCCL", {TPDRAFT_NCCL_FILE, "libnccl.so.2", "libnccl.so"});
#else
  static void* handle = open_first("NCCL", {"libnccl.so.2", "libnccl.so"});
#endif
  return handle;
}

void* symbol(void* lib, const char* name) {
  dlerror();
  void* p = dlsym(lib, name);
  TPDRAFT_CHECK(p != nullptr, "symbol '{}' not found in the loaded library ({})", name,
                dlerror() ? "dlsym failed" : "null");
  return p;
}

}  // namespace tpdraft::lazy
