#include "api/completion_engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>

#include <caf/actor_system_config.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "api/openai_request.hpp"
#include "model/error.hpp"
#include "schedule/prompt_reuse.hpp"

namespace corolla::api {

slot_pool::slot_pool(int slots) : free_(static_cast<std::size_t>(std::max(slots, 1)), true) {}

int slot_pool::acquire() {
  std::unique_lock lock(mutex_);
  for (;;) {
    for (std::size_t i = 0; i < free_.size(); ++i)
      if (free_[i]) {
        free_[i] = false;
        return static_cast<int>(i);
      }
    freed_.wait(lock);
  }
}

void slot_pool::release(int slot) {
  {
    std::lock_guard lock(mutex_);
    free_.at(static_cast<std::size_t>(slot)) = true;
  }
  freed_.notify_one();
}

int slot_pool::busy() const {
  std::lock_guard lock(mutex_);
  int n = 0;
  for (bool f : free_) n += f ? 0 : 1;
  return n;
}

namespace {

/// Holds a slot for the lifetime of one request.
class slot_lease {
 public:
  explicit slot_lease(slot_pool& pool) : pool_(pool), slot_(pool.acquire()) {}
  ~slot_lease() { pool_.release(slot_); }
  slot_lease(const slot_lease&) = delete;
  slot_lease& operator=(const slot_lease&) = delete;
  std::size_t index() const { return static_cast<std::size_t>(slot_); }

 private:
  slot_pool& pool_;
  int slot_;
};

/// Turns in arrival order: whoever asked first goes next (a mutex lets the
/// thread that just released it take it again at once).
class turnstile {
 public:
  void enter() {
    std::unique_lock lock(mutex_);
    const std::uint64_t mine = next_++;
    turn_.wait(lock, [&] { return serving_ == mine; });
  }
  void leave() {
    {
      std::lock_guard lock(mutex_);
      ++serving_;
    }
    turn_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable turn_;
  std::uint64_t next_ = 0, serving_ = 0;
};

/// The model in this process, a generator per slot. On a device the
/// generators take turns, a token at a time: a device backend's stream and
/// scratch buffers serve one thread at a time (kernels/cuda/cuda_backend.hpp).
class local_engine final : public completion_engine {
 public:
  local_engine(transformer& model, int slots, weight_format weights, dtype kv)
      : cfg_(model.config()), pool_(slots), take_turns_(model.backend().dev().kind != device_kind::cpu) {
    // One set of inference weights: the first generator makes the copies,
    // the others read them (each with its own KV cache and workspace).
    generators_.push_back(std::make_unique<generator>(model, 0, weights, kv));
    for (int i = 1; i < pool_.size(); ++i)
      generators_.push_back(std::make_unique<generator>(model, *generators_.front(), 0, kv));
  }
  const model_config& config() const override { return cfg_; }
  void check_ready() override {}
  engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                         const token_callback& on_token, const std::string& /*cache_domain*/,
                         const std::string& adapter) override {
    if (!adapter.empty()) throw model_error("no adapter '" + adapter + "' is served here (none is)");
    // (A generator per request shares no cache: every domain is apart.)
    slot_lease slot(pool_);
    generator& g = *generators_[slot.index()];
    if (!take_turns_) return {g.generate(prompt, p, on_token), 0};
    // The device is held while a step computes, and let go while its token
    // is handed out (and streamed): the requests' steps take turns.
    struct turn {
      turnstile& t;
      bool held = false;
      void enter() { t.enter(), held = true; }
      void leave() { t.leave(), held = false; }
      ~turn() {
        if (held) t.leave();
      }
    } device{turns_};
    device.enter();
    return {g.generate(prompt, p,
                       [&](std::int32_t id) {
                         device.leave();
                         if (on_token) on_token(id);
                         device.enter();
                       }),
            0};
  }
  int busy() const override { return pool_.busy(); }
  int slots() const override { return pool_.size(); }

