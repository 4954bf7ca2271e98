#!/bin/sh
# H2 on a real NVIDIA GPU, in one run of under 8 minutes (docs/ditorch.md,
# "On a GPU"): configures with the CUDA toolkit under /usr/local/cuda
# against the machine's CUDA-enabled libtorch (PyTorch's
# torch.utils.cmake_prefix_path), builds the device, model and runtime tests
# and the binaries, then
#   1. runs the CUDA device tests (they must run, not skip) and the device,
#      model and runtime suites and the shm and frame tests against this
#      libtorch;
#   2. h2-opcheck --device cuda:0 --reference cpu, in fp32 and bf16;
#   3. bench_single_chip --chip cuda:0: H2 on a cuda:0-only job vs a bare
#      libtorch loop on the same device, tokens/s ratio;
#   4. the demo model on cuda:0 (bf16) with two emulated chips for 50 steps,
#      and the same job with `cpu` (bf16) in cuda:0's place: every step's
#      loss within 2% (the bf16 bound of actors_exactness_bf16); then the
#      cuda:0 job under zb-h1 (B and W split on the GPU): within 2% of the
#      cpu run too, and its difference from cuda:0's 1f1b run printed;
#   5. two h2-node processes, one cuda:0 chip each, over shm: activations
#      and gradients by CUDA IPC, then the same job with transport.cuda_ipc
#      = false (staged through pinned host memory): the IPC run passed its
#      bytes in device memory, the staged run none, the losses agree.
# Packages the build needs besides libtorch come from the system or from
# .gpu-debs/ (bench/gpu-debs.sh fetches them on Debian 12), unpacked into a
# private prefix. The build keeps going past errors and treats warnings as
# warnings (H2_WERROR=OFF: another compiler and libtorch than CI's), and
# every step runs whatever the others did: one run on a lent GPU reports all
# it can. Prints the figures and each failure; exits non-zero if any step
# failed.
set -eu
t0=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GPU_BUILD_DIR:-$root/build-gpu}
work=$(mktemp -d)
# GPU_CHECK_LOGS=DIR: the configure and build logs are copied there.
trap 'cp "$work/cmake.log" "$work/build.log" "${GPU_CHECK_LOGS:-$work}" \
  2>/dev/null; rm -rf "$work"' EXIT
