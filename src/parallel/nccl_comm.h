// Communicators for ranks whose buffers live on a GPU: NCCL (one GPU per rank, bootstrapped over
// a host communicator such as MPI), and host staging, which lets a host communicator (the
// in-process threads, or MPI without NCCL) carry device buffers by copying them through host
// memory. Both also accept host buffers (the drafter gathers its head candidates on the host).
#pragma once

#include <memory>

#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace tpdraft::parallel {

// The communicator a rank computing with `ops` uses over `group`, or nullptr when `group` takes
// the backend's buffers as they are (every host backend). For the CUDA backend: NCCL over
// `group` when prefer_nccl and this build has NCCL (at one rank too), else `group` with host staging. The result
// refers to `group` and must not outlive it.
std::unique_ptr<Communicator> make_backend_comm(Communicator& group, kernels::Ops& ops, bool prefer_nccl);

}  // namespace tpdraft::parallel

#ifdef TPDRAFT_HAVE_CUDA

#include <cuda_runtime_api.h>

namespace tpdraft::parallel {

// `host` carrying device buffers of `device`: a device buffer is copied to host memory (after
// the work queued on `stream` before it), reduced / gathered by `host`, and copied back. Several
// ranks sharing one GPU (the in-process communicator) work this way; NCCL refuses two ranks on
// one device. Host buffers go to `host` untouched.
std::unique_ptr<Communicator> make_host_staged(Communicator& host, int device, cudaStream_t stream);

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_CUDA

#ifdef TPDRAFT_HAVE_NCCL

#include <nccl.h>

// NCCL_CHECK(call): evaluates the call once; on failure throws tpdraft::Error naming the call,
// file:line and NCCL's description of the error.
#define NCCL_CHECK(call)                                                                      \
  do {                                                                                        \
    const ncclResult_t nccl_check_rc_ = (call);                                               \
    if (nccl_check_rc_ != ncclSuccess && nccl_check_rc_ != ncclInProgress)                    \
      ::tpdraft::parallel::nccl_fail(#call, nccl_check_rc_, __FILE__, __LINE__);              \
  } while (0)

namespace tpdraft::parallel {

[[noreturn]] void nccl_fail(const char* call, ncclResult_t code, const char* file, int line);

// One NCCL rank per GPU: rank 0 of `bootstrap` creates the ncclUniqueId and broadcasts it over
// `bootstrap` (host buffers, e.g. the MPI group), then every rank joins on `device`. Collectives
// run on `stream` (the CUDA ops' stream, so they follow the kernels that produce their inputs)
// and each waits for its completion, polling NCCL for errors; after TPDRAFT_NCCL_TIMEOUT_S
// seconds (default 120) the communicator is aborted and tpdraft::Error names the rank and the
// operation. abort() aborts the NCCL communicator (not the bootstrap).
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device, cudaStream_t stream);

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_NCCL
