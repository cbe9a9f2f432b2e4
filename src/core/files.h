// Files and shared memory. Input files are opened safely: a path given as a checkpoint, config or
// taps file may name a FIFO, a device or a directory; these open without blocking, check that a
// regular file is there and fail naming the path and what it is, before anything is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tpdraft {

// A read-only descriptor of the regular file at `path` (the caller closes it), and its size in
// *size when asked. `what` names the file's role in messages ("safetensors file", "drafter config").
int open_regular_file(const std::string& path, const char* what, uint64_t* size = nullptr);
// The whole content of the regular file at `path` (JSON files), refused above `max_bytes`.
std::string read_regular_file(const std::string& path, const char* what, size_t max_bytes = size_t{256} << 20);

// Writes `text` to `path` whole: into PATH.tmp, then renamed over it; false when it cannot (no
// PATH.tmp is left behind).
bool write_file_whole(const std::string& path, const std::string& text);

// Makes (`create`: a new segment, mode 600, sized to `bytes` and read as zeros) or opens (one of
// at least `bytes`) the POSIX shared-memory segment `name`, and maps `bytes` of it read-write;
// null (errno set) when it cannot. A segment made here is unlinked again on failure.
void* map_shared_memory(const char* name, size_t bytes, bool create);

// Which file a path named when it was taken (device and inode), so that a file this process made
// is removed only while it is still the same one (another process may have replaced it).
struct FileIdentity {
  unsigned long long device = 0, inode = 0;
  bool valid = false;
};
FileIdentity file_identity(const std::string& path);
// Removes `path` when it is still the file `id` names; returns whether it did.
bool remove_if_same(const std::string& path, const FileIdentity& id);

}  // namespace tpdraft
