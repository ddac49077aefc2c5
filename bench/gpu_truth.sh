#!/usr/bin/env bash
# GPU truth in ONE call of at most 8 minutes (issue 47): the environment line, the kernel and
# CUDA-marked tests, the Triton statistics kernel on 1 GiB fp32 and bf16 against the measured copy
# bandwidth, forward and training-step overhead of a ~1.1B Llama in bf16 (default level and
# `modules`, DebugUnderflowOverflow and naive isfinite hooks, host syncs counted), `scan --device
# cuda` of the examples against the CPU answers, and a `--trace` on CPU and on CUDA compared by
# `nanhunter diff`.
#
#   OUT=/some/dir bash bench/gpu_truth.sh                  # on the lent GPU machine
#   GPU_TRUTH_DEVICE=cpu bash bench/gpu_truth.sh           # rehearsal on CPU: small sizes, cpu vs cpu
#   GPU_TRUTH_STAGES=env,kernel bash bench/gpu_truth.sh    # only these stages (summary always runs)
#
# Stages and their budgets in seconds (GPU_TRUTH_BUDGET_SCALE multiplies them: 1 on the GPU, 3 in
# the rehearsal). Each runs under `timeout`, cut to what the whole run's deadline leaves
# (GPU_TRUTH_DEADLINE_S, default 450 x scale); a stage that overruns or fails is recorded in the
# stage table (exit 124 = timed out) and the script moves on. The timed stages run alone, one after
# another; the correctness stages then run side by side (16 cores on the lent machine):
#   env 30 -> kernel 75 -> forward 100 -> train 110 ->
#     tests_kernels 150 | tests_gpu 150 | scan 120 then scan_compare 20 | trace 90 then trace_diff 30
# Worst case 450 s, then about 10 s to pack: inside the 8 minutes, with a 10-minute call limit.
#
# Writes 3 files under $OUT (a temporary folder when OUT is unset), rewritten after every stage so
# a run cut short still leaves them: gpu_truth_summary.json, gpu_truth_summary.md and
# gpu_truth_logs.tgz (every log, JSON, junit file and trace of the work folder).
#
# Runs with the machine's own python3 (PY=...), its torch, triton and transformers: nothing is
# installed, nanhunter comes from this checkout by PYTHONPATH, and the environment line records the
# versions that ran (below the declared floors on the lent machine: torch 2.11, triton 3.6).
set -uo pipefail
if [ -n "${OUT:-}" ]; then  # a relative OUT is relative to where the script was started
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
fi
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
t0=$SECONDS
MODE=${GPU_TRUTH_DEVICE:-cuda}
case "$MODE" in
  cuda) DEV=cuda; DEV2=cuda; SCALE=${GPU_TRUTH_BUDGET_SCALE:-1} ;;
  # rehearsal: the "GPU" side is the CPU again; a small shared CPU is slower than the lent machine
  cpu) DEV=cpu; DEV2=cpu; SCALE=${GPU_TRUTH_BUDGET_SCALE:-3} ;;
  *) echo "GPU_TRUTH_DEVICE must be cuda or cpu, got '$MODE'" >&2; exit 2 ;;
esac
DEADLINE=${GPU_TRUTH_DEADLINE_S:-$((450 * SCALE))}
STAGES=${GPU_TRUTH_STAGES:-env,kernel,forward,train,tests_kernels,tests_gpu,scan,trace}
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_truth_out.XXXXXX")
  echo "OUT unset: writing to $OUT"
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/gpu_truth_work.XXXXXX")
: >"$W/stages.tsv"

