#include "faultlab/scenario.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "net/shaping.hpp"

namespace corolla::faultlab {

namespace {

[[noreturn]] void fail(const std::string& origin, const toml::node* at, const std::string& what) {
  std::string loc = origin;
  if (at && at->source().begin.line > 0) loc += ":" + std::to_string(at->source().begin.line);
  throw std::invalid_argument(loc + ": " + what);
}

/// The latest moment in seconds a fault may name: a week, as
/// `train --timeout-s` allows.
constexpr double max_moment_s = 7 * 24 * 3600.0;

/// A non-negative whole number in `text` after `prefix`, or -1.
long whole_after(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) != 0) return -1;
  const std::string rest = text.substr(prefix.size());
  if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos || rest.size() > 9) return -1;
  return std::stol(rest);
}

/// The value of `flag` in command-line words ("--steps 24" or
/// "--steps=24"), -1 when not given or not a whole number.
long flag_value(const std::string& words, const std::string& flag) {
  std::istringstream in(words);
  for (std::string w; in >> w;) {
    std::string value;
    if (w == flag) {
      if (!(in >> value)) return -1;
    } else if (w.rfind(flag + "=", 0) == 0) {
      value = w.substr(flag.size() + 1);
    } else {
      continue;
    }
    return whole_after(value, "");
  }
  return -1;
}

