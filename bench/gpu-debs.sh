#!/bin/sh
# Downloads the Debian 12 packages H2's build needs besides libtorch into
# .gpu-debs/ (ignored by git), for a GPU machine without apt: the `device`
# tool carries the folder there and bench/gpu-check.sh unpacks it
# (docs/ditorch.md, "On a GPU"). Run on a Debian 12 machine.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.gpu-debs"
cd "$root/.gpu-debs"
apt-get download \
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17 \
  libasio-dev libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev \
  libcli11-dev libgtest-dev libgmock-dev libssl-dev libssl3
ls -l "$root/.gpu-debs"
