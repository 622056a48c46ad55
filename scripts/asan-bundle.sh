#!/usr/bin/env bash
# AddressSanitizer build of the GPU test binaries, laid out as gpu-bundle is, for a GPU machine
# with no Rust toolchain (RELIABILITY.md's "What was not run": `-Zsanitizer=address`).
#   scripts/asan-bundle.sh [NAME...]   build, then bundle the test binaries NAME (all by default:
#                                      `tests/tests/NAME.rs`, `raft_tests`, `raft_core`,
#                                      `raft_exit`) into ./asan-bundle, and pack it into
#                                      ./asan-bundle/asan-bundle.txz (at most 60 MiB)
#   ASAN_TARGET_DIR=DIR ...            build there (default target/asan)
#   ASAN_TOOLCHAIN=TC ...              the nightly toolchain to build with (default nightly)
#   ASAN_BUNDLE_NO_PACK=1 ...          lay out asan-bundle/ without the archive (a run on this
#                                      machine: CI runs the binaries' CPU paths so)
#   ASAN_BUNDLE_NO_BUILD=1 ...         bundle what the last build made, without cargo
#   ASAN_BUNDLE_KEEP_DEBUG=1 ...       keep the line tables (about 50 MiB a binary instead of 5:
#                                      for a few binaries); by default only the symbol table stays
#   scripts/asan-bundle.sh --symbolize LOG...
#                                      file:line for each frame `(NAME+0xOFFSET)` of the reports in
#                                      LOG, from the unstripped binaries of the last build here
# On the GPU machine (carry asan-bundle/asan-bundle.txz), from the repository root:
#   tar xJf asan-bundle/asan-bundle.txz && asan-bundle/run.sh [NAME...]
#
# Only the Rust code is instrumented. The nightly toolchain with `--target` keeps build scripts
# and proc macros uninstrumented; the C++ (the shim, the tests' baseline) never is: cc would add
# -fsanitize=address for CARGO_CFG_SANITIZE, the build scripts take it off (the shim's
# `-Wl,--no-undefined` cannot take the ASan runtime, which rustc links into executables only).
# RAPIDS, CUDA and Rust's precompiled std are not instrumented either: ASan checks their
# allocations (it replaces malloc and operator new process-wide) but not their accesses.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
triple=x86_64-unknown-linux-gnu
target_dir=${ASAN_TARGET_DIR:-$root/target/asan}
out=$root/asan-bundle
list=$target_dir/asan-artifacts.txt

if [ "${1:-}" = --symbolize ]; then
  shift
  [ -s "$list" ] || { echo "no build list at $list" >&2; exit 1; }
  # Each frame line as it was, then the unstripped binary's file:line (inlined frames first).
  python3 - "$list" "$@" <<'EOF'
import re, shutil, subprocess, sys
paths = {}
for line in open(sys.argv[1]):
    kind, *rest = line.split()
    if kind in ("test", "bin"):
        paths[rest[0]] = rest[1]
tool = shutil.which("llvm-symbolizer")
frame = re.compile(r"\(([^()\s]+)\+(0x[0-9a-f]+)\)")
for log in sys.argv[2:]:
    for line in open(log, errors="replace"):
        sys.stdout.write(line)
        m = frame.search(line)
        exe = m and paths.get(m.group(1).rsplit("/", 1)[-1])
        if not exe:
            continue
        if tool:
            cmd = [tool, "--obj=" + exe, "--inlining", "--demangle", "--relative-address", m.group(2)]
        else:
            cmd = ["addr2line", "-f", "-i", "-C", "-e", exe, m.group(2)]
        got = subprocess.run(cmd, capture_output=True, text=True).stdout.split("\n")
        got = [l for l in got if l.strip()]
        for fn, loc in zip(got[0::2], got[1::2]):
            sys.stdout.write(f"        = {fn} {loc}\n")
EOF
  exit
fi

