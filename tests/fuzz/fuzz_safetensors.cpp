// libFuzzer harness for the safetensors reader: each input is a whole file. It goes through the
// real path (SafetensorsFile opens and maps a file) by way of an in-memory file (memfd) reopened
// through /proc/self/fd, so nothing touches the disk. A file the reader accepts must keep its
// promises: every listed name is found, and every tensor's bytes lie inside the mapping (they are
// all read, and converted to f32 where small). Rejections must be tpdraft::Error; anything else
// (another exception, a crash, a sanitizer report) is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace {

int memory_file() {
  static const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) std::abort();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpdraft;
  const int fd = memory_file();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  try {
    const model::SafetensorsFile file(path);
    for (const std::string& name : file.names()) {
      const model::TensorInfo* t = file.find(name);
      if (t == nullptr) std::abort();  // listed but not found
      volatile unsigned sum = 0;
      for (size_t i = 0; i < t->nbytes; ++i) sum = sum + static_cast<unsigned>(t->data[i]);
      if (t->numel() <= 4096 && (t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16))
        (void)model::to_f32(*t);
    }
  } catch (const Error&) {
    // a rejection with a message: what a bad file should get
  }
  return 0;
}