class reader {
 public:
  reader(const toml::table& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  scenario read() {
    only(root_, "", {"name", "seed", "swarm", "train", "fault", "expect"});
    scenario s;
    s.name = text(root_, "name", "", "unnamed scenario");
    s.seed = static_cast<std::uint64_t>(integer(root_, "seed", "", 1, 0));
    if (const toml::table* t = table(root_, "swarm", "")) s.swarm = read_swarm(*t);
    if (const toml::table* t = table(root_, "train", "")) s.train = read_train(*t);
    if (s.swarm.has_value() == s.train.has_value())
      fail(origin_, nullptr, "give exactly one of [swarm] and [train]");
    if (const toml::node* n = root_.get("fault")) {
      const toml::array* faults = n->as_array();
      if (!faults) fail(origin_, n, "'fault' must be an array of tables ([[fault]])");
      for (std::size_t i = 0; i < faults->size(); ++i) {
        const toml::table* f = faults->get(i)->as_table();
        if (!f) fail(origin_, faults->get(i), "each [[fault]] must be a table");
        s.faults.push_back(read_fault(*f, "fault[" + std::to_string(i) + "].", s));
      }
      for (std::size_t i = 0; i < faults->size(); ++i)
        check_reach(s, s.faults[i], *faults->get(i)->as_table(), "fault[" + std::to_string(i) + "].");
    }
    if (const toml::table* t = table(root_, "expect", "")) {
      only(*t, "expect.", {"same_output_as_reference", "same_losses_as_reference", "max_stall_s", "wrong_servers_caught",
                             "every_fault_hits"});
      s.expect.same_output_as_reference = boolean(*t, "same_output_as_reference", "expect.", false);
      s.expect.same_losses_as_reference = boolean(*t, "same_losses_as_reference", "expect.", false);
      s.expect.max_stall_s = number(*t, "max_stall_s", "expect.", 0);
      s.expect.wrong_servers_caught = boolean(*t, "wrong_servers_caught", "expect.", false);
      s.expect.every_fault_hits = boolean(*t, "every_fault_hits", "expect.", true);
      if (s.expect.wrong_servers_caught && !s.swarm)
        fail(origin_, t, "expect.wrong_servers_caught is for [swarm] scenarios (their client runs the spot checks)");
      if (s.expect.same_output_as_reference && !s.swarm)
        fail(origin_, t, "expect.same_output_as_reference is for [swarm] scenarios (training has same_losses_as_reference)");
      if (s.expect.same_losses_as_reference && !s.train)
        fail(origin_, t, "expect.same_losses_as_reference is for [train] scenarios (a swarm has same_output_as_reference)");
    }
    return s;
  }

 private:
  swarm_job read_swarm(const toml::table& t) {
    only(t, "swarm.", {"model", "servers", "client", "link", "relays", "nat"});
    swarm_job j;
    j.model = text(t, "model", "swarm.", "");
    if (j.model.empty()) fail(origin_, &t, "swarm.model is required (a HuggingFace model directory)");
    j.link = text(t, "link", "swarm.", "");
    if (!j.link.empty()) try {
        net::parse_link_profile(j.link);
      } catch (const std::invalid_argument& e) {
        fail(origin_, t.get("link"), std::string("swarm.link: ") + e.what());
      }
    const toml::array* servers = t.get("servers") ? t.get("servers")->as_array() : nullptr;
    if (!servers || servers->empty()) fail(origin_, &t, "swarm.servers is required: the blocks of each server, e.g. [\"0:2\", \"2:4\"]");
    for (const toml::node& n : *servers) {
      const auto v = n.value<std::string>();
      if (!v) fail(origin_, &n, "swarm.servers holds strings \"A:B\"");
      try {
        j.servers.push_back(parse_blocks(*v));
      } catch (const std::invalid_argument& e) {
        fail(origin_, &n, std::string("swarm.servers: ") + e.what());
      }
    }
    j.relays = static_cast<int>(integer(t, "relays", "swarm.", 0, 0));
    if (const toml::node* n = t.get("nat")) {
      const toml::array* list = n->as_array();
      if (!list) fail(origin_, n, "swarm.nat holds the indices of the servers behind NAT, e.g. [1]");
      for (const toml::node& k : *list) {
        const auto v = k.value<std::int64_t>();
        if (!v || *v < 0 || *v >= static_cast<std::int64_t>(j.servers.size()))
          fail(origin_, &k, "swarm.nat: servers are numbered from 0 to " + std::to_string(j.servers.size() - 1));
        j.nat.push_back(static_cast<int>(*v));
      }
      if (!j.nat.empty() && j.relays == 0)
        fail(origin_, n, "swarm.nat: servers behind NAT need a relay (swarm.relays = N)");
    }
    if (const toml::table* c = table(t, "client", "swarm.")) {
      only(*c, "swarm.client.", {"prompt_ids", "new_tokens", "spot_checks", "spot_check_probation"});
      j.spot_checks = number(*c, "spot_checks", "swarm.client.", 0.05);
      if (j.spot_checks < 0 || j.spot_checks > 1)
        fail(origin_, c->get("spot_checks"), "swarm.client.spot_checks is a fraction of steps, from 0 to 1");
      j.spot_check_probation = static_cast<int>(integer(*c, "spot_check_probation", "swarm.client.", 4, 0));
      if (const toml::node* p = c->get("prompt_ids")) {
        const toml::array* ids = p->as_array();
        if (!ids || ids->empty()) fail(origin_, p, "swarm.client.prompt_ids must be a non-empty array of token ids");
        for (const toml::node& id : *ids) {
          const auto v = id.value<std::int64_t>();
          if (!v || *v < 0 || *v > INT32_MAX) fail(origin_, &id, "swarm.client.prompt_ids holds token ids >= 0");
          j.prompt_ids.push_back(static_cast<std::int32_t>(*v));
        }
      }
      j.new_tokens = static_cast<int>(integer(*c, "new_tokens", "swarm.client.", 32, 1));
    }
    if (j.prompt_ids.empty()) j.prompt_ids = {1, 2, 3};
    return j;
  }

  train_job read_train(const toml::table& t) {
    only(t, "train.", {"model", "data", "args", "layout", "elastic", "checkpoint_every"});
    train_job j;
    j.model = text(t, "model", "train.", "");
    j.data = text(t, "data", "train.", "");
    if (j.model.empty() || j.data.empty()) fail(origin_, &t, "train.model and train.data are required");
    j.args = text(t, "args", "train.", "");
    j.layout = text(t, "layout", "train.", "--pp 2 --dp 2");
    j.elastic = boolean(t, "elastic", "train.", true);
    j.checkpoint_every = static_cast<int>(integer(t, "checkpoint_every", "train.", 5, 0));
    // Flags faultlab sets itself, as "--flag value" or "--flag=value".
    const std::set<std::string> owned = {"--json",           "--elastic",          "--model", "--data",
                                         "--checkpoint-dir", "--checkpoint-every", "--resume"};
    for (const char* key : {"args", "layout"}) {
      std::istringstream words(key == std::string("args") ? j.args : j.layout);
      for (std::string w; words >> w;)
        if (const std::string flag = w.substr(0, w.find('=')); owned.count(flag))
          fail(origin_, t.get(key), "train." + std::string(key) + " must not hold " + flag + " (faultlab sets it)");
    }
    return j;
  }

  fault read_fault(const toml::table& t, const std::string& where, const scenario& s) {
    only(t, where, {"at", "do", "target", "blocks", "profile", "as", "message"});
    fault f;
    try {
      f.at = parse_moment(text(t, "at", where, ""));
      f.what = parse_action(text(t, "do", where, ""));
      f.whom = parse_target(text(t, "target", where, f.what == action::join ? "" : "random server"));
    } catch (const std::invalid_argument& e) {
      fail(origin_, &t, where + " " + e.what());
    }
    f.blocks = text(t, "blocks", where, "");
    f.profile = text(t, "profile", where, "");
    f.as = text(t, "as", where, "");
    f.message = text(t, "message", where, f.what == action::lose ? "train.act" : "");
    if (f.what == action::lose) {
      static const std::set<std::string> lost{"train.act", "train.grad", "train.rs", "train.ag", "any"};
      if (!lost.count(f.message))
        fail(origin_, t.get("message"),
             where + "message: a lose drops \"train.act\", \"train.grad\", \"train.rs\", \"train.ag\" or \"any\", "
                     "not \"" + f.message + "\"");
    } else if (!f.message.empty()) {
      fail(origin_, t.get("message"), where + "message is only for do = \"lose\"");
    }
    if (!f.as.empty() && !(f.what == action::join && s.train))
      fail(origin_, t.get("as"), where + "as is only for do = \"join\" in a training job");
    if (f.as.find_first_of(" \t\n,") != std::string::npos)
      fail(origin_, t.get("as"), where + "as: a worker name without spaces or commas, e.g. \"n1/0\"");
    if (f.what == action::throttle) {
      if (f.profile.empty()) fail(origin_, &t, where + "profile: a throttle needs the link profile, e.g. \"bw=20Mbit,lat=40ms\"");
      try {
        net::parse_link_profile(f.profile);
      } catch (const std::invalid_argument& e) {
        fail(origin_, t.get("profile"), where + "profile: " + e.what());
      }
    } else if (!f.profile.empty()) {
      fail(origin_, t.get("profile"), where + "profile is only for do = \"throttle\"");
    }
    const bool train = s.train.has_value();
    if (f.at.k == moment::kind::token && train) fail(origin_, &t, where + "at: a training job counts steps, not tokens");
    if (f.at.k == moment::kind::step && !train) fail(origin_, &t, where + "at: a swarm counts tokens, not steps");
    using tk = target::kind;
    if (f.what == action::join && train) {
      // A worker offered to the elastic launcher (corolla train --join).
      if (!f.blocks.empty()) fail(origin_, t.get("blocks"), where + "blocks: a training job's join is a whole worker");
      if (!s.train->elastic) fail(origin_, &t, where + "do: a join needs an elastic job (elastic = true)");
      f.whom = {};
      return f;
    }
    if (f.what == action::join) {
      if (f.blocks.empty()) fail(origin_, &t, where + "blocks: a join needs the new server's blocks, \"A:B\"");
      try {
        parse_blocks(f.blocks);
      } catch (const std::invalid_argument& e) {
        fail(origin_, t.get("blocks"), where + "blocks: " + e.what());
      }
      f.whom = {};
      return f;
    }
    if (!f.blocks.empty()) fail(origin_, t.get("blocks"), where + "blocks is only for do = \"join\"");
    if (train) {
      if (f.whom.k == tk::random_server) f.whom.k = tk::random_rank;  // the default target
      if (f.whom.k == tk::launcher) {
        if (f.what != action::kill)
          fail(origin_, &t, where + "do: the launcher is only killed (\"kill\"); its ranks take the other faults");
        if (!s.train->elastic)
          fail(origin_, &t, where + "target: only an elastic job (elastic = true) outlives its launcher");
        return f;
      }
      if (f.whom.k != tk::rank && f.whom.k != tk::random_rank)
        fail(origin_, &t, where + "target: a training job's faults hit \"rank K\", \"random rank\" or \"launcher\"");
      if (f.what == action::restart)
        fail(origin_, &t, where + "do: restart is for swarm servers; a lost rank is replaced by --elastic's re-plan");
      if (f.what == action::corrupt)
        fail(origin_, &t, where + "do: corrupt is for swarm servers (the client's spot checks catch them); training "
                              "ranks have no such check yet");
    } else {
      if (f.what == action::hang)
        fail(origin_, &t, where + "do: hang is for training ranks (a server's hang is stop: its requests time out)");
      if (f.what == action::lose)
        fail(origin_, &t, where + "do: lose is for training ranks (a swarm client's lost request times out)");
      if (f.whom.k == tk::rank || f.whom.k == tk::random_rank || f.whom.k == tk::launcher)
        fail(origin_, &t,
             where + "target: a swarm's faults hit \"server K\", \"route.hop K\", \"random server\" or \"relay K\"");
      if (f.whom.k == tk::server && f.whom.index >= static_cast<int>(s.swarm->servers.size()))
        fail(origin_, &t, where + "target: server " + std::to_string(f.whom.index) + " does not exist (there are " +
                              std::to_string(s.swarm->servers.size()) + ", from 0)");
      if (f.whom.k == tk::relay) {
        if (f.whom.index >= s.swarm->relays)
          fail(origin_, &t, where + "target: relay " + std::to_string(f.whom.index) + " does not exist (swarm.relays = " +
                                std::to_string(s.swarm->relays) + ")");
        if (f.what == action::restart)
          fail(origin_, &t, where + "do: a relay is not restarted (a new process listens on a port its servers do not "
                                "know); kill it, or stop and resume it");
        if (f.what == action::corrupt) fail(origin_, &t, where + "do: corrupt is for servers; a relay computes nothing");
      }
    }
    return f;
  }

  /// A fault the job can never reach: a moment after its end, or a target
  /// it never has. What only the run can tell (a rank gone after a
  /// re-plan, the route's length) is the verdict's every_fault_hits.
  void check_reach(const scenario& s, const fault& f, const toml::table& t, const std::string& where) {
    const auto joins = std::count_if(s.faults.begin(), s.faults.end(),
                                     [](const fault& g) { return g.what == action::join; });
    if (s.swarm) {
      const swarm_job& j = *s.swarm;
      if (f.at.k == moment::kind::token && f.at.value > j.new_tokens)
        fail(origin_, t.get("at"), where + "at: " + to_string(f.at) + " is never reached: the client generates " +
                                       std::to_string(j.new_tokens) + " tokens (swarm.client.new_tokens)");
      // A route has at most one hop a server; joined servers add theirs.
      const auto servers = static_cast<long>(j.servers.size()) + joins;
      if (f.whom.k == target::kind::route_hop && f.whom.index >= servers)
        fail(origin_, t.get("target"), where + "target: " + to_string(f.whom) + " is never on a route: the swarm has " +
                                           std::to_string(servers) + " server" + (servers == 1 ? "" : "s") +
                                           " at most (hops count from 0)");
      return;
    }
    const train_job& j = *s.train;
    const std::string words = j.args + " " + j.layout;
    if (const long steps = flag_value(words, "--steps"); steps >= 0 && f.at.k == moment::kind::step && f.at.value > steps)
      fail(origin_, t.get("at"), where + "at: " + to_string(f.at) + " is never reached: the job runs " +
                                     std::to_string(steps) + " steps (--steps in train.args)");
    if (f.whom.k != target::kind::rank || words.find("--cluster") != std::string::npos) return;
    // A kill, stop or resume reaches only the launcher's own rank processes
    // (a joined worker's are its children); the faults sent to a rank's
    // control actor reach a joined worker's ranks too, whose numbers only
    // the run knows.
    const bool signal = f.what == action::kill || f.what == action::stop || f.what == action::resume;
    if (!signal && joins > 0) return;
    const long pp = std::max(1L, flag_value(words, "--pp")), dp = std::max(1L, flag_value(words, "--dp"));
    if (f.whom.index >= pp * dp)
      fail(origin_, t.get("target"), where + "target: " + to_string(f.whom) + " does not exist: the layout has " +
                                         std::to_string(pp * dp) + " rank" + (pp * dp == 1 ? "" : "s") +
                                         " (from 0)");
  }

  void only(const toml::table& t, const std::string& where, std::set<std::string> keys) {
    for (const auto& [k, v] : t)
      if (!keys.count(std::string(k.str())))
        fail(origin_, &v, "unknown key '" + where + std::string(k.str()) + "'");
  }
  const toml::table* table(const toml::table& t, const char* key, const std::string& where) {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->as_table()) fail(origin_, n, "'" + where + key + "' must be a table");
    return n->as_table();
  }
  std::string text(const toml::table& t, const char* key, const std::string& where, const std::string& fallback) {
    const toml::node* n = t.get(key);
    if (!n) return fallback;
    const auto v = n->value<std::string>();
    if (!v) fail(origin_, n, "'" + where + key + "' must be a string");
    return *v;
  }
  bool boolean(const toml::table& t, const char* key, const std::string& where, bool fallback) {
    const toml::node* n = t.get(key);
    if (!n) return fallback;
    const auto v = n->value<bool>();
    if (!v) fail(origin_, n, "'" + where + key + "' must be true or false");
    return *v;
  }
  double number(const toml::table& t, const char* key, const std::string& where, double fallback) {
    const toml::node* n = t.get(key);
    if (!n) return fallback;
    const auto v = n->value<double>();
    if (!v || !std::isfinite(*v) || *v < 0) fail(origin_, n, "'" + where + key + "' must be a number >= 0");
    return *v;
  }
  std::int64_t integer(const toml::table& t, const char* key, const std::string& where, std::int64_t fallback,
                       std::int64_t min) {
    const toml::node* n = t.get(key);
    if (!n) return fallback;
    const auto v = n->value<std::int64_t>();
    if (!v || *v < min) fail(origin_, n, "'" + where + key + "' must be a whole number >= " + std::to_string(min));
    return *v;
  }

