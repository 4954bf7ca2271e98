#!/bin/sh
# Runs every benchmark into <build>/bench-results.json (make bench).
set -eu
build=${1:-build}
out="$build/bench-results.json"
rm -f "$out"
for b in runtime_overhead single_chip demo_plans plan_scale superlinear dicomm \
         demo_nodes checkpoint rebalance; do
  echo "== $b"
  "$build/bench/bench_$b" --out "$out"
done
echo "results: $out"
