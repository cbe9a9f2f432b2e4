// open_regular_file / read_regular_file: O_NONBLOCK makes open() return at once on a FIFO with
// no writer (a plain open blocks until one appears, forever); fstat on the open descriptor then
// tells the file's type without a window for it to change between a check and the open.
#include "core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace tpdraft {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

int open_regular_file(const std::string& path, const char* what, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  TPDRAFT_CHECK(fd >= 0, "{}: cannot open {} ({})", path, what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TPDRAFT_FAIL("{}: cannot read the file type of {} ({})", path, what, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TPDRAFT_FAIL("{}: is {}, expected the {} as a regular file", path, kind_of(st.st_mode), what);
  }
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const char* what, size_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    TPDRAFT_FAIL("{}: the {} is {} bytes, more than the {} bytes such a file may take", path, what, size, max_bytes);
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      TPDRAFT_FAIL("{}: reading the {} failed ({})", path, what, std::strerror(err));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

bool write_file_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << text;
  out.close();  // a file that did not open fails here too
  if (out.good() && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return false;
}

void* map_shared_memory(const char* name, size_t bytes, bool create) {
  const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) return nullptr;
  struct stat st {};
  const bool ok = create ? ftruncate(fd, static_cast<off_t>(bytes)) == 0
                         : fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes;
  void* p = ok ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name);
    return nullptr;
  }
  return p;
}

FileIdentity file_identity(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return {};
  return {static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino), true};
}

bool remove_if_same(const std::string& path, const FileIdentity& id) {
  const FileIdentity now = file_identity(path);
  if (!id.valid || !now.valid || now.device != id.device || now.inode != id.inode) return false;
  return unlink(path.c_str()) == 0;
}

}  // namespace tpdraft