if [ -z "${ASAN_BUNDLE_NO_BUILD:-}" ]; then
  # A target directory of its own (target/asan by default): these flags would rebuild everything
  # in the workspace's, and another build may be running there.
  export CARGO_TARGET_DIR=$target_dir
  unset CARGO_ENCODED_RUSTFLAGS
  export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
  # Only for doctests, which this build does not make; kept alike should one be added.
  export RUSTDOCFLAGS="$RUSTFLAGS"
  # The dev profile (debug assertions, overflow checks) at opt-level 1 (ASan's own advice: -O1
  # keeps every check and runs several times faster than -O0). Line tables only: what a report's
  # file:line needs. `line-directives-only` is no smaller in use: it gives no line at all.
  export CARGO_PROFILE_DEV_OPT_LEVEL=1 CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_INCREMENTAL=0
  mkdir -p "$target_dir"
  # The tests crate's library and integration tests (their child binaries `scenarios`,
  # `tls-exit`, `rmm-exit` are built with them, instrumented too), raft-core's and raft-exit's
  # unit tests. Not the bins' own harnesses.
  cargo "+${ASAN_TOOLCHAIN:-nightly}" test --no-run --target "$triple" -p raft-tests --lib --test '*' -p rapids-raft-core -p raft-exit \
    --message-format=json-render-diagnostics --manifest-path "$root/Cargo.toml" > "$target_dir/asan-build.json"
  # What cargo made: `test NAME PATH` for harnesses, `bin NAME PATH`, `shim PATH`, `root PREFIX`.
  python3 - "$target_dir/asan-build.json" > "$list" <<'EOF'
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    pid = m.get("package_id", "")
    if m.get("reason") == "build-script-executed" and ("/raft-sys#" in pid or "#raft-sys@" in pid):
        out = m["out_dir"]
        print("shim", os.path.join(out, "libraftrs_shim.so"))
        # The stack the shim was built against (raft-sys's `cargo:root`).
        for l in open(os.path.join(os.path.dirname(out), "output")):
            if l.startswith("cargo:root="):
                print("root", l.strip().split("=", 1)[1])
    exe = m.get("executable")
    if not exe:
        continue
    kinds = m["target"]["kind"]
    if m["profile"]["test"] and "bin" not in kinds:
        # Harnesses are `<target>-<hash>`: keep the target's name, as gpu-bundle does.
        print("test", os.path.basename(exe).rsplit("-", 1)[0], exe)
    elif "bin" in kinds and m["target"]["name"] in ("scenarios", "tls-exit", "rmm-exit"):
        print("bin", m["target"]["name"], exe)
EOF
fi
[ -s "$list" ] || { echo "no build list at $list: build first" >&2; exit 1; }

shim=$(awk '$1 == "shim" {print $2}' "$list" | tail -n 1)
prefix=$(awk '$1 == "root" {print $2}' "$list" | tail -n 1)
[ -f "$shim" ] && [ -d "$prefix" ] || { echo "the build reported no shim or stack root ($shim, $prefix)" >&2; exit 1; }
for name in "$@"; do
  grep -q "^test $name " "$list" || { echo "no test binary named $name (have: $(awk '$1 == "test" {printf "%s ", $2}' "$list"))" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/tests" "$out/bin" "$out/lib"
# Ignored whole, by itself: the folder must never travel with the working tree (a device call
# carries the archive only, named in `carry`).
echo '*' > "$out/.gitignore"
wanted=" $* "
n=0
while read -r kind name path; do
  case $kind in
    test) if [ $# -eq 0 ] || [[ $wanted == *" $name "* ]]; then cp "$path" "$out/tests/$name"; n=$((n + 1)); fi ;;
    bin) cp "$path" "$out/bin/$name" ;;
  esac
