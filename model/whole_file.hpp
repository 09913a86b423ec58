// model/whole_file.hpp — reading a whole file the user named (a cluster
// or scenario TOML, a job description, a token shard, a chat template, a
// model's JSON) into memory, with errors that say which file and what is
// wrong with it, so a missing file, a directory or an unreadable file is
// reported the same way by every loader that reads a file in one piece.
#pragma once

#include <cstddef>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>

namespace corolla {

/// The bytes of `file`, all of them (text or binary: nothing is
/// translated). `what` names the file in errors ("cluster file"; empty:
/// the path alone). Throws model_error with one complete line:
/// "<what> <path> does not exist", "<what> <path> is a directory",
/// "<what> <path> is not a regular file (a device or a socket)" (a FIFO is
/// read to its end),
/// "cannot read <what> <path>: <reason>" (no permission, an I/O error), or
/// "<what> <path> is larger than <max_bytes> bytes" — reading stops there,
/// so a device or a pipe that never ends is refused too.
std::string read_whole_file(const std::filesystem::path& file, std::string_view what = {},
                            std::size_t max_bytes = std::numeric_limits<std::size_t>::max());

/// Writes `bytes` to `file` so that a reader sees the old file or the new
/// one, never part of it, even after a crash: through `<file>.tmp.<pid>`,
/// synced, renamed over `file`, then the directory synced. Throws
/// model_error "cannot write <file>: <reason>" (the temporary file removed).
void write_whole_file(const std::filesystem::path& file, std::string_view bytes);

}  // namespace corolla