  const toml::table& root_;
  std::string origin_;
};

}  // namespace

moment parse_moment(const std::string& text) {
  if (const long n = whole_after(text, "token "); n >= 0) return {moment::kind::token, double(n)};
  if (const long n = whole_after(text, "step "); n >= 0) return {moment::kind::step, double(n)};
  if (text.size() > 1 && text.back() == 's') {
    try {
      std::size_t used = 0;
      const double s = std::stod(text.substr(0, text.size() - 1), &used);
      if (used == text.size() - 1 && std::isfinite(s) && s >= 0) {
        if (s > max_moment_s)
          throw std::invalid_argument("at: '" + text + "' is more than a week (604800s) after the start");
        return {moment::kind::seconds, s};
      }
    } catch (const std::exception&) {
    }
  }
  throw std::invalid_argument("at: '" + text + "' is not \"token N\", \"step N\" or seconds such as \"2.5s\"");
}

std::string to_string(const moment& m) {
  // The shortest digits that read back as the same double, never in
  // exponent form: "token 1000000", not the stream's "token 1e+06" that
  // parse_moment refuses. 512 bytes hold any finite double written out.
  char digits[512];
  const auto written = std::to_chars(digits, digits + sizeof digits, m.value, std::chars_format::fixed);
  const std::string value = written.ec == std::errc() ? std::string(digits, written.ptr) : "?";
  if (m.k == moment::kind::token) return "token " + value;
  if (m.k == moment::kind::step) return "step " + value;
  return value + "s";
}