done < "$list"
if [ -z "${ASAN_BUNDLE_KEEP_DEBUG:-}" ]; then
  # Debug sections are 90% of an ASan binary; the symbol table stays, so reports still name
  # functions (with addr2line there) and always give `(NAME+0xOFFSET)` for --symbolize here.
  strip --strip-debug "$out"/tests/* "$out"/bin/*
fi
# The same libraries as gpu-bundle (xtask/src/bundle.rs's CARRIED), the shim where the loader
# looks (`<exe dir>/../lib`); cuBLAS, cuSOLVER, cuSPARSE come from the GPU machine's CUDA.
cp "$prefix/librmm/lib64/librmm.so" "$prefix/rapids_logger/lib64/librapids_logger.so" \
   "$prefix/nvidia/cu13/lib/libcudart.so.13" "$shim" "$out/lib/"

cat > "$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs this bundle's ASan test binaries on a GPU machine (no Rust toolchain needed):
#   ./run.sh [NAME...]     the test binaries NAME (all by default), each under RAFT_REQUIRE_GPU=1
# One summary line per binary: name, rc, ASan reports (the binary's and its child processes'),
# seconds, the `test result:` line. Logs go to $LOGDIR (default /tmp/asan-logs when $OUT is set,
# as on the device machine, else ./logs beside this script); with $OUT set, $OUT/asan-summary.txt
# and $OUT/asan-logs.tgz are rewritten after each binary, so a call cut off at its limit still
# returns what ran. RAFT_TEST_TIMEOUT bounds one binary (300 s), RAFT_ASAN_BUDGET the whole run
# (540 s, inside a device call's 600), RAFT_TEST_ARGS go to every binary.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cuda_libs=${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
export LD_LIBRARY_PATH="$here/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
# The instrumented children (`scenarios`; `tls-exit` and `rmm-exit` are found in bin/ beside it,
# as in gpu-bundle, since the paths cargo built them at do not exist here). RAFT_REQUIRE_GPU=0
# runs the binaries' CPU paths on a machine with no GPU (a check of the bundle itself).
export RAFT_REQUIRE_GPU=${RAFT_REQUIRE_GPU-1} RAFT_SCENARIOS_EXE="$here/bin/scenarios"
if [ -n "${OUT:-}" ]; then logs=${LOGDIR:-/tmp/asan-logs}; else logs=${LOGDIR:-$here/logs}; fi
rm -rf "$logs"; mkdir -p "$logs"
# protect_shadow_gap=0: ASan maps the gap between its shadow regions PROT_NONE; the CUDA driver
#   maps memory in that range (cuInit fails without it).
# detect_leaks=0: LeakSanitizer would report what CUDA, RMM and the library keep for the
#   process's life on purpose (contexts, retired async pools, registries); valgrind covers leaks.
# halt_on_error=1: the first report ends the process: what runs after memory is corrupted
#   proves nothing.
# abort_on_error=0: end with exit status 1, not SIGABRT: no core dump, and the tests' own crash
#   reporter (their SIGABRT handler) prints no second stack over the report.
# detect_odr_violation=0: Rust may emit one instrumented global in several crates or codegen
#   units (inlined and generic statics); ASan reports those as ODR violations, which they are not.
# allocator_may_return_null=1: a malloc too large returns NULL, as glibc's does (the library's
#   refusal of impossible host sizes is under test), instead of a fatal report.
# log_path: every report, child processes' too, to its own file NAME.asan.PID beside the log (a
#   test that captures a child's stderr may not print it).
# allow_addr2line=1: frames get function names from addr2line where llvm-symbolizer is absent.
# stack_trace_format: every frame also as (NAME+0xOFFSET), for `asan-bundle.sh --symbolize`.
base=protect_shadow_gap=0:detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_odr_violation=0
base+=':allocator_may_return_null=1:allow_addr2line=1:stack_trace_format="    #%n %p %F %L %M"'
deadline=$(( $(date +%s) + ${RAFT_ASAN_BUDGET:-540} ))
summary=$logs/asan-summary.txt; : > "$summary"
say() { echo "$*"; echo "$*" >> "$summary"; }
save() {
  [ -n "${OUT:-}" ] || return 0
  cp "$summary" "$OUT/asan-summary.txt"
  tar czf "$OUT/asan-logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"
}
if [ $# -gt 0 ]; then names=("$@"); else names=(); for t in "$here"/tests/*; do names+=("$(basename "$t")"); done; fi
failed=0
say "asan run: ${#names[@]} binaries; ASAN_OPTIONS=$base:log_path=$logs/NAME.asan"
for name in "${names[@]}"; do
  t=$here/tests/$name
  [ -x "$t" ] || { say "$name: MISSING (not in this bundle)"; failed=1; continue; }
  # A binary gets what is left of the whole run's budget, at most RAFT_TEST_TIMEOUT.
  left=$(( deadline - $(date +%s) ))
  if [ $left -lt 10 ]; then say "$name: NOT RUN (RAFT_ASAN_BUDGET spent)"; failed=1; continue; fi
  limit=${RAFT_TEST_TIMEOUT:-300}; [ $left -lt $limit ] && limit=$left
  start=$(date +%s)
  ASAN_OPTIONS="$base:log_path=$logs/$name.asan" timeout -k 10 "$limit" "$t" ${RAFT_TEST_ARGS:-} > "$logs/$name.log" 2>&1
  rc=$?
  result=$(grep -E '^test result:' "$logs/$name.log" | tail -n 1)
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result="HUNG or over time: killed after $limit s"; fi
  reports=$(cat "$logs/$name.log" "$logs/$name".asan.* 2>/dev/null | grep -c 'ERROR: AddressSanitizer')
  say "$name: rc=$rc asan_reports=$reports $(( $(date +%s) - start ))s ${result:-no test result line (see $name.log)}"
  if [ "$reports" -ne 0 ]; then
    say "  $(cat "$logs/$name".asan.* "$logs/$name.log" 2>/dev/null | grep -m 1 '^SUMMARY: AddressSanitizer')"
  fi
  [ $rc -eq 0 ] && [ "$reports" -eq 0 ] || failed=1
  save
done
save
exit $failed
EOF
chmod +x "$out/run.sh"

if [ -n "${ASAN_BUNDLE_NO_PACK:-}" ]; then
  echo "asan bundle: $out ($n test binaries; not packed)"
  exit 0
fi
# xz with a dictionary larger than a binary: the binaries share most of their code (std,
# cudarc, the library), which gzip's 32 KiB window cannot see: 11 MiB instead of 42 for all.
archive=$out/asan-bundle.txz
tar cf - -C "$root" asan-bundle | xz -T1 --lzma2=preset=6,dict=192MiB > "$target_dir/asan-bundle.txz.tmp"
mv "$target_dir/asan-bundle.txz.tmp" "$archive"
size=$(du -sb --exclude=asan-bundle.txz "$out" | cut -f1)
packed=$(stat -c %s "$archive")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "asan bundle: $out ($n test binaries, $(mib "$size") MiB), archive $archive ($(mib "$packed") MiB)"
# A device call carries at most 64 MiB, the working tree included: 4 MiB kept for it.
if [ "$packed" -gt $((60 << 20)) ]; then
  echo "the archive is over 60 MiB: bundle fewer binaries (scripts/asan-bundle.sh NAME...)" >&2
  exit 1
fi
