// Test helpers: temp dirs, source paths, error norms.
#include "support/test_support.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace tpdraft::testing {

namespace {

std::string make_temp_dir() {
  std::string templ = (std::filesystem::temp_directory_path() / "tpdraft-test-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
  return templ;
}

}  // namespace

TempDir::TempDir() : path_(make_temp_dir()) {}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

SharedTempDir::SharedTempDir(parallel::Communicator& comm) {
  uint64_t length = 0;
  if (comm.rank() == 0) {
    path_ = make_temp_dir();
    owner_ = true;
    length = path_.size();
  }
  comm.broadcast(&length, sizeof(length), 0);
  path_.resize(length);
  comm.broadcast(path_.data(), length, 0);
}

SharedTempDir::~SharedTempDir() {
  if (!owner_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string source_path(const std::string& relative) { return std::string(TPDRAFT_SOURCE_DIR) + "/" + relative; }

double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.good()) throw std::runtime_error("cannot write " + path);
}

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a tpdraft::Error mentioning '" << (parts.empty() ? "" : parts[0]) << "'";
}

std::string json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string found;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.front() == '{') found = line;
  return found;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) ++n;
  return n;
}

std::vector<model::OwnedTensor> read_tensors(const std::string& path) {
  model::SafetensorsFile f(path);
  std::vector<model::OwnedTensor> tensors;
  for (const auto& n : f.names()) {
    const model::TensorInfo& t = *f.find(n);
    tensors.push_back({n, t.dtype, t.shape, std::vector<std::byte>(t.data, t.data + t.nbytes)});
  }
  return tensors;
}

void write_tensors(const std::string& path, const std::vector<model::OwnedTensor>& tensors) {
  model::SafetensorsWriter w;
  for (const auto& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  w.write(path);
}

void set_element(const std::string& path, const std::string& name, int64_t index, float value) {
  std::vector<model::OwnedTensor> tensors = read_tensors(path);
  bool found = false;
  for (model::OwnedTensor& t : tensors) {
    if (t.name != name) continue;
    const size_t size = dtype_size(t.dtype);
    if (!is_float_weight(t.dtype) || (index + 1) * static_cast<int64_t>(size) > static_cast<int64_t>(t.bytes.size()))
      throw std::runtime_error("set_element: no float element " + std::to_string(index) + " in " + name);
    convert_from_f32(t.dtype, &value, t.bytes.data() + static_cast<size_t>(index) * size, 1);
    found = true;
  }
  if (!found) throw std::runtime_error("set_element: no tensor " + name + " in " + path);
  write_tensors(path, tensors);
}

void make_fifo(const std::string& path) {
  if (::mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed for " + path);
}

bool finishes_without_blocking(const std::string& fifo, const std::function<void()>& f, double seconds) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready) {
    done.get();
    return true;
  }
  // A reader stuck in open() returns once a writer opens the FIFO; keep trying until f ends.
  while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  done.get();
  return false;
}

}  // namespace tpdraft::testing
