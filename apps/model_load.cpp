#include "apps/model_load.hpp"

#include <spdlog/spdlog.h>

#include "model/progress_bar.hpp"

namespace corolla::app {

transformer load_for_decoding(const std::string& dir, Backend& be, weight_format f, const std::string& who) {
  progress_bar bar(true);
  const std::string label = who + ": loading blocks as " + weight_format_name(f);
  const auto on_block = [&](int done, int total) { bar.draw(label, done, total); };
  if (f == weight_format::f32) {
    transformer model = transformer::load(dir, be, on_block);
    bar.finish();
    return model;
  }
  transformer model = transformer::load_inference(dir, be, f, on_block);
  bar.finish();
  spdlog::info("{}: {} blocks loaded as {} weights (f32 parameters not kept)", who, model.config().n_layers,
               weight_format_name(f));
  return model;
}

}  // namespace corolla::app
