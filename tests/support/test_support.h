// Helpers shared by the tests: scratch directories, config fixtures, error comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpdraft::testing {

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

// How many times `needle` occurs in `text`.
size_t count_of(const std::string& text, const std::string& needle);

}  // namespace tpdraft::testing
