#!/usr/bin/env bash
# scripts/gpu/check.sh — the GPU checks of docs/cuda.md ("Verifying on a
# GPU") from a pack made by scripts/gpu/pack.sh, run from the repository
# root on the GPU machine. Logs go to $OUT (default ./gpu-logs).
#
#   scripts/gpu/check.sh PACK [lean|serve|profile|gemv|quant|quick|full]
# lean: sized for one call of about 8 minutes on an H100 or H200 (the
# 15 minutes of device time a session may get): first the correctness of
# everything not yet run on a GPU (every CUDA kernel and model test, with a
# time limit each), then the two target benchmarks (7B bf16 decode against
# the HBM bound, with step graphs and without, in the same run; GPT-2-1.5B
# bf16 decode, launch-bound, the same two ways; GPT-2-1.5B bf16 training
# MFU) and the training attention's
# register kernels against its WMMA ones (`bench attention --kernels
# fa,wmma`; should the register kernels fail or disagree, the training
# benchmark falls back to the WMMA ones and says so), each line of progress
# printed as it happens and at most 8 files in $OUT: one log per step
# (seven), summary.json (each step's exit status and seconds, and the final
# JSON line of each benchmark); what `corolla info` says is printed. A run cut off still leaves what it finished.
# What is new to the GPU falls back where it can: a failed chunked-column-sum
# or four-a-thread AdamW test runs again alone, then with its switch off
# and, passing so, the rest runs so; a kernel or model test that crashes
# its binary has the others run again without it; likewise the GEMM tuner
# (COROLLA_CUDA_GEMM_TUNE=0) and the training epilogues
# (COROLLA_CUDA_LT_EPILOGUES=0).
# profile: about 4 minutes of where-the-time-goes for the two targets:
# `--profile` of bf16 decode and of GPT-2-1.5B bf16 training (batch 4, and
# batch 8 unprofiled, and batch 16 in micro-batches of 4 against batch 4
# alone), batch 4 without cuBLASLt's training epilogues
# (COROLLA_CUDA_LT_EPILOGUES=0, against lean's bench_train) and without
# the q/k/v products as one batched product (COROLLA_CUDA_BATCHED_LINEAR=0)
# and without timing cuBLASLt's algorithms (COROLLA_CUDA_GEMM_TUNE=0)
# and without chunked column sums (COROLLA_CUDA_COLUMN_CHUNKS=0), its
# GEMM shapes against cuBLASLt's heuristic's first (`bench gemm`, twice:
# the second reads the choices the first wrote, COROLLA_CUDA_GEMM_TUNE_FILE), each fused
# training op against its two ops (`bench fusions`), AdamW with
# its bf16 copy against the two ops
# (`bench update`, and again one parameter a thread:
# COROLLA_CUDA_ADAMW_VEC4=0), Nsight Compute's counters over the decode
# GEMVs, and PyTorch's figures on the same GPU (torch_reference.py).
# gemv: about 2 minutes: the GEMV tests, then 7B bf16 decode five ways:
# the tuner over its own variants or over all (COROLLA_GEMV=all), each with
# the driver's shared-memory carve-out or a common 50 % one
# (COROLLA_CUDA_CARVEOUT=50), and over its own but the split kernel's
# (COROLLA_GEMV=nosplit: whether its shared memory costs early launch what
# it gains); then once with the q/k/v product's RoPE and cache-append
# epilogue off (COROLLA_CUDA_QKV_EPILOGUE=0), against the first.
# serve: about 6 minutes, the second call after lean (issue 25's serving
# target): a swarm server holding all of 7B in bf16 on the GPU
# (`corolla bench serve`): 1, 4 and 16 concurrent sessions through the
# span server and on its engine, aggregate tokens/s against one session,
# and the KV cache it allocates up front at a 40 GiB budget in f32, then in
# bf16 at --max-memory auto (what `serve --max-memory auto` would hold on
# this GPU; 512-token prompts: attention over a longer cache), 1 and 16
# sessions again with step graphs (COROLLA_CUDA_GRAPHS=1); then
# `corolla api --local` on the GPU with 1 and 16 streaming clients, its
# requests' steps batched vs a generator per request (`bench api --local`,
# the ~100M bench model: the same text both ways, and the ratio), then the
# same with step graphs on (COROLLA_CUDA_GRAPHS=1); about 6 minutes in all.
# quant: about 4 minutes, the second call after lean: the figures of the
# quantised and mixture-of-experts formats (issue 23): 7B decode with int8
# and with nf4 weights (each against f32 and bf16 in the same run and the
# HBM bound for the bytes it reads), and the MoE preset's decode and
# prefill with bf16 and nf4 weights (only the active experts' bytes counted).
# quick: the CUDA unit tests and model tests; full (default): also
# compute-sanitizer's memcheck over the CUDA unit tests and racecheck over
# the attention tests, every test binary
# with the GPU visible (multi-process tests included), a comparison with
# HuggingFace transformers when python3 has it, and the benchmarks of
# docs/benchmarks.md.
#
# For its own test (tests/scripts/gpu_check_lean.sh, stub binaries, no GPU):
# COROLLA_GPU_DIR is where the pack is unpacked (default /tmp/corolla-gpu),
# and a set COROLLA_GPU_LIBDIRS replaces the search for CUDA's libraries.
set -uo pipefail
pack=$1
mode=${2:-full}
out=${OUT:-$PWD/gpu-logs}
dir=${COROLLA_GPU_DIR:-/tmp/corolla-gpu}
mkdir -p "$out" "$dir"
tar -C "$dir" -xzf "$pack"
libdirs=$dir/lib
if [ -n "${COROLLA_GPU_LIBDIRS+set}" ]; then
  libdirs="$libdirs${COROLLA_GPU_LIBDIRS:+:$COROLLA_GPU_LIBDIRS}"
