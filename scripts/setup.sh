#!/usr/bin/env bash
# scripts/setup.sh — installs the Debian 12 packages fastpath builds and tests with.
# Idempotent: skips apt when everything is already installed.
set -euo pipefail
PKGS=(cmake ninja-build g++ clang libclang-rt-14-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev pkgconf python3)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
