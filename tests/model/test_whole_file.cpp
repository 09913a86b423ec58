// read_whole_file: every loader's way to read a file the user named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "model/error.hpp"
#include "model/whole_file.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

/// The model_error `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a whole file is read byte for byte, binary as text") {
  testing::temp_dir_guard dir("whole-file");
  const std::string bytes("line one\r\nzero \0 byte\xff\n", 23);
  std::ofstream(dir / "f.bin", std::ios::binary) << bytes;
  CHECK(read_whole_file(dir / "f.bin") == bytes);
  CHECK(read_whole_file(dir / "f.bin", "data file") == bytes);

  std::ofstream(dir / "empty.txt", std::ios::binary).flush();
  CHECK(read_whole_file(dir / "empty.txt", "scenario").empty());
}

TEST_CASE("a missing file, a directory and an unreadable file are named in the error") {
  testing::temp_dir_guard dir("whole-file");
  const std::string missing = (dir / "absent.toml").string();
  CHECK(error_of([&] { read_whole_file(missing, "cluster file"); }) == "cluster file " + missing + " does not exist");
  CHECK(error_of([&] { read_whole_file(missing); }) == missing + " does not exist");
  CHECK(error_of([&] { read_whole_file(dir.path(), "job file"); }) ==
        "job file " + dir.path().string() + " is a directory");

  // Permission bits do not stop root, so this part only runs as a user.
  if (::geteuid() != 0) {
    const auto locked = dir / "locked.toml";
    std::ofstream(locked) << "x = 1\n";
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    CHECK(error_of([&] { read_whole_file(locked, "scenario"); }) == "cannot read scenario " + locked.string());
  }
}