else
  for l in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    p=$(ls /usr/local/cuda/lib64/$l 2>/dev/null | head -1)
    [ -z "$p" ] && p=$(timeout 30 find / -xdev -name "$l" -not -path '/proc/*' 2>/dev/null | head -1)
    [ -n "$p" ] && libdirs="$libdirs:$(dirname "$p")"
  done
fi
export LD_LIBRARY_PATH=$libdirs PATH=$dir/bin:$PATH
# The multi-process tests start the corolla binary by its build path.
bin_path=$(strings "$dir/bin/test_apps_mp" 2>/dev/null | grep -m1 '/apps/corolla$' || true)
[ -n "$bin_path" ] && mkdir -p "$(dirname "$bin_path")" && ln -sf "$dir/bin/corolla" "$bin_path"

run() {  # name, command...: runs, logs to $out/name.log, prints the verdict
  local name=$1; shift
  "$@" > "$out/$name.log" 2>&1
  echo "$name: exit $? ($(tail -n 2 "$out/$name.log" | tr '\n' ' '))"
}
if [ "$mode" = lean ] || [ "$mode" = serve ] || [ "$mode" = profile ] || [ "$mode" = gemv ] || [ "$mode" = quant ]; then
  start=$(date +%s)
  steps=()
  step() {  # name, time limit in seconds, command...: logs to $out/name.log
    local name=$1 limit=$2; shift 2
    local t0; t0=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$? t1; t1=$(date +%s)
    local verdict=PASS
    [ "$rc" -ne 0 ] && verdict=FAIL
    [ "$rc" -eq 124 ] && verdict="TIMEOUT after ${limit}s"
    echo "[+$((t1 - start))s] $name: $verdict (exit $rc, $((t1 - t0))s): $(tail -n 2 "$out/$name.log" | tr '\n' ' ' | cut -c1-200)"
    local json; json=$(grep '^{' "$out/$name.log" | tail -n 1)
    [ -z "$json" ] && json=null
    steps+=("{\"name\":\"$name\",\"exit\":$rc,\"seconds\":$((t1 - t0)),\"result\":$json}")
    summary
    return "$rc"
  }
  summary() {  # rewritten after every step, so a cut-off run keeps what it has
    local IFS=,
    printf '{"mode":"%s","gpu":"%s","steps":[%s]}\n' "$mode" \
      "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" "${steps[*]}" > "$out/summary.json"
  }
  # What corolla sees, printed rather than kept (lean writes at most 8 files).
  echo "[+0s] $(corolla info 2>&1 | grep -i -m2 -E 'cuda|device' | tr '\n' ' ')"
  if [ "$mode" = serve ]; then
    step bench_serve 150 corolla bench serve --preset llama7b --weights bf16 --sessions 1,4,16 \
      --prompt-tokens 128 --new-tokens 32 --rounds 2 --max-memory 40GiB
    step bench_serve_kv16 120 corolla bench serve --preset llama7b --weights bf16 --kv-dtype bf16 \
      --sessions 1,16 --prompt-tokens 512 --new-tokens 32 --rounds 1 --max-memory auto
    # The server's batches of decode steps as step graphs (a graph per
    # batch size): against the first line's 1 and 16 sessions.
    step bench_serve_graphs 100 env COROLLA_CUDA_GRAPHS=1 corolla bench serve --preset llama7b --weights bf16 \
      --sessions 1,16 --prompt-tokens 128 --new-tokens 32 --rounds 1 --max-memory 40GiB
    step bench_api_local 90 corolla bench api --local --device cuda --clients 1,16 --new-tokens 32 --rounds 1
    # The same with step graphs (the generators' decode steps, the batcher's
    # batches of decode steps): against the line above.
    step bench_api_local_graphs 90 env COROLLA_CUDA_GRAPHS=1 corolla bench api --local --device cuda \
      --clients 1,16 --new-tokens 32 --rounds 1
    echo "[+$(($(date +%s) - start))s] serve done: $out/summary.json"
    exit 0
  fi
  if [ "$mode" = quant ]; then
    step cuda_quant_kernels 60 test_kernels -tc='cuda*int8*,cuda*nf4*,cuda*q8*,cuda*moe*'
    step bench_decode_int8 75 corolla bench decode --preset llama7b --weights int8 --repeats 1
    step bench_decode_nf4 75 corolla bench decode --preset llama7b --weights nf4 --repeats 1
    step bench_decode_moe 45 corolla bench decode --preset moe --weights bf16 --repeats 2
    step bench_decode_moe_nf4 45 corolla bench decode --preset moe --weights nf4 --repeats 2
    echo "[+$(($(date +%s) - start))s] quant done: $out/summary.json"
    exit 0
  fi
  if [ "$mode" = gemv ]; then
    step cuda_decode_launch 60 test_kernels \
      -tc='cuda: every batch-1*,cuda: linear_fused*,cuda: linear_rope*,cuda: early launch*'
    for run in default:auto:- nosplit:nosplit:- all:all:- all_c50:all:50 c50:auto:50; do
      IFS=: read -r name gemv carveout <<< "$run"
      extra=(); [ "$carveout" != - ] && extra=(COROLLA_CUDA_CARVEOUT="$carveout")
      step "decode_$name" 90 env COROLLA_GEMV="$gemv" "${extra[@]}" corolla bench decode --preset llama7b \
        --weights bf16 --repeats 2
    done
    step decode_no_qkv_epilogue 90 env COROLLA_CUDA_QKV_EPILOGUE=0 corolla bench decode --preset llama7b \
      --weights bf16 --repeats 2
    echo "[+$(($(date +%s) - start))s] gemv done: $out/summary.json"
    exit 0
  fi
  if [ "$mode" = profile ]; then
    step profile_decode 120 corolla bench decode --preset llama7b --weights bf16 --repeats 1 --profile
    step profile_train 90 corolla bench train --preset gpt2-1.5b --batch 4 --seq 1024 --steps 2 --matmul bf16 \
      --compute bf16 --profile
    step train_b8 90 corolla bench train --preset gpt2-1.5b --batch 8 --seq 1024 --steps 2 --matmul bf16 \
      --compute bf16
    # Gradient accumulation: batch 16 in micro-batches of 4 (one AdamW pass
    # per 16 sequences), against batch 4 alone (a pass per 4) in the same run.
    step train_accum 120 corolla bench train --preset gpt2-1.5b --batch 16 --micro-batch 4 --seq 1024 --steps 2 \
      --matmul bf16 --compute bf16
    # Training without cuBLASLt's epilogues (the forward's residual adds,
    # GELU and its backward as their own ops; the norm backward's add stays
    # fused): against lean's bench_train.
    step train_no_lt_epilogues 90 env COROLLA_CUDA_LT_EPILOGUES=0 corolla bench train --preset gpt2-1.5b \
      --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute bf16
    # Training with the q, k and v products (and their weight gradients) as
    # three products each, not one strided batch: against lean's bench_train.
    step train_no_batched_linear 90 env COROLLA_CUDA_BATCHED_LINEAR=0 corolla bench train --preset gpt2-1.5b \
      --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute bf16
    # Training with cuBLASLt's heuristic's first algorithm for every product,
    # none timed: against lean's bench_train. Then GPT-2-1.5B's shapes at
    # batch 4's rows, the backend (tuned) against cuBLASLt's first.
    step train_no_gemm_tune 90 env COROLLA_CUDA_GEMM_TUNE=0 corolla bench train --preset gpt2-1.5b \
      --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute bf16
    # Training with every column sum (bias and norm parameter gradients) in
    # one chunk of all rows, the kernels before chunking: against lean's
    # bench_train.
    step train_no_column_chunks 90 env COROLLA_CUDA_COLUMN_CHUNKS=0 corolla bench train --preset gpt2-1.5b \
      --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute bf16
    rm -f "$dir/gemm-choices.tsv"  # timed afresh, then read back
    step bench_gemm_gpt2 60 env COROLLA_CUDA_GEMM_TUNE_FILE="$dir/gemm-choices.tsv" corolla bench gemm \
      --dtype bf16 --shapes gpt2-1.5b --rows 4096
    # The same again: every problem's choice read back from the file the run
    # above wrote (from_file in its JSON), none timed.
    step bench_gemm_gpt2_file 60 env COROLLA_CUDA_GEMM_TUNE_FILE="$dir/gemm-choices.tsv" corolla bench \
      gemm --dtype bf16 --shapes gpt2-1.5b --rows 4096
    cp "$dir/gemm-choices.tsv" "$out/" 2>/dev/null
    python3 - "$out/bench_gemm_gpt2_file.log" <<'PY' 2>/dev/null || echo "tuning file: no gemm_tuning in the second run's JSON"
