// actors/span_push.hpp — the server-to-server half of a span server
// (actors/span_server.cpp): answers carrying a posted route's trail, the
// push of a step's output to the next hop, the failure notice that ends
// the next hop's wait at once, and the store of pushes that came before
// their step's request. Internal to the span server (docs/protocol.md,
// "Pushed steps" and "Posted steps").
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/response_promise.hpp>

#include "actors/messages.hpp"
#include "actors/span_server_state.hpp"

namespace corolla::span_detail {

/// A reply of `type` with a body and tensors.
remote_message answer(std::string type, std::vector<std::uint8_t> body = {}, std::vector<Tensor> tensors = {});

/// `out` followed by `trail` (a posted route's, span_step::trail), the
/// output int8-compressed on the wire when asked (the trail stays exact).
remote_message with_trail(std::string type, std::vector<std::uint8_t> body, Tensor out, const std::vector<Tensor>& trail,
                          bool compress);

/// Tells the step's next hop that the step failed here (best effort).
void notify_next(span_server_state& st, const span_step& step, const std::string& why);

/// Answers a step with an error, telling its next hop too.
void fail_step(span_server_state& st, const span_step& step, caf::response_promise& rp, caf::error err);

/// Sends `out` (and a posted route's trail) on to the step's next hop.
span_step_done push_on(span_server_state& st, const span_step& step, const Tensor& out, const std::vector<Tensor>& trail);

/// Answers the session's waiting request (if any) with an error and forgets it.
void end_wait(span_server_state& st, const std::string& session, const char* code, const std::string& why);

/// Drops the session's early pushes for steps up to `last_step_id` (all of
/// them with the default).
void drop_early(span_server_state& st, const std::string& session,
                std::uint64_t last_step_id = std::numeric_limits<std::uint64_t>::max());

/// Drops early pushes older than early_push_ttl.
void expire_early(span_server_state& st);

/// Keeps a push that came before its step's request.
void keep_early(span_server_state& st, early_key key, early_push p);

/// The early push filed under `key`, taken out of the store (none: empty).
std::optional<early_push> take_early(span_server_state& st, const early_key& key);

}  // namespace corolla::span_detail