action parse_action(const std::string& text) {
  if (text == "kill") return action::kill;
  if (text == "stop") return action::stop;
  if (text == "resume") return action::resume;
  if (text == "restart") return action::restart;
  if (text == "join") return action::join;
  if (text == "throttle") return action::throttle;
  if (text == "heal") return action::heal;
  if (text == "partition") return action::partition;
  if (text == "corrupt") return action::corrupt;
  if (text == "hang") return action::hang;
  if (text == "lose") return action::lose;
  throw std::invalid_argument("do: '" + text +
                              "' is not one of kill, stop, resume, restart, join, throttle, partition, heal, corrupt, "
                              "hang, lose");
}

const char* to_string(action a) {
  switch (a) {
    case action::kill: return "kill";
    case action::stop: return "stop";
    case action::resume: return "resume";
    case action::restart: return "restart";
    case action::join: return "join";
    case action::throttle: return "throttle";
    case action::heal: return "heal";
    case action::partition: return "partition";
    case action::corrupt: return "corrupt";
    case action::hang: return "hang";
    case action::lose: return "lose";
  }
  return "?";
}

target parse_target(const std::string& text) {
  if (text.empty()) return {};
  if (text == "random server") return {target::kind::random_server, 0};
  if (text == "random rank") return {target::kind::random_rank, 0};
  if (text == "launcher") return {target::kind::launcher, 0};
  if (const long n = whole_after(text, "server "); n >= 0) return {target::kind::server, int(n)};
  if (const long n = whole_after(text, "rank "); n >= 0) return {target::kind::rank, int(n)};
  if (const long n = whole_after(text, "route.hop "); n >= 0) return {target::kind::route_hop, int(n)};
  if (const long n = whole_after(text, "relay "); n >= 0) return {target::kind::relay, int(n)};
  throw std::invalid_argument("target: '" + text +
                              "' is not \"server K\", \"rank K\", \"route.hop K\", \"random server\", \"random rank\", "
                              "\"relay K\" or \"launcher\"");
}

