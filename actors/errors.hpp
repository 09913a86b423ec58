// actors/errors.hpp — the runtime's error codes as caf::error values.
//
// Every error the runtime hands to an actor or returns at the API boundary is
// a caf::error in the category "corolla" whose context is the message
// (code name, text). The code name is what travels on the wire (Envelope
// errorCode), so an error raised on one node keeps its name on the other:
// error_code() of an "unknown_actor" error is "unknown_actor" on both sides.
#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

namespace corolla {

/// Runtime error codes (category "corolla").
enum class errc : std::uint8_t {
  unknown_actor = 1,  ///< the target node has no actor published under that name
  peer_down,          ///< the peer is reported down, or the connection was lost
  not_connected,      ///< no link to that peer (never connected, or still connecting)
  protocol_mismatch,  ///< the hello was refused: incompatible protocol versions
  handshake_timeout,  ///< no answer to the hello within the connect timeout
  remote_error,       ///< the remote actor answered with an error of another code
  bad_message,        ///< a malformed or unexpected message
  send_failed,        ///< the transport refused the message (closed link, full queue)
  invalid_argument,   ///< a bad option, name or endpoint
  already_published,  ///< publish() with a name that is taken
  stopped,            ///< the node is stopping or stopped
  auth_refused,       ///< CurveZMQ: the peer refused our key (allow-list) or we failed its handshake
};

/// The category atom of corolla errors.
inline constexpr caf::atom_value error_category = caf::atom("corolla");

/// Snake-case name of a code ("unknown_actor"), as sent on the wire.
const char* errc_name(errc code);

/// A corolla error with a message for humans.
caf::error make_error(errc code, std::string message);

/// An error received from a peer: `code` is the wire name. Known names map
/// to their errc; others become errc::remote_error keeping `code` as name.
caf::error error_from_wire(const std::string& code, std::string message);

/// Machine-readable name of any error: the corolla code name
/// ("unknown_actor"), CAF's system error name ("request_timeout"), or
/// "<category>:<number>" for other categories; "" for no error.
std::string error_code(const caf::error& e);

/// One line for humans: the message of a corolla error, or a rendering of
/// any other error ("request_timeout"); "" for no error.
std::string error_message(const caf::error& e);
/// The same for the error an expected holds; "" when it holds a value (safe
/// where the text is built either way, as a test framework's message).
template <class T>
std::string error_message(const caf::expected<T>& e) {
  return e ? std::string() : error_message(e.error());
}

/// Renders corolla errors for caf::actor_system::render (registered by the
/// node on its actor system).
std::string render_error(std::uint8_t code, caf::atom_value category, const caf::message& context);

}  // namespace corolla