 private:
  model_config cfg_;
  slot_pool pool_;
  bool take_turns_;
  turnstile turns_;  ///< on a device: the slot computing holds it
  std::vector<std::unique_ptr<generator>> generators_;
};

/// Tokens of KV cache for `slots` whole contexts, in pages of `page_tokens`.
std::int64_t contexts_of(const model_config& cfg, int slots, int page_tokens) {
  const std::int64_t pages = (cfg.max_positions + page_tokens - 1) / page_tokens;
  return std::int64_t{slots} * pages * page_tokens;
}

/// The blocks of `model` with `slots` contexts of KV cache (taken as
/// sessions grow), reading `weights`, holding `adapters` for the sessions
/// that ask for them.
span_engine local_span_engine(transformer& model, int slots, weight_format weights, dtype kv,
                              const std::vector<named_adapter>& adapters) {
  if (!is_float_dtype(kv))
    throw model_error(std::string("the KV cache is f32, bf16 or f16, not ") + dtype_name(kv));
  model.require_decoding_format(weights);
  stage blocks = model.decoding_stage();
  span_engine_options o;
  o.kv_dtype = kv;
  o.cache_allocation = kv_allocation::lazy;
  o.weights = weights;
  span_engine e(std::move(blocks), contexts_of(model.config(), slots, o.page_tokens), o);
  for (const named_adapter& a : adapters)
    if (auto ok = e.add_adapter(a.name, *a.adapter); !ok) throw model_error(ok.error().message);
  return e;
}

/// The head of `model` reading `weights` (its LM head's inference copy).
head local_head(transformer& model, weight_format weights) {
  head h(model.config(), model.head(), model.backend());
  h.use_inference_weights(weights);
  return h;
}

/// CAF for the batcher alone: its actor is detached, so the scheduler's
/// threads only carry the replies' bookkeeping.
std::unique_ptr<caf::actor_system_config> batcher_system_config() {
  auto cfg = std::make_unique<caf::actor_system_config>();
  cfg->set("scheduler.max-threads", std::int64_t{2});
  cfg->add_error_category(error_category, render_error);
  return cfg;
}

/// The batcher of `slots` slots: as many finished requests' caches kept
/// for prompts that start the same way (a chat's system prompt and earlier
/// turns), within the same KV budget (let go whenever running requests need
/// the pages), unless the requests are isolated.
decode_batcher_options batcher_options(int slots, local_decoding decoding) {
  decode_batcher_options o;
  o.retained_sessions = decoding == local_decoding::batched_isolated ? 0 : slots;
  o.share_prefixes = decoding == local_decoding::batched;
  return o;
}

/// The model in this process, its slots' decode steps batched.
class batched_local_engine final : public completion_engine {
 public:
  batched_local_engine(transformer& model, int slots, weight_format weights, dtype kv, local_decoding decoding,
                       const std::vector<named_adapter>& adapters)
      : cfg_(model.config()),
        pool_(slots),
        system_config_(batcher_system_config()),
        system_(*system_config_),
        batcher_(system_, local_span_engine(model, pool_.size(), weights, kv, adapters), local_head(model, weights),
                 batcher_options(pool_.size(), decoding)) {}
  const model_config& config() const override { return cfg_; }
  void check_ready() override {}
  engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                         const token_callback& on_token, const std::string& cache_domain,
                         const std::string& adapter) override {
    slot_lease slot(pool_);
    batched_generation g = batcher_.generate(prompt, p, on_token, cache_domain, adapter);
    return {std::move(g.result), 0, g.cached_prompt_tokens};
  }
  std::vector<std::string> adapters() const override { return batcher_.adapters(); }
  int busy() const override { return pool_.busy(); }
  int slots() const override { return pool_.size(); }
  std::optional<decode_batcher_stats> batching() const override { return batcher_.stats(); }