PY=${PY:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false

if [ "$MODE" = cpu ]; then
  export TRITON_INTERPRET=1  # the kernel runs interpreted on CPU tensors
  # interpreted Triton runs a program in ~30 ms: 16 programs per call, one timed call
  KERNEL_ARGS=(--mib "${GPU_TRUTH_KERNEL_MIB:-0.0625}" --reps 1 --warmup 1 --profile-calls 1)
  MODEL=tiny; BATCH=2; SEQ=16; ROUNDS=2; ITERS=2; WARMUP=1; THREADS=1
  PYTEST_N=0; PYTEST_COLLECT="--collect-only"  # the test stages only collect: the suite has CPU runs of its own
else
  unset TRITON_INTERPRET  # compiled kernels on the GPU (the tests' conftest sets it only without CUDA)
  KERNEL_ARGS=(--mib "${GPU_TRUTH_KERNEL_MIB:-1024}" --reps 20 --warmup 3 --profile-calls 5)
  MODEL=llama1b; BATCH=4; SEQ=512; ROUNDS=5; ITERS=5; WARMUP=2; THREADS=4
  PYTEST_N=6; PYTEST_COLLECT=""
fi

has() { [[ ",$STAGES," == *",$1,"* ]]; }
stamp() { echo "[$((SECONDS - t0))s] $*"; }

# The 3 result files, from whatever the work folder holds now.
pack() {
  "$PY" bench/gpu_truth.py summary --dir "$W" --mode "$MODE" --total-s "$((SECONDS - t0))" \
    --out-json "$OUT/gpu_truth_summary.json" --out-md "$OUT/gpu_truth_summary.md" >"$W/summary.log" 2>&1 \
    || echo "summary failed: see summary.log in the tgz"
  tar czf "$OUT/gpu_truth_logs.tgz.part" -C "$W" . && mv "$OUT/gpu_truth_logs.tgz.part" "$OUT/gpu_truth_logs.tgz"
}

# Stopped from outside (the device tool's limit, ^C): stop the running stages (each `timeout` is
# in a process group of its own, so a signal to ours does not reach it), write the files from what
# has run, exit. Stage commands run in the background and are waited for, so the trap runs at once.
stopped() {
  trap - TERM INT
  : >"$W/STOP"
  printf 'stopped_from_outside\t143\t%s\t-\n' "$((SECONDS - t0))" >>"$W/stages.tsv"
  stamp "stopped from outside: ending the running stages, packing what ran"
  [ "${#pids[@]}" -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null
  while read -r p; do kill -TERM "$p" 2>/dev/null; done <"$W/timeouts"
  sleep 1
  pack
  rm -rf "$W"
  exit 143
}
pids=()
: >"$W/timeouts"
trap stopped TERM INT

# run_stage NAME BUDGET_S CMD...: CMD under timeout (the budget, cut to what the deadline leaves),
# output to NAME.log, one row in stages.tsv (name, exit code, seconds, budget).
run_stage() {
  local name=$1 budget=$2 left s rc
  shift 2
  left=$((DEADLINE - (SECONDS - t0)))
  [ -e "$W/STOP" ] && return 0
  if [ "$left" -lt 10 ]; then
    printf '%s\tskip\t0\t%s\n' "$name" "$budget" >>"$W/stages.tsv"
    stamp "$name: skipped, ${left}s left before the deadline"
    return 0
  fi
  budget=$((budget * SCALE))
  [ "$budget" -gt "$left" ] && budget=$left
  stamp "$name (budget ${budget}s)"
  s=$SECONDS
  timeout -k 5 "$budget" "$@" >"$W/$name.log" 2>&1 &
  echo "$!" >>"$W/timeouts"
  wait "$!"
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - s))" "$budget" >>"$W/stages.tsv"
  stamp "$name rc=$rc in $((SECONDS - s))s$([ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo ' (TIMED OUT)')"
  tail -n 6 "$W/$name.log" | cut -c1-200
  return 0
}

# -- the timed stages, one at a time ---------------------------------------------------------------
if has env; then
  run_stage env 30 bash -c "
    { nvidia-smi 2>&1 || echo 'nvidia-smi: not available'; } >'$W/nvidia_smi.txt'
    '$PY' bench/gpu_truth.py env --root '$ROOT' --out '$W/env.json'"
  pack
fi
if has kernel; then
  run_stage kernel 75 "$PY" bench/gpu_truth.py kernel --device "$DEV" "${KERNEL_ARGS[@]}" --out "$W/kernel.json"
  pack
fi
if has forward; then
  run_stage forward 100 "$PY" bench/gpu_truth.py forward --device "$DEV" --model "$MODEL" --batch "$BATCH" \
    --seq "$SEQ" --rounds "$ROUNDS" --iters "$ITERS" --warmup "$WARMUP" --threads "$THREADS" --out "$W/forward.json"
  pack
fi
if has train; then
  run_stage train 110 "$PY" bench/gpu_truth.py train --device "$DEV" --model "$MODEL" --batch "$BATCH" \
    --seq "$SEQ" --rounds "$((ROUNDS > 3 ? 3 : ROUNDS))" --iters "$((ITERS > 3 ? 3 : ITERS))" --warmup "$WARMUP" \
    --threads "$THREADS" --out "$W/train.json"
  pack
