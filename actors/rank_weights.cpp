// Where a training rank gets its parameters (actors/train_job.hpp: rank_weights).
#include <memory>
#include <vector>

#include "actors/train_job.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/head.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"

namespace corolla {

rank_weights weights_of(transformer& model) {
  rank_weights w;
  w.cfg = model.config();
  w.be = &model.backend();
  w.blocks = [&model](int first, int last) {
    return std::vector<param_set>(model.blocks().begin() + first, model.blocks().begin() + last);
  };
  w.head = [&model] { return model.head(); };
  return w;
}

rank_weights weights_from_checkpoint(const std::filesystem::path& dir, Backend& be) {
  auto ck = std::make_shared<checkpoint>(checkpoint::open(dir));
  rank_weights w;
  w.cfg = load_config(dir);
  w.be = &be;
  w.blocks = [ck, cfg = w.cfg, &be](int first, int last) {
    return stage::load(*ck, cfg, first, last, be).params();
  };
  w.head = [ck, cfg = w.cfg, &be] { return head::load(*ck, cfg, be).params(); };
  return w;
}

}  // namespace corolla
