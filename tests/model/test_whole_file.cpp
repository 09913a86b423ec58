// read_whole_file: every loader's way to read a file the user named.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/error.hpp"
#include "model/whole_file.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

TEST_CASE("a whole file is read byte for byte, binary as text") {
  testing::temp_dir_guard dir("whole-file");
  const std::string bytes("line one\r\nzero \0 byte\xff\n", 23);
  std::ofstream(dir / "f.bin", std::ios::binary) << bytes;
  CHECK(read_whole_file(dir / "f.bin") == bytes);
  CHECK(read_whole_file(dir / "f.bin", "data file") == bytes);

  std::ofstream(dir / "empty.txt", std::ios::binary).flush();
  CHECK(read_whole_file(dir / "empty.txt", "scenario").empty());

  // A limit: exactly that many bytes pass; one more, and a device that never
  // ends, are refused without reading on.
  CHECK(read_whole_file(dir / "f.bin", "machine", bytes.size()) == bytes);
  CHECK_THROWS_WITH_AS(read_whole_file(dir / "f.bin", "machine", bytes.size() - 1),
                       ("machine " + (dir / "f.bin").string() + " is larger than 22 bytes").c_str(), model_error);
  CHECK_THROWS_WITH_AS(read_whole_file("/dev/zero", "--join-machine", 16 << 10),
                       "--join-machine /dev/zero is not a regular file (a device or a socket)", model_error);
  CHECK_THROWS_WITH_AS(read_whole_file("/dev/zero", "cluster file"),
                       "cluster file /dev/zero is not a regular file (a device or a socket)", model_error);
}

TEST_CASE("a missing file, a directory and an unreadable file are named in the error") {
  testing::temp_dir_guard dir("whole-file");
  const std::string missing = (dir / "absent.toml").string();
  CHECK_THROWS_WITH_AS(read_whole_file(missing, "cluster file"), ("cluster file " + missing + " does not exist").c_str(),
                       model_error);
  CHECK_THROWS_WITH_AS(read_whole_file(missing), (missing + " does not exist").c_str(), model_error);
  CHECK_THROWS_WITH_AS(read_whole_file(dir.path(), "job file"),
                       ("job file " + dir.path().string() + " is a directory").c_str(), model_error);

  // A socket exists and is no directory, but no stream can read it (also as root).
  const auto socket_path = dir / "s.sock";
  REQUIRE(socket_path.native().size() < sizeof(sockaddr_un::sun_path));  // a longer TMPDIR would bind elsewhere
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof address.sun_path - 1);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  CHECK_THROWS_WITH_AS(read_whole_file(socket_path, "chat template"),
                       ("chat template " + socket_path.string() + " is not a regular file (a device or a socket)").c_str(),
                       model_error);
  ::close(fd);

  // A file that opens but fails to read (EIO at offset 0): named with the reason, not an ios_base::failure.
  CHECK_THROWS_WITH_AS(read_whole_file("/proc/self/mem", "data file"),
                       "cannot read data file /proc/self/mem: Input/output error", model_error);

  // Permission bits do not stop root, so this part only runs as a user.
  if (::geteuid() != 0) {
    const auto locked = dir / "locked.toml";
    std::ofstream(locked) << "x = 1\n";
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    CHECK_THROWS_WITH_AS(read_whole_file(locked, "scenario"), ("cannot read scenario " + locked.string() + ": Permission denied").c_str(),
                         model_error);
  }
}

TEST_CASE("a whole file is written in one piece over the old one, and a failed write leaves no temporary file") {
  testing::temp_dir_guard dir("write-whole");
  const std::filesystem::path file = dir / "latest";
  write_whole_file(file, "step-1\n");
  CHECK(read_whole_file(file) == "step-1\n");
  const std::string binary("a\0b\nc", 5);
  write_whole_file(file, binary);  // replaces it
  CHECK(read_whole_file(file) == binary);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);  // no temporary file left beside it
  const std::string want = "cannot write " + (dir / "absent" / "x.json").string();
  CHECK_THROWS_WITH_AS(write_whole_file(dir / "absent" / "x.json", "{}"), doctest::Contains(want.c_str()), model_error);
  CHECK_FALSE(std::filesystem::exists(dir / "absent"));
}
