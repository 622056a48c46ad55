#!/usr/bin/env bash
# Miri over every test that runs without a GPU or a native library: the unit tests of raft-error,
# raft-exit, raft-build, raft-abi and raft-core (tests that load a native library are marked
# `cfg_attr(miri, ignore)`), and the DLPack import checks of tests/tests/dlpack.rs (its GPU tests
# skip under Miri). Undefined behaviour in the unsafe code these reach (DLPack's raw tensors, the
# staged copies' stores, the registries' atomics and raw slots) fails the run.
#   scripts/miri.sh            (needs a nightly toolchain with its miri and rust-src components;
#                              MIRI_TOOLCHAIN names it, `nightly` by default)
set -euo pipefail
cd "$(dirname "$0")/.."
tc=${MIRI_TOOLCHAIN:-nightly}
# Isolation off: the tests read their environment and the clock; nothing here reaches the network.
# Leaks ignored: the release and crew threads live for the process, as they do outside Miri.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation -Zmiri-ignore-leaks}"
cargo +"$tc" miri test -q -p raft-error -p raft-exit -p raft-build -p raft-abi --lib
cargo +"$tc" miri test -q -p rapids-raft-core --lib
cargo +"$tc" miri test -q -p raft-tests --test dlpack
