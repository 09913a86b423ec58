#include "apps/model_load.hpp"

#include <spdlog/spdlog.h>

#include "model/progress_bar.hpp"

namespace corolla::app {

transformer load_for_decoding(const std::string& dir, Backend& be, weight_format f, const std::string& who) {
  if (f == weight_format::f32) return transformer::load(dir, be);
  progress_bar bar(true);
  const std::string label = who + ": loading blocks as " + weight_format_name(f);
  transformer model = transformer::load_inference(dir, be, f, [&](int done, int total) { bar.draw(label, done, total); });
  bar.finish();
  spdlog::info("{}: {} blocks loaded as {} weights (f32 parameters not kept)", who, model.config().n_layers,
               weight_format_name(f));
  return model;
}

}  // namespace corolla::app
