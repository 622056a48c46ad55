#!/usr/bin/env bash
# valgrind memcheck (errors + definite leaks) over every test binary of the workspace on a
# machine without a GPU: the CPU paths (no driver, exit scenarios, error texts, ABI, the loader).
# The one suppression is glibc's loader expanding $ORIGIN (tests/valgrind/ld-so-dst.supp).
set -u
cd "$(dirname "$0")/.."
supp=tests/valgrind/ld-so-dst.supp
bins=$(cargo test --workspace --no-run --message-format=json 2>/dev/null |
  python3 -c 'import sys,json
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("profile",{}).get("test") and m.get("executable"): print(m["executable"])')
status=0
for t in $bins; do
  out=$(valgrind --suppressions=$supp --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        --trace-children=no "$t" --test-threads=2 2>&1)
  rc=$?
  echo "$(basename "$t"): rc=$rc $(echo "$out" | grep -E 'ERROR SUMMARY' | tail -1 | sed 's/==[0-9]*== //') $(echo "$out" | grep -E '^test result' | tail -1)"
  [ $rc -eq 0 ] || status=1
done
exit $status
