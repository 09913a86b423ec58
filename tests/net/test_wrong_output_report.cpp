// net/wrong_output_report: the wire form of spot-check reports survives a
// round trip, and what an untrusted peer could put in the DHT instead is
// refused with a reason, never an exception.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "net/wrong_output_report.hpp"

using namespace corolla::net;

namespace {

wrong_output_report sample() {
  return {"tiny-llama", "s-b", "n-client", {2, 4}, 0.84, 1764400000000, 7};
}

std::string error_of(const std::vector<std::uint8_t>& bytes) {
  auto r = decode_report(bytes);
  return r ? std::string() : caf::to_string(r.error());
}

template <class T>
std::vector<std::uint8_t> packed(const T& value) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, value);
  return {reinterpret_cast<const std::uint8_t*>(buf.data()), reinterpret_cast<const std::uint8_t*>(buf.data()) + buf.size()};
}

}  // namespace

TEST_CASE("a wrong-output report survives its encoding") {
  const wrong_output_report r = sample();
  auto back = decode_report(encode_report(r));
  REQUIRE(back);
  CHECK(*back == r);
  CHECK(encode_report(r).size() < 200u);
  CHECK(wrong_output_key("tiny-llama").size() == 40u);
  CHECK(wrong_output_key("tiny-llama") != wrong_output_key("other"));
}

TEST_CASE("malformed or hostile reports are refused with a reason") {
  CHECK(error_of({}).find("malformed") != std::string::npos);
  CHECK(error_of({0xc1, 0x00}).find("malformed") != std::string::npos);
  CHECK(error_of(packed(std::string("not a map"))).find("malformed") != std::string::npos);
  CHECK(error_of(std::vector<std::uint8_t>(4096, 0x90)).find("bytes") != std::string::npos);
  auto r = sample();
  r.server.clear();
  CHECK(error_of(encode_report(r)).find("empty") != std::string::npos);
  r = sample();
  r.span = {4, 2};
  CHECK(error_of(encode_report(r)).find("not a span") != std::string::npos);
  r = sample();
  r.span = {-1, 2};
  CHECK(error_of(encode_report(r)).find("not a span") != std::string::npos);
  r = sample();
  r.difference = std::numeric_limits<double>::quiet_NaN();
  CHECK(error_of(encode_report(r)).find("difference") != std::string::npos);
  r = sample();
  r.difference = -1;
  CHECK(error_of(encode_report(r)).find("difference") != std::string::npos);
  r = sample();
  r.model = std::string(300, 'm');
  CHECK(error_of(encode_report(r)).find("longer than") != std::string::npos);
}
