#!/usr/bin/env bash
# tests/scripts/gpu_check_lean.sh — scripts/gpu/check.sh's lean mode, the
# one call a rare 15-minute GPU window gets, run here on a pack of stub
# binaries (bash scripts named test_kernels, test_model and corolla that
# print what the real ones print, and fail where a scenario says). Checks
# every decision lean takes by itself: the steps and their order in
# summary.json, at most 8 files in $OUT, the chunked-column-sum and AdamW
# fallbacks (a failure alone, then with the switch off; a skip's MESSAGE is
# no failure; a case that passes alone keeps its switch on), the reruns
# after a case crashes the kernel or model tests, the GEMM
# tuner's switch, the WMMA attention fallback and bench_train's second run
# without cuBLASLt's epilogues; each switch must reach the later steps'
# environment, and no other. Exits 77 (skipped) without python3, which
# check.sh itself needs.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
command -v python3 > /dev/null || { echo "no python3: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pack/bin" "$work/pack/lib"

# The stubs. STUB_FAIL (a space-separated list) says what fails:
#   crash          a case crashes the cuda_kernels batch (before AdamW's)
#   crash_twice    ... and another one the rerun without it
#   model_crash    a case crashes the model tests
#   adamw          the AdamW case fails in the cuda_kernels batch
#   adamw_alone    ... and alone, unless COROLLA_CUDA_ADAMW_VEC4=0
#   tuner          the GEMM tuner's three cases: 2 of 3 pass
#   attention      the register kernels disagree with the WMMA ones
#   train          bench train fails unless COROLLA_CUDA_LT_EPILOGUES=0
cat > "$work/pack/bin/test_kernels" << 'EOF'
#!/usr/bin/env bash
has() { [[ " ${STUB_FAIL:-} " == *" $1 "* ]]; }
report() {  # doctest's report block of a case: name, then its lines
  echo "==============================================================================="
  echo "tests/kernels/stub.cpp:1:"
  echo "TEST CASE:  $1"
  shift
  echo
  for l in "$@"; do echo "$l"; done
  echo
}
args="$*"
echo "test_kernels $args"
case "$args" in
  "-tc=cuda*,device names*"*)
    # a crash ends the binary: the cases after it do not run
    if has crash && [[ "$args" != *"cuda: tensor-core attention*"* ]]; then
      report "cuda: tensor-core attention, register kernels, head size 64" \
        "tests/kernels/stub.cpp:4: FATAL ERROR: test case CRASHED: SIGSEGV - Segmentation violation signal"
      exit 139
    fi
    if has crash_twice && [[ "$args" != *"cuda: paged attention*"* ]]; then
      report "cuda: paged attention" "tests/kernels/stub.cpp:5: FATAL ERROR: test case CRASHED: SIGABRT - Abort"
      exit 134
    fi
    # a skip's MESSAGE (no failure), and AdamW's failure where asked
    report "cuda: parameter gradients over many rows in chunks" "tests/kernels/stub.cpp:2: MESSAGE: skipped: stub"
    if has adamw; then
      report "cuda: adamw steps match the cpu" "tests/kernels/stub.cpp:3: ERROR: CHECK( a == b ) is NOT correct!"
      echo "==============================================================================="
      echo "[doctest] test cases: 40 | 39 passed | 1 failed | 0 skipped"
      exit 1
    fi
    echo "==============================================================================="
    echo "[doctest] test cases: 40 | 40 passed | 0 failed | 0 skipped"
    ;;
  "-tc=cuda: adamw steps match the cpu*")
    if has adamw_alone && [ "${COROLLA_CUDA_ADAMW_VEC4:-}" != 0 ]; then
      echo "[doctest] test cases: 1 | 0 passed | 1 failed | 0 skipped"
      exit 1
    fi
    echo "[doctest] test cases: 1 | 1 passed | 0 failed | 0 skipped"
    ;;
  "-tc=cuda: cuBLASLt algo*"*)
    if has tuner; then
      echo "[doctest] test cases: 3 | 2 passed | 1 failed | 0 skipped"
      exit 1
    fi
    echo "[doctest] test cases: 3 | 3 passed | 0 failed | 0 skipped"
    ;;
  *) echo "[doctest] test cases: 5 | 5 passed | 0 failed | 0 skipped" ;;
esac
EOF
cat > "$work/pack/bin/test_model" << 'EOF'
#!/usr/bin/env bash
echo "test_model $*"
if [[ " ${STUB_FAIL:-} " == *" model_crash "* && "$*" != *"-tce=cuda: a model on the gpu*"* ]]; then
  echo "==============================================================================="
  echo "TEST CASE:  cuda: a model on the gpu, step graphs"
  echo
  echo "tests/model/stub.cpp:1: FATAL ERROR: test case CRASHED: SIGSEGV - Segmentation violation signal"
  exit 139
