// Whether a listening node can be reached (actors/dialback.hpp).
#include "actors/dialback.hpp"

#include <deque>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "actors/capnp_body.hpp"
#include "actors/errors.hpp"
#include "actors/link_actor.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/node_context.hpp"
#include "net/wire.capnp.h"

namespace corolla {
namespace {

using clock = std::chrono::steady_clock;
constexpr auto dial_timeout = std::chrono::seconds(3);

std::vector<std::uint8_t> encode_dialback(const std::string& endpoint) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::DialBack>().setEndpoint(endpoint);
  return capnp_body::flat(b);
}

caf::expected<std::string> decode_dialback(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::DialBack>(body, "DialBack", [](wire::DialBack::Reader r) {
    return capnp_body::text(r.getEndpoint(), "endpoint", 256);
  });
}

std::vector<std::uint8_t> encode_result(const reach_result& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::DialBackResult>();
  w.setReached(r.reached);
  w.setReason(r.reason);
  return capnp_body::flat(b);
}

caf::expected<reach_result> decode_result(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::DialBackResult>(body, "DialBackResult", [](wire::DialBackResult::Reader r) {
    return reach_result{r.getReached(), capnp_body::text(r.getReason(), "reason", 1024)};
  });
}

remote_message result_message(const reach_result& r) {
  remote_message m;
  m.type = reach_msg::result;
  m.body = encode_result(r);
  return m;
}

struct reach_state {
  // Not an aggregate: CAF constructs a state from the actor pointer when it
  // can, and C++20 would aggregate-initialise `busy` from it (true).
  reach_state() = default;
  bool busy = false;
  std::deque<clock::time_point> recent;  ///< dial-backs in the last minute
  static inline const char* name = "corolla.reach";
};

caf::behavior reach(caf::stateful_actor<reach_state>* self, std::shared_ptr<node_context> ctx) {
  self->set_default_handler(caf::drop);
  return {
      [self, ctx](remote_message& m) -> caf::result<remote_message> {
        if (m.type != reach_msg::dialback)
          return make_error(errc::bad_message, "the reach actor answers '" + std::string(reach_msg::dialback) +
                                                   "', not '" + m.type + "'");
        if (m.from_node.empty()) return make_error(errc::invalid_argument, "a dial-back is asked for over a link");
        auto endpoint = decode_dialback(m.body);
        if (!endpoint) return endpoint.error();
        auto& st = self->state;
        const auto now = clock::now();
        while (!st.recent.empty() && now - st.recent.front() > std::chrono::minutes(1)) st.recent.pop_front();
        if (st.busy || st.recent.size() >= static_cast<std::size_t>(dialback_per_minute))
          return make_error(errc::invalid_argument, "node " + ctx->node_id + " is busy with other dial-backs; ask later");
        if (ctx->stopping) return make_error(errc::stopped, "node " + ctx->node_id + " is stopping");
        link_args args;
        args.connect_timeout = dial_timeout;
        auto dialled = dial_link(ctx, *endpoint, "", std::move(args));
        if (!dialled) return dialled.error();
        st.busy = true;
        st.recent.push_back(now);
        auto link = *dialled;
        auto rp = self->make_response_promise();
        const std::string asker = m.from_node, where = *endpoint;
        auto done = [self, link, rp, where](reach_result r) mutable {
          self->state.busy = false;
          caf::anon_send(link, close_atom::value, std::string("dial-back done"));
          spdlog::debug("reach: dial-back of {}: {}", where, r.reached ? "answered" : r.reason);
          rp.deliver(result_message(r));
        };
        self->request(link, dial_timeout + std::chrono::seconds(1), hello_atom::value)
            .then(
                [done, asker, where](const std::string& peer) mutable {
                  if (peer == asker)
                    done({true, ""});
                  else
                    done({false, "node " + peer + " answered at " + where + ", not " + asker});
                },
                [done, where](caf::error& e) mutable { done({false, "no hello from " + where + ": " + error_message(e)}); });
        return caf::delegated<remote_message>{};
      },
  };
}

}  // namespace

caf::actor spawn_reach_actor(caf::actor_system& system, std::shared_ptr<node_context> ctx) {
  return system.spawn(reach, std::move(ctx));
}

caf::expected<reach_result> request_dialback(node& n, const std::string& helper, const std::string& endpoint,
                                             std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = reach_msg::dialback;
  m.body = encode_dialback(endpoint);
  auto r = n.request(helper, reach_actor_name, std::move(m), timeout);
  if (!r) return r.error();
  if (r->type != reach_msg::result)
    return make_error(errc::bad_message, "the reach actor of " + helper + " answered '" + r->type + "'");
  return decode_result(r->body);
}

}  // namespace corolla
