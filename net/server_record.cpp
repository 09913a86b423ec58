// net/server_record.cpp — wire form and read-side rules of membership records.
//
// The wire form is a msgpack map with short string keys (the format OpenDHT
// itself uses for values), so a record stays a few hundred bytes and new
// optional fields can be added without breaking older readers.
#include "net/server_record.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <tuple>

#include <msgpack.hpp>

namespace corolla::net {

namespace {

caf::error fail(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, "membership record: " + std::move(what));
}

bool finite_non_negative(double x) { return std::isfinite(x) && x >= 0.0; }

std::string check_string(const std::string& s, const char* field, bool required) {
  if (required && s.empty()) return std::string(field) + " is empty";
  if (s.size() > max_record_string_bytes)
    return std::string(field) + " has " + std::to_string(s.size()) + " bytes (at most " +
           std::to_string(max_record_string_bytes) + ")";
  return {};
}

// ---- msgpack field readers: each returns false on a type/range mismatch ----

bool read_uint(const msgpack::object& o, std::uint64_t& out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
  out = o.via.u64;
  return true;
}

bool read_int(const msgpack::object& o, std::int64_t& out) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<std::uint64_t>(INT64_MAX)) return false;
    out = static_cast<std::int64_t>(o.via.u64);
    return true;
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    out = o.via.i64;
    return true;
  }
  return false;
}

bool read_double(const msgpack::object& o, double& out) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: out = o.via.f64; return true;
    case msgpack::type::POSITIVE_INTEGER: out = static_cast<double>(o.via.u64); return true;
    case msgpack::type::NEGATIVE_INTEGER: out = static_cast<double>(o.via.i64); return true;
    default: return false;
  }
}

bool read_string(const msgpack::object& o, std::string& out) {
  if (o.type != msgpack::type::STR || o.via.str.size > max_record_string_bytes) return false;
  out.assign(o.via.str.ptr, o.via.str.size);
  return true;
}

bool read_index(const msgpack::object& o, int& out) {
  std::uint64_t u = 0;
  if (!read_uint(o, u) || u > static_cast<std::uint64_t>(max_block_index)) return false;
  out = static_cast<int>(u);
  return true;
}

template <class T>
bool read_u32(const msgpack::object& o, T& out) {
  std::uint64_t u = 0;
  if (!read_uint(o, u) || u > UINT32_MAX) return false;
  out = static_cast<T>(u);
  return true;
}

/// A map of at most `limit` entries whose keys are non-empty strings, each
/// once, and whose values `read_value` takes (false for a value it refuses).
template <class V, class Read>
bool read_keyed(const msgpack::object& o, std::size_t limit, std::map<std::string, V>& out, Read read_value) {
  if (o.type != msgpack::type::MAP || o.via.map.size > limit) return false;
  out.clear();
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    std::string key;
    V value{};
    if (!read_string(o.via.map.ptr[i].key, key) || key.empty()) return false;
    if (!read_value(o.via.map.ptr[i].val, value)) return false;
    if (!out.emplace(std::move(key), std::move(value)).second) return false;  // a key twice
  }
  return true;
}

bool read_rtts(const msgpack::object& o, std::map<std::string, double>& out) {
  return read_keyed(o, max_rtt_entries, out, read_double);
}

bool read_adapters(const msgpack::object& o, std::map<std::string, std::string>& out) {
  return read_keyed(o, max_record_adapters, out, [](const msgpack::object& v, std::string& digest) {
    return read_string(v, digest) && !digest.empty();
  });
}

/// Reads one field by key; false = wrong type or range for that key.
/// Unknown keys are accepted and skipped (forward compatibility).
bool read_field(const std::string& key, const msgpack::object& v, server_record& r,
                std::uint64_t& version) {
  if (key == "v") return read_uint(v, version);
  if (key == "m") return read_string(v, r.model);
  if (key == "n") return read_string(v, r.node_id);
  if (key == "e") return read_string(v, r.endpoint);
  if (key == "b0") return read_index(v, r.span.start);
  if (key == "b1") return read_index(v, r.span.end);
  if (key == "st") {
    std::uint64_t s = 0;
    if (!read_uint(v, s) || s > static_cast<std::uint64_t>(server_state::offline)) return false;
    r.state = static_cast<server_state>(s);
    return true;
  }
  if (key == "tp") return read_double(v, r.throughput);
  if (key == "c") return read_int(v, r.cache_tokens_left);
  if (key == "sp") return read_double(v, r.step_s_per_block);
  if (key == "r") return read_rtts(v, r.rtt_ms);
  if (key == "d") return read_string(v, r.dtype);
  if (key == "w") return read_string(v, r.weights);
  if (key == "pv") return read_u32(v, r.protocol_version);
  if (key == "q") return read_uint(v, r.seq);
  if (key == "ts") return read_int(v, r.timestamp_ms);
  if (key == "ttl") return read_u32(v, r.ttl_ms);
  if (key == "net") return read_u32(v, r.network_id);
  if (key == "pk") return read_string(v, r.public_key);
  if (key == "rl") return read_string(v, r.relay);
  if (key == "rs") {
    std::uint64_t b = 0;
    if (!read_uint(v, b) || b > 1) return false;
    r.relay_service = b == 1;
    return true;
  }
  if (key == "ad") {
    // Shown to people only: an "ad" this version cannot take (more
    // entries, other types: a later writer's) is dropped, not the record.
    if (!read_adapters(v, r.adapters)) r.adapters.clear();
    return true;
  }
  return true;
}

}  // namespace

