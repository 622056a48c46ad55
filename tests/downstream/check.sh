#!/usr/bin/env bash
# A user's crate (this directory: its own workspace, a path dependency on the facade, no build
# script), built and run as a user would, then with the native stack hidden. Called by .ci/run
# after `cargo xtask test`; needs no GPU (with one, the binary also copies through the device).
#
#  1. builds the binary, the test, the example and the cdylib probe;
#  2. runs each with a bare environment (`env -i PATH HOME`: no LD_LIBRARY_PATH) and checks that
#     it prints this build's ABI line and loads the native stack;
#  3. hides the stack and checks that the same binary starts, prints the ABI line and a clear
#     error naming the missing library and what to set, and exits with 2 (not 127, no panic);
#     then that RAFT_RS_LIB_PATH, or the libraries beside a copied binary, bring it back;
#  4. loads librmm.so and the cdylib into one host program and checks they share RMM's
#     per-device map.
#
# The build reaches the stack through a link of its own (target/native-stack, given as
# RAFT_SYS_PREFIX): hiding the stack is moving that link, which is what moving or deleting the
# stack does to a user, and the real stack (the `cargo xtask deps` cache) is never touched.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target="$here/target"
mkdir -p "$target"

fail() {
  echo "downstream: FAIL: $*" >&2
  exit 1
}

if [ -n "${RAFT_SYS_PREFIX:-}" ]; then
  real=$RAFT_SYS_PREFIX
else
  real=$(cd "$root" && cargo xtask deps | sed -n 's/^native stack ready in //p')
fi
[ -d "$real" ] || fail "no native stack found (got '$real'): run \`cargo xtask deps\`"
link="$target/native-stack"
rm -f "$link.hidden"
ln -sfn "$real" "$link"
export RAFT_SYS_PREFIX="$link"

expected=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); print("raft=%s rmm=%s cccl=%s" % (t["raft"], t["rmm"], t["cccl"]))' \
  "$root/crates/raft-abi/abi-tag.json")

echo "downstream: building (against $real, through $link)"
cd "$here"
cargo build --quiet --workspace --all-targets --message-format=json-render-diagnostics >"$target/build.json"
# The integration test's harness, and where raft-sys built the shim (for the deployed copy).
read -r test_exe shim < <(python3 -c '
import json, sys
test = shim = ""
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        test = m["executable"]
    if m.get("reason") == "build-script-executed" and "/raft-sys" in m["package_id"].replace("#", "/"):
        shim = m["out_dir"] + "/libraftrs_shim.so"
print(test, shim)' "$target/build.json")
bin="$target/debug/raft-downstream"
example="$target/debug/examples/abi_and_copy"
cdylib="$target/debug/libraft_cdylib_probe.so"
for f in "$bin" "$example" "$cdylib" "$test_exe" "$shim"; do [ -f "$f" ] || fail "not built: $f"; done

# Nothing native is linked in: the shim and the stack are loaded at run time.
if readelf -d "$bin" | grep -E 'NEEDED.*(raftrs|rmm|rapids|cuda|cublas|cusolver|cusparse)'; then
  fail "$bin has a load-time dependency on the native stack"
fi

bare=(env -i PATH="$PATH" HOME="$HOME")
out=""
rc=0
run() { # runs "$@", keeping its output in $out and its status in $rc
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  printf '%s\n' "$out" | sed 's/^/    | /'
}
has() { grep -qF -- "$1" <<<"$out" || fail "$2: the output lacks '$1'"; }
lacks() { ! grep -qF -- "$1" <<<"$out" || fail "$2: the output has '$1'"; }
sane() { # no loader failure before main, no panic
  [ "$rc" -ne 127 ] || fail "$1: exit status 127 (the dynamic loader refused the binary)"
  [ "$rc" -lt 128 ] || fail "$1: killed by a signal (status $rc)"
  lacks "panicked" "$1"
  grep -qxF -- "$expected" <<<"$out" || fail "$1: no ABI line '$expected'"
}
device_or_none() { # status 0 (ran on a GPU) or 2 (no driver or device here)
  case "$rc" in
    0) ;;
    2) [ "${RAFT_REQUIRE_GPU:-0}" != 1 ] || fail "$1: RAFT_REQUIRE_GPU=1 but it found no usable GPU" ;;
    *) fail "$1: exit status $rc" ;;
  esac
}

