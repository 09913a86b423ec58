// Where a decode batcher's new generation starts (schedule/prompt_reuse.hpp):
// continuing a finished cache it wholly begins with, on the pages of the
// cache holding the most of its prompt, or computing; and when it waits for
// a running generation's prompt instead.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "schedule/prompt_reuse.hpp"

using namespace corolla::schedule;

namespace {

std::vector<std::int32_t> ids(std::initializer_list<std::int32_t> v) { return v; }

}  // namespace

TEST_CASE("a prompt starts where the caches held spare the most of it, keeping finished caches whole") {
  using how = prompt_start::how;
  const auto prompt = ids({1, 2, 3, 4, 5, 6, 7, 8});
  // Nothing held, or nothing in common.
  CHECK(plan_prompt_start(prompt, {}, {}, true).kind == how::compute);
  CHECK(plan_prompt_start(prompt, {"r"}, {{"r", ids({9, 9})}}, true).kind == how::compute);

  // A finished cache the prompt wholly begins with (a chat's next turn): continued.
  prompt_start s = plan_prompt_start(prompt, {"r"}, {{"r", ids({1, 2, 3, 4})}}, true);
  CHECK(s.kind == how::continue_retained);
  CHECK(s.session == "r");
  CHECK(s.tokens == 4);

  // The same prompt again: the finished cache holds more (its reply); the
  // prompt starts on its pages (all but the prompt's last token) and the
  // cache stays whole.
  s = plan_prompt_start(prompt, {"r"}, {{"r", ids({1, 2, 3, 4, 5, 6, 7, 8, 40, 41})}}, true);
  CHECK(s.kind == how::share);
  CHECK(s.session == "r");
  CHECK(s.tokens == 7);

  // A running generation holding more of the prompt than the finished
  // cache it wholly begins with: its pages win.
  s = plan_prompt_start(prompt, {"r"}, {{"r", ids({1, 2})}, {"running", ids({1, 2, 3, 4, 5, 6, 30})}}, true);
  CHECK(s.kind == how::share);
  CHECK(s.session == "running");
  CHECK(s.tokens == 6);
  // As much: continuing needs no new session.
  s = plan_prompt_start(prompt, {"r"}, {{"r", ids({1, 2, 3})}, {"running", ids({1, 2, 3, 30})}}, true);
  CHECK(s.kind == how::continue_retained);

  // Without sharing: the finished cache holding the most, cut back; the
  // running one is not a candidate.
  s = plan_prompt_start(prompt, {"a", "b"},
                        {{"a", ids({1, 2, 50})}, {"b", ids({1, 2, 3, 60})}, {"running", ids({1, 2, 3, 4, 5})}}, false);
  CHECK(s.kind == how::continue_retained);
  CHECK(s.session == "b");
  CHECK(s.tokens == 3);
  CHECK(plan_prompt_start(prompt, {}, {{"running", ids({1, 2, 3})}}, false).kind == how::compute);

  // At least the last token is computed, even of a prompt held whole.
  s = plan_prompt_start(ids({1, 2, 3}), {"r"}, {{"r", ids({1, 2, 3})}}, true);
  CHECK(s.tokens == 2);
  CHECK(plan_prompt_start(ids({1}), {"r"}, {{"r", ids({1})}}, true).kind == how::compute);
}

TEST_CASE("a prompt waits for a running generation still computing at least a page more of it") {
  std::vector<std::int32_t> sys;
  for (std::int32_t i = 0; i < 40; ++i) sys.push_back(i);
  auto prompt = sys;
  prompt.push_back(100);
  auto theirs = sys;
  theirs.push_back(200);
  const session_ids prompts{{"a", theirs}};

  // Its cache holds nothing yet: wait for 40 tokens.
  auto w = prompt_to_wait_for(prompt, prompts, {{"a", {}}}, 0, 16);
  REQUIRE(w);
  CHECK(w->session == "a");
  CHECK(w->tokens == 40);
  // It has computed them: nothing to wait for (start on its pages now).
  CHECK_FALSE(prompt_to_wait_for(prompt, prompts, {{"a", theirs}}, 40, 16));
  // Less than a page more than a cache spares now: not worth the wait.
  CHECK_FALSE(prompt_to_wait_for(prompt, prompts, {{"a", {}}}, 30, 16));
  CHECK(prompt_to_wait_for(prompt, prompts, {{"a", {}}}, 24, 16));
  // Little in common: no wait.
  CHECK_FALSE(prompt_to_wait_for(ids({0, 1, 2, 99, 98}), prompts, {{"a", {}}}, 0, 16));
  // Of two, the one sparing the most.
  auto longer = sys;
  longer.insert(longer.end(), {100, 101});
  auto more = prompt;
  more.insert(more.end(), {101, 102});
  w = prompt_to_wait_for(more, {{"a", theirs}, {"b", longer}}, {}, 0, 16);
  REQUIRE(w);
  CHECK(w->session == "b");
  CHECK(w->tokens == 42);
}