import json, sys
t = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["gemm_tuning"]
print(f"tuning file: {t['from_file']} of {t['problems']} problems read back (all expected, none timed again)")
PY
    # Each fused training op against its two ops, same run (GPT-2-1.5B's block shapes).
    step bench_fusions 30 corolla bench fusions --dtype bf16
    # AdamW writing the bf16 compute copy against AdamW, then the copy (a GPT-2-1.5B block).
    step bench_update 30 corolla bench update --groups 1 --compute-copy bf16
    # The same with one parameter a thread (the kernel before the
    # four-a-thread one): against the line above.
    step bench_update_no_vec4 30 env COROLLA_CUDA_ADAMW_VEC4=0 corolla bench update --groups 1 --compute-copy bf16
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    # The decode GEMVs after the tuner's launches: one of each shape of a layer.
    [ -n "$ncu" ] && step ncu_gemv 120 "$ncu" --clock-control none -k regex:linear_bf16 --launch-skip 3000 \
      --launch-count 5 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats corolla bench decode --preset llama7b --weights bf16 --repeats 1
    # PyTorch's own libraries, not the pack's.
    step torch_reference 150 env -u LD_LIBRARY_PATH python3 scripts/gpu/torch_reference.py
    echo "[+$(($(date +%s) - start))s] profile done: $out/summary.json"
    exit 0
  fi
  # 1. Correctness of what was written without a GPU: tensor-core attention,
  # mixed precision and f16 loss scaling, the chunked loss, early launch,
  # fused GEMV epilogues and the tuner, device AdamW, the one-rank NCCL case,
  # the int8 and nf4 GEMVs and their prefill GEMMs.
  # (The GEMM tuner times nothing under COROLLA_CUDA_SYNC: its tests run in
  # the second step, after the decode-launch tests, in the same log.)
  tuner_tests="cuda: cuBLASLt algo*,cuda: training's fused*"
  kernels_excluded="cuda: every batch-1*,cuda: linear_fused*,cuda: linear_rope*,cuda: early launch*,$tuner_tests"
  step cuda_kernels 180 env COROLLA_CUDA_SYNC=1 test_kernels -tc='cuda*,device names*' -tce="$kernels_excluded"
  # A case that crashes its binary (a signal, not a failed check) ends it:
  # the cases after it never ran. Every case but the crashed one then runs
  # again (excluded by its name up to the first comma: doctest splits its
  # filters at commas), at most twice, appended to the same log, each a step
  # "<step>_rest_N" in summary.json naming the case.
  rerun_after_crash() {  # step name, time limit, filters already excluded ('' for none), command...
    local name=$1 limit=$2 excluded=$3; shift 3
    local attempt crashed prefix t0 rc
    for attempt in 1 2; do
      crashed=$(awk '/^TEST CASE:  / { name = substr($0, 13) } /test case CRASHED/ { c = name } END { print c }' \
        "$out/$name.log")
      [ -z "$crashed" ] && return 0
      prefix=${crashed%%,*}
      case ",$excluded," in *",$prefix*,"*) return 0 ;; esac  # excluded already: it crashed an earlier run
      excluded="${excluded:+$excluded,}$prefix*"
      echo "[+$(($(date +%s) - start))s] \"$crashed\" crashed $name: every other case runs again"
      t0=$(date +%s)
      echo "=== the rest without \"$prefix*\" ===" >> "$out/$name.log"
      timeout -k 10 "$limit" "$@" -tce="$excluded" >> "$out/$name.log" 2>&1
      rc=$?
      echo "[+$(($(date +%s) - start))s] $name without it: exit $rc"
      steps+=("{\"name\":\"${name}_rest_$attempt\",\"exit\":$rc,\"seconds\":$(($(date +%s) - t0)),\"result\":{\"crashed\":\"$(printf '%s' "$crashed" | tr -d '"\\')\"}}")
      summary
    done
  }
  rerun_after_crash cuda_kernels 120 "$kernels_excluded" env COROLLA_CUDA_SYNC=1 test_kernels -tc='cuda*,device names*'
  # Chunked column sums (bias and norm parameter gradients) and AdamW four
  # parameters a thread are new to the GPU and have switches back to the
  # kernels before them: should their test fail, it runs again alone (an
  # earlier case may have broken the process's CUDA context), and if it
  # fails again, with the switch off; passing so, everything after runs
  # with the switch off. Both reruns go to the same log, the outcome to
  # summary.json (as a step "fallback_SWITCH").
  fallback() {  # test case, switch
    # doctest's report of a case (also of a skip's MESSAGE) runs from one
    # line of '=' to the next; it failed if it holds an ERROR line.
    awk -v name="TEST CASE:  $1" '/^=====/ { if (hit && err) failed = 1; hit = err = 0; next }
      index($0, name) == 1 { hit = 1 } / (FATAL )?ERROR: / { err = 1 }
      END { if (hit && err) failed = 1; exit failed ? 0 : 1 }' "$out/cuda_kernels.log" || return 0
    local t0; t0=$(date +%s)
    timeout -k 10 60 env COROLLA_CUDA_SYNC=1 test_kernels -tc="$1*" >> "$out/cuda_kernels.log" 2>&1
    local alone=$? rc=-1 verdict
    if [ "$alone" -eq 0 ]; then
      verdict="passes alone (an earlier case's fault?): the switch stays on"
    else
      timeout -k 10 60 env COROLLA_CUDA_SYNC=1 "$2=0" test_kernels -tc="$1*" >> "$out/cuda_kernels.log" 2>&1
      rc=$?
      if [ "$rc" -eq 0 ]; then
        export "$2=0"
        verdict="fails alone, passes with $2=0: the rest runs with $2=0"
      else
        verdict="fails alone and with $2=0 (exit $rc): the switch does not help"
      fi
    fi
    echo "[+$(($(date +%s) - start))s] \"$1\" failed in cuda_kernels; $verdict"
    steps+=("{\"name\":\"fallback_$2\",\"exit\":$alone,\"seconds\":$(($(date +%s) - t0)),\"result\":{\"alone_exit\":$alone,\"switched_exit\":$rc,\"switched_off\":$([ "$rc" -eq 0 ] && echo true || echo false)}}")
    summary
  }
  fallback "cuda: parameter gradients over many rows" COROLLA_CUDA_COLUMN_CHUNKS
  fallback "cuda: adamw steps match the cpu" COROLLA_CUDA_ADAMW_VEC4
  step cuda_decode_launch 90 bash -c 'test_kernels \
    -tc="cuda: every batch-1*,cuda: linear_fused*,cuda: linear_rope*,cuda: early launch*"; d=$?
    test_kernels -tc="$1"; t=$?; echo "gemm tuner tests: exit $t"; exit $((d | t))' _ "$tuner_tests"
  # The cuBLASLt algorithm tuner (kernels/cuda/gemm_tuner.hpp) is new to
  # the GPU: unless its three tests ran and passed, everything after runs
  # with the heuristic's first algorithm, as before it.
  if ! python3 - "$out/cuda_decode_launch.log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
