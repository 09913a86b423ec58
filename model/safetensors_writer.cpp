// model/safetensors_writer.cpp — a .safetensors file written tensor by tensor
// (model/safetensors_writer.hpp), and write_safetensors over it.
#include "model/safetensors_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/safetensors.hpp"

namespace corolla {

namespace {

std::string errno_text() { return std::strerror(errno); }

/// Writes all of `bytes` at `offset`; false (errno set) when it cannot.
bool write_at(int fd, const void* bytes, std::uint64_t n, std::uint64_t offset) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<std::uint64_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
  return true;
}

}  // namespace

safetensors_writer::safetensors_writer(std::filesystem::path path, const std::vector<entry>& entries,
                                       const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const entry& e : entries) {
    if (e.name == "__metadata__" || placed_.count(e.name))
      throw tensor_error("write_safetensors: duplicate or reserved tensor name '" + e.name + "'");
    const std::uint64_t bytes = static_cast<std::uint64_t>(shape_numel(e.shape)) * dtype_size(e.type);
    header[e.name] = {{"dtype", safetensors_dtype_name(e.type)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    placed_.emplace(e.name, placed{e.type, e.shape, offset, bytes});
    order_.push_back(e.name);
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t data_start = 8 + text.size();
  for (auto& [name, p] : placed_) p.offset += data_start;

  tmp_ = path_;
  tmp_ += ".tmp." + std::to_string(::getpid());
  // 0666 less the umask, as fopen creates files.
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) throw model_error("cannot create " + tmp_.string() + ": " + errno_text());
  unsigned char len[8];
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  // The whole length up front: tensors land at their offsets in any order.
  if (!write_at(fd_, len, 8, 0) || !write_at(fd_, text.data(), text.size(), 8) ||
      ::ftruncate(fd_, static_cast<off_t>(data_start + offset)) != 0) {
    const std::string why = errno_text();
    // No destructor runs for a constructor that throws.
    ::close(fd_);
    fd_ = -1;
    std::remove(tmp_.c_str());
    throw model_error("cannot write " + path_.string() + ": " + why);
  }
}

safetensors_writer::~safetensors_writer() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) std::remove(tmp_.c_str());
}

void safetensors_writer::write(const std::string& name, const Tensor& t) {
  const auto it = placed_.find(name);
  if (it == placed_.end()) throw tensor_error("write_safetensors: no tensor '" + name + "' in the header");
  placed& p = it->second;
  if (p.written) throw tensor_error("write_safetensors: tensor '" + name + "' was written already");
  if (!t.defined()) throw tensor_error("write_safetensors: tensor '" + name + "' is undefined");
  if (t.dev().kind != device_kind::cpu) throw tensor_error("write_safetensors: tensor '" + name + "' is not on the host");
  if (t.type() != p.type || t.shape() != p.shape)
    throw tensor_error("write_safetensors: tensor '" + name + "' is " + std::string(dtype_name(t.type())) + " " +
                       shape_str(t.shape()) + ", its header says " + dtype_name(p.type) + " " + shape_str(p.shape));
  if (!write_at(fd_, t.raw(), p.bytes, p.offset))
    throw model_error("cannot write " + path_.string() + ": " + errno_text());
  p.written = true;
}

void safetensors_writer::commit() {
  for (const std::string& name : order_)
    if (!placed_.at(name).written)
      throw model_error("cannot write " + path_.string() + ": tensor '" + name + "' was never given");
  if (::fsync(fd_) != 0) throw model_error("cannot write " + path_.string() + ": " + errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw model_error("cannot write " + path_.string() + ": " + errno_text());
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) throw model_error("cannot write " + path_.string() + ": " + ec.message());
  committed_ = true;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<safetensors_writer::entry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw tensor_error("write_safetensors: tensor '" + name + "' is undefined");
    entries.push_back({name, t.type(), t.shape()});
  }
  safetensors_writer w(path, entries, metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.commit();
}

}  // namespace corolla
