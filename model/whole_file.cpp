// model/whole_file.cpp — see whole_file.hpp.
#include "model/whole_file.hpp"

#include <fstream>
#include <iterator>

#include "model/error.hpp"

namespace corolla {

std::string read_whole_file(const std::filesystem::path& file, std::string_view what) {
  const std::string named = what.empty() ? file.string() : std::string(what) + " " + file.string();
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (status.type() == std::filesystem::file_type::not_found) throw model_error(named + " does not exist");
  if (status.type() == std::filesystem::file_type::directory) throw model_error(named + " is a directory");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw model_error("cannot read " + named);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw model_error("cannot read " + named);
  return bytes;
}

}  // namespace corolla
