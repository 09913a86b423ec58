// model/json_file.cpp — see json_file.hpp.
#include "model/json_file.hpp"

#include <fstream>
#include <sstream>
#include <string>

#include "model/error.hpp"

namespace corolla {

nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw model_error("cannot read " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw model_error("cannot read " + file.string());
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw model_error("invalid JSON in " + file.string() + " at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

}  // namespace corolla
