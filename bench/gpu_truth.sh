#!/usr/bin/env bash
# GPU truth in few, full calls on a lent GPU machine (device/METHOD.md): the GPU tests, the overhead
# and training benches, and the CLI on CUDA against CPU. Each stage has its own time limit; every log
# and JSON lands in one folder, packed into $OUT/gpu_truth_<stages>.tgz at the end (the device tool
# brings back at most 8 files), and a short summary is printed last.
#
#   bash bench/gpu_truth.sh tests,overhead         # stages: env tests suite overhead train scan
#
# Runs with the machine's own python3 (its torch, triton and transformers); nanhunter is installed
# from this checkout with --no-deps (nothing can be downloaded there).
set -uo pipefail
cd "$(dirname "$0")/.."
stages=${1:-env,tests,overhead,train,scan}
OUT=${OUT:-bench/_out/gpu}
W="$OUT/work"
mkdir -p "$W"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PY:-python3}
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0))s] $*"; }

# nanhunter from this checkout, without touching the machine's packages
if ! $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$W/install.log" 2>&1; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "pip install -e . failed (see install.log): using PYTHONPATH" | tee -a "$W/install.log"
fi

if has env; then
  stamp env
  {
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
    $PY - <<'EOF'
import platform, torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability(0),
      "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
for name in ("triton", "transformers", "accelerate", "lightning", "safetensors", "torchao", "compressed_tensors",
             "pytest", "xdist", "hypothesis", "typer", "rich"):
    try:
        m = __import__(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:
        print(name, "missing:", type(e).__name__)
EOF
  } >"$W/env.txt" 2>&1
  head -40 "$W/env.txt"
fi

if has tests; then
  stamp "tests: kernels and CUDA-marked"
  timeout 280 $PY -m pytest -q -n 8 -p no:cacheprovider -o addopts="" \
    tests/kernels tests/integration/test_incidents.py tests/integration/test_on_fault.py \
    tests/integration/test_watch_long.py tests/integration/test_generate.py tests/unit/modes/test_capsule_step.py \
    tests/unit/model/test_execute.py \
    --junitxml="$W/junit_gpu.xml" >"$W/pytest_gpu.log" 2>&1
  echo "pytest (gpu files) rc=$?"
  tail -25 "$W/pytest_gpu.log"
fi

if has probe; then
  stamp "probe: one-off checks in bench/probes/"
  for f in bench/probes/*.py; do
    [ -e "$f" ] || continue
    echo "== $f"; timeout 120 $PY "$f" 2>&1 | tee "$W/probe_$(basename "$f" .py).log" | tail -20
  done
fi

if has suite; then
  stamp "suite: the whole test suite with CUDA visible (--device auto picks cuda)"
  timeout 420 $PY -m pytest -q -n 14 -p no:cacheprovider --maxfail=200 -m "not chromium" \
    --junitxml="$W/junit_suite.xml" >"$W/pytest_suite.log" 2>&1
  echo "pytest (suite) rc=$?"
  grep -E "^(FAILED|ERROR)" "$W/pytest_suite.log" | head -60
  tail -3 "$W/pytest_suite.log"
fi

if has overhead; then
  stamp "overhead: ~1.1B Llama bf16, 4x512 and 8x2048, kernel bandwidth"
  timeout 330 $PY bench/overhead.py --device cuda --rounds 3 --iters 5 --warmup 2 --levels blocks,modules --no-graphs \
    --out "$W/overhead_cuda.json" >"$W/overhead_cuda.log" 2>&1
  echo "overhead rc=$?"
  tail -45 "$W/overhead_cuda.log"
fi

if has train; then
  stamp "train: llama100m and llama1b, bf16 autocast, AdamW"
  timeout 110 $PY bench/train_overhead.py --device cuda --model llama100m --batch 8 --seq 512 --rounds 5 --steps 5 \
    --threads 8 --json "$W/train_cuda_llama100m.json" >"$W/train_cuda_llama100m.log" 2>&1
  echo "train llama100m rc=$?"
  tail -16 "$W/train_cuda_llama100m.log"
  timeout 150 $PY bench/train_overhead.py --device cuda --model llama1b --rounds 3 --steps 3 --threads 8 \
    --variants plain,watch_blocks,watch_modules,watch_skip,callback,detect_anomaly,naive \
    --json "$W/train_cuda_llama1b.json" >"$W/train_cuda_llama1b.log" 2>&1
  echo "train llama1b rc=$?"
  tail -14 "$W/train_cuda_llama1b.log"
fi

if has scan; then
  stamp "scan: the examples on cuda against cpu"
  for dev in cpu cuda; do
    for ex in "examples/tiny-llama-fp16 --prompt 'the quick brown fox' --dtype fp16" \
              "examples/tiny-llama-decode-fp16 --generate 16 --prompt 'the 1 2 3' --dtype fp16" \
              "examples/clean.safetensors" "examples/corrupt.safetensors"; do
      tag=$(echo "$ex" | awk '{print $1}' | tr '/.' '__')_$(echo "$ex" | grep -q generate && echo gen || echo fwd)
      eval timeout 120 $PY -m nan_hunter scan $ex --device $dev --json "$W/scan_${tag}_${dev}.json" \
        >"$W/scan_${tag}_${dev}.txt" 2>&1
      echo "scan $tag $dev rc=$?"
    done
  done
  $PY - "$W" <<'EOF' | tee "$W/scan_compare.txt"
import json, sys, pathlib
w = pathlib.Path(sys.argv[1])
keys = ("verdict", "first_nonfinite", "diagnosis")
for cpu in sorted(w.glob("scan_*_cpu.json")):
    gpu = w / cpu.name.replace("_cpu.json", "_cuda.json")
    if not gpu.exists():
        print(cpu.name, "no cuda result"); continue
    a, b = json.loads(cpu.read_text()), json.loads(gpu.read_text())
    def pick(d, path):
        for k in path.split("."):
            d = d.get(k) if isinstance(d, dict) else None
        return d
    for path in ("first_nonfinite.module", "first_nonfinite.op", "first_nonfinite.step",
                 "first_nonfinite.position", "first_nonfinite.kind", "diagnosis.cause", "verdict"):
        x, y = pick(a, path), pick(b, path)
        print(f"{cpu.name[5:-9]:<40} {path:<28} {'same' if x == y else 'DIFF'}  cpu={x!r}  cuda={y!r}")
EOF
fi

stamp done
tar czf "$OUT/gpu_truth_${stages//,/_}.tgz" -C "$W" . && rm -rf "$W"
ls -la "$OUT"
