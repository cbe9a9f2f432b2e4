// Opening input files (core/files.h): a regular file is read whole; a directory, FIFO or device
// is refused at once, named with its path and kind; a file larger than the caller allows is
// refused before it is read.
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "core/files.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

using testing::error_of;

TEST(Files, RegularFilesAreReadWhole) {
  testing::TempDir dir;
  const std::string path = dir.file("config.json");
  const std::string text(100000, 'x');  // more than one read() chunk
  testing::write_text(path, text);
  EXPECT_EQ(read_regular_file(path, "config"), text);
  testing::write_text(path, "");
  EXPECT_EQ(read_regular_file(path, "config"), "");
  const int fd = open_regular_file(path, "config");
  EXPECT_GE(fd, 0);
  ::close(fd);
}

TEST(Files, OtherKindsAreRefusedNamingPathAndKind) {
  testing::TempDir dir;
  std::string msg = error_of([&] { read_regular_file(dir.path(), "drafter config"); });
  EXPECT_EQ(msg, dir.path() + ": is a directory, expected the drafter config as a regular file");
  msg = error_of([&] { open_regular_file("/dev/null", "taps file"); });
  EXPECT_EQ(msg, "/dev/null: is a character device, expected the taps file as a regular file");
  const std::string fifo = dir.file("pipe");
  testing::make_fifo(fifo);
  EXPECT_TRUE(testing::finishes_without_blocking(fifo, [&] {
    EXPECT_EQ(error_of([&] { read_regular_file(fifo, "index file"); }),
              fifo + ": is a FIFO (named pipe), expected the index file as a regular file");
  }));
  msg = error_of([&] { read_regular_file(dir.file("missing.json"), "target config"); });
  EXPECT_EQ(msg, dir.file("missing.json") + ": cannot open target config (No such file or directory)");
}

TEST(Files, SizeLimit) {
  testing::TempDir dir;
  const std::string path = dir.file("big.json");
  testing::write_text(path, std::string(65, ' '));
  EXPECT_EQ(read_regular_file(path, "config", 65).size(), 65u);
  EXPECT_EQ(error_of([&] { read_regular_file(path, "config", 64); }),
            path + ": the config is 65 bytes, more than the 64 bytes such a file may take");
}

}  // namespace
}  // namespace tpdraft
