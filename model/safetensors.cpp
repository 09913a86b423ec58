// model/safetensors.cpp — reading (mmap), writing and HF checkpoint
// directories of .safetensors files.
//
// Layout: u64 little-endian header length N, N bytes of JSON header
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}),
// then the data section; offsets are relative to the data section.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/half.hpp"
#include "model/error.hpp"
#include "model/fd_guard.hpp"
#include "model/json_file.hpp"

namespace corolla {

const char* safetensors_dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
    case dtype::i8: return "I8";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

/// Headers larger than this are rejected before we try to parse them (the
/// reference implementation uses the same bound).
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

bool parse_dtype(const std::string& s, dtype& out) {
  if (s == "F32") out = dtype::f32;
  else if (s == "F16") out = dtype::f16;
  else if (s == "BF16") out = dtype::bf16;
  else if (s == "I32") out = dtype::i32;
  else if (s == "I8") out = dtype::i8;
  else return false;
  return true;
}

std::string errno_text() { return std::strerror(errno); }

/// Converts a stored F32/F16/BF16 tensor to f32 into `dst` (numel elements).
void convert_to_f32(const Tensor& src, float* dst, const std::string& name,
                    const std::filesystem::path& file) {
  auto n = static_cast<std::size_t>(src.numel());
  switch (src.type()) {
    case dtype::f32: std::memcpy(dst, src.raw(), n * 4); return;
    case dtype::bf16: bf16_to_f32(static_cast<const std::uint16_t*>(src.raw()), dst, n); return;
    case dtype::f16: f16_to_f32(static_cast<const std::uint16_t*>(src.raw()), dst, n); return;
    default:
      throw model_error("tensor " + name + " in " + file.string() + " has dtype " +
                        safetensors_dtype_name(src.type()) +
                        ", which cannot be loaded as floating-point weights");
  }
}

}  // namespace

// ---- safetensors_file ---------------------------------------------------------

std::shared_ptr<safetensors_file> safetensors_file::open(const std::filesystem::path& path) {
  std::shared_ptr<safetensors_file> f(new safetensors_file());
  f->path_ = path;
  const std::string where = path.string();

  fd_guard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw model_error("cannot open " + where + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw model_error("cannot stat " + where + ": " + errno_text());
  if (!S_ISREG(st.st_mode)) throw model_error(where + " is not a regular file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < 8)
    throw model_error(where + " is truncated: " + std::to_string(file_size) +
                      " bytes, too short for a safetensors header");

  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED) throw model_error("cannot map " + where + ": " + errno_text());
  f->map_ = map;
  f->map_bytes_ = file_size;

  const auto* bytes = static_cast<const unsigned char*>(map);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes)
    throw model_error(where + " is not a safetensors file: header length " +
                      std::to_string(header_len) + " is implausible");
  if (8 + header_len > file_size)
    throw model_error(where + " is truncated: header of " + std::to_string(header_len) +
                      " bytes but the file has only " + std::to_string(file_size) + " bytes");
  f->data_offset_ = static_cast<std::size_t>(8 + header_len);
  const std::uint64_t data_size = file_size - 8 - header_len;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8),
                         reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const json::parse_error& e) {
    throw model_error(where + " has an invalid safetensors header (JSON error at byte " +
                      std::to_string(e.byte) + "): " + e.what());
  }
  if (!header.is_object())
    throw model_error(where + " has an invalid safetensors header: not a JSON object");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      // Optional string-to-string map; values of other types are ignored.
      if (entry.is_object())
        for (const auto& [k, v] : entry.items())
          if (v.is_string()) f->metadata_[k] = v.get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& what) {
      return model_error("tensor " + name + " in " + where + " " + what);
    };
    if (!entry.is_object()) throw bad("has a malformed header entry " + entry.dump());
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) throw bad("has no dtype");
    if (!entry.contains("shape") || !entry["shape"].is_array()) throw bad("has no shape");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      throw bad("has no data_offsets [begin, end]");

    tensor_info info;
    info.name = name;
    const std::string dt = entry["dtype"].get<std::string>();
    if (!parse_dtype(dt, info.type))
      throw model_error("tensor " + name + " has unsupported dtype " + dt + " in " + where +
                        " (supported: F32, F16, BF16, I32, I8)");

    std::uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw bad("has an invalid shape " + entry["shape"].dump());
      auto v = d.get<std::uint64_t>();
      if (v > (1ull << 40) || (v && numel > (1ull << 50) / v))
        throw bad("has an implausible shape " + entry["shape"].dump());
      numel *= v;
      info.shape.push_back(static_cast<std::int64_t>(v));
    }
    const auto& off = entry["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("has invalid data_offsets " + off.dump());
    info.begin = off[0].get<std::uint64_t>();
    info.end = off[1].get<std::uint64_t>();
    if (info.begin > info.end) throw bad("has data_offsets " + off.dump() + " with begin > end");
    if (info.end > data_size)
      throw model_error(where + " is truncated: tensor " + name + " ends at byte " +
                        std::to_string(info.end) + " of the data section, which has only " +
                        std::to_string(data_size) + " bytes");
    const std::uint64_t expected = numel * dtype_size(info.type);
    if (info.end - info.begin != expected)
      throw bad("has " + std::to_string(info.end - info.begin) + " bytes of data, but shape " +
                shape_str(info.shape) + " of " + dt + " needs " + std::to_string(expected));
    f->tensors_.emplace(name, std::move(info));
  }
  return f;
}

