// model/json_file.hpp — reading the JSON files of a model directory
// (config.json, generation_config.json, tokenizer.json, vocab.json,
// model.safetensors.index.json) with errors that name the file.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

namespace corolla {

/// The JSON value in `file`. Throws model_error naming the file when it
/// cannot be read, and naming the byte when it is not JSON.
nlohmann::json read_json_file(const std::filesystem::path& file);

}  // namespace corolla
