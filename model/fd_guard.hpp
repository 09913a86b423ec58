// model/fd_guard.hpp — a POSIX file descriptor closed on every path out of
// the scope that opened it (the safetensors mapper and read_whole_file).
#pragma once

#include <unistd.h>

namespace corolla {

/// Owns `fd` (-1: none) and closes it when it goes out of scope. Not
/// copyable: one owner per descriptor.
struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int descriptor) : fd(descriptor) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace corolla
