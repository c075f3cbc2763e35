#!/bin/busybox sh
# The VM test's /init (busybox sh, in the initramfs `cargo xtask vm-test` builds). It runs the
# steps and prints what they wrote between `@@@ BEGIN name` and `@@@ END name` lines on the
# console; the host checks them (xtask/src/vm/checks.rs), so nothing here decides pass or fail.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
ifconfig lo 127.0.0.1 up
. /etc/vm-test.env
cd /tmp

show() { echo "@@@ BEGIN $1"; cat "$2"; echo "@@@ END $1"; }
# Waits (up to 120 s) for cudatrace's `ready:` line in FILE.
ready() { for _ in $(seq 600); do grep -q '^ready:' "$1" && return 0; sleep 0.2; done; return 1; }

uname -r > kernel.txt; uname -m >> kernel.txt
show kernel kernel.txt
bpf-objects > bpf-before.txt
show bpf-before bpf-before.txt

# 1. trace: the library where the loader finds it, attached at start (no --lib).
cudatrace trace --json > trace.jsonl 2> trace.err &
tracer=$!
ready trace.err
cuda-workload each "$EACH" > each.json
cuda-workload --threads 2 basic "$LAUNCHES" "$COPIES" > basic.json
kill -INT $tracer
wait $tracer
echo $? > trace.rc
show trace.rc trace.rc
show trace.err trace.err
show each.json each.json
show basic.json basic.json
show trace.jsonl trace.jsonl

# 2. run: a library outside the loader's folders, found when the workload dlopens it after
# cudatrace started; launches counted in the kernel, read from /metrics.
# getppid() timed untraced, beside the daemon (its open hook) and untraced again: what its
# discovery hook costs other system calls (under emulation: a ratio, not a time).
cuda-workload syscalls 200000 > sys-bare.json
cudatrace run --listen 127.0.0.1:9464 > run.out 2> run.err &
daemon=$!
ready run.err
cuda-workload syscalls 200000 > sys-hooked.json
cuda-workload --lib /opt/cuda/libcuda.so.1 --settle 3000 basic "$RUN_LAUNCHES" 0 > run.json
pid=$(sed -n 's/^{"pid":\([0-9]*\).*/\1/p' run.json)
# Until this pid's cuLaunchKernel count reaches RUN_LAUNCHES (at most 60 s): the host checks
# the last scrape exactly.
for _ in $(seq 120); do
    wget -q -O metrics.txt http://127.0.0.1:9464/metrics
    n=$(awk -v p="pid=\"$pid\"" '/^cudatrace_calls_total\{/ && index($0, p) && index($0, "api=\"cuLaunchKernel\"") { s += $NF } END { print s + 0 }' metrics.txt)
    [ "$n" = "$RUN_LAUNCHES" ] && break
    sleep 0.5
done
bpf-objects > bpf-during.txt
kill -INT $daemon
wait $daemon
echo $? > run.rc
# cudatrace hands the removal of its probes to a child: wait for it too.
for _ in $(seq 300); do pidof cudatrace > /dev/null || break; sleep 0.2; done
bpf-objects > bpf-after.txt
show run.json run.json
show metrics.txt metrics.txt
show run.rc run.rc
show run.err run.err
cuda-workload syscalls 200000 > sys-after.json
cat sys-bare.json sys-hooked.json sys-after.json > syscalls.txt
show syscalls syscalls.txt
show bpf-during bpf-during.txt
show bpf-after bpf-after.txt

# 3. Do no harm: the sites and how this kernel runs them; then the harm workload (register
# checks around every call, SIGPROF, forks, the library unmapped and mapped again) while
# cudatrace is attached and detached ten times, its code compared with the file after each
# detach (SIGUSR2), and once while attached (SIGWINCH: the check's control).
cudatrace sites --lib /usr/lib/aarch64-linux-gnu/libcuda.so.1 > sites.txt 2>&1
show sites sites.txt
# Ten cycles; three with classic uprobes (before 6.6), whose removal takes half a minute of
# emulated time per cycle.
cycles=10
grep -q "using classic uprobes" trace.err && cycles=3
echo $cycles > harm-cycles.txt
show harm-cycles harm-cycles.txt
cuda-workload --threads 3 harm 900 > harm.json 2> harm.err &
w=$!
sleep 2
: > cycles.txt
i=0
while [ $i -lt $cycles ]; do
    i=$((i + 1))
    cudatrace run --listen 127.0.0.1:$((9470 + i)) > /dev/null 2> cycle.err &
    d=$!
    ready cycle.err
    [ $i = 2 ] && kill -WINCH $w
    sleep 2
    kill -TERM $d
    wait $d
    # Classic uprobes (before 6.6) are removed by a child cudatrace leaves behind: wait for it.
    for _ in $(seq 600); do pidof cudatrace > /dev/null || break; sleep 0.2; done
    grep '^summary:' cycle.err >> cycles.txt
    kill -USR2 $w
    sleep 1
done
kill -USR1 $w
wait $w
echo $? > harm.rc
show harm.json harm.json
show harm.rc harm.rc
show harm.err harm.err
show cycles.txt cycles.txt

# 4. The breaker: a workload's own SIGSEGV stays its own; a stand-in entry point made to fault
# a few instructions past its entry (udf) opens the library's breaker and detaches its probes.
mkdir -p /tmp/state
printf '[state]\ndir = "/tmp/state"\n' > breaker.toml
cudatrace run --config breaker.toml --listen 127.0.0.1:9481 > breaker.out 2> breaker.err &
d=$!
ready breaker.err
cuda-workload fault-own > own.json 2> /dev/null
CUDA_STANDIN_FAULT=1 cuda-workload fault-in-call > harmed.json 2> /dev/null
sleep 2
wget -q -O breaker-metrics.txt http://127.0.0.1:9481/metrics
kill -TERM $d
wait $d
show own.json own.json
show harmed.json harmed.json
show breaker.err breaker.err
show breaker.out breaker.out
show breaker-metrics breaker-metrics.txt
echo "@@@ DONE"
poweroff -f
