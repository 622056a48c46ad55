#!/usr/bin/env bash
# Packs what the cuVS GPU run needs into parts a device call can carry (64 MiB each, the working
# tree included): raft-cuvs's test binaries and examples (release, debug info stripped), the
# raft-rs shim with librmm, librapids_logger and libcudart (as `cargo xtask gpu-bundle` lays them
# out: binaries find the shim in ../lib), and what the GPU image lacks for cuVS: libcuvs_c.so,
# libcuvs.so (259 MiB), its libgomp and nvJitLink 13.3. cuBLAS, cuSOLVER, cuSPARSE, cuRAND, NVRTC
# and NCCL come from the image (every symbol libcuvs needs from them is in the image's versions).
#
#   crates/raft-cuvs/gpu/pack.sh [OUT]    (default target/cuvs-gpu; needs `cargo xtask deps --cuvs`)
#
# Writes OUT/part-aa, part-ab, ... (one tar.zst split at 56 MiB) and prints the device calls.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-$root/target/cuvs-gpu}
cache=${RAFT_RS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/raft-rs}
base=$cache/26.08.00/prefix
cuvs=$cache/26.08.00/cuvs
[ -f "$cuvs/libcuvs/lib64/libcuvs_c.so" ] || { echo "no cuVS in $cuvs: run cargo xtask deps --cuvs" >&2; exit 1; }
cd "$root"
rm -rf "$out"; mkdir -p "$out"
stage=$out/stage/bundle
mkdir -p "$stage/tests" "$stage/bin" "$stage/lib" "$stage/cuvs"
json=$out/stage/cargo.json
cargo test --release -p raft-cuvs --no-run --message-format=json-render-diagnostics >"$json"
cargo build --release -p raft-cuvs --examples --message-format=json-render-diagnostics >>"$json"
python3 - "$json" "$stage" <<'PY'
import json, os, shutil, sys
stage = sys.argv[2]
shim = None
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and ("/raft-sys#" in m["package_id"] or "#raft-sys@" in m["package_id"]):
        f = os.path.join(m["out_dir"], "libraftrs_shim.so")
        shim = f if os.path.isfile(f) else shim
    exe = m.get("executable")
    if not exe:
        continue
    kinds = m["target"]["kind"]
    if m["profile"]["test"]:
        shutil.copy(exe, os.path.join(stage, "tests", m["target"]["name"]))
    elif "example" in kinds:
        shutil.copy(exe, os.path.join(stage, "bin", "cuvs-" + m["target"]["name"]))
if not shim:
    sys.exit("the build reported no libraftrs_shim.so")
shutil.copy(shim, os.path.join(stage, "lib", "libraftrs_shim.so"))
PY
strip --strip-debug "$stage"/tests/* "$stage"/bin/*
cp "$base/librmm/lib64/librmm.so" "$base/rapids_logger/lib64/librapids_logger.so" "$base/nvidia/cu13/lib/libcudart.so.13" "$stage/lib/"
cp "$cuvs/libcuvs/lib64/libcuvs_c.so" "$cuvs/libcuvs/lib64/libcuvs.so" "$cuvs"/libcuvs_cu13.libs/libgomp-*.so* \
   "$cuvs/nvidia/cu13/lib/libnvJitLink.so.13" "$stage/cuvs/"
( cd "$out/stage" && tar -cf - bundle ) | zstd -T0 -19 -q -o "$out/payload.tar.zst"
split -b 56m "$out/payload.tar.zst" "$out/part-"
rm -rf "$out/stage" "$out/payload.tar.zst"
# The GPU image has no zstd (run 26 found out): this machine's goes along with the last part
# (it links libzstd statically; libz, liblzma and liblz4 are in the image).
mkdir -p "$out/tools"
cp "$(command -v zstd)" "$out/tools/zstd"
ls -la "$out"
parts=$(cd "$out" && ls part-* | wc -l)
rel=${out#"$root"/}
echo
echo "the device calls, one part each, to one warm machine (ignored paths already there are kept):"
i=0
for p in $(cd "$out" && ls part-*); do
  i=$((i+1))
  if [ "$i" -lt "$parts" ]; then
    echo "  call $i: carry [\"$rel/$p\"]  command: ls -la $rel"
  else
    echo "  call $i: carry [\"$rel/$p\", \"$rel/tools\"]  command: crates/raft-cuvs/gpu/run.sh $rel"
  fi
done
