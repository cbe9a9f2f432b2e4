// Device-buffer communicators: host staging around any host communicator, and NCCL. NCCL runs
// nonblocking (every call may return ncclInProgress) so that no wait is unbounded: the rank
// polls its stream and NCCL's asynchronous error state until the collective is done, and gives
// up after TPDRAFT_NCCL_TIMEOUT_S seconds by aborting the communicator. Built with CUDA only,
// except make_backend_comm, which every build has.
#include "cuda/lazy_lib.h"
#include "parallel/nccl_comm.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace tpdraft::parallel {

std::unique_ptr<Communicator> make_backend_comm([[maybe_unused]] Communicator& group, kernels::Ops& ops,
                                               [[maybe_unused]] bool prefer_nccl) {
  if (ops.host_memory()) return nullptr;
#ifdef TPDRAFT_HAVE_CUDA
  const int device = ops.device();
  auto stream = static_cast<cudaStream_t>(ops.stream());
#ifdef TPDRAFT_HAVE_NCCL
  if (prefer_nccl) return make_nccl(group, device, stream);  // at one rank too: nothing moves, but graphs hold it
#endif
  return make_host_staged(group, device, stream);
#else
  TPDRAFT_FAIL("a 'cuda' backend in a build without CUDA");
#endif
}

std::string nccl_version_name(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

AllReducePath choose_all_reduce_path(int version, bool has_symbols, bool device_vmm, const char* setting) {
  const std::string s = setting ? setting : "";
  TPDRAFT_CHECK(s.empty() || s == "auto" || s == "off", "TPDRAFT_NCCL_SYMMETRIC must be 'auto' or 'off', got '{}'", s);
  const std::string nccl = "NCCL " + nccl_version_name(version);
  if (s == "off") return {false, fmt::format("ring ({}; symmetric windows off: TPDRAFT_NCCL_SYMMETRIC=off)", nccl)};
  if (version < kNcclSymmetricVersion)
    return {false, fmt::format("ring ({}; symmetric windows need {} or later)", nccl,
                               nccl_version_name(kNcclSymmetricVersion))};
  if (!has_symbols)
    return {false, fmt::format("ring ({}; this library lacks ncclMemAlloc or ncclCommWindowRegister)", nccl)};
  if (!device_vmm)
    return {false,
            fmt::format("ring ({}; the device has no virtual memory management, which ncclMemAlloc needs)", nccl)};
  return {true, fmt::format("symmetric windows ({})", nccl)};
}

}  // namespace tpdraft::parallel

#ifdef TPDRAFT_HAVE_CUDA

#include <dlfcn.h>
#ifdef TPDRAFT_HAVE_NCCL
#include <nccl.h>
#endif

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <vector>

#include "core/log.h"
#include "cuda/cuda_check.h"
#include "cuda/runtime.h"