echo "downstream: the binary, with a bare environment"
run "${bare[@]}" "$bin"
sane binary
device_or_none binary
has "CUDA runtime" binary
lacks "could not load" binary

echo "downstream: the test, with a bare environment"
run "${bare[@]}" "$test_exe" --nocapture
sane test
[ "$rc" -eq 0 ] || fail "test: exit status $rc"

echo "downstream: the example, with a bare environment"
run "${bare[@]}" "$example"
sane example
[ "$rc" -eq 0 ] || fail "example: exit status $rc"
has "CUDA runtime" example

echo "downstream: the stack hidden"
restore() { [ -L "$link.hidden" ] && mv -T "$link.hidden" "$link"; true; }
trap restore EXIT
mv -T "$link" "$link.hidden"
run "${bare[@]}" "$bin"
sane "hidden stack"
[ "$rc" -eq 2 ] || fail "hidden stack: exit status $rc, not 2"
has "the native stack is not usable" "hidden stack"
grep -qE 'lib(rapids_logger|rmm|cudart|cublas|cusparse|cusolver)\.so[.0-9]*: cannot open shared object file' <<<"$out" ||
  fail "hidden stack: the error does not name the missing library"
has "RAFT_RS_LIB_PATH" "hidden stack"

echo "downstream: RAFT_RS_SHIM names a shim that is not there"
run "${bare[@]}" RAFT_RS_SHIM=/nonexistent/libraftrs_shim.so "$bin"
sane "RAFT_RS_SHIM"
[ "$rc" -eq 2 ] || fail "RAFT_RS_SHIM: exit status $rc, not 2"
has "/nonexistent/libraftrs_shim.so (absent)" "RAFT_RS_SHIM"

hidden="$link.hidden"
libs="$hidden/librmm/lib64:$hidden/rapids_logger/lib64:$hidden/nvidia/cu13/lib"
echo "downstream: the stack hidden, found again through RAFT_RS_LIB_PATH"
run "${bare[@]}" RAFT_RS_LIB_PATH="$libs" "$bin"
sane "RAFT_RS_LIB_PATH"
device_or_none "RAFT_RS_LIB_PATH"
has "CUDA runtime" "RAFT_RS_LIB_PATH"

echo "downstream: the stack hidden, a deployed copy (bin/, lib/ with the shim and the RAPIDS libraries)"
deploy="$target/deployed"
rm -rf "$deploy"
mkdir -p "$deploy/bin" "$deploy/lib"
cp "$bin" "$deploy/bin/"
cp "$shim" "$hidden/librmm/lib64/librmm.so" "$hidden/rapids_logger/lib64/librapids_logger.so" \
  "$hidden/nvidia/cu13/lib/libcudart.so.13" "$deploy/lib/"
# cuBLAS, cuSOLVER and cuSPARSE (hundreds of MB) stay where the machine has them.
run "${bare[@]}" RAFT_RS_LIB_PATH="$hidden/nvidia/cu13/lib" "$deploy/bin/raft-downstream"
sane "deployed copy"
device_or_none "deployed copy"
has "CUDA runtime" "deployed copy"
restore
trap - EXIT

echo "downstream: one RMM per process (librmm.so and a cdylib on raft in one host program)"
g++ -O1 -o "$target/rmm_map_check" "$here/rmm_map_check.cpp" -ldl
librmm="$link/librmm/lib64/librmm.so"
symbol=$(nm -D --defined-only "$librmm" | awk '$3 ~ /get_ref_map/ && $3 ~ /device_id_to_resource/ && $3 !~ /^_ZGV/ { print $3 }')
[ "$(wc -w <<<"$symbol")" -eq 1 ] || fail "expected one get_ref_map map symbol in $librmm, found: '$symbol'"
run "${bare[@]}" "$target/rmm_map_check" "$librmm" "$symbol" "$cdylib"
[ "$rc" -eq 0 ] || fail "rmm_map_check: exit status $rc"
has "one per-device map" "rmm_map_check"

echo "downstream: all good"
