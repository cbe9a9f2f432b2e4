// Helpers shared by the tests: scratch directories, config fixtures, error comparisons, the kept
// set of docs/sampling.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace tpdraft::parallel {
class Communicator;
}
namespace tpdraft::model {
struct OwnedTensor;
}

namespace tpdraft::testing {

// Exit status of a test binary in which every test skipped itself (support/gtest_main.cpp);
// CTest's SKIP_RETURN_CODE of every test registered by tests/CMakeLists.txt.
constexpr int kAllSkipped = 77;

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One fresh directory for all ranks of a communicator: rank 0 makes it (mkdtemp) and broadcasts
// its name, so that concurrent runs of the same test never meet in one path. Not collective on
// destruction (a rank unwinding from a failure must not wait for its peers): call
// comm.barrier() before it goes out of scope when other ranks may still read from it; rank 0
// then removes it.
class SharedTempDir {
 public:
  explicit SharedTempDir(parallel::Communicator& comm);
  ~SharedTempDir();
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool owner_ = false;
};

// Path of a file in the source tree (e.g. "configs/tiny-dflash.json").
std::string source_path(const std::string& relative);

// ||a - b|| / ||b|| over the two vectors (b the reference).
double relative_error(const std::vector<float>& a, const std::vector<double>& b);

void write_text(const std::string& path, const std::string& text);

// A shell command's exit status (-1 when a signal ended it) and its stdout and stderr together.
struct CommandResult {
  int status = -1;
  std::string out;
};
CommandResult run_command(const std::string& command);

// The message of the tpdraft::Error that f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f);
// Expects f to throw a tpdraft::Error whose message holds every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts);

// The ids 0 .. n-1 ordered by values[id], largest first; equal values keep ascending ids (a stable
// sort, the candidate order of docs/sampling.md).
template <typename T>
std::vector<int64_t> ids_by_value(const T* values, int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  return ids;
}

// The kept set of docs/sampling.md in candidate order: the ids by logit (equal logits keep ascending
// ids), the first top_k (0: all), then the shortest prefix whose softmax mass at temperature t over
// that set reaches top_p.
template <typename T>
std::vector<int64_t> documented_kept_set(const std::vector<T>& logits, double t, int64_t top_k, double top_p) {
  std::vector<int64_t> ids = ids_by_value(logits.data(), static_cast<int64_t>(logits.size()));
  if (top_k > 0 && top_k < static_cast<int64_t>(ids.size())) ids.resize(static_cast<size_t>(top_k));
  if (top_p < 1.0) {
    double z = 0;
    for (int64_t id : ids) z += std::exp((logits[id] - logits[ids[0]]) / t);
    double mass = 0;
    size_t n = 0;
    while (n < ids.size() && mass < top_p) mass += std::exp((logits[ids[n++]] - logits[ids[0]]) / t) / z;
    ids.resize(n);
  }
  return ids;
}

// softmax(logits / t) over `kept`, one probability per id (zero outside the set).
template <typename T>
std::vector<double> softmax_over(const std::vector<T>& logits, const std::vector<int64_t>& kept, double t) {
  double mx = -INFINITY, z = 0;
  for (int64_t id : kept) mx = std::max(mx, logits[id] / t);
  for (int64_t id : kept) z += std::exp(logits[id] / t - mx);
  std::vector<double> q(logits.size(), 0.0);
  for (int64_t id : kept) q[static_cast<size_t>(id)] = std::exp(logits[id] / t - mx) / z;
  return q;
}

// The last line of a command's output that starts with '{': its JSON result among the log lines.
std::string json_line(const std::string& output);

// How many times `needle` occurs in `text`.
size_t count_of(const std::string& text, const std::string& needle);
// Every tensor of the safetensors file at `path`, copied out of it, in the file's order.
std::vector<model::OwnedTensor> read_tensors(const std::string& path);
// Writes `tensors` as the safetensors file at `path`.
void write_tensors(const std::string& path, const std::vector<model::OwnedTensor>& tensors);
// Rewrites the safetensors file at `path` with element `index` of tensor `name` set to `value`
// (stored in the tensor's float dtype): how tests plant a NaN or an Inf in a checkpoint.
void set_element(const std::string& path, const std::string& name, int64_t index, float value);

// Creates a FIFO (named pipe) at `path`.
void make_fifo(const std::string& path);
// Runs f on another thread. Returns true when f finished within `seconds`; otherwise opens the
// FIFO for writing, which releases a reader blocked in open(), waits for f and returns false.
// Lets a test show that code refuses a FIFO without blocking, and never hang the suite.
bool finishes_without_blocking(const std::string& fifo, const std::function<void()>& f, double seconds = 10);

}  // namespace tpdraft::testing
