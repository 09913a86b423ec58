// actors/swarm_hop_state.hpp — what a swarm session keeps per hop of its
// route, and the helpers the client's files share (private to
// actors/swarm_client.cpp, swarm_session.cpp and swarm_spot_check.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/swarm_client.hpp"
#include "kernels/tensor.hpp"

namespace corolla {

struct swarm_session::hop_state {
  swarm::route_hop hop;
  std::string session;         ///< the session id on hop.server
  std::vector<Tensor> inputs;  ///< every row sent into this span, in position order
  std::int64_t rows = 0;       ///< rows in `inputs`; -1 = not known yet (see pass())
  bool fresh = false;          ///< a replacement whose server cache is still empty
  /// The last hop's answers so far, in position order (a spot check's
  /// history; another hop's are the next hop's inputs), and how many rows
  /// they hold (-1: not known).
  std::vector<Tensor> outputs;
  std::int64_t out_rows = 0;
};

namespace swarm_detail {

/// Rows [0, rows) of the chunks laid end to end, as one [rows, width] tensor.
Tensor concat_rows(const std::vector<Tensor>& chunks, std::int64_t rows, std::int64_t width);

/// Rows [0, rows) of the chunks laid end to end, as the chunks themselves
/// (the last one sliced; no copy).
std::vector<Tensor> first_rows(const std::vector<Tensor>& chunks, std::int64_t rows);

/// A span request of `type` with its body and tensors.
remote_message request_of(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {});

}  // namespace swarm_detail
}  // namespace corolla