std::string check_record_fields(const server_record& r) {
  for (auto [s, field, required] : {std::tuple{&r.model, "model", true},
                                    std::tuple{&r.node_id, "node id", true},
                                    std::tuple{&r.endpoint, "endpoint", false},
                                    std::tuple{&r.dtype, "dtype", false},
                                    std::tuple{&r.weights, "weights dtype", false},
                                    std::tuple{&r.public_key, "public key", false},
                                    std::tuple{&r.relay, "relay node id", false}}) {
    if (auto e = check_string(*s, field, required); !e.empty()) return e;
  }
  if (r.span.start < 0 || r.span.end > max_block_index || r.span.length() == 0)
    return "span [" + std::to_string(r.span.start) + ", " + std::to_string(r.span.end) +
           ") is not a non-empty range inside [0, " + std::to_string(max_block_index) + ")";
  if (!finite_non_negative(r.throughput))
    return "throughput " + std::to_string(r.throughput) + " is not a finite number >= 0";
  if (!finite_non_negative(r.step_s_per_block))
    return "step time per block " + std::to_string(r.step_s_per_block) + " is not a finite number >= 0";
  if (r.cache_tokens_left < -1)
    return "cache tokens left " + std::to_string(r.cache_tokens_left) + " is below -1";
  if (r.rtt_ms.size() > max_rtt_entries)
    return std::to_string(r.rtt_ms.size()) + " RTT entries (at most " + std::to_string(max_rtt_entries) + ")";
  for (const auto& [id, ms] : r.rtt_ms) {
    if (auto e = check_string(id, "RTT node id", true); !e.empty()) return e;
    if (!finite_non_negative(ms)) return "RTT to '" + id + "' is not a finite number >= 0";
  }
  if (r.adapters.size() > max_record_adapters)
    return std::to_string(r.adapters.size()) + " adapters (at most " + std::to_string(max_record_adapters) + ")";
  for (const auto& [name, digest] : r.adapters) {
    if (auto e = check_string(name, "adapter name", true); !e.empty()) return e;
    if (auto e = check_string(digest, "adapter digest", true); !e.empty()) return e;
  }
  return {};
}

std::vector<std::uint8_t> encode_record(const server_record& r) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(19 + (r.relay.empty() ? 0 : 1) + (r.relay_service ? 1 : 0) + (r.adapters.empty() ? 0 : 1));
  pk.pack(std::string_view("v")), pk.pack(record_format_version);
  pk.pack(std::string_view("m")), pk.pack(r.model);
  pk.pack(std::string_view("n")), pk.pack(r.node_id);
  pk.pack(std::string_view("e")), pk.pack(r.endpoint);
  pk.pack(std::string_view("b0")), pk.pack(static_cast<std::uint32_t>(std::max(r.span.start, 0)));
  pk.pack(std::string_view("b1")), pk.pack(static_cast<std::uint32_t>(std::max(r.span.end, 0)));
  pk.pack(std::string_view("st")), pk.pack(static_cast<std::uint32_t>(r.state));
  pk.pack(std::string_view("tp")), pk.pack_double(r.throughput);
  pk.pack(std::string_view("c")), pk.pack(r.cache_tokens_left);
  pk.pack(std::string_view("sp")), pk.pack_double(r.step_s_per_block);
  pk.pack(std::string_view("r"));
  pk.pack_map(static_cast<std::uint32_t>(r.rtt_ms.size()));
  for (const auto& [id, ms] : r.rtt_ms) pk.pack(id), pk.pack_double(ms);
  pk.pack(std::string_view("d")), pk.pack(r.dtype);
  pk.pack(std::string_view("w")), pk.pack(r.weights);
  pk.pack(std::string_view("pv")), pk.pack(r.protocol_version);
  pk.pack(std::string_view("q")), pk.pack(r.seq);
  pk.pack(std::string_view("ts")), pk.pack(r.timestamp_ms);
  pk.pack(std::string_view("ttl")), pk.pack(r.ttl_ms);
  pk.pack(std::string_view("net")), pk.pack(r.network_id);
  pk.pack(std::string_view("pk")), pk.pack(r.public_key);
  if (!r.relay.empty()) pk.pack(std::string_view("rl")), pk.pack(r.relay);
  if (r.relay_service) pk.pack(std::string_view("rs")), pk.pack(std::uint32_t{1});
  if (!r.adapters.empty()) {
    pk.pack(std::string_view("ad"));
    pk.pack_map(static_cast<std::uint32_t>(r.adapters.size()));
    for (const auto& [name, digest] : r.adapters) pk.pack(name), pk.pack(digest);
  }
  const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data());
  return std::vector<std::uint8_t>(p, p + buf.size());
}

