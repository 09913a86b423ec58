// What the API benchmarks share (apps/bench_api_load.hpp).
#include "apps/bench_api_load.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <httplib.h>

#include "model/tokenizer.hpp"

namespace corolla::app {

using json = nlohmann::json;

double seconds_between(bench_clock::time_point a, bench_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// A byte-level BPE tokenizer.json with exactly `vocab` ids: the 256 bytes,
/// then merges of printable byte pairs, so every id the random model can
/// generate decodes to text.
void write_bench_tokenizer(const std::filesystem::path& dir, int vocab) {
  const auto chars = [](int b) { return byte_level_char(static_cast<unsigned char>(b)); };
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[chars(b)] = b;
  json merges = json::array();
  int id = 256;
  for (int a = '!'; a <= '~' && id < vocab; ++a)
    for (int b = '!'; b <= '~' && id < vocab; ++b) {
      const std::string l = chars(a), r = chars(b);
      merges.push_back(l + " " + r);
      v[l + r] = id++;
    }
  if (id < vocab) throw std::invalid_argument("bench api: the default tokenizer covers at most " + std::to_string(id) + " ids");
  const json tok = {{"version", "1.0"},
                    {"added_tokens", json::array()},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}}},
                    {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", merges}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
}

load_result load_result::for_clients(int clients) {
  load_result r;
  const auto n = static_cast<std::size_t>(clients);
  r.first_token_s.resize(n);
  r.request_s.resize(n);
  r.texts.resize(n);
  return r;
}

json load_result::to_json(int requests) const {
  return json{{"requests_per_s", wall_s > 0 ? requests / wall_s : 0.0},
              {"tokens_per_s", tokens_per_s()},
              {"ttft_p50_ms", median(first_token_s) * 1e3},
              {"ttft_max_ms", first_token_s.empty() ? 0.0 : *std::max_element(first_token_s.begin(), first_token_s.end()) * 1e3},
              {"failed", failed}};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

/// Adds round `r` to the pooled figures `into`.
way_ratios compare_ways(const load_result& fast, const load_result& slow) {
  const auto worst = [](const load_result& r) {
    return r.first_token_s.empty() ? 0.0 : *std::max_element(r.first_token_s.begin(), r.first_token_s.end());
  };
  way_ratios w;
  if (slow.tokens_per_s() > 0) w.tokens_per_s = fast.tokens_per_s() / slow.tokens_per_s();
  if (median(fast.first_token_s) > 0) w.first_text_p50 = median(slow.first_token_s) / median(fast.first_token_s);
  if (worst(fast) > 0) w.first_text_max = worst(slow) / worst(fast);
  return w;
}

std::vector<std::vector<std::int32_t>> prompts_after(const std::vector<std::int32_t>& shared, int n,
                                                     const std::function<std::vector<std::int32_t>()>& own) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(shared);
    const auto ids = own();
    prompts.back().insert(prompts.back().end(), ids.begin(), ids.end());
  }
  return prompts;
}

void pool(load_result& into, const load_result& r) {
  into.wall_s += r.wall_s;
  into.tokens += r.tokens;
  into.failed += r.failed;
  into.first_token_s.insert(into.first_token_s.end(), r.first_token_s.begin(), r.first_token_s.end());
  into.request_s.insert(into.request_s.end(), r.request_s.begin(), r.request_s.end());
}

/// `clients` streaming requests at once through the HTTP API.
load_result run_http(int port, const std::string& model_id, const std::vector<std::vector<std::int32_t>>& prompts,
                     int clients, int new_tokens, const std::string& salt_prefix,
                     const std::vector<std::string>& models) {
  load_result r = load_result::for_clients(clients);
  std::vector<int> counts(static_cast<std::size_t>(clients));
  const auto t0 = bench_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      const auto u = static_cast<std::size_t>(i);
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(300, 0);
      c.set_tcp_nodelay(true);  // the body must not wait for the ACK of the headers
      json body = {{"model", models.empty() ? model_id : models[u % models.size()]},
                   {"prompt", prompts[u % prompts.size()]},
                   {"max_tokens", new_tokens},  {"temperature", 0},
                   {"ignore_eos", true},        {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      if (!salt_prefix.empty()) body["cache_salt"] = salt_prefix + std::to_string(i);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      std::string raw;
      bool first = true;
      const auto start = bench_clock::now();
      req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
        if (first) r.first_token_s[u] = seconds_between(start, bench_clock::now()), first = false;
        raw.append(data, n);
        return true;
      };
      auto res = c.send(req);
      r.request_s[u] = seconds_between(start, bench_clock::now());
      if (!res || res->status != 200) {
        std::fprintf(stderr, "bench api: request %d failed (%s)\n", i, res ? std::to_string(res->status).c_str() : "no answer");
        counts[u] = -1;
        return;
      }
      for (std::size_t at = 0; (at = raw.find("data: {", at)) != std::string::npos;) {
        const auto end = raw.find("\n\n", at);
        const json e = json::parse(raw.substr(at + 6, end - at - 6));
        if (e.contains("usage") && e["usage"].is_object()) counts[u] = e["usage"]["completion_tokens"].get<int>();
        if (e.contains("choices") && !e["choices"].empty()) r.texts[u] += e["choices"][0]["text"].get<std::string>();
        at = end;
      }
    });
  for (auto& t : threads) t.join();
  r.wall_s = seconds_between(t0, bench_clock::now());
  for (int c : counts) c < 0 ? ++r.failed : r.tokens += c;
  return r;
}

}  // namespace corolla::app
