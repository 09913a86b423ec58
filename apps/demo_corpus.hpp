// apps/demo_corpus.hpp — the text corpus embedded in the binary for `corolla demo`
// (data/demo_corpus.txt at build time), so the demo needs no download or file.
#pragma once

#include <string_view>

namespace corolla::app {

/// The whole corpus (UTF-8 text, original short stories).
std::string_view demo_corpus();

}  // namespace corolla::app
