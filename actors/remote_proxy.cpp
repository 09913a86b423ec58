#include "actors/remote_proxy.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/link_actor.hpp"
#include "actors/messages.hpp"

namespace corolla {
namespace {

caf::behavior remote_proxy(caf::event_based_actor* self, std::shared_ptr<node_context> ctx,
                           std::string peer, std::string name) {
  self->set_default_handler(caf::drop);
  return {
      [self, ctx, peer, name](remote_message& m) {
        auto link = ctx->directory.route(peer);
        if (!link) {
          auto why = make_error(errc::not_connected, "no link to peer '" + peer + "'");
          auto promise = self->make_response_promise();
          if (promise.async())
            spdlog::warn("dropping a message for {}@{}: no link to the peer", name, peer);
          else
            promise.deliver(std::move(why));
          return;
        }
        self->delegate(link, tx_atom::value, name, std::move(m));
      },
      // The mailbox is FIFO: by the time this is answered, every earlier
      // message is in its link's mailbox.
      [](flush_atom) { return flush_atom::value; },
  };
}

}  // namespace

caf::actor spawn_remote_proxy(const std::shared_ptr<node_context>& ctx, std::string peer,
                              std::string name) {
  return ctx->system.spawn(remote_proxy, ctx, std::move(peer), std::move(name));
}

}  // namespace corolla
