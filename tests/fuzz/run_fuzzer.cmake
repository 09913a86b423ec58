# tests/fuzz/run_fuzzer.cmake — the "fuzz: wire decoder" test: runs the
# fuzzer over the committed seed corpus for SECONDS seconds. New inputs go
# to WORK_DIR (recreated each run), never into the source tree; a finding
# (crash, leak, timeout, out of memory) fails the test and leaves the input
# in WORK_DIR as crash-*/leak-*/timeout-*/oom-*.
foreach(v FUZZER CORPUS WORK_DIR SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D ${v}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${FUZZER})
  message(FATAL_ERROR "fuzzer ${FUZZER} was not built")
endif()
if(NOT DEFINED MAX_LEN)
  set(MAX_LEN 4096)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10
          -max_len=${MAX_LEN} -print_final_stats=1 -artifact_prefix=${WORK_DIR}/
          ${WORK_DIR}/corpus ${CORPUS}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
string(LENGTH "${out}" n)
if(n GREATER 6000)
  math(EXPR start "${n} - 6000")
  string(SUBSTRING "${out}" ${start} -1 out)
endif()
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer ${FUZZER} found a problem (exit ${rc}); inputs in ${WORK_DIR}")
endif()