# the tuner tests' exit line, and the last doctest summary before it (theirs)
exit_line = re.search(r"^gemm tuner tests: exit (\d+)$", text, flags=re.M)
summaries = re.findall(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed",
                       text[: exit_line.start()] if exit_line else "")
ok = exit_line and exit_line.group(1) == "0" and summaries and summaries[-1] == ("3", "3", "0")
sys.exit(0 if ok else 1)
PY
  then
    export COROLLA_CUDA_GEMM_TUNE=0
    echo "[+$(($(date +%s) - start))s] the cuBLASLt algorithm tuner's tests failed or did not run: the rest" \
      "runs with COROLLA_CUDA_GEMM_TUNE=0"
  fi
  step cuda_model 120 test_model -tc='cuda*'
  rerun_after_crash cuda_model 90 "" test_model -tc='cuda*'
  # 2. The targets, each against its bound measured in the same run, and
  # the training attention's two kernel families (the register kernels,
  # which training takes by default, against the WMMA ones) on GPT-2-1.5B's
  # shape, forward and backward.
  step bench_decode 120 corolla bench decode --preset llama7b --weights bf16 --repeats 2
  # Thin layers are launch-bound: the step graphs' case (graphs vs launches
  # in the same run, as in bench_decode's line).
  step bench_decode_gpt2 75 corolla bench decode --preset gpt2-1.5b --weights bf16 --repeats 2
  step bench_attention 60 corolla bench attention --shape gpt2-1.5b --storage bf16 --precisions bf16 \
    --kernels fa,wmma
  # The register kernels are the default and new to the GPU: should they
  # fail, or their output differ from the WMMA kernels' (which ran on an
  # H200 on 2026-11-30) by more than bf16 rounding, the training benchmark
  # runs with the WMMA kernels, and says so.
  if ! python3 - "$out/bench_attention.log" <<'PY' 2>/dev/null