fi

# -- the correctness stages, side by side ----------------------------------------------------------
pytest_args=(-q -p no:cacheprovider -o addopts= --continue-on-collection-errors)
[ "$PYTEST_N" -gt 0 ] && pytest_args+=(-n "$PYTEST_N")
[ -n "$PYTEST_COLLECT" ] && pytest_args+=("$PYTEST_COLLECT")
mapfile -t gpu_marked < <(grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | grep -v '^tests/kernels/' | sort)

# every example on the CPU (side "cpu") and, at the same time, on $DEV2 (side "dev": the CPU
# again in the rehearsal); exit codes into scan_rc.tsv (tag, side, code)
scan_side() {
  local side=$1 dev=cpu tag ex rc
  [ "$side" = dev ] && dev=$DEV2
  while IFS='|' read -r tag ex; do
    [ -n "$tag" ] || continue
    eval "set -- $ex"  # the example's words, quotes kept (a fixed list, below)
    "$PY" -m nan_hunter scan "$@" --device "$dev" --quiet --json "$W/scan_${tag}_$side.json" \
      >"$W/scan_${tag}_$side.txt" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$tag" "$side" "$rc" >>"$W/scan_rc.tsv"
    echo "scan $tag on $dev: rc=$rc (0 clean, 1 non-finite found)"
  done <"$W/examples.txt"
}
scan_all() {
  scan_side cpu & scan_side dev & wait
}

# the same scan with --trace on the CPU and, at the same time, on $DEV2, for `nanhunter diff`
trace_side() {
  local side=$1 dev=cpu rc
  [ "$side" = dev ] && dev=$DEV2
  "$PY" -m nan_hunter scan examples/tiny-llama-fp16 --prompt "the quick brown fox" --dtype fp16 --quiet \
    --device "$dev" --trace "$W/trace_$side.jsonl" >"$W/trace_$side.txt" 2>&1
  rc=$?
  echo "trace on $dev: rc=$rc (1: non-finite found, as expected), $(wc -l <"$W/trace_$side.jsonl" 2>/dev/null || echo no) lines"
}
trace_both() {
  trace_side cpu & trace_side dev & wait
  test -s "$W/trace_cpu.jsonl" && test -s "$W/trace_dev.jsonl"
}
export -f scan_side scan_all trace_side trace_both
export W PY DEV2

if has scan; then
  cat >"$W/examples.txt" <<'EOF'
tiny_llama_fp16|examples/tiny-llama-fp16 --prompt 'the quick brown fox' --dtype fp16
tiny_llama_decode_fp16|examples/tiny-llama-decode-fp16 --generate 16 --prompt 'the 1 2 3' --dtype fp16
clean_safetensors|examples/clean.safetensors
corrupt_safetensors|examples/corrupt.safetensors
EOF
fi

if has tests_kernels; then
  run_stage tests_kernels 150 "$PY" -m pytest "${pytest_args[@]}" tests/kernels --junitxml="$W/junit_kernels.xml" &
  pids+=($!)
fi
if has tests_gpu; then
  run_stage tests_gpu 150 "$PY" -m pytest "${pytest_args[@]}" -m gpu "${gpu_marked[@]}" \
    --junitxml="$W/junit_gpu_marked.xml" &
  pids+=($!)
fi
if has scan; then
  (
    run_stage scan 120 bash -c scan_all
    run_stage scan_compare 20 "$PY" bench/gpu_truth.py compare --dir "$W" --a cpu --b dev --out "$W/scan_compare.json"
  ) &
  pids+=($!)
fi
if has trace; then
  (
    run_stage trace 90 bash -c trace_both
    # exit 0: no divergence, 1: the runs part (a result, not a failure), 2: cannot be compared
    run_stage trace_diff 30 "$PY" -m nan_hunter diff "$W/trace_cpu.jsonl" "$W/trace_dev.jsonl" --quiet \
      --json "$W/trace_diff.json"
  ) &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done

stamp "done: packing into $OUT"
pack
cut -c1-240 "$OUT/gpu_truth_summary.md" 2>/dev/null
ls -la "$OUT"
rm -rf "$W"