namespace tpdraft::parallel {
namespace {

using cuda::DeviceGuard;

// Device memory of the current device (plain cudaMalloc); host, pinned and managed memory are
// all reachable from the host, so only device memory needs staging.
bool on_device(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

// ---- host staging ----------------------------------------------------------------------------

class HostStaged final : public Communicator {
 public:
  HostStaged(Communicator& host, int device, cudaStream_t stream)
      : Communicator(host.rank(), host.size()), host_(host), device_(device), stream_(stream) {}

  std::string name() const override { return host_.name() + "+staging"; }
  // One rank moves nothing (the all-reduce of a device buffer returns at once), so a graph may
  // hold it; with more ranks the copies and the host collective run between graph segments.
  bool can_capture() const override { return size() == 1; }
  std::string all_reduce_path() const override { return "copied through host memory, summed by " + host_.name(); }
  void abort(const std::string& reason) override { host_.abort(reason); }

 protected:
  void do_all_reduce_sum(float* data, size_t count) override {
    if (!on_device(data)) return host_.all_reduce_sum(data, count);
    if (size() == 1 || count == 0) return;  // a sum over one rank is the data itself
    auto* h = static_cast<float*>(download(data, count * sizeof(float), &a_));
    host_.all_reduce_sum(h, count);
    upload(data, h, count * sizeof(float));
  }

  void do_all_gather(const void* send, void* recv, size_t bytes) override {
    const bool dev_send = on_device(send), dev_recv = on_device(recv);
    if (!dev_send && !dev_recv) return host_.all_gather(send, recv, bytes);
    const size_t total = bytes * static_cast<size_t>(size());
    const void* hs = dev_send ? download(send, bytes, &a_) : send;
    void* hr = recv;
    if (dev_recv) {
      b_.resize(total);
      hr = b_.data();
    }
    host_.all_gather(hs, hr, bytes);
    if (dev_recv) upload(recv, hr, total);
  }

  void do_broadcast(void* data, size_t bytes, int root) override {
    if (!on_device(data)) return host_.broadcast(data, bytes, root);
    void* h = download(data, bytes, &a_);
    host_.broadcast(h, bytes, root);
    upload(data, h, bytes);
  }

  // The host's barrier only: unlike the NCCL one it does not wait for work queued on the stream
  // (collectives of device buffers here synchronise the stream themselves).
  void do_barrier() override { host_.barrier(); }

 private:
  // After the work queued before the collective (which produced the buffer).
  void* download(const void* src, size_t bytes, std::vector<uint8_t>* buf) {
    DeviceGuard guard(device_);
    buf->resize(bytes);
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(buf->data(), src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return buf->data();
  }

  void upload(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the scratch is reused by the next collective
  }

  Communicator& host_;
  const int device_;
  cudaStream_t stream_;
  std::vector<uint8_t> a_, b_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged(Communicator& host, int device, cudaStream_t stream) {
  return std::make_unique<HostStaged>(host, device, stream);
}

#ifdef TPDRAFT_HAVE_NCCL

namespace {

// NCCL_CHECK(call): evaluates the call once; on failure throws tpdraft::Error naming the call,
// file:line, the device and NCCL's description of the error.
#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)
void nccl_check(ncclResult_t code, const char* call, const char* file, int line) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  const char* slash = std::strrchr(file, '/');
  int device = -1;
  cudaGetDevice(&device);
  TPDRAFT_FAIL("{} failed at {}:{} on device {}: {} (NCCL error {})", call, slash ? slash + 1 : file, line, device,
               TPDRAFT_LAZY(nccl, ncclGetErrorString)(code), static_cast<int>(code));
}

using Clock = std::chrono::steady_clock;

// The symmetric window's size: the largest all-reduce that goes through it ([128, 4096] f32, a
// draft of 8 sessions at H = 4096); larger ones are bandwidth bound, where the ring does well.
constexpr size_t kWindowBytes = size_t{2} << 20;

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define TPDRAFT_NCCL_WINDOWS 1
// NCCL's symmetric-memory functions, looked up without failing: the library loaded at run time
// may be older than the headers this build saw, and then the ring carries every all-reduce.
struct WindowApi {
  decltype(&ncclMemAlloc) mem_alloc;
  decltype(&ncclMemFree) mem_free;
  decltype(&ncclCommWindowRegister) register_window;
  decltype(&ncclCommWindowDeregister) deregister_window;
  bool complete() const { return mem_alloc && mem_free && register_window && deregister_window; }
};

const WindowApi& window_api() {
  static const WindowApi api = [] {
    void* lib = lazy::nccl();
    const auto find = [lib](const char* name) {
      dlerror();
      return dlsym(lib, name);
    };
    return WindowApi{reinterpret_cast<decltype(&ncclMemAlloc)>(find("ncclMemAlloc")),
                     reinterpret_cast<decltype(&ncclMemFree)>(find("ncclMemFree")),
                     reinterpret_cast<decltype(&ncclCommWindowRegister)>(find("ncclCommWindowRegister")),
                     reinterpret_cast<decltype(&ncclCommWindowDeregister)>(find("ncclCommWindowDeregister"))};
  }();
  return api;
}
#endif

double timeout_seconds() {
  const char* env = std::getenv("TPDRAFT_NCCL_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 120.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  TPDRAFT_CHECK(end != env && *end == '\0' && v > 0.0,
                "TPDRAFT_NCCL_TIMEOUT_S must be a number of seconds > 0, got '{}'", env);
  return v;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, cudaStream_t stream)
      : Communicator(bootstrap.rank(), bootstrap.size()), device_(device), stream_(stream),
        timeout_(timeout_seconds()) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank_ == 0) NCCL_CHECK(TPDRAFT_LAZY(nccl, ncclGetUniqueId)(&id));
    bootstrap.broadcast(&id, sizeof(id), 0);
    DeviceGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; waits are ours, with a deadline
    // A failed start may leave a half-made communicator behind: give_up aborts it (a throwing
    // constructor runs no destructor).
    const ncclResult_t rc = TPDRAFT_LAZY(nccl, ncclCommInitRankConfig)(&comm_, size_, id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
      give_up("initialisation (ncclCommInitRankConfig)",
              fmt::format("failed: {}", TPDRAFT_LAZY(nccl, ncclGetErrorString)(rc)));
    finish_call("initialisation (ncclCommInitRankConfig)");
    try {
      open_window();
    } catch (const Error&) {
      abort_comm();  // a throwing constructor runs no destructor
      free_window_memory();
      throw;
    }
  }

  ~NcclCommunicator() override {
    DeviceGuard guard(device_, std::nothrow);
    if (comm_ != nullptr) {
      // The window goes first (every rank deregisters it, as it registered it); finalize flushes
      // outstanding work. If either fails or stalls, abort instead of hanging here.
      bool clean = true;
#ifdef TPDRAFT_NCCL_WINDOWS
      if (window_ != nullptr) clean = settled(window_api().deregister_window(comm_, window_));
      window_ = nullptr;
#endif
      clean = clean && settled(TPDRAFT_LAZY(nccl, ncclCommFinalize)(comm_));
      if (clean)
        TPDRAFT_LAZY(nccl, ncclCommDestroy)(comm_);
      else
        TPDRAFT_LAZY(nccl, ncclCommAbort)(comm_);
    }
    free_window_memory();
    for (cuda::Workspace* w : {&stage_a_, &stage_b_, &barrier_}) w->reset();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaGetLastError();
  }

  std::string name() const override { return "nccl"; }
  bool can_capture() const override { return true; }
  std::string all_reduce_path() const override { return path_; }
  void wait_pending(const std::string& what) override {
    require_live("wait_pending");
    DeviceGuard guard(device_);
    wait(what);
    double device = 0;
    for (size_t i = 0; i < timed_; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
      device += ms * 1e-3;
    }
    if (timed_ > 0) retime(enqueue_seconds_, device);
    timed_ = 0, enqueue_seconds_ = 0;
  }

  void abort(const std::string& reason) override {
    if (comm_ == nullptr) return;
    TPDRAFT_LOG_ERROR("rank {}: aborting the NCCL communicator: {}", rank_, reason);
    abort_comm();
  }

 protected:
  void do_all_reduce_sum(float* data, size_t count) override {
    require_live("all_reduce_sum");
    if (count == 0) return;
    DeviceGuard guard(device_);
    const size_t bytes = count * sizeof(float);
    const bool staged = !on_device(data);
    if (cuda::stream_capturing(stream_)) {
      // Part of a graph: it runs when the graph does, and wait_pending() then waits for it.
      TPDRAFT_CHECK(!staged, "rank {}: all_reduce_sum of a host buffer cannot be captured into a graph", rank_);
      sum_in_place(data, count);
      return;
    }
    if (!staged) {
      // Device memory: the kernels queued after it on the same stream wait for it, so the host
      // need not; the caller waits once for all of them (wait_pending), with the deadline, and
      // wait_pending reads its time on the device from the events around it.
      const auto t0 = Clock::now();
      if (events_.size() < 2 * timed_ + 2)
        for (int i = 0; i < 2; ++i) CUDA_CHECK(cudaEventCreate(&events_.emplace_back(nullptr)));
      CUDA_CHECK(cudaEventRecord(events_[2 * timed_], stream_));
      sum_in_place(data, count);
      CUDA_CHECK(cudaEventRecord(events_[2 * timed_ + 1], stream_));
      ++timed_;
      check_async("all_reduce_sum");
      enqueue_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
      return;
    }
    float* d = static_cast<float*>(stage_in(data, bytes, &stage_a_));
    sum_in_place(d, count);
    wait(fmt::format("all_reduce_sum(f32, {} elements)", count));
    stage_out(data, d, bytes);
  }

  void do_all_gather(const void* send, void* recv, size_t bytes) override {
    require_live("all_gather", false);
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    const size_t total = bytes * static_cast<size_t>(size_);
    const bool stage_send = !on_device(send), stage_recv = !on_device(recv);
    const void* ds = stage_send ? stage_in(send, bytes, &stage_a_) : send;
    void* dr = stage_recv ? stage_b_.get(total, stream_) : recv;
    start("all_gather", TPDRAFT_LAZY(nccl, ncclAllGather)(ds, dr, bytes, ncclInt8, comm_, stream_));
    wait(fmt::format("all_gather({} bytes)", bytes));
    if (stage_recv) stage_out(recv, dr, total);
  }

  void do_broadcast(void* data, size_t bytes, int root) override {
    TPDRAFT_CHECK(root >= 0 && root < size_, "rank {}: broadcast root {} is not a rank of a group of {}", rank_, root,
                  size_);
    require_live("broadcast", false);
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    const bool staged = !on_device(data);
    void* d = staged ? stage_in(data, bytes, &stage_a_) : data;
    start("broadcast", TPDRAFT_LAZY(nccl, ncclBroadcast)(d, d, bytes, ncclInt8, root, comm_, stream_));
    wait(fmt::format("broadcast({} bytes, root {})", bytes, root));
    if (staged) stage_out(data, d, bytes);
  }

  // A one-element all-reduce: returns once every rank has reached it.
  void do_barrier() override {
    require_live("barrier", false);
    DeviceGuard guard(device_);
    float* one = barrier_.as<float>(1, stream_);
    CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_));  // a defined sum, for the checkers
    start("barrier", TPDRAFT_LAZY(nccl, ncclAllReduce)(one, one, 1, ncclFloat, ncclSum, comm_, stream_));
    wait("barrier");
  }

