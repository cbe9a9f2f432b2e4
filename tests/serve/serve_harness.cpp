// The serve tests' server process, clients and step specs.
#include "serve/serve_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

namespace tpdraft::serve_test {

ServerProcess::ServerProcess(const std::string& dir, const std::vector<std::string>& args,
                             const std::vector<std::string>& launcher, const std::vector<std::string>& env) {
  static int counter = 0;
  const int n = counter++;
  log_ = dir + "/server-" + std::to_string(n) + ".log";
  address_file_ = dir + "/server-" + std::to_string(n) + ".address";
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), {TPDRAFT_BIN, "serve", "--drafter", dir + "/drafter", "--target",
                           dir + "/target", "--address-file", address_file_, "--threads", "1",
                           "--backend", "cpu"});
  argv.insert(argv.end(), args.begin(), args.end());
  pid_ = fork();
  if (pid_ == 0) {
    // The child: its own process group, so that a test can end the whole launch at once.
    setpgid(0, 0);
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
    raw.push_back(nullptr);
    execvp(raw[0], raw.data());
    _exit(127);
  }
}

ServerProcess::~ServerProcess() {
  if (running()) {
    kill(-pid_, SIGKILL);
    wait_exit(30);
  }
}

bool ServerProcess::running() { return wait_exit(0) == -1; }

int ServerProcess::wait_exit(double seconds) {
  if (pid_ <= 0) return status_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      pid_ = -1;
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void ServerProcess::signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

std::string ServerProcess::log() const {
  std::ifstream in(log_);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string ServerProcess::wait_address(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(address_file_);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    if (!running()) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

Client::Client(const std::string& address, double timeout, int shared_memory) {
  tpdraft_client_options o;
  tpdraft_client_options_init(&o);
  o.timeout_seconds = timeout;
  o.shared_memory = shared_memory;
  o.ring_bytes = 1 << 20;
  EXPECT_EQ(tpdraft_client_open(address.c_str(), &o, &c), TPDRAFT_OK) << tpdraft_last_error();
}

tpdraft_session Client::open() const {
  tpdraft_session s = -1;
  EXPECT_EQ(tpdraft_client_session_open(c, &s), TPDRAFT_OK) << tpdraft_last_error();
  return s;
}

tpdraft_caps client_caps(tpdraft_client* c) {
  tpdraft_caps caps{sizeof caps};
  EXPECT_EQ(tpdraft_client_caps_get(c, &caps), TPDRAFT_OK) << tpdraft_last_error();
  return caps;
}

Spec random_spec(std::mt19937_64& rng, int64_t length, int64_t taps_width, int64_t vocab, int64_t max_new) {
  Spec s;
  std::uniform_int_distribution<int64_t> pick(0, 1 << 20);
  // Roll back a little now and then, as a target that refused some drafts does.
  s.keep = length > 2 && pick(rng) % 3 == 0 ? length - 1 - pick(rng) % 2 : -1;
  s.n_new = 1 + pick(rng) % max_new;
  s.anchor = pick(rng) % vocab;
  const int kind = static_cast<int>(pick(rng) % 3);
  if (kind > 0) {
    s.temperature = 0.8;
    s.seed = static_cast<uint64_t>(pick(rng));
  }
  s.dist_width = kind == 2 ? 4 : 0;
  std::normal_distribution<float> normal(0, 1);
  s.taps.resize(static_cast<size_t>(s.n_new * taps_width));
  for (float& v : s.taps) v = normal(rng);
  return s;
}

void fill_entry(const Spec& s, int64_t session, int64_t block, Out* out, tpdraft_step_entry* e) {
  tpdraft_step_entry_init(e);
  const size_t rows = static_cast<size_t>(block - 1);
  out->tokens.assign(rows, -7);
  out->q.assign(rows, -7);
  e->session = session;
  e->keep = s.keep;
  e->n_new = s.n_new;
  e->taps = s.taps.data();
  e->anchor = s.anchor;
  e->sampling = {s.temperature, s.top_k, 1.0, s.seed};
  e->dist_width = s.dist_width;
  e->tokens = out->tokens.data();
  e->q = out->q.data();
  if (s.dist_width > 0) {
    const size_t w = static_cast<size_t>(s.dist_width);
    out->dist_ids.assign(rows * w, -7);
    out->dist_probs.assign(rows * w, -7);
    out->dist_rest.assign(rows, -7);
    e->dist_ids = out->dist_ids.data();
    e->dist_probs = out->dist_probs.data();
    e->dist_rest = out->dist_rest.data();
  }
}

// Bitwise equality of two float vectors (memcmp would be handed null for empty ones).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same(const Out& a, const Out& b, const std::string& where) {
  EXPECT_EQ(a.tokens, b.tokens) << where;
  EXPECT_TRUE(same_bits(a.q, b.q)) << where << ": q differs";
  EXPECT_EQ(a.dist_ids, b.dist_ids) << where;
  EXPECT_TRUE(same_bits(a.dist_probs, b.dist_probs)) << where << ": dist_probs differ";
  EXPECT_TRUE(same_bits(a.dist_rest, b.dist_rest)) << where << ": dist_rest differs";
}

}  // namespace tpdraft::serve_test
