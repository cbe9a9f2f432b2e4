// A tensor-parallel group of engines in this process: one rank per thread, the in-process
// communicator between them. The threads live as long as the group, so a call costs a hand-off
// to waiting threads, not thread starts. With one rank there are no threads: the caller's
// thread runs it. The library's handle is one of these.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "parallel/communicator.h"

namespace tpdraft::engine {

class LocalGroup {
 public:
  // Builds `tp` ranks (each on its own thread, rank 0 on the caller's) and their engines.
  LocalGroup(const model::ModelSource& source, const model::RuntimeOptions& options, int tp,
             int64_t max_open_sessions);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return static_cast<int>(engines_.size()); }
  // Rank 0's engine (its caps, and whatever only rank 0 reports).
  Engine& leader() { return *engines_[0]; }

  // Runs fn(engine of rank r) on every rank at once and returns when all are done. When fn
  // throws on any rank, the others are released from any collective they wait in and the first
  // error is rethrown here; the group is then broken, and every later call fails with that
  // reason. So check what can be checked first, on leader() (Engine::check), then run the work.
  void on_all(const std::function<void(Engine&)>& fn);

 private:
  void run(const std::function<void(int)>& job);
  void worker(int rank);
  void stop_workers();  // ends and joins the rank threads

  std::vector<std::unique_ptr<parallel::Communicator>> comms_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::string broken_;
};

}  // namespace tpdraft::engine
