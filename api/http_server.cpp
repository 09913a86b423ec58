// The HTTP server with a deadline on reading each request (api/http_server.hpp).
#include "api/http_server.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

namespace corolla::api {

namespace {

using clock_type = std::chrono::steady_clock;

/// How long a connection cut off at its read limit is drained before it closes.
constexpr std::chrono::seconds kLinger{2};

/// poll() for `events` on `sock` for at most `wait_ms`, retried on EINTR:
/// > 0 ready (or hung up: the read or write that follows says how), 0 not
/// within the wait, < 0 an error.
int poll_socket(socket_t sock, short events, int wait_ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, wait_ms);
    if (r >= 0 || errno != EINTR) return r;
  }
}

void address_of(socket_t sock, bool remote, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int r = remote ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
                       : ::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return;
  ip = host;
  port = std::atoi(serv);
}

/// One connection's socket as httplib reads and writes it (as httplib's
/// own SocketStream, buffered the same way), with the current request's
/// deadline on every read.
class deadline_stream final : public httplib::Stream {
 public:
  deadline_stream(socket_t sock, int read_timeout_ms, int write_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  /// A request starts: reads fail after `deadline` (none: only the per-read timeout).
  void start_request(std::optional<clock_type::time_point> deadline) {
    deadline_ = deadline;
    passed_ = false;
    closing_ = false;
  }
  /// The connection ends after this request's answer.
  void close_after_answer() { closing_ = true; }
  bool closing() const { return closing_; }
  /// Whether a read gave up at the deadline.
  bool passed() const { return passed_; }
  /// Bytes received and not read yet (the start of a pipelined request).
  bool buffered() const { return off_ < size_; }

  bool is_readable() const override {
    int wait_ms = read_timeout_ms_;
    if (deadline_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - clock_type::now()).count();
      if (left <= 0) {
        passed_ = true;
        return false;
      }
      wait_ms = static_cast<int>(std::min<std::int64_t>(wait_ms, left));
    }
    const int r = poll_socket(sock_, POLLIN, wait_ms);
    if (r == 0 && deadline_ && clock_type::now() >= *deadline_) passed_ = true;
    return r > 0;
  }

  bool is_writable() const override {
    if (poll_socket(sock_, POLLOUT, write_timeout_ms_) <= 0) return false;
    // Still connected: nothing to read, or something (a pipelined
    // request) rather than the end of the stream.
    if (poll_socket(sock_, POLLIN, 0) == 0) return true;
    char byte;
    ssize_t n;
    do n = ::recv(sock_, &byte, 1, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    return n > 0;
  }

  ssize_t read(char* ptr, std::size_t size) override {
    if (off_ == size_) {
      if (!is_readable()) return -1;
      ssize_t n;
      do n = ::recv(sock_, buf_, sizeof buf_, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      size_ = static_cast<std::size_t>(n);
    }
    const std::size_t n = std::min(size, size_ - off_);
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, std::size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, false, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  socket_t sock_;
  int read_timeout_ms_, write_timeout_ms_;
  std::optional<clock_type::time_point> deadline_;
  mutable bool passed_ = false;
  bool closing_ = false;
  char buf_[4096];
  std::size_t off_ = 0, size_ = 0;
};

/// The stream of the request this thread is answering (read_limit_passed).
thread_local deadline_stream* current_stream = nullptr;

int to_ms(time_t sec, time_t usec) {
  return static_cast<int>(std::clamp<std::int64_t>(static_cast<std::int64_t>(sec) * 1000 + usec / 1000, 0, 1 << 30));
}

}  // namespace

http_server::http_server(std::chrono::milliseconds read_limit) : read_limit_ms_(read_limit.count()) {}

std::string http_server::read_limit_text() const {
  const std::int64_t ms = read_limit_ms_.load();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

bool http_server::read_limit_passed() { return current_stream && current_stream->passed(); }

void http_server::close_after_answer() {
  if (current_stream) current_stream->close_after_answer();
}

bool http_server::process_and_close_socket(socket_t sock) {
  deadline_stream stream(sock, to_ms(read_timeout_sec_, read_timeout_usec_), to_ms(write_timeout_sec_, write_timeout_usec_));
  current_stream = &stream;
  // The next request's first byte, or the end of the keep-alive wait (or
  // of the server): a request already in the buffer starts at once.
  const auto next_request = [&] {
    if (stream.buffered()) return true;
    const auto until = clock_type::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET) {
      const int r = poll_socket(sock, POLLIN, 10);  // checks the server's stop every 10 ms
      if (r != 0) return r > 0;
      if (clock_type::now() > until) return false;
    }
    return false;
  };
  bool ok = false;
  for (std::size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET && next_request(); --left) {
    const std::int64_t limit = read_limit_ms_.load();
    stream.start_request(limit > 0 ? std::optional(clock_type::now() + std::chrono::milliseconds(limit))
                                   : std::nullopt);
    bool closed = false;
    ok = process_request(stream, left == 1, closed, nullptr);
    // A request cut off at its deadline, or refused on its headers, leaves
    // the rest of it unread: it must not be read as the next request.
    if (!ok || closed || stream.passed() || stream.closing()) break;
  }
  current_stream = nullptr;
  if (stream.passed() || stream.closing()) {
    // Bytes of the client's may be unread (a trickle still sending, a
    // refused body): closing now would reset the connection, and the
    // reset may destroy the answer before the client reads it. The
    // answer's end is sent first, and what comes is read and dropped for a
    // moment (a "lingering close").
    ::shutdown(sock, SHUT_WR);
    const auto until = clock_type::now() + kLinger;
    char drop[4096];
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock_type::now()).count();
      if (left <= 0 || poll_socket(sock, POLLIN, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(sock, drop, sizeof drop, 0);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace corolla::api
