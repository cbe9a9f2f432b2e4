// Part of scripts/gpu-check.sh: per-kernel GPU time where nsys is missing. The CUDA driver loads
// this library into a program started with CUDA_INJECTION64_PATH=libkernel-trace.so and calls
// InitializeInjection; from then on CUPTI's activity API records every kernel (the nodes of a
// replayed graph too) with its start and end on the GPU. At exit one CSV line per kernel name
//     kernel,calls,total_ns
// goes to the file TPDRAFT_KERNEL_TRACE names (names demangled, quoted). The check runs the same
// benchmark twice with different repeat counts, so that the difference is the timed drafts alone.
//
//   g++ -O2 -shared -fPIC -I$CUDA/include kernel-trace.cpp -L$CUDA/lib64 -lcupti -o libkernel-trace.so
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace {

struct Totals {
  uint64_t calls = 0, ns = 0;
};

std::mutex mu;
std::map<std::string, Totals>* totals = nullptr;  // never freed: written at exit

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
#if CUPTI_API_VERSION >= 130000
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
#else
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
#endif
      Totals& t = (*totals)[demangled(k->name)];
      t.calls += 1;
      t.ns += k->end > k->start ? k->end - k->start : 0;
    }
  }
  std::free(buffer);
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_at_exit() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("TPDRAFT_KERNEL_TRACE");
  FILE* f = path ? std::fopen(path, "w") : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "kernel-trace: cannot write TPDRAFT_KERNEL_TRACE='%s'\n", path ? path : "");
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(f, "kernel,calls,total_ns\n");
  for (const auto& [name, t] : *totals)
    std::fprintf(f, "%s,%llu,%llu\n", quoted(name).c_str(), static_cast<unsigned long long>(t.calls),
                 static_cast<unsigned long long>(t.ns));
  std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  totals = new std::map<std::string, Totals>();
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel-trace: CUPTI refused kernel activity records\n");
    return 0;
  }
  std::atexit(write_at_exit);
  return 1;
}