safetensors_file::~safetensors_file() {
  if (map_) ::munmap(map_, map_bytes_);
}

const tensor_info* safetensors_file::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Tensor safetensors_file::view(const std::string& name) const {
  const tensor_info* info = find(name);
  if (!info) throw model_error("tensor " + name + " missing from " + path_.string());
  // The storage keeps this file (and so the mapping) alive.
  std::shared_ptr<const void> owner = shared_from_this();
  auto* base = static_cast<char*>(map_) + data_offset_ + info->begin;
  auto s = storage::borrow(base, static_cast<std::size_t>(info->end - info->begin),
                           std::move(owner));
  return Tensor::wrap(std::move(s), 0, info->shape, info->type);
}

// ---- writing ------------------------------------------------------------------

// ---- checkpoint -----------------------------------------------------------------

checkpoint checkpoint::open(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw no_model_directory(dir);
  checkpoint c;
  c.dir_ = dir;

  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    auto f = safetensors_file::open(single);
    for (const auto& [name, info] : f->tensors()) c.by_name_.emplace(name, f);
    return c;
  }
  if (!fs::exists(index, ec))
    throw model_error("no model.safetensors or model.safetensors.index.json in " + dir.string());

  const json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw model_error(index.string() + " has no \"weight_map\" object");

  std::map<std::string, std::shared_ptr<safetensors_file>> shards;  // opened once each
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      throw model_error(index.string() + ": weight_map entry for " + name +
                        " is not a file name: " + shard.dump());
    const std::string file = shard.get<std::string>();
    // Shards live in the directory itself; refuse paths that leave it.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw model_error(index.string() + ": weight_map entry for " + name +
                        " names an invalid shard file '" + file + "'");
    auto it = shards.find(file);
    if (it == shards.end()) {
      const fs::path shard_path = dir / file;
      if (!fs::exists(shard_path, ec))
        throw model_error("shard " + shard_path.string() + " listed in " + index.string() +
                          " does not exist");
      it = shards.emplace(file, safetensors_file::open(shard_path)).first;
    }
    if (!it->second->find(name))
      throw model_error("tensor " + name + " missing from shard " + it->second->path().string() +
                        " (listed there by " + index.string() + ")");
    c.by_name_.emplace(name, it->second);
  }
  return c;
}

bool checkpoint::has(const std::string& name) const { return by_name_.count(name) != 0; }

const tensor_info& checkpoint::info(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    throw model_error("tensor " + name + " missing from " + dir_.string());
  return *it->second->find(name);
}

Tensor checkpoint::load_f32(const std::string& name, const shape_t* expected) const {
  const tensor_info& ti = info(name);
  const auto& file = by_name_.at(name);
  if (expected && ti.shape != *expected)
    throw model_error("tensor " + name + " in " + file->path().string() + " has shape " +
                      shape_str(ti.shape) + ", expected " + shape_str(*expected));
  Tensor src = file->view(name);
  Tensor dst = Tensor::empty(ti.shape, dtype::f32);
  convert_to_f32(src, dst.data<float>(), name, file->path());
  return dst;
}

void checkpoint::load_into(const std::string& name, Tensor& dst) const {
  const tensor_info& ti = info(name);
  const auto& file = by_name_.at(name);
  expect_dtype(dst, dtype::f32, "checkpoint::load_into destination");
  if (dst.dev().kind != device_kind::cpu)
    throw tensor_error("checkpoint::load_into: destination must be a host tensor");
  if (ti.shape != dst.shape())
    throw model_error("tensor " + name + " in " + file->path().string() + " has shape " +
                      shape_str(ti.shape) + ", expected " + shape_str(dst.shape()));
  convert_to_f32(file->view(name), dst.data<float>(), name, file->path());
}

std::vector<std::string> checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, file] : by_name_) out.push_back(name);
  return out;
}

}  // namespace corolla