say() { echo "== gpu-check [$(( $(date +%s) - t0 )) s] $*"; }
failed=""
fail() { echo "gpu-check: FAILED: $*"; failed="$failed
  $*"; }

prefix=""
if [ -d "$root/.gpu-debs" ]; then
  deps=/tmp/h2-gpu-deps
  mkdir -p "$deps"
  for f in "$root"/.gpu-debs/*.deb; do dpkg -x "$f" "$deps"; done
  prefix=";$deps/usr"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
fi
torch=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
say "libtorch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)') at $torch"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

say "configure"
generator=""
command -v ninja >/dev/null && generator="-G Ninja"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" $generator -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch$prefix" -DCUDAToolkit_ROOT=/usr/local/cuda \
  -DH2_WITH_CUDA=ON -DH2_WITH_HIP=OFF -DH2_WITH_RDMA=OFF -DH2_WERROR=OFF \
  >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; exit 1; }
grep "H2 0" "$work/cmake.log" || true
grep -i -A2 "warning" "$work/cmake.log" | head -20 || true
grep -q "libtorch cuda=1" "$work/cmake.log" ||
  { echo "gpu-check: this libtorch has no c10_cuda"; exit 1; }

say "build"
keep_going="-k"
[ -n "$generator" ] && keep_going="-k 0"
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" --target test_devices test_model \
  test_runtime test_transport h2-launch h2-node h2-opcheck bench_single_chip \
  -- $keep_going >"$work/build.log" 2>&1 ||
  { grep -E -A6 "error:|Error [0-9]|undefined reference" "$work/build.log" |
      head -150; fail "build"; }
warnings=$(grep -c "warning:" "$work/build.log" || true)
echo "build: $warnings warnings"
grep "warning:" "$work/build.log" | sort -u | head -40

say "1. device, model and runtime tests"
suite() { # $1: test binary under tests/, then its arguments
  t=$1; shift
  [ -x "$build/tests/$t" ] || { fail "$t: not built"; return; }
  if stdbuf -oL -eL "$build/tests/$t" --gtest_brief=1 "$@" >"$work/suite.log" 2>&1
  then
    tail -2 "$work/suite.log"
  else
    rc=$?
    tail -80 "$work/suite.log"; fail "$t $* (exit $rc)"
    if [ "$rc" -gt 128 ] && command -v cuda-gdb >/dev/null; then
      echo "gpu-check: $t crashed; its backtrace:"
      timeout 240 cuda-gdb -batch -ex run -ex bt --args "$build/tests/$t" "$@" \
        2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -60
    fi
  fi
}
suite devices/test_devices --gtest_filter='devices_context.cuda*' --gtest_brief=0
if grep -q "SKIPPED" "$work/suite.log"; then
  grep -B3 "SKIPPED" "$work/suite.log"; fail "a CUDA device test skipped"
fi
grep -E "^\[ +OK \]" "$work/suite.log" || true
for t in devices/test_devices model/test_model runtime/test_runtime; do
  suite "$t"
done
suite transport/test_transport --gtest_filter='transport_shm.*:transport_frames.*'

say "2. h2-opcheck"
for dtype in fp32 bf16; do
  "$build/apps/h2-opcheck" --device cuda:0 --reference cpu --dtype "$dtype" ||
    fail "h2-opcheck --dtype $dtype"
done

say "3. cuda:0 vs a bare libtorch loop"
"$build/bench/bench_single_chip" --chip cuda:0 || fail "bench_single_chip"

say "4. cuda:0 (bf16) with emulated chips, against cpu (bf16) in its place"
job() { # $1: the first chip's device, $2: the schedule
  sed -n '/^\[job\]/,/^\[emulation\]/p' "$root/examples/demo.toml" |
    sed '/^\[emulation\]/d; s/^steps = .*/steps = 50/; s/^eval_every = .*/eval_every = 0/'
  cat <<TOML
[emulation]
clock = "virtual"
memory_scale = 2e-3
overhead_scale = 0.01
[[nodes]]
chips = [{device = "$1", dtype = "bf16"}, "emulated:h100-sxm", "emulated:mi250x"]
[plan]
mode = "even"
schedule = "$2"
TOML
}
job cuda:0 1f1b >"$work/gpu.toml"
job cpu 1f1b >"$work/cpu.toml"
job cuda:0 zb-h1 >"$work/gpu-zb.toml"
for run in gpu cpu gpu-zb; do
  "$build/apps/h2-launch" "$work/$run.toml" -q --no-metrics \
    --json-log "$work/$run.jsonl" || fail "the mixed job on $run"
done
python3 - "$work/gpu.jsonl" "$work/cpu.jsonl" <<'PY' || fail "mixed job losses"
import json, sys
def steps(path):
    return [e for e in map(json.loads, open(path)) if e.get("event") == "step"]
gpu, cpu = steps(sys.argv[1]), steps(sys.argv[2])
assert len(gpu) == len(cpu) == 50, (len(gpu), len(cpu))
worst = max(abs(g["loss"] - c["loss"]) / c["loss"] for g, c in zip(gpu, cpu))
tps = sum(g["tokens_per_second"] for g in gpu[1:]) / (len(gpu) - 1)
print(f"mixed job: loss {gpu[0]['loss']:.4f} -> {gpu[-1]['loss']:.4f} on cuda:0, "
      f"{cpu[-1]['loss']:.4f} on cpu; worst step difference {100 * worst:.2f}% "
      f"(bound 2%); {tps:.0f} tokens/s")
