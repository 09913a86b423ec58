// Wire form of wrong-output reports (net/wrong_output_report.hpp): a msgpack
// map with short keys, as membership records.
#include "net/wrong_output_report.hpp"

#include <cmath>

#include <msgpack.hpp>
#include <opendht/infohash.h>

namespace corolla::net {

namespace {

caf::error fail(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, "wrong-output report: " + std::move(what));
}

/// What travels (the names are the map's keys).
struct report_wire {
  std::string m, s, r;
  int a = 0, b = 0;
  double d = 0;
  std::int64_t t = 0;
  std::uint32_t n = 0;
  MSGPACK_DEFINE_MAP(m, s, r, a, b, d, t, n);
};

constexpr std::size_t max_report_bytes = 2048;

}  // namespace

std::string wrong_output_key(const std::string& model) { return dht::InfoHash::get(model + ":wrong").toString(); }

std::vector<std::uint8_t> encode_report(const wrong_output_report& r) {
  report_wire w{r.model, r.server, r.reporter, r.span.start, r.span.end, r.difference, r.timestamp_ms, r.network_id};
  msgpack::sbuffer buf;
  msgpack::pack(buf, w);
  return {reinterpret_cast<const std::uint8_t*>(buf.data()), reinterpret_cast<const std::uint8_t*>(buf.data()) + buf.size()};
}

caf::expected<wrong_output_report> decode_report(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > max_report_bytes)
    return fail(std::to_string(bytes.size()) + " bytes (at most " + std::to_string(max_report_bytes) + ")");
  report_wire w;
  try {
    auto handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    handle.get().convert(w);
  } catch (const std::exception& e) {
    return fail(std::string("malformed: ") + e.what());
  }
  if (w.m.empty() || w.s.empty()) return fail("model or server is empty");
  if (w.m.size() > max_record_string_bytes || w.s.size() > max_record_string_bytes ||
      w.r.size() > max_record_string_bytes)
    return fail("a name is longer than " + std::to_string(max_record_string_bytes) + " bytes");
  if (w.a < 0 || w.b <= w.a || w.b > max_block_index) return fail("span [" + std::to_string(w.a) + ", " + std::to_string(w.b) + ") is not a span of blocks");
  if (!std::isfinite(w.d) || w.d < 0) return fail("difference is not a finite non-negative number");
  return wrong_output_report{w.m, w.s, w.r, {w.a, w.b}, w.d, w.t, w.n};
}

}  // namespace corolla::net