TEST_CASE("a prompt never starts on, or waits for, a session its filter refuses (another cache domain)") {
  using how = prompt_start::how;
  const auto prompt = ids({1, 2, 3, 4, 5, 6, 7, 8});
  const session_ids cached{{"mine", ids({1, 2})}, {"theirs", ids({1, 2, 3, 4, 5, 6, 7})}};
  const session_filter only_mine = [](const std::string& s) { return s == "mine"; };
  // Unfiltered, the other domain's cache holds the most and would be taken.
  CHECK(plan_prompt_start(prompt, {"theirs"}, cached, true).session == "theirs");
  // Filtered: continued or shared only from one's own, whatever the others hold.
  prompt_start s = plan_prompt_start(prompt, {"theirs", "mine"}, cached, true, only_mine);
  CHECK(s.kind == how::continue_retained);
  CHECK(s.session == "mine");
  CHECK(s.tokens == 2);
  s = plan_prompt_start(prompt, {"theirs", "mine"}, cached, false, only_mine);
  CHECK(s.session == "mine");
  // The helper the batcher and the swarm board use: a session without a
  // domain entry is nobody's.
  const std::map<std::string, std::string> domains{{"mine", "alice"}, {"theirs", "mallory"}};
  const std::string alice = "alice";
  const session_filter alices = same_domain(domains, alice);
  CHECK(alices("mine"));
  CHECK_FALSE(alices("theirs"));
  CHECK_FALSE(alices("unknown"));
  CHECK(plan_prompt_start(prompt, {"theirs", "mine"}, cached, true, alices).session == "mine");
  const session_filter none = [](const std::string&) { return false; };
  CHECK(plan_prompt_start(prompt, {"theirs", "mine"}, cached, true, none).kind == how::compute);
  CHECK(plan_prompt_start(prompt, {"theirs", "mine"}, cached, false, none).kind == how::compute);

  // Nor waits for another domain's running prompt, however much it holds.
  std::vector<std::int32_t> sys;
  for (std::int32_t i = 0; i < 40; ++i) sys.push_back(i);
  auto long_prompt = sys;
  long_prompt.push_back(100);
  const session_ids prompts{{"theirs", sys}};
  CHECK(prompt_to_wait_for(long_prompt, prompts, {{"theirs", {}}}, 0, 16));
  CHECK_FALSE(prompt_to_wait_for(long_prompt, prompts, {{"theirs", {}}}, 0, 16, only_mine));
}

TEST_CASE("adapter domains: one per pair of cache domain and adapter, none spelt by a salt") {
  // Every pair below differs, and so must its domain: a salt that reads
  // like an adapter's prefix, an adapter name that ends like a salt, the
  // base model ("") beside an adapter.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"", ""},         {"", "a"},          {"a", ""},           {"1:a", ""},   {"", "1:a"},
      {"x", "a"},       {"ax", ""},         {"", "ax"},          {"1:ax", ""},  {"0:", ""},
      {"", "a1:"},      {"1:", "a"},        {"b", "a"},          {"", "ab"},    {std::string("\0", 1), "a"},
      {"salt", "style"}, {"5:style", ""},    {"style", "salt"}};
  std::set<std::string> seen;
  for (const auto& [domain, adapter] : pairs) {
    CAPTURE(domain);
    CAPTURE(adapter);
    CHECK(seen.insert(adapter_domain(domain, adapter)).second);
  }
  CHECK(adapter_domain("salt", "style") == adapter_domain("salt", "style"));
}
