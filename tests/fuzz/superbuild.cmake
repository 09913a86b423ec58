# tests/fuzz/superbuild.cmake — included from tests/CMakeLists.txt: builds the
# wire decoder and RDMA receive fuzzers (tests/fuzz, its own CMake project
# compiled with clang++) and registers the ctest tests "fuzz: wire decoder"
# and "fuzz: rdma receive". Skipped, with a
# message, where clang++ or its libFuzzer runtime is missing.
include(ExternalProject)

find_program(COROLLA_FUZZ_CXX NAMES clang++ clang++-16 clang++-15 clang++-14
             DOC "clang++ with libFuzzer, for the wire decoder fuzzer")
set(_fuzz_ok FALSE)
if(COROLLA_FUZZ_CXX)
  # Can it link a libFuzzer target with the sanitizers? (needs libclang-rt-dev)
  set(_probe_dir ${CMAKE_CURRENT_BINARY_DIR}/fuzz-probe)
  file(MAKE_DIRECTORY ${_probe_dir})
  file(WRITE ${_probe_dir}/probe.cpp
       "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND ${COROLLA_FUZZ_CXX} -fsanitize=fuzzer,address,undefined
                          ${_probe_dir}/probe.cpp -o ${_probe_dir}/probe
                  RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_VARIABLE _probe_err)
  if(_probe_rc EQUAL 0)
    set(_fuzz_ok TRUE)
  else()
    message(STATUS "corolla: ${COROLLA_FUZZ_CXX} cannot build libFuzzer targets "
                   "(install libclang-rt-dev); the wire decoder fuzzer is skipped")
  endif()
else()
  message(STATUS "corolla: clang++ not found; the wire decoder fuzzer is skipped")
endif()

if(_fuzz_ok)
  message(STATUS "corolla: wire decoder fuzzer built with ${COROLLA_FUZZ_CXX}")
  set(_fuzz_bin ${CMAKE_CURRENT_BINARY_DIR}/fuzz)
  ExternalProject_Add(corolla_fuzz
    SOURCE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz
    BINARY_DIR ${_fuzz_bin}
    CMAKE_GENERATOR ${CMAKE_GENERATOR}
    CMAKE_CACHE_ARGS
      -DCMAKE_CXX_COMPILER:FILEPATH=${COROLLA_FUZZ_CXX}
      -DCMAKE_BUILD_TYPE:STRING=Fuzz
      -DCOROLLA_SOURCE_DIR:PATH=${PROJECT_SOURCE_DIR}
      -DCOROLLA_GEN_DIR:PATH=${PROJECT_BINARY_DIR}/gen
      -DCOROLLA_KERNELS_LIB:FILEPATH=$<TARGET_FILE:corolla_kernels>
      -DCOROLLA_KERNELS_DEPS:STRING=${OpenMP_CXX_LIBRARIES};${OPENBLAS_LINK_LIBRARIES}
    # two jobs: the parent build runs next to it on a two-core machine
    BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --parallel 2
    INSTALL_COMMAND ""
    BUILD_ALWAYS ON
    BUILD_BYPRODUCTS ${_fuzz_bin}/fuzz_wire_decode ${_fuzz_bin}/fuzz_rdma_receive
    DEPENDS corolla_kernels corolla_net)

  # Rewrites tests/fuzz/corpus from make_corpus.cpp (by hand, after wire changes).
  add_custom_target(fuzz_make_corpus_run
    COMMAND ${CMAKE_COMMAND} --build ${_fuzz_bin} --target fuzz_make_corpus
    COMMAND ${_fuzz_bin}/fuzz_make_corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus
    DEPENDS corolla_fuzz
    COMMENT "Writing the wire decoder's seed corpus")

  add_test(NAME "fuzz: wire decoder"
           COMMAND ${CMAKE_COMMAND}
                   -D FUZZER=${_fuzz_bin}/fuzz_wire_decode
                   -D CORPUS=${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus
                   -D WORK_DIR=${_fuzz_bin}/run
                   -D SECONDS=15
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzzer.cmake)
  set_tests_properties("fuzz: wire decoder" PROPERTIES LABELS fuzz TIMEOUT 120 RUN_SERIAL TRUE)
  add_test(NAME "fuzz: rdma receive"
           COMMAND ${CMAKE_COMMAND}
                   -D FUZZER=${_fuzz_bin}/fuzz_rdma_receive
                   -D CORPUS=${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus_rdma
                   -D WORK_DIR=${_fuzz_bin}/run_rdma
                   -D SECONDS=10
                   -D MAX_LEN=70000
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzzer.cmake)
  set_tests_properties("fuzz: rdma receive" PROPERTIES LABELS fuzz TIMEOUT 120 RUN_SERIAL TRUE)
endif()
