#include "apps/demo_corpus.hpp"

// The assembler copies the file into .rodata; CMake lists it as an object
// dependency so editing the corpus rebuilds this file.
__asm__(
    ".section .rodata\n"
    ".balign 16\n"
    "corolla_demo_corpus_begin:\n"
    ".incbin \"" COROLLA_DEMO_CORPUS "\"\n"
    "corolla_demo_corpus_end:\n"
    ".byte 0\n"
    ".previous\n");

extern "C" const char corolla_demo_corpus_begin[];
extern "C" const char corolla_demo_corpus_end[];

namespace corolla::app {

std::string_view demo_corpus() {
  return {corolla_demo_corpus_begin,
          static_cast<std::size_t>(corolla_demo_corpus_end - corolla_demo_corpus_begin)};
}

}  // namespace corolla::app