fi
echo "[doctest] test cases: 9 | 9 passed | 0 failed | 0 skipped"
EOF
cat > "$work/pack/bin/corolla" << 'EOF'
#!/usr/bin/env bash
has() { [[ " ${STUB_FAIL:-} " == *" $1 "* ]]; }
# The switches a benchmark ran under, in its JSON line.
switches() {
  printf '"env":{"adamw_vec4":"%s","column_chunks":"%s","gemm_tune":"%s","attention":"%s","lt_epilogues":"%s"}' \
    "${COROLLA_CUDA_ADAMW_VEC4-unset}" "${COROLLA_CUDA_COLUMN_CHUNKS-unset}" "${COROLLA_CUDA_GEMM_TUNE-unset}" \
    "${COROLLA_ATTENTION_KERNELS-unset}" "${COROLLA_CUDA_LT_EPILOGUES-unset}"
}
case "$1 ${2:-}" in
  "info ") echo "device: cuda:0 (stub)" ;;
  "bench attention")
    diff=0.001
    has attention && diff=0.5
    echo "{\"bench\":\"attention\",\"results\":[{\"kernels\":\"fa\"},{\"kernels\":\"wmma\",\"max_out_diff_vs_first\":$diff}]}"
    ;;
  "bench train")
    if has train && [ "${COROLLA_CUDA_LT_EPILOGUES:-}" != 0 ]; then
      echo "cuBLASLt: CUBLAS_STATUS_NOT_SUPPORTED (stub)" >&2
      exit 1
    fi
    echo "{\"bench\":\"train\",$(switches)}"
    ;;
  "bench "*) echo "{\"bench\":\"$2\",$(switches)}" ;;
  *) echo "corolla stub: $*" >&2; exit 2 ;;
esac
EOF
chmod +x "$work/pack/bin/"*
tar -C "$work/pack" -czf "$work/pack.tgz" bin lib

failures=0
fail() { echo "FAIL [$scenario]: $*"; failures=$((failures + 1)); }

# Runs lean with STUB_FAIL=$1 into $work/out-$2; then `query EXPR` evaluates
# a Python expression over summary.json (s) and prints it.
run_lean() {
  scenario=$2
  out=$work/out-$2
  if ! STUB_FAIL=$1 OUT=$out COROLLA_GPU_DIR=$work/unpacked-$2 COROLLA_GPU_LIBDIRS= \
    timeout 120 bash "$root/scripts/gpu/check.sh" "$work/pack.tgz" lean > "$work/stdout-$2" 2>&1; then
    fail "check.sh exited non-zero"
  fi
  grep -q "lean done" "$work/stdout-$2" || fail "no 'lean done' line"
  local files
  files=$(find "$out" -type f | wc -l)
  [ "$files" -le 8 ] || fail "$files files in \$OUT (at most 8)"
}
query() {
  python3 - "$out/summary.json" "$1" << 'PY'
import json, sys
s = json.load(open(sys.argv[1]))
names = [x["name"] for x in s["steps"]]
def step(name, i=-1):
    return [x for x in s["steps"] if x["name"] == name][i]
print(eval(sys.argv[2]))
PY
}
expect() {  # python expression, what it must print
  local got
  got=$(query "$1" 2>&1)
  [ "$got" = "$2" ] || fail "$1: got '$got', want '$2'"
}
all_steps="['cuda_kernels', 'cuda_decode_launch', 'cuda_model', 'bench_decode', 'bench_decode_gpt2', 'bench_attention', 'bench_train']"
no_switches="{'adamw_vec4': 'unset', 'column_chunks': 'unset', 'gemm_tune': 'unset', 'attention': 'unset', 'lt_epilogues': 'unset'}"

# Everything passes: every step once, no fallback, no switch anywhere.
run_lean "" pass
expect "names" "$all_steps"
expect "all(x['exit'] == 0 for x in s['steps'])" "True"
expect "step('bench_train')['result']['env']" "$no_switches"
expect "step('bench_decode')['result']['env']" "$no_switches"

# AdamW fails in the batch and alone, passes with its switch off: the rest
# runs with COROLLA_CUDA_ADAMW_VEC4=0. The column-sum case's skip MESSAGE
# starts no fallback.
run_lean "adamw adamw_alone" adamw
expect "names" "['cuda_kernels', 'fallback_COROLLA_CUDA_ADAMW_VEC4', 'cuda_decode_launch', 'cuda_model', \
'bench_decode', 'bench_decode_gpt2', 'bench_attention', 'bench_train']"
expect "step('fallback_COROLLA_CUDA_ADAMW_VEC4')['result']" "{'alone_exit': 1, 'switched_exit': 0, 'switched_off': True}"
expect "step('bench_train')['result']['env']['adamw_vec4']" "0"
expect "step('bench_decode')['result']['env']['adamw_vec4']" "0"
expect "step('bench_train')['result']['env']['column_chunks']" "unset"
grep -q "passes with COROLLA_CUDA_ADAMW_VEC4=0" "$work/stdout-adamw" || fail "no fallback line on stdout"
[ "$(grep -c "^test_kernels -tc=cuda: adamw" "$out/cuda_kernels.log")" = 2 ] || fail "not two reruns in cuda_kernels.log"

