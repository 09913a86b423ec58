// model/whole_file.hpp — reading a whole file the user named (a cluster
// or scenario TOML, a job description, a token shard, a chat template)
// into memory, with errors that say which file and what is wrong with it.
// Every loader reads through this one function, so a missing file, a
// directory or an unreadable file is reported the same way everywhere.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace corolla {

/// The bytes of `file`, all of them (text or binary: nothing is
/// translated). `what` names the file in errors ("cluster file"; empty:
/// the path alone). Throws model_error with one complete line:
/// "<what> <path> does not exist", "<what> <path> is a directory" or
/// "cannot read <what> <path>" (no permission, an I/O error).
std::string read_whole_file(const std::filesystem::path& file, std::string_view what = {});

}  // namespace corolla
