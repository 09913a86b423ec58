// tests/net/test_membership_records.cpp — membership records, pure:
// encoding and decoding, validation of malformed values, freshness within
// the ttl, newest-wins and merging spans. The OpenDHT-backed membership is
// in test_membership.cpp and test_membership_expiry.cpp.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <map>
#include <vector>

// msgpack before doctest, as in test_membership.cpp (doctest defines a WARN
// macro that breaks OpenDHT's headers).
#include <msgpack.hpp>

#include <doctest/doctest.h>

#include "net/server_record.hpp"
#include "tests/net/membership_test_util.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::membership_test;

namespace {

/// A record as membership would stamp it (for the pure tests).
server_record stamped(server_record r, std::uint64_t seq, std::int64_t ts, std::uint32_t ttl_ms = 15'000) {
  r.seq = seq;
  r.timestamp_ms = ts;
  r.ttl_ms = ttl_ms;
  r.network_id = 7;
  return r;
}

std::span<const std::uint8_t> bytes_of(const std::vector<std::uint8_t>& v) { return {v.data(), v.size()}; }

/// Bytes of a msgpack map built by `fill` (for crafting bad records).
template <class F>
std::vector<std::uint8_t> packed(std::uint32_t entries, F fill) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(entries);
  fill(pk);
  const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data());
  return {p, p + buf.size()};
}

/// Re-encodes a valid record with one key's value replaced by `bad` (packed
/// by the callback), to check each field's type and range checks.
std::vector<std::uint8_t> with_field(const std::string& key, const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& bad,
                                     server_record base = make_record("m", "n", {0, 2})) {
  auto good = encode_record(stamped(std::move(base), 1, unix_ms_now()));
  auto h = msgpack::unpack(reinterpret_cast<const char*>(good.data()), good.size());
  const auto& map = h.get().via.map;
  return packed(map.size, [&](auto& pk) {
    for (std::uint32_t i = 0; i < map.size; ++i) {
      std::string k(map.ptr[i].key.via.str.ptr, map.ptr[i].key.via.str.size);
      pk.pack(k);
      if (k == key)
        bad(pk);
      else
        pk.pack(map.ptr[i].val);
    }
  });
}

}  // namespace

// ---- records (pure) ----------------------------------------------------------

TEST_CASE("a membership record survives encoding and decoding unchanged") {
  auto r = stamped(make_record("llama-tiny", "node-7", {3, 9}, server_state::joining), 1234567, unix_ms_now());
  r.public_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  r.cache_tokens_left = -1;
  r.weights = "bf16";
  r.adapters = {{"other", "0123456789abcdef"}, {"style", "fedcba9876543210"}};
  auto bytes = encode_record(r);
  CHECK(bytes.size() < 400);  // compact: well under one UDP packet
  auto back = decode_record(bytes_of(bytes));
  REQUIRE_MESSAGE(back, (back ? std::string() : caf::to_string(back.error())));
  CHECK(*back == r);
  CHECK(std::string(to_string(server_state::offline)) == "OFFLINE");
}

