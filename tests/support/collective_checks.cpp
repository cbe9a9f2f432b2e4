#include "support/collective_checks.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "parallel/communicator.h"

namespace tpdraft::testing {

namespace {

uint8_t pattern_byte(int rank, size_t j) { return static_cast<uint8_t>(rank * 37 + j * 11 + 5); }

}  // namespace

void check_all_reduce_exact(parallel::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  for (size_t count : {0, 1, 7, 1000, 4099}) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((i % 2 ? -1.0 : 1.0) * (r * 1000.0 + i));
    comm.all_reduce_sum(x.data(), count);
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const double expect = (i % 2 ? -1.0 : 1.0) * (1000.0 * n * (n - 1) / 2 + double(n) * i);
      if (static_cast<double>(x[i]) != expect && bad++ == 0)
        ADD_FAILURE() << "rank " << r << " count " << count << " [" << i << "] = " << x[i] << ", expected " << expect;
    }
    EXPECT_EQ(bad, 0u) << "rank " << r << " count " << count;
  }
}

void check_all_gather(parallel::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  for (size_t bytes : {0, 1, 3, 17, 4097}) {
    for (bool in_place : {false, true}) {
      std::vector<uint8_t> recv(bytes * n, 0xee), send(bytes);
      for (size_t j = 0; j < bytes; ++j) send[j] = pattern_byte(r, j);
      const void* src = send.data();
      if (in_place) {
        if (bytes > 0) std::memcpy(recv.data() + bytes * r, send.data(), bytes);  // memcpy wants non-null pointers
        src = recv.data() + bytes * r;
      }
      comm.all_gather(src, recv.data(), bytes);
      size_t bad = 0;
      for (int k = 0; k < n; ++k)
        for (size_t j = 0; j < bytes; ++j) bad += recv[k * bytes + j] != pattern_byte(k, j);
      EXPECT_EQ(bad, 0u) << "rank " << r << " bytes " << bytes << " in place " << in_place;
    }
  }
}

void check_broadcast(parallel::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  for (size_t bytes : {0, 1, 13, 1000}) {
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> data(bytes);
      for (size_t j = 0; j < bytes; ++j) data[j] = pattern_byte(r, j);
      comm.broadcast(data.data(), bytes, root);
      size_t bad = 0;
      for (size_t j = 0; j < bytes; ++j) bad += data[j] != pattern_byte(root, j);
      EXPECT_EQ(bad, 0u) << "rank " << r << " root " << root << " bytes " << bytes;
    }
  }
}

void check_counters(parallel::Communicator& comm, const std::string& name) {
  const int n = comm.size();
  std::vector<float> f(10);
  std::vector<uint8_t> block(5), gathered(5 * n), bytes(7);
  comm.all_reduce_sum(f.data(), f.size());
  comm.all_reduce_sum(f.data(), 3);
  comm.all_gather(block.data(), gathered.data(), block.size());
  comm.broadcast(bytes.data(), bytes.size(), n - 1);
  comm.broadcast(bytes.data(), 2, 0);
  for (int i = 0; i < 3; ++i) comm.barrier();
  const parallel::CommStats& s = comm.stats();
  EXPECT_EQ(s.all_reduce_calls, 2u);
  EXPECT_EQ(s.all_reduce_bytes, 10u * 4 + 3u * 4);
  EXPECT_EQ(s.all_gather_calls, 1u);
  EXPECT_EQ(s.all_gather_bytes, 5u);
  EXPECT_EQ(s.broadcast_calls, 2u);
  EXPECT_EQ(s.broadcast_bytes, 9u);
  EXPECT_EQ(s.barrier_calls, 3u);
  EXPECT_EQ(s.total_bytes(), 52u + 5u + 9u);
  EXPECT_GE(s.seconds, 0.0);
  EXPECT_EQ(comm.name(), name);
}

}  // namespace tpdraft::testing
