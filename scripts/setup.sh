#!/usr/bin/env bash
# scripts/setup.sh — installs the Debian 12 packages fastpath builds and tests with.
# Idempotent: skips apt when everything is already installed.
set -euo pipefail
PKGS=(cmake ninja-build g++ clang libclang-rt-14-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev pkgconf python3 python3-venv
      libopenmpi-dev openmpi-bin iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Python tools for the tests (the official openai client), in the repo's .venv. Nothing at run
# time uses Python. Without network the tests that need it report "skipped".
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import openai" 2>/dev/null; then
  python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check "openai==3.57.0" ||
    echo "setup.sh: could not install the openai client into .venv; its test will be skipped" >&2
fi
