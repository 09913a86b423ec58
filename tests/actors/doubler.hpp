// tests/actors/doubler.hpp — a remote actor for the node tests: answers its
// first tensor doubled (and a second one unchanged), with the requester's
// node id as the body.
#pragma once

#include <caf/event_based_actor.hpp>

#include "actors/corolla.hpp"

namespace corolla::testing {

/// Doubles every f32 value of the first tensor; answers "doubled" with the
/// node id the request came from as its body.
inline caf::behavior doubler(caf::event_based_actor*) {
  return {
      [](remote_message& m) -> caf::result<remote_message> {
        if (m.tensors.empty()) return make_error(errc::invalid_argument, "doubler needs a tensor");
        Tensor out = m.tensors[0].clone();
        float* p = out.data<float>();
        for (std::int64_t i = 0; i < out.numel(); ++i) p[i] *= 2;
        remote_message r;
        r.type = "doubled";
        r.body.assign(m.from_node.begin(), m.from_node.end());
        r.tensors = {out};
        if (m.tensors.size() > 1) r.tensors.push_back(m.tensors[1]);
        return r;
      },
  };
}

}  // namespace corolla::testing
