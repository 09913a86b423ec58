// api/http_server.hpp — the cpp-httplib server every HTTP listener of
// corolla runs (internal to api/: the API, the dashboard and the server
// metrics), with a deadline on reading each request.
//
// cpp-httplib 0.11 bounds each read of a request (5 s), not the request:
// a client that sends a header line, or a few bytes of its body, every
// few seconds holds an HTTP thread for as long as it likes, and enough of
// them take every thread (slowloris). Here a request's line, headers and
// body must all arrive within `read_limit` of the moment the server starts
// reading it (its first byte, or when a thread takes a connection that
// waited); past it the client gets 408 and the connection closes. Only
// reading is bounded: an answer (a long completion, a stream) takes as
// long as it takes, and a keep-alive connection's wait for its next
// request is httplib's 5 s. A request is also bounded in bytes (the
// payload limit and 1 MiB of headers), which httplib 0.11 does not do for
// chunked bodies.
//
// The connection loop is this class's own (httplib's is private): it also
// answers requests pipelined on one connection (up to the keep-alive
// count), which httplib 0.11 dropped; it ends a connection after an error
// answer, whose request may be partly unread (httplib's own refusals, or a
// handler's close_after_answer: httplib 0.11 ignores "Connection: close" in
// a response); and it drains what the client still sends for a moment
// before closing after an answer, so that the answer is not lost to a
// reset.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <httplib.h>

namespace corolla::api {

class http_server : public httplib::Server {
 public:
  /// `read_limit`: how long a request may take to arrive, from when the
  /// server starts reading it to the end of its body (zero: no bound but
  /// httplib's per read).
  explicit http_server(std::chrono::milliseconds read_limit);

  std::chrono::milliseconds read_limit() const { return std::chrono::milliseconds(read_limit_ms_); }
  /// The bound for messages: "60 s", "1500 ms".
  std::string read_limit_text() const;

  /// On an HTTP thread, inside a handler (the error handler's check):
  /// whether the request being answered did not arrive within the bound.
  /// httplib then answers 400 for it; servers turn that into 408.
  static bool read_limit_passed();
  /// On an HTTP thread, inside a handler: whether the request being
  /// answered was cut off for holding more than the payload limit (and
  /// 1 MiB of headers): a body sent chunked, which httplib 0.11 reads
  /// without a bound, or headers without end. httplib then answers 400;
  /// servers turn that into 413.
  static bool request_too_large();
  /// On an HTTP thread, inside a handler: the connection ends after this
  /// request's answer (a refusal on the headers, whose body is unread and
  /// must not be read as the next request). Works for a HEAD too, whose
  /// answer has no body.
  static void close_after_answer();

  /// The server's logger is its own (it tells the connection loop each
  /// answer's status).
  void set_logger(httplib::Logger) = delete;

 private:
  bool process_and_close_socket(socket_t sock) override;

  const std::int64_t read_limit_ms_;
};

}  // namespace corolla::api