TEST_CASE("malformed membership values are rejected with a reason and never crash") {
  const auto now = unix_ms_now();
  auto good = encode_record(stamped(make_record("m", "n", {0, 2}), 1, now));
  REQUIRE(decode_record(bytes_of(good)));

  auto reason = [](const std::vector<std::uint8_t>& b) {
    auto r = decode_record(bytes_of(b));
    return r ? std::string("accepted") : caf::to_string(r.error());
  };

  CHECK(reason({}).find("empty") != std::string::npos);
  // Every truncation of a valid record, and one byte too many.
  for (std::size_t n = 1; n < good.size(); ++n) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_MESSAGE(!decode_record(bytes_of(cut)), "truncated to " << n << " bytes was accepted");
  }
  auto longer = good;
  longer.push_back(0xc0);
  CHECK(reason(longer).find("trailing") != std::string::npos);
  // Random bytes (fixed seed), including random mutations of a good record.
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::uint8_t> junk(1 + rng() % 300);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    (void)decode_record(bytes_of(junk));
    auto mutated = good;
    for (int k = 0; k < 3; ++k) mutated[rng() % mutated.size()] = static_cast<std::uint8_t>(rng());
    if (auto r = decode_record(bytes_of(mutated))) CHECK(check_record_fields(*r).empty());
  }
  // Oversize, not a map, nesting, duplicate and missing keys.
  CHECK(reason(std::vector<std::uint8_t>(max_record_bytes + 1, 0x90)).find("bytes") != std::string::npos);
  CHECK(reason({0x93, 0x01, 0x02, 0x03}) != "accepted");  // an array
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(std::string("v")); pk.pack_map(1); pk.pack(std::string("x")); pk.pack_map(1); pk.pack(std::string("y")); pk.pack_map(0); })) != "accepted");
  CHECK(reason(packed(2, [](auto& pk) { pk.pack(std::string("v")); pk.pack(1); pk.pack(std::string("v")); pk.pack(1); })).find("twice") != std::string::npos);
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(std::string("v")); pk.pack(1); })).find("missing") != std::string::npos);
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(7); pk.pack(1); })).find("not a string") != std::string::npos);
  // Wrong types and ranges, field by field.
  auto str = [](auto& pk) { pk.pack(std::string("x")); };
  CHECK(reason(with_field("v", [](auto& pk) { pk.pack(2); })).find("format version 2") != std::string::npos);
  CHECK(reason(with_field("b0", str)).find("'b0'") != std::string::npos);
  CHECK(reason(with_field("b1", [](auto& pk) { pk.pack(-1); })).find("'b1'") != std::string::npos);
  CHECK(reason(with_field("b1", [](auto& pk) { pk.pack(0); })).find("span") != std::string::npos);
  CHECK(reason(with_field("st", [](auto& pk) { pk.pack(3); })).find("'st'") != std::string::npos);
  CHECK(reason(with_field("tp", [](auto& pk) { pk.pack_double(std::nan("")); })).find("throughput") != std::string::npos);
  CHECK(reason(with_field("tp", [](auto& pk) { pk.pack_double(-1.0); })).find("throughput") != std::string::npos);
  CHECK(reason(with_field("c", [](auto& pk) { pk.pack(-5); })).find("cache") != std::string::npos);
  CHECK(reason(with_field("n", [](auto& pk) { pk.pack(std::string()); })).find("node id") != std::string::npos);
  CHECK(reason(with_field("m", [](auto& pk) { pk.pack(std::string(300, 'm')); })) != "accepted");
  CHECK(reason(with_field("ttl", [](auto& pk) { pk.pack(10); })).find("ttl") != std::string::npos);
  CHECK(reason(with_field("ttl", [](auto& pk) { pk.pack(std::uint64_t{1} << 40); })) != "accepted");
  CHECK(reason(with_field("r", [](auto& pk) { pk.pack_map(1); pk.pack(std::string("peer")); pk.pack(std::string("fast")); })).find("'r'") != std::string::npos);
  CHECK(reason(with_field("r", [](auto& pk) { pk.pack_map(1); pk.pack(std::string("peer")); pk.pack_double(INFINITY); })).find("RTT") != std::string::npos);
  // Adapters: a map of at most max_record_adapters non-empty names to
  // non-empty digests.
  server_record held = make_record("m", "n", {0, 2});
  held.adapters = {{"style", "0123456789abcdef"}};
  const auto adapters = [](std::vector<std::pair<std::string, std::string>> entries) {
    return [entries](auto& pk) {
      pk.pack_map(static_cast<std::uint32_t>(entries.size()));
      for (const auto& [k, v] : entries) pk.pack(k), pk.pack(v);
    };
  };
  const auto read_adapters = [&](const std::vector<std::uint8_t>& b) {
    auto r = decode_record(bytes_of(b));
    REQUIRE_MESSAGE(r, "a record with a bad adapter map was refused whole");
    return r->adapters;
  };
  CHECK(read_adapters(with_field("ad", adapters({{"a", "1"}, {"b", "2"}}), held)) ==
        std::map<std::string, std::string>{{"a", "1"}, {"b", "2"}});
  // One this version cannot take is dropped, the record kept (a later
  // writer may hold more, or say more of each): the server still routes.
  CHECK(read_adapters(with_field("ad", str, held)).empty());
  CHECK(read_adapters(with_field("ad", adapters({{"a", "1"}, {"", "2"}}), held)).empty());
  CHECK(read_adapters(with_field("ad", adapters({{"a", ""}}), held)).empty());
  CHECK(read_adapters(with_field("ad", adapters({{"a", "1"}, {"a", "2"}}), held)).empty());
  CHECK(read_adapters(with_field("ad", [](auto& pk) { pk.pack_map(1); pk.pack(std::string("a")); pk.pack(7); }, held)).empty());
  std::vector<std::pair<std::string, std::string>> many;
  for (std::size_t i = 0; i <= max_record_adapters; ++i) many.emplace_back("a" + std::to_string(i), "1");
  CHECK(read_adapters(with_field("ad", adapters(many), held)).empty());
  // A string over the unpacker's limit fails the unpacking itself.
  CHECK(reason(with_field("ad", adapters({{std::string(300, 'a'), "1"}}), held)) != "accepted");
  // A writer must keep within the bounds.
  for (std::size_t i = 0; i <= max_record_adapters; ++i) held.adapters["x" + std::to_string(i)] = "1";
  CHECK(check_record_fields(held).find("adapters (at most") != std::string::npos);
  // A reader of the format before adapters (no arrays admitted, unknown
  // keys skipped) still reads a record naming some: they are a map.
  {
    server_record r = stamped(make_record("m", "n", {0, 2}), 1, unix_ms_now());
    r.adapters = {{"style", "0123456789abcdef"}};
    const auto b = encode_record(r);
    std::size_t off = 0;
    const msgpack::unpack_limit old_reader(0, 64, max_record_string_bytes, 0, 0, 3);
    CHECK_NOTHROW(msgpack::unpack(reinterpret_cast<const char*>(b.data()), b.size(), off, nullptr, nullptr, old_reader));
  }
  // Unknown keys are skipped (newer writers may add fields).
  CHECK(decode_record(bytes_of(with_field("pk", [](auto& pk) { pk.pack(std::string("key")); }))));
}