caf::expected<server_record> decode_record(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return fail("empty value");
  if (bytes.size() > max_record_bytes)
    return fail(std::to_string(bytes.size()) + " bytes (at most " + std::to_string(max_record_bytes) + ")");
  // Limits bound what the unpacker allocates before we look at anything:
  // a record has ~20 keys, nested maps of RTTs and adapters, short strings
  // (no arrays: a reader of this version skips an unknown key whose value
  // is a map or a scalar, but refuses a record holding any array).
  const msgpack::unpack_limit limits(/*array*/ 0, /*map*/ std::max<std::size_t>(32, max_rtt_entries),
                                     /*str*/ max_record_string_bytes, /*bin*/ 0, /*ext*/ 0,
                                     /*depth*/ 3);
  server_record r;
  std::uint64_t version = 0;
  try {
    std::size_t offset = 0;
    auto handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), offset,
                                  nullptr, nullptr, limits);
    if (offset != bytes.size())
      return fail(std::to_string(bytes.size() - offset) + " trailing bytes after the record");
    const msgpack::object& o = handle.get();
    if (o.type != msgpack::type::MAP) return fail("not a msgpack map");
    std::set<std::string> seen;
    for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
      const auto& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) return fail("a key is not a string");
      std::string key(kv.key.via.str.ptr, kv.key.via.str.size);
      if (!seen.insert(key).second) return fail("key '" + key + "' appears twice");
      if (!read_field(key, kv.val, r, version)) return fail("field '" + key + "' has a wrong type or range");
    }
    for (const char* required : {"v", "m", "n", "e", "b0", "b1", "st", "tp", "q", "ts", "ttl", "net"})
      if (!seen.count(required)) return fail(std::string("field '") + required + "' is missing");
  } catch (const std::exception& e) {
    // msgpack signals malformed input (truncation, limits) by exceptions;
    // they end here, never crossing into OpenDHT's callbacks.
    return fail(std::string("malformed msgpack (") + e.what() + ")");
  }
  if (version != record_format_version)
    return fail("format version " + std::to_string(version) + " (this build reads " +
                std::to_string(record_format_version) + ")");
  if (auto e = check_record_fields(r); !e.empty()) return fail(e);
  if (r.ttl_ms < min_record_ttl_ms || r.ttl_ms > max_record_ttl_ms)
    return fail("ttl " + std::to_string(r.ttl_ms) + " ms outside [" + std::to_string(min_record_ttl_ms) +
                ", " + std::to_string(max_record_ttl_ms) + "]");
  return r;
}

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool is_fresh(const server_record& r, std::int64_t now_ms, std::int64_t max_clock_skew_ms) {
  const std::int64_t age = now_ms - r.timestamp_ms;
  return age <= static_cast<std::int64_t>(r.ttl_ms) && age >= -max_clock_skew_ms;
}

bool is_newer(const server_record& a, const server_record& b) {
  return std::tie(a.seq, a.timestamp_ms) > std::tie(b.seq, b.timestamp_ms);
}

std::vector<server_record> newest_per_server(std::vector<server_record> records) {
  std::map<std::string, server_record> best;
  for (auto& r : records) {
    auto it = best.find(r.node_id);
    if (it == best.end())
      best.emplace(r.node_id, std::move(r));
    else if (is_newer(r, it->second))
      it->second = std::move(r);
  }
  std::vector<server_record> out;
  out.reserve(best.size());
  for (auto& [id, r] : best) out.push_back(std::move(r));
  return out;
}

std::vector<server_record> merge_spans(const std::vector<std::vector<server_record>>& per_block) {
  std::map<std::tuple<std::string, int, int>, server_record> best;
  for (const auto& block : per_block) {
    for (const auto& r : block) {
      auto key = std::tuple{r.node_id, r.span.start, r.span.end};
      auto it = best.find(key);
      if (it == best.end())
        best.emplace(std::move(key), r);
      else if (is_newer(r, it->second))
        it->second = r;
    }
  }
  std::vector<server_record> out;
  out.reserve(best.size());
  for (auto& [key, r] : best) out.push_back(std::move(r));
  return out;
}

}  // namespace corolla::net
