// apps/serve_adapters.hpp — the LoRA adapters `corolla serve --adapter`
// holds for its sessions (Petals' servers' --adapters): parsed and loaded
// before the server joins the swarm, then handed to each engine it serves
// with (the first, and the one a move loads). `corolla api --local
// --adapter` loads its adapters with the same rules.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace corolla {
class lora_adapter;
class span_engine;
}  // namespace corolla

namespace corolla::app {

/// One adapter a server holds: the name sessions ask for and the adapter
/// (on the host; each engine copies its blocks' factors to its device).
struct served_adapter {
  std::string name;
  std::string dir;
  std::shared_ptr<const lora_adapter> adapter;
};

/// Each `--adapter NAME=DIR` (or DIR: named by its last path component)
/// loaded for a model of `cfg`. Throws std::invalid_argument naming the
/// flag for a bad name (empty, "." or "..", over 128 bytes, with a space,
/// control character, '=', ',' or '@'), a name given twice, more than 64, or an adapter
/// that cannot be loaded or was made for another model.
std::vector<served_adapter> load_served_adapters(const std::vector<std::string>& flags, const model_config& cfg);

/// Throws std::invalid_argument naming `--adapter flag` unless `name` is an
/// adapter name as above (what clients may send as a model or NAME@DIGEST).
void check_adapter_name(const std::string& name, const std::string& flag);

/// Gives every adapter to `engine` (span_engine::add_adapter). Throws
/// std::runtime_error when one is refused.
void hold_adapters(span_engine& engine, const std::vector<served_adapter>& adapters);

/// What the server's DHT record says it holds (net::server_record::
/// adapters): each one's digest by name, the first
/// net::max_record_adapters in name order (logged when there are more).
std::map<std::string, std::string> announced_adapters(const std::vector<served_adapter>& adapters);

}  // namespace corolla::app