 private:
  model_config cfg_;
  slot_pool pool_;
  std::unique_ptr<caf::actor_system_config> system_config_;
  caf::actor_system system_;
  decode_batcher batcher_;  ///< declared last: stopped before the actor system
};

class swarm_engine final : public completion_engine {
 public:
  swarm_engine(node& runtime, swarm_client_options options, head client_head, int slots, weight_format weights,
               bool share_prefixes, const std::vector<std::string>& adapters)
      : cfg_(client_head.config()),
        pool_(slots),
        shared_head_(std::move(client_head)),
        options_(std::move(options)),
        probe_(runtime, options_),
        runtime_(runtime),
        share_prefixes_(share_prefixes),
        board_(16, std::chrono::seconds(30), share_prefixes ? static_cast<std::size_t>(pool_.size()) : 0) {
    if (!options_.adapter.empty())
      throw std::invalid_argument("the swarm engine's requests name their adapters: give '" + options_.adapter +
                                  "' among the engine's adapters, not as the client's");
    for (const std::string& spec : adapters) {
      if (spec == "*") {
        discover_ = true;
        continue;
      }
      const std::string name = adapter_ref::parse(spec).name;
      if (!adapter_specs_.emplace(name, spec).second)
        throw std::invalid_argument("adapter '" + name + "' is given twice");
      adapter_names_.push_back(name);
    }
    std::sort(adapter_names_.begin(), adapter_names_.end());
    probe_.expect_shape(cfg_.n_layers, static_cast<int>(cfg_.hidden_size));
    for (int i = 0; i < pool_.size(); ++i) {
      slots_.push_back(std::make_unique<slot>(slot{head(cfg_, shared_head_.params(), shared_head_.backend()), {}}));
      slots_.back()->clients.emplace("", std::make_unique<swarm_client>(runtime, options_));
      slots_.back()->h.use_inference_weights(weights);
    }
  }
  ~swarm_engine() override {
    for (const auto& p : board_.drop_all_kept()) close_parked(runtime_, p);
  }
  const model_config& config() const override { return cfg_; }

  void check_ready() override {
    std::lock_guard lock(probe_mutex_);
    // A route found less than a second ago still stands: asking the links
    // for every server's state and RTT costs milliseconds per request, and
    // a swarm that failed since is met by the request's own failover (or
    // its 503) anyway.
    if (std::chrono::steady_clock::now() - last_ready_ < std::chrono::seconds(1)) return;
    // Asks the servers again when the last answer has no route: a server
    // may have joined (or come back) since.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!probe_.refreshed() || attempt > 0)
        if (auto err = probe_.refresh())
          throw api_error(503, "service_unavailable", "no server of the swarm answers: " + error_message(err), {},
                          "swarm_unavailable");
      auto r = probe_.route(0, cfg_.n_layers, {}, 1);
      if (r) {
        last_ready_ = std::chrono::steady_clock::now();
        return;
      }
      if (attempt > 0)
        throw api_error(503, "service_unavailable",
                        "the swarm cannot serve this model now: " + error_message(r.error()), {}, "swarm_unavailable");
    }
  }

  engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                         const token_callback& on_token, const std::string& cache_domain,
                         const std::string& adapter) override {
    if (!adapter.empty() && !std::binary_search(adapter_names_.begin(), adapter_names_.end(), adapter)) {
      // A name the swarm held when the request was checked and holds no
      // more: 404 naming nothing else (the list would hold names private
      // to other tenants; api/adapter_access.hpp).
      if (discover_ && !discovered_now(adapter))
        throw api_error(404, "invalid_request_error", "The model '" + adapter + "' is not served now (GET /v1/models).",
                        "model", "model_not_found");
      if (!discover_) {
        std::string held;
        for (const auto& a : adapter_names_) held += (held.empty() ? "" : ", ") + a;
        throw model_error("no adapter '" + adapter + "' is served here" +
                          (held.empty() ? " (none is)" : " (these are: " + held + ")"));
      }
    }
    slot_lease lease(pool_);
    slot& s = *slots_[lease.index()];
    swarm_client& client = client_for(s, adapter);
    // The slots' sessions are one node's: a prompt may start on the pages
    // of another running request's session (api/swarm_prefix_board.hpp).
    const std::string id = std::to_string(next_request_++);
    swarm_prompt_sharing sharing;
    // At the end, however it ends: off the board unless kept, and the kept
    // sessions let go closed on their servers (after generation, so the
    // closes never delay a token).
    struct leaving {
      swarm_engine& e;
      const std::string& id;
      std::vector<swarm_prefix> to_close;
      ~leaving() {
        if (!e.share_prefixes_) return;
        e.board_.leave(id);
        for (const auto& p : to_close) close_parked(e.runtime_, p);
      }
    } on_end{*this, id, {}};
    if (share_prefixes_) {
      // Pages computed with another adapter (or none) are of no use.
      sharing.start = board_.enter(id, {prompt.begin(), prompt.end()}, schedule::adapter_domain(cache_domain, adapter));
      sharing.on_prompt = [this, &id, &on_end](swarm_prefix held) {
        // A kept session this one continued whole (a chat's last turn) is
        // of no more use: this one holds all of it.
        swarm_prefix superseded = board_.computed(id, std::move(held));
        if (!superseded.hops.empty()) on_end.to_close.push_back(std::move(superseded));
      };
      // Finished: parked on its servers for a later request (a chat's next
      // turn) while the board keeps it.
      sharing.on_end = [this, &id, &on_end](const swarm_generation& g, swarm_prefix held, std::vector<std::int32_t> ids) {
        auto f = board_.finished(id, std::move(held), std::move(ids), g.share_missed);
        for (auto& p : f.close) on_end.to_close.push_back(std::move(p));
        return f.keep;
      };
    }
    try {
      swarm_generation g = swarm_generate(client, s.h, prompt, p, on_token, {}, share_prefixes_ ? &sharing : nullptr);
      return {std::move(g.result), g.failovers, static_cast<int>(g.shared_prompt_tokens)};
    } catch (const model_error&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw api_error(503, "service_unavailable", std::string("the swarm failed: ") + e.what(), {}, "swarm_unavailable");
    }
  }
  int busy() const override { return pool_.busy(); }
  int slots() const override { return pool_.size(); }
  std::optional<prefix_board_stats> prompt_sharing() const override {
    return share_prefixes_ ? std::optional(board_.stats()) : std::nullopt;
  }
  std::vector<std::string> adapters() const override {
    if (!discover_) return adapter_names_;
    std::vector<std::string> all = discovered();
    all.insert(all.end(), adapter_names_.begin(), adapter_names_.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }
  bool discovers_adapters() const override { return discover_; }

 private:
  /// The adapters the swarm holds over the whole model (names), asked of
  /// the servers when the last answer is older than
  /// adapter_discovery_interval (by one caller; the others meanwhile get
  /// the last list, so no request waits on the servers' answers but the
  /// one that asks). Each name is admitted once and for good while fewer
  /// than max_discovered_adapters are; its digest is pinned as a name
  /// given alone is (client_for).
  std::vector<std::string> discovered() const {
    {
      std::lock_guard lock(discovery_mutex_);
      if (discovered_at_ && std::chrono::steady_clock::now() - *discovered_at_ < adapter_discovery_interval)
        return discovered_;
    }
    std::unique_lock asking(discovery_refresh_mutex_, std::try_to_lock);
    if (!asking) {
      std::lock_guard lock(discovery_mutex_);
      return discovered_;
    }
    std::vector<adapter_ref> held;
    {
      std::lock_guard probe(probe_mutex_);
      if (auto err = probe_.refresh()) {  // (the last list stands: requests naming one meet the failure)
        spdlog::info("api: asking the swarm for its adapters: {}", error_message(err));
        std::lock_guard lock(discovery_mutex_);
        discovered_at_ = std::chrono::steady_clock::now();
        return discovered_;
      }
      held = probe_.complete_adapters();
    }
    std::lock_guard lock(discovery_mutex_);
    discovered_at_ = std::chrono::steady_clock::now();
    std::vector<std::string> names;
    for (const adapter_ref& a : held) {
      if (!admitted_.count(a.name)) {
        if (admitted_.size() >= max_discovered_adapters) {
          if (!warned_full_)
            spdlog::warn("api: the swarm holds more than {} adapters: '{}' and later ones are not served",
                         max_discovered_adapters, a.name);
          warned_full_ = true;
          continue;
        }
        admitted_.insert(a.name);
        spdlog::info("api: serving the swarm's adapter '{}'", a.name);
      }
      names.push_back(a.name);
    }
    names.erase(std::unique(names.begin(), names.end()), names.end());  // (held is sorted: a name's digests adjacent)
    discovered_ = std::move(names);
    return discovered_;
  }
  /// Whether the swarm holds `adapter` over the whole model now.
  bool discovered_now(const std::string& adapter) const {
    const auto names = discovered();
    return std::binary_search(names.begin(), names.end(), adapter);
  }

  /// A slot's head, and its clients by adapter ("": the base model's),
  /// each made the first time a request of the slot names its adapter
  /// (routes of one adapter never mix with another's).
  struct slot {
    head h;
    std::map<std::string, std::unique_ptr<swarm_client>> clients;
  };

  /// Slot `s`'s client for `adapter` (one of adapter_specs_, or ""). A
  /// name given without a digest is pinned, for every slot, to the digest
  /// the first client meets, so that all requests naming it compute with
  /// the same adapter (the refresh that finds it runs outside the lock: it
  /// asks every server).
  swarm_client& client_for(slot& s, const std::string& adapter) {
    if (auto it = s.clients.find(adapter); it != s.clients.end()) return *it->second;
    swarm_client_options o = options_;
    {
      std::lock_guard pin(pin_mutex_);
      o.adapter = adapter_specs_.try_emplace(adapter, adapter).first->second;  // (a discovered one: its name)
    }
    auto c = std::make_unique<swarm_client>(runtime_, o);
    if (!adapter.empty() && c->adapter_digest().empty()) {
      // (Not kept when no server answers with it: the next request tries
      // again. The servers' answers stay in the log, not in the response.)
      if (auto err = c->refresh()) {
        spdlog::warn("api: no server holds adapter '{}' now: {}", adapter, error_message(err));
        throw api_error(503, "service_unavailable",
                        "no server of the swarm serves adapter '" + adapter + "' now", {}, "swarm_unavailable");
      }
      std::lock_guard pin(pin_mutex_);
      std::string& spec = adapter_specs_.at(adapter);
      if (adapter_ref::parse(spec).digest.empty()) {
        spec = adapter + "@" + c->adapter_digest();
        spdlog::info("api: adapter '{}' is {}", adapter, spec);
      } else if (spec != adapter + "@" + c->adapter_digest()) {
        o.adapter = spec;  // another slot pinned it meanwhile, to another server's: that one
        c = std::make_unique<swarm_client>(runtime_, o);
      }
    }
    return *s.clients.emplace(adapter, std::move(c)).first->second;
  }

  model_config cfg_;
  slot_pool pool_;
  head shared_head_;
  swarm_client_options options_;
  std::vector<std::string> adapter_names_;  ///< sorted, "*" left out
  bool discover_ = false;                   ///< "*" given: adapters the swarm holds too
  mutable std::mutex discovery_refresh_mutex_;  ///< held by the one caller asking the servers; before probe_mutex_
  mutable std::mutex discovery_mutex_;          ///< guards the list; never held while asking
  mutable std::optional<std::chrono::steady_clock::time_point> discovered_at_;  ///< guarded by discovery_mutex_
  mutable std::vector<std::string> discovered_;  ///< sorted names; guarded by discovery_mutex_
  mutable std::set<std::string> admitted_;       ///< every name ever served; guarded by discovery_mutex_
  mutable bool warned_full_ = false;             ///< guarded by discovery_mutex_
  std::mutex pin_mutex_;
  std::map<std::string, std::string> adapter_specs_;  ///< name -> NAME or NAME@DIGEST; guarded by pin_mutex_
  mutable std::mutex probe_mutex_;
  /// Answers check_ready() and discovered(), guarded by probe_mutex_.
  mutable swarm_client probe_;
  std::chrono::steady_clock::time_point last_ready_{};  ///< the last route found, guarded by probe_mutex_
  std::vector<std::unique_ptr<slot>> slots_;
  node& runtime_;
  bool share_prefixes_;
  swarm_prefix_board board_;
  std::atomic<std::uint64_t> next_request_{0};
};

}  // namespace

std::unique_ptr<completion_engine> make_local_engine(transformer& model, int slots, weight_format weights, dtype kv,
                                                     local_decoding decoding, const std::vector<named_adapter>& adapters) {
  if (decoding != local_decoding::per_request)
    return std::make_unique<batched_local_engine>(model, slots, weights, kv, decoding, adapters);
  if (!adapters.empty())
    throw model_error("adapters are served by batched decoding (their terms beside the weights in the batcher's "
                      "batches): drop --batching off, or merge one adapter into the weights (--merge-adapter)");
  return std::make_unique<local_engine>(model, slots, weights, kv);
}

std::unique_ptr<completion_engine> make_swarm_engine(node& runtime, swarm_client_options options, head client_head,
                                                     int slots, weight_format weights, bool share_prefixes,
                                                     const std::vector<std::string>& adapters) {
  return std::make_unique<swarm_engine>(runtime, std::move(options), std::move(client_head), slots, weights,
                                        share_prefixes, adapters);
}

}  // namespace corolla::api