sys.exit(0 if worst <= 0.02 else 1)
PY
python3 - "$work/gpu-zb.jsonl" "$work/gpu.jsonl" "$work/cpu.jsonl" <<'PY' ||
import json, sys
def steps(path):
    return [e for e in map(json.loads, open(path)) if e.get("event") == "step"]
zb, gpu, cpu = (steps(p) for p in sys.argv[1:4])
assert len(zb) == len(cpu) == 50, (len(zb), len(cpu))
worst = max(abs(z["loss"] - c["loss"]) / c["loss"] for z, c in zip(zb, cpu))
vs_1f1b = max(abs(z["loss"] - g["loss"]) / g["loss"] for z, g in zip(zb, gpu))
print(f"zb-h1 on cuda:0: loss {zb[-1]['loss']:.4f}; worst step difference "
      f"{100 * worst:.2f}% from cpu (bound 2%), {100 * vs_1f1b:.4f}% from "
      f"cuda:0 under 1f1b; bubble {zb[-1]['bubble_fraction']:.3f} vs "
      f"{gpu[-1]['bubble_fraction']:.3f}")
sys.exit(0 if worst <= 0.02 else 1)
PY
  fail "zb-h1 losses on cuda:0"
say "5. two processes on cuda:0 over shm: CUDA IPC against staging"
two_nodes() { # $1: transport.cuda_ipc
  sed -n '/^\[job\]/,/^\[emulation\]/p' "$root/examples/demo.toml" |
    sed '/^\[emulation\]/d; s/^steps = .*/steps = 30/; s/^eval_every = .*/eval_every = 0/'
  cat <<TOML
[[nodes]]
chips = ["cuda:0"]
[[nodes]]
chips = ["cuda:0"]
[plan]
mode = "even"
schedule = "1f1b"
[transport]
backend = "shm"
cuda_ipc = $1
TOML
}
two_nodes true >"$work/ipc.toml"
two_nodes false >"$work/staged.toml"
for run in ipc staged; do
  "$build/apps/h2-launch" "$work/$run.toml" --nodes 2 -q --no-metrics \
    --json-log "$work/$run.jsonl" >"$work/$run.log" 2>&1 ||
    { tail -20 "$work/$run.log"; fail "two processes, $run"; }
  grep "h2: channel" "$work/$run.log" || true
done
grep -q "by CUDA IPC" "$work/ipc.log" ||
  fail "the channel line does not name CUDA IPC"
python3 - "$work/ipc.jsonl" "$work/staged.jsonl" <<'PY' || fail "two processes"
import json, sys
def steps(path):
    return [e for e in map(json.loads, open(path)) if e.get("event") == "step"]
ipc, staged = steps(sys.argv[1]), steps(sys.argv[2])
assert len(ipc) == len(staged) == 30, (len(ipc), len(staged))
def device_bytes(run):
    return sum(c["sent_device_bytes"] for s in run for c in s["chips"])
def sent_bytes(run):
    return sum(c["sent_bytes"] for s in run for c in s["chips"])
worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(ipc, staged))
def tps(run):
    return sum(s["tokens_per_second"] for s in run[1:]) / (len(run) - 1)
print(f"two processes: {device_bytes(ipc)} of {sent_bytes(ipc)} bytes by CUDA IPC, "
      f"{device_bytes(staged)} staged run; worst step loss difference "
      f"{100 * worst:.4f}%; {tps(ipc):.0f} tokens/s by IPC, {tps(staged):.0f} staged "
      f"(ratio {tps(ipc) / tps(staged):.2f})")
ok = device_bytes(ipc) > 0 and device_bytes(staged) == 0 and worst <= 1e-3
sys.exit(0 if ok else 1)
PY
say "done in $(( $(date +%s) - t0 )) s"
if [ -n "$failed" ]; then
  echo "gpu-check: failed:$failed"
  exit 1
fi
