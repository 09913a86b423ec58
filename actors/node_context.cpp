#include "actors/node_context.hpp"

#include "net/message.hpp"

namespace corolla {

net::hello_info node_context::hello(const std::string& requested_profile) const {
  net::hello_info h;
  h.protocol_version = net::protocol_version;
  h.node_id = node_id;
  h.listen_endpoint = listen_endpoint;
  h.nic_class = settings.nic_class;
  h.capabilities.push_back("int8-tensors");
  if (settings.curve) h.capabilities.push_back("curve");
  if (!requested_profile.empty() && requested_profile != "none")
    h.capabilities.push_back("shape=" + requested_profile);
  h.max_message_bytes = max_message_bytes;
  return h;
}

std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace corolla
