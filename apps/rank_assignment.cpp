// apps/rank_assignment.cpp — see rank_assignment.hpp.
#include "apps/rank_assignment.hpp"

#include <algorithm>
#include <stdexcept>

#include "actors/capnp_body.hpp"
#include "net/wire.capnp.h"

namespace corolla::app {

namespace {

/// A job description is a few kilobytes; its limit leaves room for many boundaries.
constexpr std::size_t max_job_bytes = 256 << 10;
constexpr unsigned max_args = 256;

}  // namespace

remote_message assignment_message(const std::string& type, const rank_assignment& a) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::TrainAssign>();
  auto list = r.initArgs(static_cast<unsigned>(a.args.size()));
  for (unsigned i = 0; i < a.args.size(); ++i) list.set(i, a.args[i]);
  r.setJob(a.job);
  r.setRun(a.run);
  remote_message m;
  m.type = type;
  m.body = capnp_body::flat(b);
  return m;
}

caf::expected<rank_assignment> decode_assignment(const remote_message& m) {
  return capnp_body::decode<wire::TrainAssign>(m.body, "TrainAssign", [](wire::TrainAssign::Reader r) {
    rank_assignment out;
    auto args = r.getArgs();
    if (args.size() == 0 || args.size() > max_args)
      throw std::invalid_argument(std::to_string(args.size()) + " arguments");
    for (auto x : args) out.args.push_back(capnp_body::text(x, "argument", 4096));
    out.job = capnp_body::text(r.getJob(), "job", max_job_bytes);
    out.run = r.getRun();
    return out;
  });
}

std::string arg_after(const std::vector<std::string>& args, const std::string& flag) {
  const auto at = std::find(args.begin(), args.end(), flag);
  return at == args.end() || at + 1 == args.end() ? std::string() : *(at + 1);
}

}  // namespace corolla::app