TEST_CASE("a record is fresh only within its ttl and a bounded clock skew") {
  const std::int64_t now = 1'700'000'000'000;
  auto r = stamped(make_record("m", "n", {0, 1}), 1, now - 1000, 2000);
  CHECK(is_fresh(r, now, 500));
  r.timestamp_ms = now - 2001;
  CHECK_FALSE(is_fresh(r, now, 500));
  r.timestamp_ms = now + 400;  // announcer's clock slightly ahead
  CHECK(is_fresh(r, now, 500));
  r.timestamp_ms = now + 600;
  CHECK_FALSE(is_fresh(r, now, 500));
}

TEST_CASE("the newest record per server wins, and spans merge one record per server and span") {
  auto a1 = stamped(make_record("m", "a", {0, 4}, server_state::joining), 10, 1000);
  auto a2 = stamped(make_record("m", "a", {0, 4}, server_state::online), 11, 900);  // seq decides, not clock
  auto b1 = stamped(make_record("m", "b", {2, 6}), 5, 1000);
  auto newest = newest_per_server({a1, b1, a2});
  REQUIRE(newest.size() == 2);
  CHECK(newest[0].node_id == "a");
  CHECK(newest[0].seq == 11);
  CHECK(newest[0].state == server_state::online);
  CHECK(newest[1].node_id == "b");

  // Block 2 has seen a's refresh, block 0 not yet: one record per span.
  auto a_moved = stamped(make_record("m", "a", {4, 8}, server_state::joining), 12, 1000);
  auto merged = merge_spans({{a1, b1}, {a2, b1}, {a_moved}});
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].node_id == "a");
  CHECK(merged[0].span == block_range{0, 4});
  CHECK(merged[0].seq == 11);
  CHECK(merged[1].span == block_range{4, 8});
  CHECK(merged[2].node_id == "b");
}
