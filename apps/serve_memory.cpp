#include "apps/serve_memory.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/commands.hpp"
#include "kernels/backend.hpp"
#include "kernels/memory_available.hpp"
#include "model/block.hpp"
#include "model/span_engine.hpp"

namespace corolla::app {

swarm::memory_budget served_memory_budget(std::uint64_t available, const model_config& cfg, weight_format weights,
                                          bool keep_f32, std::uint64_t cache_bytes_per_block) {
  const bool lean = weights != weight_format::f32 && !keep_f32;
  swarm::memory_budget m;
  m.available_bytes = available;
  m.bytes_per_block = static_cast<std::uint64_t>(served_block_bytes(cfg, weights, keep_f32));
  m.cache_bytes_per_block = cache_bytes_per_block;
  m.reserved_bytes = lean ? static_cast<std::uint64_t>(served_block_bytes(cfg, weight_format::f32)) : 0;
  return m;
}

memory_plan plan_memory(const serve_memory_flags& f, const model_config& cfg, weight_format weights, dtype kv) {
  memory_plan p;
  p.kv_bytes_per_token = span_engine::kv_bytes_per_token(cfg, 1, kv);
  p.budget = served_memory_budget(
      static_cast<std::uint64_t>(parse_memory_budget(f.max_memory, "--max-memory", parse_device(f.device))), cfg,
      weights, f.keep_f32, p.kv_bytes_per_token * static_cast<std::uint64_t>(f.cache_tokens));
  const bool lean = p.budget.reserved_bytes > 0;
  const auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  const std::string aside = lean ? fmt::format(", after {:.1f} MiB for one block in f32 (loading, fine-tuning requests)",
                                               mib(p.budget.reserved_bytes))
                                 : "";
  auto n = swarm::blocks_that_fit(p.budget, static_cast<int>(cfg.n_layers));
  if (!n)
    throw std::invalid_argument(fmt::format(
        "--max-memory {} holds no block: one needs {:.1f} MiB ({:.1f} MiB of {} weights, {:.1f} MiB of KV cache for "
        "--cache-tokens {}){}; lower --cache-tokens, quantise (--weights int8 or nf4) or give more memory",
        f.max_memory, mib(p.budget.bytes_per_block + p.budget.cache_bytes_per_block), mib(p.budget.bytes_per_block),
        weight_format_name(weights), mib(p.budget.cache_bytes_per_block), f.cache_tokens, aside));
  p.blocks = n.value();
  spdlog::info("serve: --max-memory {} holds {} block(s) of {} at {:.1f} MiB of {} weights each and at least {} tokens "
               "of KV cache ({:.1f} MiB a block){}",
               f.max_memory, p.blocks, cfg.n_layers, mib(p.budget.bytes_per_block), weight_format_name(weights),
               f.cache_tokens, mib(p.budget.cache_bytes_per_block), aside);
  return p;
}

void check_cache_tokens(const serve_memory_flags& f, const model_config& cfg, int blocks, dtype kv) {
  const std::uint64_t per_block = span_engine::kv_bytes_per_token(cfg, 1, kv);
  const device where = parse_device(f.device);
  memory_available m;
  try {
    m = available_memory(where);
  } catch (const std::exception&) {
    return;  // nothing to compare with (no such device): the allocation says why
  }
  const auto mib = [](double b) { return b / (1 << 20); };
  const double bytes = static_cast<double>(per_block) * static_cast<double>(f.cache_tokens) * blocks;
  if (m.total_bytes > 0 && bytes > static_cast<double>(m.total_bytes))
    throw std::invalid_argument(fmt::format(
        "--cache-tokens {} needs {:.0f} MiB of {} KV cache for {} block(s), more than the {:.0f} MiB {} has in all: "
        "give fewer tokens, or --max-memory to size the cache by memory",
        f.cache_tokens, mib(bytes), dtype_name(kv), blocks, mib(static_cast<double>(m.total_bytes)), where.str()));
}

std::int64_t cache_tokens_for(const serve_memory_flags& f, const std::optional<memory_plan>& plan, int blocks,
                              int page_tokens) {
  if (!plan) return f.cache_tokens;
  auto t = swarm::cache_tokens_that_fit(plan->budget, blocks, plan->kv_bytes_per_token, page_tokens, f.cache_tokens);
  if (!t) throw std::invalid_argument("--max-memory: " + t.error().message);
  return t.value();
}

}  // namespace corolla::app
