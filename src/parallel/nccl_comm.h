// Communicators for ranks whose buffers live on a GPU: NCCL (one GPU per rank, bootstrapped over
// a host communicator such as MPI), and host staging, which lets a host communicator (the
// in-process threads, or MPI without NCCL) carry device buffers by copying them through host
// memory. Both also accept host buffers (the drafter gathers its head candidates on the host).
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace tpdraft::parallel {

// The communicator a rank computing with `ops` uses over `group`, or nullptr when `group` takes
// the backend's buffers as they are (every host backend). For the CUDA backend: NCCL over
// `group` when prefer_nccl and this build has NCCL (at one rank too), else `group` with host staging. The result
// refers to `group` and must not outlive it.
std::unique_ptr<Communicator> make_backend_comm(Communicator& group, kernels::Ops& ops, bool prefer_nccl);

// How the NCCL communicator carries all-reduces of device buffers. A draft's o and down
// all-reduces are small (an [M, H] f32 block: 256 KB at M = 16, H = 4096), where NCCL's ring is
// latency bound; NCCL 2.27 and later run such all-reduces with its symmetric-memory kernels when
// the buffer was allocated by ncclMemAlloc and registered on every rank as a symmetric window
// (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). ncclMemAlloc allocates through CUDA's
// virtual memory management, which the device must support.
struct AllReducePath {
  bool symmetric = false;
  std::string reason;  // one line for `bench` and the logs: the path, the NCCL version, why
};

// The oldest NCCL with symmetric windows, as ncclGetVersion reports it.
inline constexpr int kNcclSymmetricVersion = 22700;  // 2.27.0

// "2.28.9" from a version code of ncclGetVersion (NCCL 2.9 and later: major*10000 + minor*100 +
// patch; before: major*1000 + minor*100 + patch).
std::string nccl_version_name(int code);

// The choice, from what the NCCL loaded at run time reports (`version`, and whether it exports
// ncclMemAlloc, ncclMemFree and the window functions: `has_symbols`), whether the device
// supports virtual memory management (`device_vmm`), and TPDRAFT_NCCL_SYMMETRIC (`setting`:
// null, "" or "auto" use the symmetric path where it is available, "off" never does; anything
// else throws tpdraft::Error naming the variable). Ranks agree on the result before using it
// (registration is collective): one rank's "no" makes it the ring for all.
AllReducePath choose_all_reduce_path(int version, bool has_symbols, bool device_vmm, const char* setting);

}  // namespace tpdraft::parallel

#ifdef TPDRAFT_HAVE_CUDA

#include <cuda_runtime_api.h>

namespace tpdraft::parallel {

// `host` carrying device buffers of `device`: a device buffer is copied to host memory (after
// the work queued on `stream` before it), reduced / gathered by `host`, and copied back. Several
// ranks sharing one GPU (the in-process communicator) work this way; NCCL refuses two ranks on
// one device. Host buffers go to `host` untouched.
std::unique_ptr<Communicator> make_host_staged(Communicator& host, int device, cudaStream_t stream);

#ifdef TPDRAFT_HAVE_NCCL
// One NCCL rank per GPU: rank 0 of `bootstrap` creates the ncclUniqueId and broadcasts it over
// `bootstrap` (host buffers, e.g. the MPI group), then every rank joins on `device`. Collectives
// run on `stream` (the CUDA ops' stream, so they follow the kernels that produce their inputs)
// and each waits for its completion, polling NCCL for errors; after TPDRAFT_NCCL_TIMEOUT_S
// seconds (default 120) the communicator is aborted and tpdraft::Error names the rank and the
// operation. abort() aborts the NCCL communicator (not the bootstrap).
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device, cudaStream_t stream);
#endif  // TPDRAFT_HAVE_NCCL

}  // namespace tpdraft::parallel

#endif  // TPDRAFT_HAVE_CUDA