import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["results"]
sys.exit(0 if len(r) == 2 and r[1]["kernels"] == "wmma" and r[1]["max_out_diff_vs_first"] < 2e-2 else 1)
PY
  then
    export COROLLA_ATTENTION_KERNELS=wmma
    echo "[+$(($(date +%s) - start))s] the register attention kernels failed or disagree with the WMMA ones:" \
      "bench_train runs with COROLLA_ATTENTION_KERNELS=wmma"
  fi
  # cuBLASLt's epilogues in training (gemm_epilogues.cpp) are new to the
  # GPU too: should the run fail, it runs once more without them (the same
  # log name: lean keeps at most 8 files; summary.json keeps both runs).
  if ! step bench_train 90 corolla bench train --preset gpt2-1.5b --batch 4 --seq 1024 --steps 3 --matmul bf16 \
    --compute bf16; then
    echo "[+$(($(date +%s) - start))s] bench_train failed (its last lines below, the log is reused):" \
      "once more with COROLLA_CUDA_LT_EPILOGUES=0"
    tail -n 30 "$out/bench_train.log"
    step bench_train 90 env COROLLA_CUDA_LT_EPILOGUES=0 corolla bench train --preset gpt2-1.5b --batch 4 \
      --seq 1024 --steps 3 --matmul bf16 --compute bf16
  fi
  echo "[+$(($(date +%s) - start))s] lean done: $out/summary.json"
  exit 0
