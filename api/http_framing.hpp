// api/http_framing.hpp — refusing requests whose body length is ambiguous
// before their body is read (internal to api/: the API, the dashboard and
// the server metrics share it).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <httplib.h>

#include "api/http_server.hpp"

namespace corolla::api {

/// Why the request's body length is ambiguous or invalid, as a sentence
/// for the client ("The request's framing is invalid: ..."; RFC 9112, 6.1
/// and 6.3), or nothing. Where what a proxy in front and this server read
/// as the body could differ, the rest would pass as a request of its own:
/// Content-Length values that differ (cpp-httplib would take the first) or
/// are not a number, a Content-Length beside a Transfer-Encoding, a
/// Transfer-Encoding other than one "chunked", and a body on a method
/// cpp-httplib reads none for (GET, HEAD, ...: it would read the body as
/// the next request).
std::optional<std::string> framing_error(const httplib::Request& req);

/// Answers `status` with `body` and closes the connection after the answer
/// (http_server::close_after_answer; on an http_server's thread). For a
/// refusal on the headers: the request's body is unread, and httplib would
/// read it as the next request.
void answer_and_close(httplib::Response& res, int status, std::string body, const std::string& content_type);

/// Runs `admitted` on every request's headers, before its body is read
/// (also when the client asks first, Expect: 100-continue): false, with
/// the refusal in the response, ends the request there.
void check_on_headers(http_server& server,
                      std::function<bool(const httplib::Request&, httplib::Response&)> admitted);

/// How long a page request may take to arrive (http_server's read limit).
inline constexpr std::chrono::seconds kPageReadLimit{30};

/// For a server that serves GET pages only (the dashboard, a server's
/// metrics): a request with invalid framing is a 400, and one of another
/// method (which httplib would read a body for, of any length) a 405,
/// both on the headers, before any body is read; a request not read
/// within the server's read limit a 408; each refusal ends its connection.
void serve_pages_only(http_server& server);

}  // namespace corolla::api
