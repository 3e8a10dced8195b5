#!/usr/bin/env bash
# bench/device_prepare.sh — run HERE (the development machine) before a device session: builds
# fastpath and its tests with the CUDA backend (Release, sm_80/89/90a) and packs what the GPU
# machine lacks into device-bundle/ (git-ignored): the two binaries (stripped), the shared
# libraries they load that are not glibc's or CUDA's own (the GPU machine's image has CUDA 13
# but not Debian's libcpp-httplib, brotli, ...), and the test data the checks read (stories260K).
# Then, in one device call:   run(command="bash bench/device_check.sh", carry=["device-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-device}
BUNDLE=device-bundle
TESTDATA=${FASTPATH_TESTDATA:-../shared/testdata}
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFASTPATH_BENCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >/dev/null
ninja -C "$BUILD" -j "${JOBS:-$(nproc)}" fastpath fastpath_tests
# The chained kernels read nothing the kernel before writes above their wait (pdl.cuh): a race
# that no test off a Hopper GPU shows, checked in their machine code.
bash scripts/check_chained_sass.sh
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/testdata/models/stories260K"
cp "$BUILD/fastpath" "$BUILD/tests/fastpath_tests" "$BUNDLE/bin/"
strip "$BUNDLE/bin/"*
# Every shared library the binaries load, except glibc's (the device's newer glibc runs older
# binaries) and the CUDA toolkit's (the device has its own CUDA 13, with cuBLAS).
for b in "$BUNDLE/bin/"*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcublas*|libcudart*) ;;
    *) cp -L "$lib" "$BUNDLE/lib/" ;;
  esac
done
cp "$TESTDATA/models/stories260K/"* "$BUNDLE/testdata/models/stories260K/"
git rev-parse HEAD > "$BUNDLE/COMMIT"
du -sh "$BUNDLE"
echo "bundle ready: $(ls "$BUNDLE/lib" | wc -l) libraries; now run bench/device_check.sh on the device with carry [\"$BUNDLE\"]"