fi
corolla info
run cuda_kernels env COROLLA_CUDA_SYNC=1 test_kernels -tc='cuda*,device names*'
run cuda_model test_model -tc='cuda*'
# Early launch overlaps kernels only without COROLLA_CUDA_SYNC.
run cuda_decode_launch test_kernels -tc="cuda: every batch-1*,cuda: linear_fused*,cuda: early launch*,cuda: cuBLASLt algo*,cuda: training's fused*"
[ "$mode" = quick ] && exit 0
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ -n "$sanitizer" ] && run cuda_memcheck "$sanitizer" --tool memcheck --error-exitcode 1 test_kernels -tc='cuda*'
# Shared-memory hazards of the tensor-core attention kernels (racecheck is
# slow: only their test).
[ -n "$sanitizer" ] && run cuda_racecheck "$sanitizer" --tool racecheck --error-exitcode 1 test_kernels \
  -tc='*tensor cores*'
for t in test_kernels test_model test_apps test_apps_mp test_actors_mp; do run "$t" "$t"; done
if python3 -c 'import transformers' 2>/dev/null; then
  run hf_reference python3 scripts/gpu/hf_reference.py "$dir/hf"
fi
run bench_gemm corolla bench gemm --dtype bf16 --shapes llama7b
run bench_decode corolla bench decode --preset llama7b --weights bf16 --repeats 3 --profile
# The configuration of 2026-11-22 (default GEMV variant, no early launch),
# to set against bench_decode's tuned GEMVs with early launch.
run bench_decode_before env COROLLA_GEMV=r8.u4.w8 COROLLA_CUDA_EARLY_LAUNCH=0 \
  corolla bench decode --preset llama7b --weights bf16 --repeats 3
run bench_decode_gpt2 corolla bench decode --preset gpt2-1.5b --weights bf16 --repeats 3
run bench_decode_kv16 corolla bench decode --preset llama7b --weights bf16 --kv-dtype bf16 --prompt-tokens 2048 --new-tokens 64 --repeats 2
run bench_update corolla bench update
run bench_loss corolla bench loss --rows 4096 --hidden 1600
run bench_loss_512 corolla bench loss --rows 4096 --hidden 1600 --chunk-rows 512
run bench_attention corolla bench attention --shape gpt2-1.5b
run bench_attention_7b corolla bench attention --shape llama7b
run bench_attention_16 corolla bench attention --shape gpt2-1.5b --precisions f32 --storage f32,bf16,f16
run bench_train corolla bench train --preset gpt2-1.5b --batch 4 --seq 1024 --steps 3 --matmul bf16 --profile
run bench_train_mixed corolla bench train --preset gpt2-1.5b --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute bf16 --profile
run bench_train_f16 corolla bench train --preset gpt2-1.5b --batch 4 --seq 1024 --steps 3 --matmul bf16 --compute f16