 private:
  void abort_comm() {
    if (comm_ == nullptr) return;
    TPDRAFT_LAZY(nccl, ncclCommAbort)(comm_);
    comm_ = nullptr;
#ifdef TPDRAFT_NCCL_WINDOWS
    window_ = nullptr;  // went with the communicator; its memory is freed by the destructor
#endif
  }

  // After the communicator is gone (or before it registered the window).
  void free_window_memory() {
#ifdef TPDRAFT_NCCL_WINDOWS
    if (window_buf_ != nullptr) window_api().mem_free(window_buf_);
#endif
    window_buf_ = nullptr;
  }

  // Queues data[i] = sum over ranks on the stream: through the symmetric window when there is
  // one and the data fits (a device copy on each side of NCCL's symmetric kernel), else in place.
  void sum_in_place(float* d, size_t count) {
#ifdef TPDRAFT_NCCL_WINDOWS
    if (const size_t bytes = count * sizeof(float); window_ != nullptr && bytes <= kWindowBytes) {
      CUDA_CHECK(cudaMemcpyAsync(window_buf_, d, bytes, cudaMemcpyDeviceToDevice, stream_));
      start("all_reduce_sum",
            TPDRAFT_LAZY(nccl, ncclAllReduce)(window_buf_, window_buf_, count, ncclFloat, ncclSum, comm_, stream_));
      // After start(): a nonblocking call may reach the stream only once NCCL has taken it.
      CUDA_CHECK(cudaMemcpyAsync(d, window_buf_, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
#endif
    start("all_reduce_sum", TPDRAFT_LAZY(nccl, ncclAllReduce)(d, d, count, ncclFloat, ncclSum, comm_, stream_));
  }

  // Whether every rank says yes: a min-reduction of one flag, waited for.
  bool all_agree(bool mine, const std::string& what) {
    float* flag = barrier_.as<float>(1, stream_);
    const float v = mine ? 1.0f : 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(flag, &v, sizeof(v), cudaMemcpyHostToDevice, stream_));
    start(what.c_str(), TPDRAFT_LAZY(nccl, ncclAllReduce)(flag, flag, 1, ncclFloat, ncclMin, comm_, stream_));
    wait(what);
    float all = 0.0f;
    CUDA_CHECK(cudaMemcpy(&all, flag, sizeof(all), cudaMemcpyDeviceToHost));
    return all == 1.0f;
  }

  // The symmetric window, where every rank can have one (choose_all_reduce_path; registration is
  // collective, so the ranks agree first), else the ring as before. path_ says which.
  void open_window() {
    int version = 0;
    NCCL_CHECK(TPDRAFT_LAZY(nccl, ncclGetVersion)(&version));
#ifdef TPDRAFT_NCCL_WINDOWS
    const bool symbols = window_api().complete();
#else
    const bool symbols = false;
#endif
    AllReducePath path = choose_all_reduce_path(version, symbols, cuda::device_has_vmm(device_),
                                                std::getenv("TPDRAFT_NCCL_SYMMETRIC"));
#ifdef TPDRAFT_NCCL_WINDOWS
    if (!all_agree(path.symmetric, "the symmetric-window check")) {
      if (path.symmetric) path = {false, "ring (a peer rank cannot use symmetric windows)"};
    } else {
      void* p = nullptr;
      const bool allocated = window_api().mem_alloc(&p, kWindowBytes) == ncclSuccess && p != nullptr;
      window_buf_ = allocated ? static_cast<float*>(p) : nullptr;
      if (all_agree(allocated, "ncclMemAlloc of the symmetric window")) {
        start("symmetric window registration (ncclCommWindowRegister; TPDRAFT_NCCL_SYMMETRIC=off avoids it)",
              window_api().register_window(comm_, window_buf_, kWindowBytes, &window_, NCCL_WIN_COLL_SYMMETRIC));
        path.reason += fmt::format(", all-reduces up to {} KiB", kWindowBytes >> 10);
      } else {
        path = {false, fmt::format("ring (ncclMemAlloc of {} KiB failed on a rank)", kWindowBytes >> 10)};
        free_window_memory();
      }
    }
#endif
    path_ = path.reason;
  }

  // A nonblocking call that must not throw (the destructor's): whether it completed, polling
  // NCCL's error state within the timeout.
  bool settled(ncclResult_t rc) {
    if (rc != ncclSuccess && rc != ncclInProgress) return false;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (TPDRAFT_LAZY(nccl, ncclCommGetAsyncError)(comm_, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress))
        return false;
      if (state == ncclSuccess) return true;
      if (Clock::now() > deadline) return false;
      std::this_thread::yield();
    }
  }

  [[noreturn]] void give_up(const std::string& what, const std::string& why) {
    abort_comm();
    TPDRAFT_FAIL("rank {}: NCCL {} {}; the communicator was aborted", rank_, what, why);
  }

  // Only all_reduce_sum on a device buffer may join a graph (capturable); the others wait on the
  // stream, which a capture forbids (and the failed wait would abort the communicator).
  void require_live(const char* what, bool capturable = true) const {
    TPDRAFT_CHECK(comm_ != nullptr, "rank {}: NCCL {} called after the communicator was aborted", rank_, what);
    TPDRAFT_CHECK(capturable || !cuda::stream_capturing(stream_), "rank {}: NCCL {} cannot be captured into a graph",
                  rank_, what);
  }

  // Host buffers travel through device scratch; the copy is ordered before the collective.
  void* stage_in(const void* src, size_t bytes, cuda::Workspace* ws) {
    void* d = ws->get(bytes, stream_);
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, stream_));
    return d;
  }
  // Only after wait(): a copy into pageable memory blocks the host until the stream gets there.
  void stage_out(void* dst, const void* src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // NCCL's name for `rc` and its last error message on this communicator.
  std::string described(ncclResult_t rc) const {
    return fmt::format("{} ({})", TPDRAFT_LAZY(nccl, ncclGetErrorString)(rc), TPDRAFT_LAZY(nccl, ncclGetLastError)(comm_));
  }

  // A nonblocking call has been issued: wait (bounded) until NCCL has taken it.
  void start(const char* what, ncclResult_t rc) {
    require_live(what);
    if (rc != ncclSuccess && rc != ncclInProgress) give_up(what, "could not start: " + described(rc));
    if (rc == ncclInProgress) finish_call(what);
  }

  void finish_call(const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = TPDRAFT_LAZY(nccl, ncclCommGetAsyncError)(comm_, &state);
      if (rc != ncclSuccess) give_up(what, fmt::format("failed: {}", TPDRAFT_LAZY(nccl, ncclGetErrorString)(rc)));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) give_up(what, "failed: " + described(state));
      if (Clock::now() > deadline)
        give_up(what, fmt::format("did not complete within {} s (TPDRAFT_NCCL_TIMEOUT_S)", timeout_));
      std::this_thread::yield();
    }
  }

  // NCCL's asynchronous error state, once, without waiting.
  void check_async(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    if (TPDRAFT_LAZY(nccl, ncclCommGetAsyncError)(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress)
      give_up(what, "failed: " + described(state));
  }

  // Polls the stream (and NCCL's error state while it is busy) until the collective is done.
  void wait(const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) give_up(what, fmt::format("failed on the device: {}", cudaGetErrorString(q)));
      check_async(what);
      if (Clock::now() > deadline)
        give_up(what, fmt::format("timed out after {} s (TPDRAFT_NCCL_TIMEOUT_S): a peer rank did not join", timeout_));
      std::this_thread::yield();
    }
  }

  ncclComm_t comm_ = nullptr;
  const int device_;
  cudaStream_t stream_;
  const double timeout_;
  cuda::Workspace stage_a_, stage_b_, barrier_;
  std::string path_;
  float* window_buf_ = nullptr;  // ncclMemAlloc'd, kWindowBytes; null on the ring path
  // Start and end events of the device all-reduces queued outside a graph since the last
  // wait_pending (timed_ pairs), and the host time their enqueues took.
  std::vector<cudaEvent_t> events_;
  size_t timed_ = 0;
  double enqueue_seconds_ = 0;
#ifdef TPDRAFT_NCCL_WINDOWS
  ncclWindow_t window_ = nullptr;
#endif
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device, cudaStream_t stream) {
  return std::make_unique<NcclCommunicator>(bootstrap, device, stream);
}

#endif  // TPDRAFT_HAVE_NCCL

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_CUDA
