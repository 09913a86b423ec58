#include "apps/model_load.hpp"

#include <spdlog/spdlog.h>

#include "model/config.hpp"
#include "model/lora.hpp"
#include "model/progress_bar.hpp"

namespace corolla::app {

transformer load_for_decoding(const std::string& dir, Backend& be, weight_format f, const std::string& who,
                              const std::string& adapter, bool progress) {
  std::shared_ptr<const lora_adapter> patch;
  if (!adapter.empty()) {
    // Merged on the host as each block is read (lora_adapter::apply).
    auto a = std::make_shared<lora_adapter>(lora_adapter::load(adapter, load_config(dir), cpu_backend()));
    spdlog::info("{}: merging the LoRA adapter {} (r {}, alpha {}, {}) into the weights", who, adapter,
                 a->config().rank, a->config().alpha, a->config().targets_text());
    patch = std::move(a);
  }
  progress_bar bar(progress);
  const std::string label = who + ": loading blocks as " + weight_format_name(f);
  const auto on_block = [&](int done, int total) { bar.draw(label, done, total); };
  if (f == weight_format::f32) {
    transformer model = transformer::load(dir, be, on_block, patch);
    bar.finish();
    return model;
  }
  transformer model = transformer::load_inference(dir, be, f, on_block, patch);
  bar.finish();
  spdlog::info("{}: {} blocks loaded as {} weights (f32 parameters not kept)", who, model.config().n_layers,
               weight_format_name(f));
  return model;
}

}  // namespace corolla::app
