// net/wrong_output_report.hpp — a client's report, put in the swarm's DHT,
// of a server that a spot check's majority found answering wrong (a broken
// GPU, a bug, a malicious volunteer). Other clients read the reports of a
// model and keep the reported servers on probation (every step checked).
//
// Reports come from untrusted peers: decoding validates every field and
// never throws; one bad report changes nothing but a client's checking.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/server_record.hpp"

namespace corolla::net {

/// A report lives this long in the DHT (it is put once, never refreshed).
inline constexpr std::int64_t wrong_output_report_ttl_ms = 60LL * 60 * 1000;

struct wrong_output_report {
  std::string model;     ///< the model id the server announces
  std::string server;    ///< its node id
  std::string reporter;  ///< the reporting client's node id
  block_range span;      ///< the blocks it answered wrong
  double difference = 0;  ///< its answer's distance to the majority's (relative, per row)
  std::int64_t timestamp_ms = 0;  ///< reporter's wall clock at the report
  std::uint32_t network_id = 0;   ///< stamped by membership
  friend bool operator==(const wrong_output_report&, const wrong_output_report&) = default;
};

/// The DHT key of a model's reports: hex of InfoHash::get(model + ":wrong").
std::string wrong_output_key(const std::string& model);

std::vector<std::uint8_t> encode_report(const wrong_output_report& r);
/// Errors (caf::sec::invalid_argument, with a message): not a report, a
/// field of the wrong type or size, an empty model or server, a bad span,
/// a difference that is not a finite non-negative number.
caf::expected<wrong_output_report> decode_report(std::span<const std::uint8_t> bytes);

}  // namespace corolla::net
