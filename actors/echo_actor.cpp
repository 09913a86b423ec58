#include "actors/echo_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/result.hpp>

#include "actors/errors.hpp"
#include "actors/messages.hpp"

namespace corolla {
namespace {

caf::behavior echo(caf::event_based_actor* self) {
  self->set_default_handler(caf::drop);
  return {
      [](remote_message& m) -> caf::result<remote_message> {
        if (m.type != "echo")
          return make_error(errc::bad_message, "the echo actor answers type 'echo', not '" + m.type + "'");
        remote_message reply;
        reply.type = "echo";
        reply.body = std::move(m.body);
        // Tensors arrive decoded (int8 wire tensors as f32): echo them raw.
        reply.tensors = std::move(m.tensors);
        return reply;
      },
  };
}

}  // namespace

caf::actor spawn_echo_actor(caf::actor_system& system) { return system.spawn(echo); }

}  // namespace corolla
