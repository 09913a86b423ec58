// Tests for model/safetensors: header validation, memory-mapped views,
// writing, dtype conversion and checkpoint directories (single and sharded).
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/half.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

/// Writes a safetensors file from a raw header string and data bytes.
void write_raw(const fs::path& file, const std::string& header, const std::string& data) {
  std::ofstream out(file, std::ios::binary);
  std::uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("safetensors write then open gives the same tensors, views borrow the mapping") {
  testing::temp_dir_guard dir("st-roundtrip");
  std::vector<float> a{1, 2, 3, 4, 5, 6};
  std::vector<std::int32_t> b{7, -8, 9};
  Tensor c = Tensor::from_f32(std::vector<float>{0.5f, -1.25f, 3.0f, 1e-3f}, {2, 2});
  std::vector<std::pair<std::string, Tensor>> ts{
      {"z.first", Tensor::from_f32(a, {2, 3})},
      {"a.second", Tensor::from_i32(b, {3})},
      {"bf", c.to(dtype::bf16)},
      {"half", c.to(dtype::f16)},
      {"scalar", Tensor::from_f32(std::vector<float>{42.0f}, {})},
      {"empty", Tensor::empty({0, 4})}};
  const fs::path file = dir / "x.safetensors";
  write_safetensors(file, ts, {{"format", "pt"}});

  // Header length keeps the data section 8-byte aligned.
  {
    std::ifstream in(file, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    CHECK(n % 8 == 0);
  }

  Tensor view;
  {
    auto f = safetensors_file::open(file);
    REQUIRE(f->tensors().size() == 6);
    CHECK(f->find("missing") == nullptr);
    const tensor_info* i = f->find("z.first");
    REQUIRE(i);
    CHECK(i->type == dtype::f32);
    CHECK(i->shape == shape_t{2, 3});
    CHECK(i->begin == 0);  // data in the given order, not sorted by name
    CHECK(f->find("a.second")->begin == 24);
    CHECK(f->view("a.second").to_vector() == std::vector<float>{7, -8, 9});
    CHECK(f->view("bf").type() == dtype::bf16);
    CHECK(f->view("half").type() == dtype::f16);
    CHECK(f->view("scalar").shape().empty());
    CHECK(f->view("empty").numel() == 0);
    view = f->view("z.first");
  }
  // The view keeps the file mapped after the last handle went away.
  CHECK(view.to_vector() == a);

  const std::vector<float> c_values = c.to_vector();
  fs::create_directories(dir / "m");
  fs::rename(file, dir / "m" / "model.safetensors");
  checkpoint ck = checkpoint::open(dir / "m");
  CHECK(ck.has("bf"));
  CHECK_FALSE(ck.has("nope"));
  CHECK(ck.load_f32("z.first").to_vector() == a);
  // BF16/F16 convert exactly to what the 16-bit values represent.
  std::vector<float> bf = ck.load_f32("bf").to_vector(), hf = ck.load_f32("half").to_vector();
  for (std::size_t k = 0; k < c_values.size(); ++k) {
    CHECK(bf[k] == bf16_to_f32(f32_to_bf16(c_values[k])));
    CHECK(hf[k] == f16_to_f32(f32_to_f16(c_values[k])));
  }
  Tensor dst = Tensor::empty({2, 3});
  ck.load_into("z.first", dst);
  CHECK(dst.to_vector() == a);
}

TEST_CASE("safetensors rejects truncated and malformed files with the file name") {
  testing::temp_dir_guard dir("st-bad");
  const fs::path file = dir / "bad.safetensors";
  auto open_error = [&] { return error_of([&] { safetensors_file::open(file); }); };

  { std::ofstream(file, std::ios::binary) << "abc"; }
  std::string e = open_error();
  CHECK(contains(e, file.string() + " is truncated"));

  // Header length larger than the file.
  {
    std::ofstream out(file, std::ios::binary);
    std::uint64_t n = 64;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  CHECK(contains(open_error(), file.string() + " is truncated: header of 64 bytes"));

  // Data shorter than the header promises.
  write_raw(file, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "12345678");
  e = open_error();
  CHECK(contains(e, file.string() + " is truncated"));
  CHECK(contains(e, "tensor w"));

  write_raw(file, R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "12345678");
  CHECK(open_error() == "tensor w has unsupported dtype F64 in " + file.string() +
                            " (supported: F32, F16, BF16, I32, I8)");

  write_raw(file, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678");
  CHECK(contains(open_error(), "needs 12"));

  write_raw(file, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "12345678");
  CHECK(contains(open_error(), "invalid shape"));

  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", "12345678");
  CHECK(contains(open_error(), "begin > end"));

  write_raw(file, R"({"w": nope})", "");
  e = open_error();
  CHECK(contains(e, "invalid safetensors header"));
  CHECK(contains(e, file.string()));

  // Absurd header length (not a safetensors file at all).
  {
    std::ofstream out(file, std::ios::binary);
    out << "PK\x03\x04 this is a zip file, not safetensors";
  }
  CHECK(contains(open_error(), "not a safetensors file"));

  // __metadata__ is skipped, not taken for a tensor.
  write_raw(file,
            R"({"__metadata__":{"format":"pt"},"w":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})",
            "\x01\x02");
  auto f = safetensors_file::open(file);
  CHECK(f->tensors().size() == 1);
  CHECK(f->view("w").type() == dtype::i8);
}

TEST_CASE("checkpoint errors name the directory, tensor, file and shapes") {
  testing::temp_dir_guard dir("st-ckpt-errors");
  CHECK(error_of([&] { checkpoint::open(dir / "absent"); }) ==
        "model directory " + (dir / "absent").string() + " does not exist");
  CHECK(error_of([&] { checkpoint::open(dir.path()); }) ==
        "no model.safetensors or model.safetensors.index.json in " + dir.path().string());

  write_safetensors(dir / "model.safetensors",
                    {{"w", Tensor::zeros({2, 3})}, {"ids", Tensor::zeros({2}, dtype::i32)}});
  checkpoint ck = checkpoint::open(dir.path());
  CHECK(error_of([&] { ck.load_f32("nope"); }) ==
        "tensor nope missing from " + dir.path().string());
  CHECK(error_of([&] { ck.info("nope"); }) == "tensor nope missing from " + dir.path().string());
  shape_t want{3, 2};
  CHECK(error_of([&] { ck.load_f32("w", &want); }) ==
        "tensor w in " + (dir / "model.safetensors").string() +
            " has shape [2, 3], expected [3, 2]");
  Tensor dst = Tensor::empty({6});
  CHECK(contains(error_of([&] { ck.load_into("w", dst); }), "expected [6]"));
  CHECK(contains(error_of([&] { ck.load_f32("ids"); }), "dtype I32"));
  shape_t right{2, 3};
  CHECK(ck.load_f32("w", &right).shape() == right);
}

TEST_CASE("sharded checkpoints load through the index and match the single file") {
  for (dtype storage : {dtype::f32, dtype::bf16, dtype::f16}) {
    CAPTURE(dtype_name(storage));
    testing::tiny_model_options o;
    o.storage = storage;
    testing::temp_dir_guard one("st-single"), many("st-sharded");
    testing::write_tiny_model(one.path(), o);
    o.shards = 3;
    testing::write_tiny_model(many.path(), o);
    CHECK(fs::exists(many / "model-00001-of-00003.safetensors"));
    CHECK(fs::exists(many / "model-00003-of-00003.safetensors"));
    CHECK_FALSE(fs::exists(many / "model.safetensors"));

    auto index = nlohmann::json::parse(std::ifstream(many / "model.safetensors.index.json"));
    std::uint64_t total = 0;
    checkpoint ck = checkpoint::open(many.path());
    for (const auto& name : ck.names()) {
      CHECK(ck.info(name).type == storage);
      total += ck.info(name).end - ck.info(name).begin;
    }
    CHECK(index["metadata"]["total_size"].get<std::uint64_t>() == total);
    CHECK(index["weight_map"].size() == ck.names().size());
    CHECK(testing::read_all_f32(one.path()) == testing::read_all_f32(many.path()));
  }
}

TEST_CASE("a broken index or shard is reported") {
  testing::temp_dir_guard dir("st-index");
  testing::tiny_model_options o;
  o.shards = 2;
  testing::write_tiny_model(dir.path(), o);
  const fs::path index_file = dir / "model.safetensors.index.json";
  auto index = nlohmann::json::parse(std::ifstream(index_file));

  auto rewrite = [&](const nlohmann::json& j) { std::ofstream(index_file) << j.dump(); };
  nlohmann::json j = index;
  j["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors";
  rewrite(j);
  CHECK(contains(error_of([&] { checkpoint::open(dir.path()); }),
                 "tensor model.extra.weight missing from shard"));

  j = index;
  j["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  rewrite(j);
  CHECK(contains(error_of([&] { checkpoint::open(dir.path()); }), "does not exist"));

  j = index;
  j["weight_map"]["model.norm.weight"] = "../model.safetensors";
  rewrite(j);
  CHECK(contains(error_of([&] { checkpoint::open(dir.path()); }), "invalid shard file"));

  { std::ofstream(index_file) << "{\"weight_map\": {"; }
  CHECK(contains(error_of([&] { checkpoint::open(dir.path()); }), "invalid JSON"));

  // A shard cut short is caught on open.
  rewrite(index);
  const fs::path shard = dir / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 10);
  CHECK(contains(error_of([&] { checkpoint::open(dir.path()); }), shard.string() + " is truncated"));
}

TEST_CASE("tiny models have the HF names and layouts") {
  testing::temp_dir_guard dir("st-tiny");
  testing::tiny_model_options o;
  testing::write_tiny_model(dir.path(), o);
  checkpoint ck = checkpoint::open(dir.path());
  CHECK(ck.info("model.embed_tokens.weight").shape == shape_t{64, 32});
  CHECK(ck.info("model.layers.1.self_attn.q_proj.weight").shape == shape_t{32, 32});
  CHECK(ck.info("model.layers.1.self_attn.k_proj.weight").shape == shape_t{16, 32});
  CHECK(ck.info("model.layers.0.mlp.down_proj.weight").shape == shape_t{32, 48});
  CHECK(ck.has("lm_head.weight"));
  CHECK(ck.names().size() == 1 + 2 * 9 + 1 + 1);

  // Deterministic per seed, different across seeds; tying drops only lm_head.
  testing::temp_dir_guard again("st-tiny2"), tied("st-tiny3");
  testing::write_tiny_model(again.path(), o);
  auto w = testing::read_all_f32(dir.path());
  CHECK(w == testing::read_all_f32(again.path()));
  o.tied = true;
  testing::write_tiny_model(tied.path(), o);
  auto t = testing::read_all_f32(tied.path());
  CHECK(t.count("lm_head.weight") == 0);
  CHECK(t.at("model.embed_tokens.weight") == w.at("model.embed_tokens.weight"));
  o.seed = 2;
  testing::write_tiny_model(tied.path(), o);
  CHECK(testing::read_all_f32(tied.path()).at("model.embed_tokens.weight") !=
        w.at("model.embed_tokens.weight"));

  testing::temp_dir_guard g("st-gpt2");
  testing::tiny_model_options go;
  go.arch = architecture::gpt2;
  go.max_positions = 40;
  testing::write_tiny_model(g.path(), go);
  checkpoint gk = checkpoint::open(g.path());
  CHECK(gk.info("wte.weight").shape == shape_t{64, 32});
  CHECK(gk.info("wpe.weight").shape == shape_t{40, 32});
  CHECK(gk.info("h.0.attn.c_attn.weight").shape == shape_t{32, 96});
  CHECK(gk.info("h.1.mlp.c_fc.weight").shape == shape_t{32, 48});
  CHECK(gk.info("h.1.mlp.c_proj.weight").shape == shape_t{48, 32});
  CHECK(gk.has("ln_f.bias"));
  CHECK_FALSE(gk.has("lm_head.weight"));
  CHECK(load_config(g.path()).arch == architecture::gpt2);
}
