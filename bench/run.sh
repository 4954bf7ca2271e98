#!/bin/sh
# Runs every benchmark into <build>/bench-results.json (make bench). Its
# first entry is the host: the CPU, the flags that decide its speed (AVX2,
# AVX-512, AMX, FMA) and the bf16 path its bf16 chips take (h2-opcheck's
# line, docs/emulation.md), so figures from two hosts are not compared
# blindly.
set -eu
build=${1:-build}
out="$build/bench-results.json"
rm -f "$out"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m 1 -E '^(flags|Features)' /proc/cpuinfo | tr ' ' '\n' |
        grep -x -E 'avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*|bf16|sve' |
        sort -u | sed 's/.*/"&"/' | paste -s -d, -)
bf16=$("$build/apps/h2-opcheck" --device cpu --dtype bf16 |
       sed -n 's/^h2-opcheck: bf16 on this host.s CPU: //p')
path=${bf16%% (*}
why=$(printf '%s' "${bf16#* (}" | sed 's/)$//; s/"/\\"/g')
printf '[{"name": "host", "cpu": "%s", "cpu_flags": [%s], "cores": %s, "bf16_path": "%s", "bf16_reason": "%s"}]\n' \
  "$cpu" "$flags" "$(nproc)" "$path" "$why" > "$out"
echo "== host: $cpu; bf16 $path ($why)"
for b in runtime_overhead single_chip demo_plans plan_scale superlinear dicomm \
         demo_nodes checkpoint rebalance schedules text twin http_server; do
  echo "== $b"
  "$build/bench/bench_$b" --out "$out"
done
echo "results: $out"
