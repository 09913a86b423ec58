// actors/corolla.hpp — the one header a program includes to embed corolla's
// actor runtime: start a node, spawn and publish actors, connect to peers,
// message remote actors, watch for peer failures, read link statistics.
// See docs/embedding.md and apps/examples/embed_echo.cpp.
//
//   auto n = corolla::node::start({.listen = "tcp://127.0.0.1:0"});
//   if (!n) { /* corolla::error_message(n.error()) */ }
//   (*n)->publish("doubler", (*n)->system().spawn(doubler));
//   auto peer = (*n)->connect("tcp://127.0.0.1:41234");
//   auto echo = (*n)->remote_actor(*peer, "echo");
//   caf::scoped_actor self{(*n)->system()};
//   self->request(*echo, std::chrono::seconds(5), corolla::remote_message{...}).receive(...);
#pragma once

#include <caf/all.hpp>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "kernels/tensor.hpp"
