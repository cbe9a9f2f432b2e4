// cuBLAS and NCCL are opened on first use: every symbol the CUDA backend and the NCCL
// communicator call must resolve from the libraries this build found. Needs the libraries, not a
// GPU, so it runs wherever the CUDA backend is built.
#include <gtest/gtest.h>

#ifdef TPDRAFT_HAVE_CUDA

#include <cublas_v2.h>

#include <string>

#include "cuda/lazy_lib.h"
#ifdef TPDRAFT_HAVE_NCCL
#include <nccl.h>
#endif

namespace tpdraft {
namespace {

TEST(LazyLibs, CublasSymbolsResolveAndAnswer) {
  // Status strings need no device: a real call through the resolved pointer.
  EXPECT_EQ(std::string(TPDRAFT_LAZY(cublas, cublasGetStatusName)(CUBLAS_STATUS_NOT_INITIALIZED)),
            "CUBLAS_STATUS_NOT_INITIALIZED");
  for (const char* name : {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSetPointerMode_v2",
                           "cublasSetMathMode", "cublasSgemm_v2", "cublasGemmEx", "cublasGetStatusString"})
    EXPECT_NE(lazy::symbol(lazy::cublas(), name), nullptr) << name;
}

#ifdef TPDRAFT_HAVE_NCCL
TEST(LazyLibs, NcclSymbolsResolveAndAnswer) {
  EXPECT_NE(std::string(TPDRAFT_LAZY(nccl, ncclGetErrorString)(ncclInvalidArgument)).size(), 0u);
  for (const char* name : {"ncclGetUniqueId", "ncclCommInitRankConfig", "ncclAllReduce", "ncclAllGather",
                           "ncclBroadcast", "ncclCommGetAsyncError", "ncclCommAbort", "ncclCommFinalize",
                           "ncclCommDestroy", "ncclGetLastError"})
    EXPECT_NE(lazy::symbol(lazy::nccl(), name), nullptr) << name;
}
#endif

}  // namespace
}  // namespace tpdraft

#else
TEST(LazyLibs, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
