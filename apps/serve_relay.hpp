// apps/serve_relay.hpp — how `corolla serve --no-listen` (a server behind
// NAT) stays reachable: it keeps a connection to a relay (actors/relay.hpp)
// and announces itself as reached through it, moving to another relay when
// that one goes.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "net/server_record.hpp"

namespace corolla {
class node;
namespace net {
class membership;
}
}  // namespace corolla

namespace corolla::app {

/// Whether this listening server can be reached at `endpoint`: asks up to
/// three servers of `model` that offer relaying to dial it back
/// (actors/dialback.hpp). False only on a clear "could not dial"; true when
/// one answered, or when nobody could be asked (the first server of a
/// swarm), with the outcome logged.
bool reachable_from_swarm(node& n, net::membership& members, const std::string& model, int n_blocks,
                          const std::string& endpoint);

/// A --relay entry "HOST:PORT[#KEY]" (a tcp:// prefix may be given) as the
/// endpoint to dial ("tcp://HOST:PORT") and the relay's CurveZMQ key (""
/// without one). Throws std::invalid_argument naming the entry when the
/// endpoint is malformed (net/endpoint.hpp), so serve refuses it before
/// dialling it for 30 s.
std::pair<std::string, std::string> given_relay(const std::string& entry);

class relay_keeper {
 public:
  /// `relays`: "HOST:PORT[#KEY]" given with --relay; then servers of
  /// `model` whose DHT records offer relaying. Of the first few that answer
  /// (relays that went away only when no other does), those not clearly
  /// farther than the nearest (echo round trip under twice its, or within a
  /// millisecond; actors/link_probe.hpp echo_rtt) are alike, and of those
  /// the one that carries the fewest servers of `model` by the DHT's
  /// records is taken, the first when tied.
  relay_keeper(node& n, std::vector<std::string> relays, net::membership* members, std::string model, int n_blocks);

  /// Makes sure `record` names a relay that is up: dials one when there is
  /// none, or when the current one has been down longer than `grace` (its
  /// link reconnects by itself after a short outage). Returns true when
  /// the record changed (to announce again). When no relay answers, the
  /// record keeps the last one and the caller tries again later.
  bool keep(net::server_record& record, std::chrono::milliseconds grace);
  /// Whether a relay has been found.
  bool has_relay() const { return !relay_id_.empty(); }
  const std::string& relay_id() const { return relay_id_; }
  const std::string& relay_endpoint() const { return endpoint_; }

 private:
  struct candidate {
    std::string endpoint, key, id;  ///< id "" when given by address only
  };
  /// Relays to try, in order, and how many servers of the model the DHT
  /// says each relay (by node id) carries: both from one DHT read.
  struct offers {
    std::vector<candidate> relays;
    std::map<std::string, int> carried;
  };
  offers candidates() const;
  /// Relays that answer, up to this many, are measured before one is taken.
  static constexpr std::size_t measured_candidates = 4;

  node& n_;
  std::vector<std::string> given_;
  net::membership* members_;
  std::string model_;
  int n_blocks_;
  std::string relay_id_, endpoint_, key_;
  std::chrono::steady_clock::time_point down_since_{};
  bool down_ = false;
  std::set<std::string> failed_;  ///< endpoints of relays that went away: tried last
};

}  // namespace corolla::app
