// CURVE key files: reading with the checks a secret deserves, and writing a fresh pair.
#include "serve/keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <zmq.h>

#include "core/error.h"

namespace tpdraft::serve {

namespace {

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Writes `text` to a new file `path` with `mode`; false (errno set) when it exists or fails.
bool write_new(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  if (!ok) {
    unlink(path.c_str());
    errno = saved;
  }
  return ok;
}

// Whether `text` is a key: 40 characters of the Z85 alphabet.
bool is_curve_key(const std::string& text) {
  static const char* kZ85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return text.size() == kCurveKeyChars && text.find_first_not_of(kZ85) == std::string::npos;
}

}  // namespace

bool curve_available() { return zmq_has("curve") == 1; }

std::string read_curve_key(const std::string& path, bool secret, const std::string& option) {
  struct stat st {};
  TPDRAFT_CHECK(stat(path.c_str(), &st) == 0, "{} {}: cannot read it: {}", option, path, std::strerror(errno));
  TPDRAFT_CHECK(S_ISREG(st.st_mode), "{} {}: not a file", option, path);
  TPDRAFT_CHECK(!secret || (st.st_mode & 0077) == 0,
                "{} {}: a secret key readable by others (mode {:o}); chmod 600 it", option, path, st.st_mode & 0777);
  TPDRAFT_CHECK(st.st_size <= 4096, "{} {}: {} bytes, not a key file (one line of {} characters)", option, path,
                st.st_size, kCurveKeyChars);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  TPDRAFT_CHECK(in.good() || in.eof(), "{} {}: cannot read it", option, path);
  const std::string key = trimmed(text.str());
  TPDRAFT_CHECK(is_curve_key(key), "{} {}: not a CURVE key ({} characters of Z85 text, as tpdraft keys writes)",
                option, path, kCurveKeyChars);
  return key;
}

std::string server_key_from(const std::string& key_or_file, const std::string& option) {
  if (is_curve_key(key_or_file)) return key_or_file;
  return read_curve_key(key_or_file, false, option);
}

std::string write_curve_keys(const std::string& prefix) {
  TPDRAFT_CHECK(curve_available(), "this ZeroMQ was built without CURVE (libsodium): no keys can be made");
  char pub[kCurveKeyChars + 1] = {0}, sec[kCurveKeyChars + 1] = {0};
  TPDRAFT_CHECK(zmq_curve_keypair(pub, sec) == 0, "cannot make a CURVE key pair: {}", zmq_strerror(zmq_errno()));
  const std::string secret_path = prefix + ".secret", public_path = prefix + ".public";
  TPDRAFT_CHECK(write_new(secret_path, std::string(sec) + "\n", 0600), "--out {}: cannot write {}: {}", prefix,
                secret_path, std::strerror(errno));
  if (!write_new(public_path, std::string(pub) + "\n", 0644)) {
    const int saved = errno;
    unlink(secret_path.c_str());
    TPDRAFT_FAIL("--out {}: cannot write {}: {}", prefix, public_path, std::strerror(saved));
  }
  return pub;
}

}  // namespace tpdraft::serve
