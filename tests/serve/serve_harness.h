// What the serve tests share: a `tpdraft serve` process started in a test's own temp dir (its
// ipc socket and address file there too) and stopped, however the test ends; and steps driven
// through a served client and the in-process library alike.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/test_support.h"
#include "tpdraft/tpdraft.h"

namespace tpdraft::serve_test {

// `[launcher...] tpdraft serve --drafter DIR/drafter --target DIR/target --address-file ...
// --threads 1 --backend cpu args...`, stdout and stderr into DIR/server-N.log.
class ServerProcess {
 public:
  ServerProcess(const std::string& dir, const std::vector<std::string>& args,
                const std::vector<std::string>& launcher = {}, const std::vector<std::string>& env = {});
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Waits (at most `seconds`) for the address file; "" when the server ended or never wrote it.
  std::string wait_address(double seconds = 60);
  // Waits at most `seconds` for the process to end: its exit status, 128 + the signal that
  // ended it, or -1 when it is still running.
  int wait_exit(double seconds);
  bool running();
  void signal(int sig);
  pid_t pid() const { return pid_; }
  std::string log() const;
  const std::string& address_file() const { return address_file_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_, address_file_;
};

// A client through libtpdraft.so, closed on destruction.
struct Client {
  tpdraft_client* c = nullptr;
  explicit Client(const std::string& address, double timeout = 20, int shared_memory = -1);
  ~Client() { tpdraft_client_close(c); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  tpdraft_session open() const;
};

// Outputs of one entry, owned.
struct Out {
  std::vector<int64_t> tokens, dist_ids;
  std::vector<float> q, dist_probs, dist_rest;
};

// One step of one session: what a decoding loop would send.
struct Spec {
  int64_t keep = -1, n_new = 0, anchor = 1, dist_width = 0;
  double temperature = 0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::vector<float> taps;  // [n_new, taps_width]
};

// A random spec for a session holding `length` positions (which it may roll back).
Spec random_spec(std::mt19937_64& rng, int64_t length, int64_t taps_width, int64_t vocab, int64_t max_new);

// Fills the entry for the spec, with buffers in `out` sized for the caps.
void fill_entry(const Spec& s, int64_t session, int64_t block, Out* out, tpdraft_step_entry* e);

// Asserts that two outputs are equal bit for bit; `where` names the step.
void expect_same(const Out& a, const Out& b, const std::string& where);

// The caps of a client.
tpdraft_caps client_caps(tpdraft_client* c);

}  // namespace tpdraft::serve_test
