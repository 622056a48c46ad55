#!/bin/sh
# Regenerates src/sys/bindings.rs from the cuVS wheel's C headers with bindgen (needs libclang and
# `cargo xtask deps --cuvs`, or RAFT_CUVS_INCLUDE=<dir holding cuvs/core/c_api.h>).
# `./bindings.sh --check` regenerates and compares instead. Plain `cargo test -p raft-cuvs` checks
# the headers' fingerprint recorded in the bindings, without bindgen.
set -e
cd "$(dirname "$0")"
if [ "$1" = "--check" ]; then
  exec cargo test -p raft-cuvs --features regenerate-bindings --test bindings -- --nocapture
fi
RAFT_CUVS_BINDINGS=write exec cargo test -p raft-cuvs --features regenerate-bindings --test bindings -- --nocapture
