#!/usr/bin/env bash
# The check to run on a machine with an NVIDIA GPU and driver: cudatrace against the real
# libcuda. N real launches (and copies) in, N events out of `trace`, N launches counted in the
# kernel by `run`, the added cost per call, and the first
# instruction of each probed symbol (the kernel emulates push/jmp/call/nop at a uprobe; anything
# else is single-stepped out of line, several times dearer: the bench measures both cases).
#   scripts/device-check.sh [LIBCUDA]      (default: the loader's libcuda.so.1)
# Where PyTorch is installed, also a PyTorch section against torch.profiler (device_check_torch.py)
# and the memory, memset, 2-D copy and two-device checks (device_check_memory.py).
# Needs root, a built tree (`cargo xtask build`), and nothing else. Writes results to $OUT when
# set (the device tool's output folder), else to target/device-check/.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:-$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')}
[ -n "$lib" ] && [ -e "$lib" ] || { echo "device-check: no libcuda.so.1 found; pass its path" >&2; exit 1; }
t=${CARGO_TARGET_DIR:-target}
bin=$t/release/cudatrace; wl=$t/standin/cuda-workload
out=${OUT:-$t/device-check}; mkdir -p "$out"
real=${DEVICE_CHECK_REAL---real}   # DEVICE_CHECK_REAL= runs the same script against a stand-in
launches=${LAUNCHES:-20000}; copies=${COPIES:-2000}; calls=${CALLS:-200000}

nvidia-smi -L > "$out/gpus.txt" 2>&1 || true
"$bin" trace --json --lib "$lib" > "$out/events.jsonl" 2> "$out/trace.err" &
tracer=$!
for _ in $(seq 600); do grep -q '^ready:' "$out/trace.err" && break; sleep 0.1; done
grep -q '^ready:' "$out/trace.err" || { cat "$out/trace.err" >&2; exit 1; }
"$wl" --lib "$lib" $real --threads 2 basic "$launches" "$copies" > "$out/workload.json"
kill -INT $tracer; wait $tracer || true
# cudatrace hands the removal of its probes to a child; measure untraced only once it is done.
detached() { while pgrep -x cudatrace > /dev/null; do sleep 0.1; done; }
detached
pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$out/workload.json" | head -n1)
got_l=$(grep -c "\"api\":\"cuLaunchKernel\",\"kind\":\"launch\",\"pid\":$pid," "$out/events.jsonl" || true)
got_c=$(grep -E "\"api\":\"cuMemcpy(HtoD|DtoH)_v2\",\"kind\":\"memcpy\",\"pid\":$pid," "$out/events.jsonl" | grep -vc '"bytes":1048576' || true)
summary=$(grep '^summary:' "$out/trace.err")

# Added cost per call: untraced, then traced, then untraced again.
ns() { "$wl" --lib "$lib" $real calls "$calls" | sed -n 's/.*"ns_per_call":\([0-9.]*\).*/\1/p'; }
a1=$(ns)
"$bin" run --lib "$lib" --listen 127.0.0.1:0 > /dev/null 2> "$out/run.err" &
daemon=$!
for _ in $(seq 600); do grep -q '^ready:' "$out/run.err" && break; sleep 0.1; done
d=$(ns)
kill -INT $daemon; wait $daemon || true
detached
run_counted=$(sed -n 's/^summary:.* launches_counted=\([0-9]*\).*/\1/p' "$out/run.err")
a2=$(ns)
# The first instruction of each probed symbol (objdump falls back to the dynamic
# symbols of a stripped library).
syms=$(grep -o '"cu[A-Za-z0-9_]*"' tracer-common/src/api.rs | tr -d '"' | sort -u | tr '\n' ' ')
if command -v objdump > /dev/null; then
  objdump -d --no-show-raw-insn "$lib" | awk -v list="$syms" '
    BEGIN { n = split(list, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 }
    /^[0-9a-f]+ <[^>]+>:$/ { name = $2; gsub(/[<>:]/, "", name); sub(/@.*/, "", name); grab = (name in want); next }
    grab && NF > 1 { sub(/^[ \t]*[0-9a-f]+:[ \t]*/, ""); print name ": " $0; grab = 0 }' | sort -u > "$out/first-instructions.txt"
else
  echo "objdump not found: install binutils to see each symbol's first instruction" > "$out/first-instructions.txt"
fi
{
  echo "libcuda: $lib"
  echo "launches in=$launches out=$got_l; copies in=$copies out=$got_c"
  echo "$summary"
  echo "ns per cuLaunchKernel: untraced $a1 / $a2, under cudatrace run $d"
  echo "launches counted in the kernel by run: $run_counted of $calls"
  echo "first instructions ($(wc -l < "$out/first-instructions.txt") symbols):"
  sed 's/^/  /' "$out/first-instructions.txt"
} | tee "$out/result.txt"
# PyTorch, where it is installed: what a serving stack calls, against torch.profiler
# (scripts/device_check_torch.py), under `cudatrace run` with every kernel named.
torch_ok=true
if python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  printf 'top_kernels = 2000\nmax_kernels = 2000\nretain_exited_s = 600\n' > "$out/torch.toml"
  "$bin" run --lib "$lib" --listen 127.0.0.1:9469 --config "$out/torch.toml" > /dev/null 2> "$out/torch-run.err" &
  daemon=$!
  for _ in $(seq 600); do grep -q '^ready:' "$out/torch-run.err" && break; sleep 0.1; done
  timeout 240 python3 scripts/device_check_torch.py "$lib" http://127.0.0.1:9469/metrics "$out" \
    > "$out/torch.jsonl" 2> "$out/torch.err" || torch_ok=false
  # Issue 41's memory, memset, 2-D copy and two-device checks (device_check_memory.py).
  timeout 180 python3 scripts/device_check_memory.py http://127.0.0.1:9469/metrics "$out" \
    >> "$out/torch.jsonl" 2>> "$out/torch.err" || torch_ok=false
  kill -INT $daemon; wait $daemon || true
  detached
  { echo "PyTorch ($(python3 -c 'import torch; print(torch.__version__)')):"; sed 's/^/  /' "$out/torch.jsonl"; } | tee -a "$out/result.txt"
else
  echo "PyTorch with CUDA not found: its section was not run" | tee -a "$out/result.txt"
fi
[ "$got_l" = "$launches" ] && [ "$got_c" = "$copies" ] && [ "$run_counted" = "$calls" ] && $torch_ok
