// A model directory written group by group (model/model_writer.hpp) and the
// safetensors file under it (model/safetensors_writer.hpp): any order of
// groups gives the same bytes as transformer::save and loads back as the
// model; a group missing, repeated or misshapen is an error, and nothing is
// left under the real name then.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/model_writer.hpp"
#include "model/safetensors.hpp"
#include "model/safetensors_writer.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool same_bits(const param_set& a, const param_set& b) {
  return a.size() == b.size() &&
         std::memcmp(a.flat().data<float>(), b.flat().data<float>(), static_cast<std::size_t>(a.size()) * 4) == 0;
}

/// Files in `dir` whose name holds ".tmp.": a writer's leftovers.
int temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("model writer: groups in any order give transformer::save's file, which loads back as the model") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    testing::temp_dir_guard dir("model-writer");
    testing::tiny_model_options o;
    o.arch = arch;
    o.layers = 3;
    const model_config cfg = testing::tiny_config(o);
    transformer model = transformer::init(cfg, 11, cpu_backend());
    model.save(dir.path() / "saved");
    // Backwards, the head last: what a coordinator does as the ranks' parameters come.
    model_writer w(dir.path() / "streamed", cfg);
    for (int i = cfg.n_layers - 1; i >= 0; --i) w.write_block(i, model.blocks()[static_cast<std::size_t>(i)]);
    w.write_head(model.head());
    CHECK_FALSE(fs::exists(dir.path() / "streamed" / "model.safetensors"));  // not before commit
    w.commit();
    CHECK(bytes_of(dir.path() / "streamed" / "model.safetensors") == bytes_of(dir.path() / "saved" / "model.safetensors"));
    CHECK(bytes_of(dir.path() / "streamed" / "config.json") == bytes_of(dir.path() / "saved" / "config.json"));
    CHECK(temporaries(dir.path() / "streamed") == 0);
    transformer back = transformer::load(dir.path() / "streamed", cpu_backend());
    CHECK(same_bits(back.head(), model.head()));
    for (int i = 0; i < cfg.n_layers; ++i)
      CHECK(same_bits(back.blocks()[static_cast<std::size_t>(i)], model.blocks()[static_cast<std::size_t>(i)]));
  }
}

TEST_CASE("model writer: a group missing, given twice or misshapen is an error, and no file takes the real name") {
  testing::temp_dir_guard dir("model-writer-bad");
  testing::tiny_model_options o;
  o.layers = 2;
  const model_config cfg = testing::tiny_config(o);
  transformer model = transformer::init(cfg, 3, cpu_backend());
  const fs::path out = dir.path() / "m";
  {
    model_writer w(out, cfg);
    w.write_head(model.head());
    w.write_block(1, model.blocks()[1]);
    CHECK_THROWS_AS(w.write_block(1, model.blocks()[1]), tensor_error);
    CHECK_THROWS_AS(w.write_block(2, model.blocks()[1]), tensor_error);
    CHECK_THROWS_AS(w.write_block(0, model.head()), tensor_error);  // the head's layout is not a block's
    try {
      w.commit();
      FAIL("a commit without block 0 succeeded");
    } catch (const model_error& e) {
      CHECK(std::string(e.what()).find("was never given") != std::string::npos);
      CHECK(std::string(e.what()).find("layers.0.") != std::string::npos);
    }
  }
  CHECK_FALSE(fs::exists(out / "model.safetensors"));
  CHECK_FALSE(fs::exists(out / "config.json"));
  CHECK(temporaries(out) == 0);  // the writer's end removed its file
}

TEST_CASE("safetensors writer: tensors land at their offsets in any order, and a wrong one is refused by name") {
  testing::temp_dir_guard dir("st-writer");
  const Tensor a = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::empty({3}, dtype::i32);
  for (int i = 0; i < 3; ++i) b.data<std::int32_t>()[i] = 10 + i;
  write_safetensors(dir.path() / "whole.safetensors", {{"a", a}, {"b", b}});
  {
    safetensors_writer w(dir.path() / "parts.safetensors", {{"a", dtype::f32, {2, 3}}, {"b", dtype::i32, {3}}});
    CHECK_THROWS_AS(w.write("c", a), tensor_error);
    CHECK_THROWS_AS(w.write("a", b), tensor_error);                                    // dtype
    CHECK_THROWS_AS(w.write("a", Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2})), tensor_error);  // shape
    w.write("b", b);
    w.write("a", a);
    w.commit();
  }
  CHECK(bytes_of(dir.path() / "parts.safetensors") == bytes_of(dir.path() / "whole.safetensors"));
  auto f = safetensors_file::open(dir.path() / "parts.safetensors");
  CHECK(f->view("b").data<std::int32_t>()[2] == 12);
  CHECK_THROWS_AS(safetensors_writer(dir.path() / "dup.safetensors", {{"a", dtype::f32, {1}}, {"a", dtype::f32, {1}}}),
                  tensor_error);
  CHECK_THROWS_AS(safetensors_writer(dir.path() / "no-such-dir" / "x.safetensors", {{"a", dtype::f32, {1}}}), model_error);
}

TEST_CASE("safetensors writer: the file's bytes are the format's, header sorted and padded, metadata first") {
  // Written out by hand from the format (and what write_safetensors wrote
  // before it went through safetensors_writer): u64 header length, the
  // JSON header with keys sorted, spaces to an 8-byte boundary, then each
  // tensor's bytes in the order given.
  testing::temp_dir_guard dir("st-golden");
  const Tensor a = Tensor::from_f32(std::vector<float>{1, 2}, {2});
  Tensor b = Tensor::empty({1}, dtype::i32);
  b.data<std::int32_t>()[0] = 7;
  write_safetensors(dir.path() / "g.safetensors", {{"z", a}, {"b", b}}, {{"format", "pt"}});
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"data_offsets":[8,12],"dtype":"I32","shape":[1]},)"
      R"("z":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string want(8, '\0');
  for (int i = 0; i < 8; ++i) want[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  want += header;
  const float fa[2] = {1, 2};
  const std::int32_t ib = 7;
  want.append(reinterpret_cast<const char*>(fa), sizeof fa);
  want.append(reinterpret_cast<const char*>(&ib), sizeof ib);
  CHECK(bytes_of(dir.path() / "g.safetensors") == want);
  CHECK(temporaries(dir.path()) == 0);
}
