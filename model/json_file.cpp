// model/json_file.cpp — see json_file.hpp.
#include "model/json_file.hpp"

#include <string>

#include "model/error.hpp"
#include "model/whole_file.hpp"

namespace corolla {

nlohmann::json read_json_file(const std::filesystem::path& file) {
  const std::string text = read_whole_file(file);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw model_error("invalid JSON in " + file.string() + " at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

}  // namespace corolla
