#include "api/http_framing.hpp"

#include <algorithm>
#include <cctype>
#include <memory>
#include <set>
#include <sstream>

namespace corolla::api {

namespace {

std::optional<std::string> why_framing_is_invalid(const httplib::Request& req) {
  std::set<std::string> lengths;
  const std::size_t fields = req.get_header_value_count("Content-Length");
  for (std::size_t i = 0; i < fields; ++i) {
    std::stringstream values(req.get_header_value("Content-Length", i));
    for (std::string v; std::getline(values, v, ',');) {
      const auto first = v.find_first_not_of(" \t"), last = v.find_last_not_of(" \t");
      if (first == std::string::npos) continue;  // an empty list item
      v = v.substr(first, last - first + 1);
      if (v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
        return "Content-Length '" + v.substr(0, 32) + "' is not a length";
      lengths.insert(v.substr(std::min(v.find_first_not_of('0'), v.size() - 1)));  // "007" is 7
    }
  }
  if (fields > 0 && lengths.empty()) return "Content-Length is empty";
  if (lengths.size() > 1) return "Content-Length is given as " + std::to_string(lengths.size()) + " different values";
  const std::size_t codings = req.get_header_value_count("Transfer-Encoding");
  if (codings > 0 && fields > 0) return "both Content-Length and Transfer-Encoding are given";
  if (codings > 1) return "Transfer-Encoding is given " + std::to_string(codings) + " times";
  if (codings == 1) {
    std::string te = req.get_header_value("Transfer-Encoding");
    std::transform(te.begin(), te.end(), te.begin(), [](unsigned char c) { return std::tolower(c); });
    if (te != "chunked") return "Transfer-Encoding '" + te.substr(0, 32) + "' is not 'chunked'";
  }
  const bool reads_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                          req.method == "DELETE" || req.method == "PRI";
  if (!reads_body && (codings > 0 || (!lengths.empty() && *lengths.begin() != "0")))
    return "a " + req.method + " request carries a body";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> framing_error(const httplib::Request& req) {
  if (auto why = why_framing_is_invalid(req)) return "The request's framing is invalid: " + *why + ".";
  return std::nullopt;
}

void answer_and_close(httplib::Response& res, int status, std::string body, const std::string& content_type) {
  res.status = status;
  res.set_header("Connection", "close");
  res.set_content(std::move(body), content_type);
  http_server::close_after_answer();
}

void check_on_headers(http_server& server,
                      std::function<bool(const httplib::Request&, httplib::Response&)> admitted) {
  server.set_pre_routing_handler([admitted](const httplib::Request& req, httplib::Response& res) {
    return admitted(req, res) ? httplib::Server::HandlerResponse::Unhandled
                              : httplib::Server::HandlerResponse::Handled;
  });
  server.set_expect_100_continue_handler([admitted](const httplib::Request& req, httplib::Response& res) {
    return admitted(req, res) ? 100 : res.status;
  });
}

void serve_pages_only(http_server& server) {
  // One request a connection: pages are polled a few times a minute, and
  // an idle keep-alive client would hold one of the few HTTP threads for
  // httplib's 5 s keep-alive wait. No body is ever read (below): 1 KiB
  // bounds what a request may hold besides its headers.
  server.set_keep_alive_max_count(1);
  server.set_payload_max_length(1024);
  check_on_headers(server, [](const httplib::Request& req, httplib::Response& res) {
    if (const auto why = framing_error(req)) {
      answer_and_close(res, 400, *why + "\n", "text/plain");
      return false;
    }
    if (req.method != "GET" && req.method != "HEAD") {
      res.set_header("Allow", "GET, HEAD");
      answer_and_close(res, 405, "This server answers GET and HEAD only, not " + req.method.substr(0, 16) + ".\n",
                       "text/plain");
      return false;
    }
    return true;
  });
  // A request that did not arrive in time, or too large (headers without
  // end; httplib says 400), is a 408 or a 413.
  server.set_error_handler(httplib::Server::HandlerWithResponse([&server](const httplib::Request&,
                                                                          httplib::Response& res) {
    if (http_server::read_limit_passed()) {
      res.status = 408;
      res.set_content("The request did not arrive within " + server.read_limit_text() + ".\n", "text/plain");
    } else if (http_server::request_too_large()) {
      res.status = 413;
      res.set_content("The request's headers are too large.\n", "text/plain");
    } else {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  }));
}

}  // namespace corolla::api
