#!/usr/bin/env bash
# The loom models of raft-core's hand-written synchronisation (models/, helper 96 of the twentieth
# audit; docs/RELIABILITY.md): the job hand-over (job.rs), the staging crew (result/crew.rs) and
# the release ledger's out-of-memory wait (release/mod.rs), each a copy of the real protocol with
# its orderings (what is stubbed is said at the top of each model). Every model must pass, and
# every mutant (a feature that puts back a known bug, or breaks the protocol on purpose) must
# make its model fail: a model that cannot fail proves nothing.
#   scripts/models.sh                  preemption bound 2 (CI: about a minute once built)
#   LOOM_MAX_PREEMPTIONS=3 scripts/models.sh   deeper (the crew alone takes minutes)
set -euo pipefail
cd "$(dirname "$0")/../models"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR_MODELS:-$PWD/target} LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! cargo test --quiet --release -- --test-threads=1 --nocapture >"$out" 2>&1; then
  cat "$out"; echo "FAIL: a loom model failed"; exit 1
fi
grep -oE 'MODEL .*' "$out"
# (feature, test target, test name, loom's report): each must fail, with that report (not a build
# error, nor another panic).
for mutant in \
  "mutant_job_parked_outside_lock job join_vs_complete deadlock;" \
  "mutant_crew_close_no_wait crew one_thread_two_copies Causality violation" \
  "mutant_drain_no_notify release drain_vs_one_settle deadlock;" \
  "mutant_two_reads release drain_owed_one_release_while_another_is_queued deadlock;"; do
  set -- $mutant
  report=${*:4}
  if cargo test --quiet --release --features "$1" --test "$2" -- --exact "$3" --test-threads=1 >"$out" 2>&1 ||
    ! grep -q "^$report" "$out"; then
    cat "$out"; echo "FAIL: with $1 the model $2::$3 did not fail with loom's '$report': it cannot catch that bug"; exit 1
  fi
  echo "mutant $1: $2::$3 fails ($report), as it must"
done