std::string to_string(const target& t) {
  switch (t.k) {
    case target::kind::server: return "server " + std::to_string(t.index);
    case target::kind::rank: return "rank " + std::to_string(t.index);
    case target::kind::route_hop: return "route.hop " + std::to_string(t.index);
    case target::kind::random_server: return "random server";
    case target::kind::random_rank: return "random rank";
    case target::kind::relay: return "relay " + std::to_string(t.index);
    case target::kind::launcher: return "launcher";
    case target::kind::none: return "";
  }
  return "";
}

std::pair<int, int> parse_blocks(const std::string& text) {
  const auto colon = text.find(':');
  const long a = colon == std::string::npos ? -1 : whole_after(text.substr(0, colon), "");
  const long b = colon == std::string::npos ? -1 : whole_after(text.substr(colon + 1), "");
  if (a < 0 || b <= a) throw std::invalid_argument("'" + text + "' is not blocks \"A:B\" with A < B");
  return {int(a), int(b)};
}

void check_against_model(const scenario& s, int n_layers, int vocab_size, int max_positions,
                         const std::string& origin) {
  if (!s.swarm) return;
  const swarm_job& j = *s.swarm;
  const auto blocks = [](std::pair<int, int> b) {
    return "\"" + std::to_string(b.first) + ":" + std::to_string(b.second) + "\"";
  };
  std::vector<bool> held(static_cast<std::size_t>(n_layers), false);
  for (const auto& b : j.servers) {
    if (b.second > n_layers)
      throw std::invalid_argument(origin + ": swarm.servers: " + blocks(b) + " runs past the model's " +
                                  std::to_string(n_layers) + " blocks");
    for (int k = b.first; k < b.second; ++k) held[static_cast<std::size_t>(k)] = true;
  }
  for (int k = 0; k < n_layers; ++k)
    if (!held[static_cast<std::size_t>(k)])
      throw std::invalid_argument(origin + ": swarm.servers: no server holds block " + std::to_string(k) +
                                  " of the model's " + std::to_string(n_layers) + " (the client could not generate)");
  for (std::size_t i = 0; i < s.faults.size(); ++i)
    if (const fault& f = s.faults[i]; f.what == action::join && parse_blocks(f.blocks).second > n_layers)
      throw std::invalid_argument(origin + ": fault[" + std::to_string(i) + "].blocks: " +
                                  blocks(parse_blocks(f.blocks)) + " runs past the model's " +
                                  std::to_string(n_layers) + " blocks");
  for (std::int32_t id : j.prompt_ids)
    if (id >= vocab_size)
      throw std::invalid_argument(origin + ": swarm.client.prompt_ids: " + std::to_string(id) +
                                  " is not a token of the model (vocab_size " + std::to_string(vocab_size) + ")");
  if (const long long n = static_cast<long long>(j.prompt_ids.size()) + j.new_tokens; n > max_positions)
    throw std::invalid_argument(origin + ": swarm.client.new_tokens: the prompt's " +
                                std::to_string(j.prompt_ids.size()) + " ids and " + std::to_string(j.new_tokens) +
                                " new tokens pass the model's context of " + std::to_string(max_positions));
}

scenario parse_scenario(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument(origin + ":" + std::to_string(e.source().begin.line) + ": " +
                                std::string(e.description()));
  }
  return reader(root, origin).read();
}

}  // namespace corolla::faultlab
