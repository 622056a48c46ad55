//! The knobs the build reads and the cache `cargo xtask deps` fills.
use std::env;
use std::path::PathBuf;

use crate::pins::PINNED;

/// Reads a knob and asks cargo to rerun when it changes (a no-op outside build scripts, so
/// xtask prints nothing).
pub fn env_var_rerun(name: &str) -> Option<String> {
    if env::var_os("CARGO_MANIFEST_DIR").is_some() && env::var_os("OUT_DIR").is_some() {
        println!("cargo:rerun-if-env-changed={name}");
    }
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// The cache `cargo xtask deps` fills: `RAFT_RS_CACHE`, else `$XDG_CACHE_HOME/raft-rs`, else
/// `~/.cache/raft-rs`.
pub fn cache_dir() -> Option<PathBuf> {
    // Read one after the other, as before: a build script watches only the knobs that decided.
    if let Some(dir) = env_var_rerun("RAFT_RS_CACHE") {
        return cache_dir_from(Some(dir), None, None);
    }
    if let Some(dir) = env_var_rerun("XDG_CACHE_HOME") {
        return cache_dir_from(None, Some(dir), None);
    }
    cache_dir_from(None, None, env_var_rerun("HOME"))
}

/// [`cache_dir`]'s rule on given values (`RAFT_RS_CACHE`, `XDG_CACHE_HOME`, `HOME`).
fn cache_dir_from(raft_rs_cache: Option<String>, xdg_cache_home: Option<String>, home: Option<String>) -> Option<PathBuf> {
    raft_rs_cache
        .map(PathBuf::from)
        .or_else(|| xdg_cache_home.map(|d| PathBuf::from(d).join("raft-rs")))
        .or_else(|| home.map(|h| PathBuf::from(h).join(".cache/raft-rs")))
}

/// Where `cargo xtask deps` unpacks the wheels: `<cache>/<PINNED>/prefix`.
pub fn cache_prefix() -> Option<PathBuf> {
    cache_dir().map(prefix_in)
}

fn prefix_in(cache: PathBuf) -> PathBuf {
    cache.join(PINNED).join("prefix")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn the_cache_is_raft_rs_cache_else_xdg_else_home() {
        assert_eq!(cache_dir_from(s("/c"), s("/x"), s("/h")), Some(PathBuf::from("/c")));
        assert_eq!(cache_dir_from(None, s("/x"), s("/h")), Some(PathBuf::from("/x/raft-rs")));
        assert_eq!(cache_dir_from(None, None, s("/h")), Some(PathBuf::from("/h/.cache/raft-rs")));
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    fn the_prefix_is_under_the_pinned_release() {
        assert_eq!(prefix_in(PathBuf::from("/c")), PathBuf::from("/c/26.08.00/prefix"));
    }
}
