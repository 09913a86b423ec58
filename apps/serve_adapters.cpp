// apps/serve_adapters.cpp — see serve_adapters.hpp.
#include "apps/serve_adapters.hpp"

#include <filesystem>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/swarm_client.hpp"
#include "actors/swarm_wire.hpp"
#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/span_engine.hpp"
#include "net/server_record.hpp"

namespace corolla::app {

void check_adapter_name(const std::string& name, const std::string& flag) {
  if (const std::string why = adapter_ref::name_problem(name); !why.empty())
    throw std::invalid_argument("--adapter " + flag + ": " + why +
                                (name.empty() || name == "." || name == ".." ? " (give NAME=DIR)" : ""));
}

std::vector<served_adapter> load_served_adapters(const std::vector<std::string>& flags, const model_config& cfg) {
  if (flags.size() > max_span_adapters)
    throw std::invalid_argument("--adapter given " + std::to_string(flags.size()) + " times: a server holds at most " +
                                std::to_string(max_span_adapters));
  std::vector<served_adapter> out;
  std::set<std::string> names;
  for (const std::string& flag : flags) {
    const auto eq = flag.find('=');
    served_adapter a;
    a.dir = eq == std::string::npos ? flag : flag.substr(eq + 1);
    a.name = eq == std::string::npos ? std::filesystem::path(a.dir).lexically_normal().filename().string()
                                     : flag.substr(0, eq);
    if (a.name.empty() && eq == std::string::npos)  // "dir/" normalises to an empty last component
      a.name = std::filesystem::path(a.dir).lexically_normal().parent_path().filename().string();
    check_adapter_name(a.name, flag);
    if (a.dir.empty()) throw std::invalid_argument("--adapter " + flag + ": no directory after '='");
    if (!names.insert(a.name).second)
      throw std::invalid_argument("--adapter " + flag + ": the name '" + a.name + "' is given twice");
    try {
      a.adapter = std::make_shared<const lora_adapter>(lora_adapter::load(a.dir, cfg, cpu_backend()));
    } catch (const std::exception& e) {
      throw std::invalid_argument("--adapter " + flag + ": " + e.what());
    }
    if (!a.adapter->fits(cfg))
      throw std::invalid_argument("--adapter " + flag + ": the adapter was made for another model (" +
                                  std::to_string(a.adapter->n_layers()) + " layers; this one has " +
                                  std::to_string(cfg.n_layers) + ")");
    out.push_back(std::move(a));
  }
  return out;
}

void hold_adapters(span_engine& engine, const std::vector<served_adapter>& adapters) {
  for (const served_adapter& a : adapters) {
    if (auto ok = engine.add_adapter(a.name, *a.adapter); !ok)
      throw std::runtime_error("adapter " + a.name + " (" + a.dir + "): " + ok.error().message);
    const lora_config& c = a.adapter->config();
    spdlog::info("serve: holding adapter {}@{} from {} (rank {}, alpha {}, {}) for blocks [{}, {})", a.name,
                 a.adapter->digest(), a.dir, c.rank, c.alpha, c.targets_text(), engine.first(), engine.last());
  }
}

std::map<std::string, std::string> announced_adapters(const std::vector<served_adapter>& adapters) {
  std::map<std::string, std::string> all, out;
  for (const served_adapter& a : adapters) all.emplace(a.name, a.adapter->digest());
  for (const auto& [name, digest] : all)
    if (out.size() < net::max_record_adapters) out.emplace(name, digest);
  if (all.size() > out.size())
    spdlog::info("serve: the DHT record names the first {} of the {} adapters held (clients find them all)",
                 out.size(), all.size());
  return out;
}

}  // namespace corolla::app