# AdamW fails in the batch but passes alone (an earlier case's fault): the
# switch stays on.
run_lean "adamw" adamw-alone-passes
expect "step('fallback_COROLLA_CUDA_ADAMW_VEC4')['result']" "{'alone_exit': 0, 'switched_exit': -1, 'switched_off': False}"
expect "step('bench_train')['result']['env']" "$no_switches"

# The tuner's tests fail, the register attention disagrees, and training
# fails with cuBLASLt's epilogues: the tuner is off from then on, training
# runs on the WMMA kernels, and bench_train runs twice, the second time
# without the epilogues.
run_lean "tuner attention train" switches
expect "names" "['cuda_kernels', 'cuda_decode_launch', 'cuda_model', 'bench_decode', 'bench_decode_gpt2', \
'bench_attention', 'bench_train', 'bench_train']"
expect "step('cuda_decode_launch')['exit']" "1"
expect "step('bench_train', 0)['exit']" "1"
expect "step('bench_train', 1)['exit']" "0"
expect "step('bench_train', 1)['result']['env']" \
  "{'adamw_vec4': 'unset', 'column_chunks': 'unset', 'gemm_tune': '0', 'attention': 'wmma', 'lt_epilogues': '0'}"
expect "step('cuda_model')['result']" "None"
expect "step('bench_decode')['result']['env']['gemm_tune']" "0"
expect "step('bench_decode')['result']['env']['attention']" "unset"
grep -q "COROLLA_CUDA_GEMM_TUNE=0" "$work/stdout-switches" || fail "the tuner's switch is not announced"
grep -q "COROLLA_ATTENTION_KERNELS=wmma" "$work/stdout-switches" || fail "the attention fallback is not announced"

# A case crashes the batch, before AdamW's, which fails: every other case
# runs again, AdamW's failure there starts its fallback, and the rest runs
# with its switch off. A model test crashes too: the others run again.
run_lean "crash adamw adamw_alone model_crash" crash
expect "names" "['cuda_kernels', 'cuda_kernels_rest_1', 'fallback_COROLLA_CUDA_ADAMW_VEC4', 'cuda_decode_launch', \
'cuda_model', 'cuda_model_rest_1', 'bench_decode', 'bench_decode_gpt2', 'bench_attention', 'bench_train']"
expect "[step('cuda_model')['exit'], step('cuda_model_rest_1')['exit']]" "[139, 0]"
expect "step('cuda_model_rest_1')['result']['crashed']" "cuda: a model on the gpu, step graphs"
grep -q -- "^test_model -tc=cuda\* -tce=cuda: a model on the gpu\*$" "$out/cuda_model.log" ||
  fail "the model tests' rerun does not exclude the crashed case"
expect "step('cuda_kernels')['exit']" "139"
expect "step('cuda_kernels_rest_1')['result']" "{'crashed': 'cuda: tensor-core attention, register kernels, head size 64'}"
expect "step('cuda_kernels_rest_1')['exit']" "1"
expect "step('bench_train')['result']['env']['adamw_vec4']" "0"
grep -q -- "-tce=.*,cuda: tensor-core attention\*$" "$out/cuda_kernels.log" || fail "the rerun does not exclude the crashed case"

# The rerun crashes on another case: a second rerun without both; then
# the same crash is not rerun a third time.
run_lean "crash crash_twice" crash-twice
expect "names" "['cuda_kernels', 'cuda_kernels_rest_1', 'cuda_kernels_rest_2', 'cuda_decode_launch', 'cuda_model', \
'bench_decode', 'bench_decode_gpt2', 'bench_attention', 'bench_train']"
expect "[step('cuda_kernels_rest_1')['exit'], step('cuda_kernels_rest_2')['exit']]" "[134, 0]"
expect "step('cuda_kernels_rest_2')['result']['crashed']" "cuda: paged attention"

if [ "$failures" -ne 0 ]; then
  echo "--- stdout of the last scenario ($scenario):"
  cat "$work/stdout-$scenario"
  echo "$failures check(s) failed"
  exit 1
fi
echo "check.sh lean: 6 scenarios on stub binaries, every check passed"
