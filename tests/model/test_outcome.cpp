// outcome<T, E>: the value-or-error holder of model/ and schedule/.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "model/outcome.hpp"

using corolla::outcome;

namespace {

struct test_error {
  int code = 0;
  std::string message;
};

}  // namespace

TEST_CASE("an outcome holds a value or an error, and misuse says which it holds") {
  outcome<std::string, test_error> good(std::string("blocks 0:4"));
  REQUIRE(good);
  CHECK(good.ok());
  CHECK(good.has_value());
  CHECK(good.value() == "blocks 0:4");
  CHECK(good->size() == 10u);
  *good += "!";
  CHECK(*good == "blocks 0:4!");
  CHECK_THROWS_WITH_AS(good.error(), "a result holds a value, not an error", std::logic_error);

  const outcome<std::string, test_error> bad(test_error{7, "no server holds block 3"});
  CHECK_FALSE(bad);
  CHECK_FALSE(bad.ok());
  CHECK(bad.error().code == 7);
  CHECK_THROWS_WITH_AS(bad.value(), "a result holds an error: no server holds block 3", std::logic_error);

  outcome<void, test_error> done;
  CHECK(done);
  CHECK_THROWS_AS(done.error(), std::logic_error);
  outcome<void, test_error> refused(test_error{2, "unknown session"});
  CHECK_FALSE(refused.has_value());
  CHECK(refused.error().message == "unknown session");
}
