// model/server_state.hpp — a swarm server's life cycle as it announces it:
// what net/'s DHT records carry and what schedule/'s routing and block
// selection read. One type for both, in model/, the layer below them.
#pragma once

#include <cstdint>

namespace corolla {

/// A server's announced state (Petals: JOINING counts for balancing,
/// clients route only through ONLINE; OFFLINE = leaving, route elsewhere
/// now). The values are the records' wire form ("st").
enum class server_state : std::uint8_t {
  joining = 0,  ///< announced, loading its blocks: counts for balancing, not for routing
  online = 1,   ///< serving: counts for balancing and routing
  offline = 2,  ///< left gracefully (or is leaving): never routed to, ignored by every algorithm
};

/// "JOINING", "ONLINE", "OFFLINE".
inline const char* to_string(server_state s) {
  switch (s) {
    case server_state::joining: return "JOINING";
    case server_state::online: return "ONLINE";
    case server_state::offline: return "OFFLINE";
  }
  return "UNKNOWN";
}

}  // namespace corolla
