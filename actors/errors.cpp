#include "actors/errors.hpp"

#include <caf/exit_reason.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace corolla {
namespace {

constexpr errc all_codes[] = {
    errc::unknown_actor,    errc::peer_down,   errc::not_connected, errc::protocol_mismatch,
    errc::handshake_timeout, errc::remote_error, errc::bad_message, errc::send_failed,
    errc::invalid_argument, errc::already_published, errc::stopped, errc::auth_refused,
};

/// The (code name, message) context of a corolla error, if it has one.
bool context_strings(const caf::message& context, std::string& code, std::string& text) {
  if (context.size() != 2 || !context.match_elements<std::string, std::string>()) return false;
  code = context.get_as<std::string>(0);
  text = context.get_as<std::string>(1);
  return true;
}

}  // namespace

const char* errc_name(errc code) {
  switch (code) {
    case errc::unknown_actor: return "unknown_actor";
    case errc::peer_down: return "peer_down";
    case errc::not_connected: return "not_connected";
    case errc::protocol_mismatch: return "protocol_mismatch";
    case errc::handshake_timeout: return "handshake_timeout";
    case errc::remote_error: return "remote_error";
    case errc::bad_message: return "bad_message";
    case errc::send_failed: return "send_failed";
    case errc::invalid_argument: return "invalid_argument";
    case errc::already_published: return "already_published";
    case errc::stopped: return "stopped";
    case errc::auth_refused: return "auth_refused";
  }
  return "unknown";
}

caf::error make_error(errc code, std::string message) {
  return caf::error(static_cast<std::uint8_t>(code), error_category,
                    caf::make_message(std::string(errc_name(code)), std::move(message)));
}

caf::error error_from_wire(const std::string& code, std::string message) {
  for (errc c : all_codes) {
    if (code == errc_name(c)) return make_error(c, std::move(message));
  }
  // Keep the peer's own code name: error_code() reports it unchanged.
  return caf::error(static_cast<std::uint8_t>(errc::remote_error), error_category,
                    caf::make_message(code.empty() ? std::string("remote_error") : code,
                                      std::move(message)));
}

std::string error_code(const caf::error& e) {
  if (!e) return "";
  if (e.category() == error_category) {
    std::string code, text;
    if (context_strings(e.context(), code, text)) return code;
    return errc_name(static_cast<errc>(e.code()));
  }
  if (e.category() == caf::atom("system")) return caf::to_string(static_cast<caf::sec>(e.code()));
  if (e.category() == caf::atom("exit")) return caf::to_string(static_cast<caf::exit_reason>(e.code()));
  return caf::to_string(e.category()) + ":" + std::to_string(e.code());
}

std::string error_message(const caf::error& e) {
  if (!e) return "";
  if (e.category() == error_category) {
    std::string code, text;
    if (context_strings(e.context(), code, text)) return text.empty() ? code : text;
    return errc_name(static_cast<errc>(e.code()));
  }
  const bool timeout =
      e.category() == caf::atom("system") && static_cast<caf::sec>(e.code()) == caf::sec::request_timeout;
  // A system error that carries its own sentence ("cannot listen: ...")
  // is that sentence: the code's name in front (cannot_open_port) and the
  // sentence in quotes tell a user nothing more.
  if (!timeout && e.category() == caf::atom("system") && e.context().match_elements<std::string>() &&
      !e.context().get_as<std::string>(0).empty())
    return e.context().get_as<std::string>(0);
  std::string out = error_code(e);
  if (timeout) out = "request timed out";
  if (!e.context().empty()) {
    out.push_back(' ');
    out.append(caf::to_string(e.context()));
  }
  return out;
}

std::string render_error(std::uint8_t code, caf::atom_value category, const caf::message& context) {
  std::string name, text;
  if (context_strings(context, name, text)) return name + ": " + text;
  return errc_name(static_cast<errc>(code));
}

}  // namespace corolla
