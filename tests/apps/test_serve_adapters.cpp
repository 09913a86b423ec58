// apps/serve_adapters.hpp's announced_adapters: what a server's DHT record
// names of the adapters it holds (net::server_record::adapters): each
// one's digest by name, at most net::max_record_adapters of them, the
// first in name order.
#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/serve_adapters.hpp"
#include "model/lora.hpp"
#include "net/server_record.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::app;

TEST_CASE("a server's record names its adapters' digests, the first 16 by name when it holds more") {
  const model_config cfg = testing::tiny_config({});
  std::vector<served_adapter> held;
  // 20 adapters given in reverse name order: the record keeps a00..a15.
  for (int i = 19; i >= 0; --i) {
    char name[8];
    std::snprintf(name, sizeof name, "a%02d", i);
    auto a = std::make_shared<lora_adapter>(testing::random_lora(cfg, static_cast<std::uint64_t>(100 + i)));
    held.push_back({name, "/adapters/" + std::string(name), a});
  }
  REQUIRE(net::max_record_adapters == 16);
  const std::map<std::string, std::string> few = announced_adapters({held.begin(), held.begin() + 3});
  CHECK(few.size() == 3u);
  CHECK(few.at("a19") == held[0].adapter->digest());

  const std::map<std::string, std::string> record = announced_adapters(held);
  REQUIRE(record.size() == 16u);
  CHECK(record.begin()->first == "a00");
  CHECK(record.rbegin()->first == "a15");
  CHECK_FALSE(record.count("a16"));
  for (const served_adapter& a : held)
    if (record.count(a.name)) CHECK(record.at(a.name) == a.adapter->digest());
  CHECK(announced_adapters({}).empty());
}
