// Test helpers: temp dirs, source paths, error norms.
#include "support/test_support.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

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

}  // namespace tpdraft::testing
