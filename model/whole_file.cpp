// model/whole_file.cpp — see whole_file.hpp.
#include "model/whole_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "model/error.hpp"
#include "model/fd_guard.hpp"

namespace corolla {

std::string read_whole_file(const std::filesystem::path& file, std::string_view what, std::size_t max_bytes) {
  const std::string named = what.empty() ? file.string() : std::string(what) + " " + file.string();
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (status.type() == std::filesystem::file_type::not_found) throw model_error(named + " does not exist");
  if (status.type() == std::filesystem::file_type::directory) throw model_error(named + " is a directory");
  // A device never ends (/dev/zero) or answers nothing a loader could
  // use; a socket cannot be opened. A FIFO is read to its end (<(cmd)).
  if (status.type() == std::filesystem::file_type::character || status.type() == std::filesystem::file_type::block ||
      status.type() == std::filesystem::file_type::socket)
    throw model_error(named + " is not a regular file (a device or a socket)");
  // POSIX reads, not a stream: libstdc++'s streams turn a failed read into
  // an ios_base::failure that names no file; here errno says why.
  // O_NONBLOCK: opening a FIFO without a writer must not hang the loader.
  fd_guard d{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (d.fd < 0) throw model_error("cannot read " + named + ": " + std::strerror(errno));
  if (const int flags = ::fcntl(d.fd, F_GETFL); flags >= 0) ::fcntl(d.fd, F_SETFL, flags & ~O_NONBLOCK);
  std::string bytes;
  char chunk[1 << 16];
  for (;;) {
    // One byte past the limit is enough to know the file is over it.
    const std::size_t left = max_bytes - bytes.size();  // bytes.size() <= max_bytes here
    const std::size_t room = left >= sizeof chunk ? sizeof chunk : left + 1;
    const ssize_t n = ::read(d.fd, chunk, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw model_error("cannot read " + named + ": " + std::strerror(errno));
    if (n == 0) return bytes;
    bytes.append(chunk, static_cast<std::size_t>(n));
    if (bytes.size() > max_bytes)
      throw model_error(named + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
}

void write_whole_file(const std::filesystem::path& file, std::string_view bytes) {
  const std::filesystem::path tmp = file.string() + ".tmp." + std::to_string(::getpid());
  const auto fail = [&](const std::string& why) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw model_error("cannot write " + file.string() + ": " + why);
  };
  {
    fd_guard d{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)};
    if (d.fd < 0) fail(std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ::ssize_t n = ::write(d.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(d.fd) != 0) fail(std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) fail(ec.message());
  // The rename reaches the disk with the directory's entries.
  const std::filesystem::path parent = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  fd_guard dir{::open(parent.c_str(), O_RDONLY | O_CLOEXEC)};
  if (dir.fd < 0 || ::fsync(dir.fd) != 0)
    throw model_error("cannot write " + file.string() + ": syncing " + parent.string() + ": " + std::strerror(errno));
}

}  // namespace corolla
