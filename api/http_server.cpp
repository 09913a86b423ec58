// The HTTP server with a deadline on reading each request (api/http_server.hpp).
#include "api/http_server.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

namespace corolla::api {

namespace {

using clock_type = std::chrono::steady_clock;

/// How long a connection that ends with bytes of the client's unread is
/// drained before it closes.
constexpr std::chrono::seconds kLinger{2};
/// What a request may hold besides its body (request line and headers).
constexpr std::uint64_t kHeaderBytes = 1 << 20;

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

/// One connection's socket as httplib reads and writes it (buffered as
/// httplib's own SocketStream), with the current request's deadline and
/// size bound on every read, and what became of the request.
class deadline_stream final : public httplib::Stream {
 public:
  deadline_stream(socket_t sock, int read_timeout_ms, int write_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  /// A request starts: reads fail after `deadline` (none: only the
  /// per-read timeout) and past `max_bytes`.
  void start_request(std::optional<clock_type::time_point> deadline, std::uint64_t max_bytes) {
    deadline_ = deadline;
    max_bytes_ = max_bytes;
    bytes_ = 0;
    passed_ = too_large_ = closing_ = false;
    status_ = 0;
  }
  /// Whether a read gave up at the deadline.
  bool passed() const { return passed_; }
  /// Whether a read gave up at the size bound.
  bool too_large() const { return too_large_; }
  /// The connection ends after this request's answer.
  void close_after_answer() { closing_ = true; }
  bool closing() const { return closing_; }
  /// The status of the answer written (0: none).
  void answered(int status) { status_ = status; }
  int status() const { return status_; }
  /// Bytes received and not read yet (the start of a pipelined request).
  bool buffered() const { return off_ < size_; }

  /// Waits up to `wait_ms` for the next request's first byte (skipping the
  /// empty lines a client may send after a body, RFC 9112, 2.2), checking
  /// `stopped` every 10 ms: whether one came.
  template <class Stopped>
  bool next_request(int wait_ms, const Stopped& stopped) {
    const auto until = clock_type::now() + std::chrono::milliseconds(wait_ms);
    for (;;) {
      while (off_ < size_ && (buf_[off_] == '\r' || buf_[off_] == '\n')) ++off_;
      if (buffered()) return true;
      int r = 0;
      while (!stopped() && (r = poll_socket(sock_, POLLIN, 10)) == 0)
        if (clock_type::now() > until) return false;
      if (r <= 0 || stopped() || !fill()) return false;
    }
  }

  bool is_readable() const override {
    if (buffered()) return true;
    for (;;) {
      int wait_ms = read_timeout_ms_;
      bool capped = false;
      if (deadline_) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - clock_type::now()).count();
        if (left <= 0) {
          passed_ = true;
          return false;
        }
        capped = left < wait_ms;
        wait_ms = static_cast<int>(std::min<std::int64_t>(wait_ms, left));
      }
      pollfd p{sock_, POLLIN, 0};
      const int r = ::poll(&p, 1, wait_ms);
      if (r < 0 && errno == EINTR) continue;  // the rest of the wait
      if (r == 0 && capped) passed_ = true;
      return r > 0;
    }
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
    if (!buffered()) {
      if (!is_readable()) return -1;
      if (!fill()) return -1;
    }
    std::size_t n = std::min(size, size_ - off_);
    if (bytes_ + n > max_bytes_) {
      // A body without a length (chunked) or headers without end: httplib
      // 0.11 reads either into memory without a bound.
      too_large_ = true;
      return -1;
    }
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    bytes_ += n;
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
  /// Receives into the (empty) buffer: false at the end of the stream or an error.
  bool fill() {
    ssize_t n;
    do n = ::recv(sock_, buf_, sizeof buf_, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    off_ = 0;
    size_ = static_cast<std::size_t>(n);
    return true;
  }

  socket_t sock_;
  int read_timeout_ms_, write_timeout_ms_;
  std::optional<clock_type::time_point> deadline_;
  std::uint64_t max_bytes_ = std::numeric_limits<std::uint64_t>::max(), bytes_ = 0;
  mutable bool passed_ = false;
  bool too_large_ = false, closing_ = false;
  int status_ = 0;
  char buf_[4096];
  std::size_t off_ = 0, size_ = 0;
};

/// The stream of the request this thread is answering (read_limit_passed).
thread_local deadline_stream* current_stream = nullptr;

int to_ms(time_t sec, time_t usec) {
  return static_cast<int>(std::clamp<std::int64_t>(static_cast<std::int64_t>(sec) * 1000 + usec / 1000, 0, 1 << 30));
}

}  // namespace

http_server::http_server(std::chrono::milliseconds read_limit) : read_limit_ms_(read_limit.count()) {
  // Called after every answer written (httplib's own refusals too): how
  // the connection loop learns the answer's status.
  httplib::Server::set_logger([](const httplib::Request&, const httplib::Response& res) {
    if (current_stream) current_stream->answered(res.status);
  });
}

std::string http_server::read_limit_text() const {
  const std::int64_t ms = read_limit_ms_;
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

bool http_server::read_limit_passed() { return current_stream && current_stream->passed(); }

bool http_server::request_too_large() { return current_stream && current_stream->too_large(); }

void http_server::close_after_answer() {
  if (current_stream) current_stream->close_after_answer();
}

bool http_server::process_and_close_socket(socket_t sock) {
  deadline_stream stream(sock, to_ms(read_timeout_sec_, read_timeout_usec_), to_ms(write_timeout_sec_, write_timeout_usec_));
  struct current {
    explicit current(deadline_stream& s) { current_stream = &s; }
    ~current() { current_stream = nullptr; }
  } on_this_thread(stream);
  const auto stopped = [this] { return svr_sock_ == INVALID_SOCKET; };
  const std::uint64_t max_bytes =
      payload_max_length_ > std::numeric_limits<std::uint64_t>::max() - kHeaderBytes
          ? std::numeric_limits<std::uint64_t>::max()
          : static_cast<std::uint64_t>(payload_max_length_) + kHeaderBytes;
  bool ok = false;
  for (std::size_t left = keep_alive_max_count_;
       left > 0 && stream.next_request(to_ms(keep_alive_timeout_sec_, 0), stopped); --left) {
    const auto deadline = clock_type::now() + std::chrono::milliseconds(read_limit_ms_);
    stream.start_request(read_limit_ms_ > 0 ? std::optional(deadline) : std::nullopt, max_bytes);
    bool closed = false;
    ok = process_request(stream, left == 1, closed, nullptr);
    // An error answer may leave the rest of its request unread (httplib's
    // own refusals of a request line, a header or a body it cannot read;
    // a refusal on the headers): that must not be read as the next request.
    if (!ok || closed || stream.status() == 0 || stream.status() >= 400 || stream.closing()) break;
  }
  // An answer followed by bytes of the client's still unread (a trickle
  // still sending, a refused body, requests pipelined past the last):
  // closing now would reset the connection, and the reset may destroy the
  // answer before the client reads it. The answer's end is sent first, and
  // what comes is read and dropped for a moment (a "lingering close").
  if (stream.status() != 0 &&
      (stream.passed() || stream.closing() || stream.buffered() || poll_socket(sock, POLLIN, 0) > 0)) {
    ::shutdown(sock, SHUT_WR);
    const auto until = clock_type::now() + kLinger;
    char drop[4096];
    for (;;) {
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(until - clock_type::now()).count();
      if (wait <= 0 || poll_socket(sock, POLLIN, static_cast<int>(wait)) <= 0) break;
      const ssize_t n = ::recv(sock, drop, sizeof drop, 0);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace corolla::api
