// The demo end to end with a short time budget: it trains, saves a model
// that `corolla generate` loads, and generates text.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla::testing;
namespace fs = std::filesystem;

TEST_CASE("demo trains, saves a loadable model and generates") {
  temp_dir_guard dir("demo");
  fs::path out = dir / "run";
  auto r = run_corolla({"demo", "--out", out.string(), "--seconds", "3", "--max-new-tokens", "12",
                        "--threads", "2"},
                       std::chrono::seconds(120));
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[4/4]") != std::string::npos);
  CHECK(r.out.find("Once upon a time") != std::string::npos);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model"})
    CHECK(fs::exists(out / "model" / f));

  auto g = run_corolla({"generate", "--model", (out / "model").string(), "--prompt",
                        "The little fox", "--max-new-tokens", "8", "--print-ids"});
  INFO("generate stderr: " << g.err);
  CHECK(g.exit_code == 0);
  CHECK_FALSE(g.out_lines().empty());
}
