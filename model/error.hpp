// model/error.hpp — the error type for bad user input at the model layer.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace corolla {

/// A problem with input the user gave us (a file, a config, ids): the
/// message is complete and is shown to the user as one line.
class model_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The error for a model path that is not a directory: missing, or a file
/// (config.json itself, one .safetensors file) where its folder belongs.
inline model_error no_model_directory(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec))
    return model_error(path.string() + " is a file, not a model directory (give the folder that holds config.json "
                                       "and the weights)");
  return model_error("model directory " + path.string() + " does not exist");
}

}  // namespace corolla
