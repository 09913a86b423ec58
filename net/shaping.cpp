// net/shaping.cpp — link profiles (parsing, description) and the sender-side
// timing model that emulates them (docs/protocol.md, "Link shaping").
#include "net/shaping.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace corolla::net {

namespace {

struct named_profile {
  const char* name;
  double bandwidth_bps, latency_s, jitter_s, loss;
};

// One-way figures; RTT is twice the latency. Documented in docs/protocol.md.
constexpr std::array<named_profile, 6> named_profiles{{
    {"none", 0, 0, 0, 0},
    {"ib", 200e9, 1e-6, 0, 0},                  // HDR InfiniBand, one switch hop
    {"roce", 100e9, 3e-6, 0, 0},                // 100 GbE RoCE v2
    {"ethernet", 10e9, 25e-6, 0, 0},            // 10 GbE with a kernel TCP stack
    {"wan", 1e9, 2.5e-3, 0.2e-3, 0},            // 1 Gbit/s metro link, 5 ms RTT
    {"consumer", 100e6, 50e-3, 2e-3, 0.001},    // home broadband, 100 ms RTT
}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

[[noreturn]] void bad(std::string_view part, const std::string& why) {
  throw std::invalid_argument("link profile: '" + std::string(part) + "': " + why);
}

/// Splits "100Mbit" into 100 and "Mbit"; the number must be finite and >= 0.
double leading_number(std::string_view value, std::string_view part, std::string_view& unit) {
  value = trim(value);
  double v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end == value.data()) bad(part, "expected a number");
  if (!std::isfinite(v) || v < 0) bad(part, "the number must be finite and not negative");
  unit = trim(std::string_view(end, static_cast<std::size_t>(value.data() + value.size() - end)));
  return v;
}

double parse_bandwidth(std::string_view value, std::string_view part) {
  std::string_view unit;
  const double v = leading_number(value, part, unit);
  if (unit.find('B') != std::string_view::npos)
    bad(part, "byte units are not accepted; give bits per second (bit, Kbit, Mbit, Gbit)");
  std::string u = lower(unit);
  if (u.size() > 2 && u.compare(u.size() - 2, 2, "/s") == 0) u.resize(u.size() - 2);
  static constexpr std::array<std::pair<const char*, double>, 9> units{{{"bit", 1},
                                                                        {"bps", 1},
                                                                        {"kbit", 1e3},
                                                                        {"kbps", 1e3},
                                                                        {"mbit", 1e6},
                                                                        {"mbps", 1e6},
                                                                        {"gbit", 1e9},
                                                                        {"gbps", 1e9},
                                                                        {"tbit", 1e12}}};
  for (const auto& [name, scale] : units)
    if (u == name) return v * scale;
  bad(part, unit.empty() ? "bandwidth needs a unit (bit, Kbit, Mbit, Gbit; or kbps, Mbps, Gbps)"
                         : "unknown bandwidth unit '" + std::string(unit) +
                               "' (use bit, Kbit, Mbit, Gbit; or kbps, Mbps, Gbps)");
}

double parse_duration(std::string_view value, std::string_view part) {
  std::string_view unit;
  const double v = leading_number(value, part, unit);
  const std::string u = lower(unit);
  double s = 0;
  if (u == "ns")
    s = v * 1e-9;
  else if (u == "us")
    s = v * 1e-6;
  else if (u == "ms")
    s = v * 1e-3;
  else if (u == "s")
    s = v;
  else
    bad(part, unit.empty() ? "a time needs a unit (us, ms, s)"
                           : "unknown time unit '" + std::string(unit) + "' (use us, ms, s)");
  // Delays are scheduled as integer nanoseconds: past this they would wrap
  // and mean nothing (no link waits an hour for a message anyway).
  if (s > 3600) bad(part, "a time of at most 1 hour (3600s)");
  return s;
}

double parse_loss(std::string_view value, std::string_view part) {
  std::string_view unit;
  double v = leading_number(value, part, unit);
  if (unit == "%") {
    v /= 100;
  } else if (!unit.empty()) {
    bad(part, "loss is a percentage ('0.1%') or a fraction ('0.001')");
  }
  if (v > 1) bad(part, "loss cannot exceed 100%");
  return v;
}

/// "1 Gbit/s", "100 Mbit/s", "2.5 Gbit/s".
std::string format_rate(double bps) {
  const char* unit = "bit/s";
  double v = bps;
  if (bps >= 1e9) {
    v = bps / 1e9, unit = "Gbit/s";
  } else if (bps >= 1e6) {
    v = bps / 1e6, unit = "Mbit/s";
  } else if (bps >= 1e3) {
    v = bps / 1e3, unit = "Kbit/s";
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g %s", v, unit);
  return buf;
}

/// "2.5 ms", "0.2 ms", "25 us", "1.5 s" (microseconds below 0.1 ms).
std::string format_time(double s) {
  char buf[48];
  if (s == 0)
    std::snprintf(buf, sizeof buf, "0 ms");
  else if (s < 1e-4)
    std::snprintf(buf, sizeof buf, "%g us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%g ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

shaping_clock::duration seconds(double s) {
  return std::chrono::duration_cast<shaping_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

link_profile parse_link_profile(std::string_view text) {
  text = trim(text);
  link_profile p;
  if (text.empty()) return p;  // "none"
  bool named = false, overridden = false;
  std::vector<std::string> given;  ///< the settings seen so far
  std::size_t start = 0;
  for (int index = 0; start <= text.size(); ++index) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view part = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (part.empty()) bad(text, "empty item between commas");
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      if (index != 0)
        bad(part, "a named profile can only come first (e.g. 'wan,lat=10ms'); settings are "
                  "key=value");
      const std::string name = lower(part);
      const named_profile* found = nullptr;
      for (const auto& np : named_profiles)
        if (name == np.name) found = &np;
      if (!found)
        bad(part, "unknown profile (named profiles: none, ib, roce, ethernet, wan, consumer; "
                  "or bw=..,lat=..,jitter=..,loss=..)");
      p = {found->name, found->bandwidth_bps, found->latency_s, found->jitter_s, found->loss};
      named = true;
      continue;
    }
    const std::string key = lower(trim(part.substr(0, eq)));
    const std::string_view value = part.substr(eq + 1);
    // One value a setting: "lat=10ms,lat=20ms" is a mistake, not a choice.
    const std::string setting = key == "bandwidth" ? "bw" : key == "latency" ? "lat" : key;
    if (std::find(given.begin(), given.end(), setting) != given.end())
      bad(part, "'" + setting + "' is given twice");
    given.push_back(setting);
    if (key == "bw" || key == "bandwidth") {
      p.bandwidth_bps = parse_bandwidth(value, part);
    } else if (key == "lat" || key == "latency") {
      p.latency_s = parse_duration(value, part);
    } else if (key == "jitter") {
      p.jitter_s = parse_duration(value, part);
    } else if (key == "loss") {
      p.loss = parse_loss(value, part);
    } else {
      bad(part, "unknown setting '" + key + "' (use bw, lat, jitter, loss)");
    }
    overridden = true;
  }
  if (!named) {
    p.name = "custom";
  } else if (overridden) {
    p.name = std::string(text);
  }
  return p;
}

std::string describe(const link_profile& p) {
  if (p.unshaped()) return p.name + " (unshaped)";
  std::string s = p.name + " (";
  s += p.bandwidth_bps > 0 ? format_rate(p.bandwidth_bps) : std::string("unlimited bandwidth");
  s += ", " + format_time(p.latency_s) + " one-way";
  s += ", jitter " + format_time(p.jitter_s);
  char loss[32];
  std::snprintf(loss, sizeof loss, "%g%%", p.loss * 100);
  s += ", loss " + std::string(loss) + ")";
  return s;
}

link_shaper::link_shaper(link_profile p, std::uint64_t seed) : profile_(std::move(p)), rng_(seed) {}

shaping_clock::time_point link_shaper::schedule(std::size_t bytes, shaping_clock::time_point now) {
  // A uniform double in [0, 1) from the top 53 bits: the same sequence on
  // every standard library, unlike std::uniform_real_distribution.
  auto uniform = [this] { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; };
  shaping_clock::time_point due = now;
  if (!profile_.unshaped()) {
    // Serialisation: the message occupies the link after the ones before it.
    const auto start = std::max(now, link_free_);
    const double tx_s =
        profile_.bandwidth_bps > 0 ? static_cast<double>(bytes) * 8.0 / profile_.bandwidth_bps : 0;
    link_free_ = start + seconds(tx_s);
    double delay_s = profile_.latency_s;
    if (profile_.jitter_s > 0) delay_s += uniform() * profile_.jitter_s;
    // A lost segment is retransmitted after TCP's timeout, never dropped.
    if (profile_.loss > 0 && uniform() < profile_.loss)
      delay_s += std::max(3 * profile_.latency_s, 0.2);
    due = link_free_ + seconds(delay_s);
  }
  // Jitter must not reorder messages: a stream transport delivers in order.
  due = std::max(due, last_due_);
  last_due_ = due;
  return due;
}

}  // namespace corolla::net
