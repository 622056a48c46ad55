//! The knobs the build reads and the cache `cargo xtask deps` fills.
use std::env;
use std::path::PathBuf;

use crate::pins::PINNED;

/// Reads a knob and asks cargo to rerun when it changes (a no-op outside build scripts, so
/// xtask prints nothing). Unset and empty are the same.
///
/// # Panics
/// When the knob is set to something that is not UTF-8, with a message naming it: cargo's build
/// directives carry paths as text, and a knob read as unset would build against another stack
/// than the one it names.
pub fn env_var_rerun(name: &str) -> Option<String> {
    if env::var_os("CARGO_MANIFEST_DIR").is_some() && env::var_os("OUT_DIR").is_some() {
        println!("cargo:rerun-if-env-changed={name}");
    }
    knob_value(name, env::var_os(name)).unwrap_or_else(|message| panic!("{message}"))
}

/// [`env_var_rerun`]'s rule on a given value.
fn knob_value(name: &str, value: Option<std::ffi::OsString>) -> Result<Option<String>, String> {
    match value.map(std::ffi::OsString::into_string) {
        None => Ok(None),
        Some(Ok(text)) => Ok(Some(text).filter(|v| !v.is_empty())),
        Some(Err(raw)) => Err(format!(
            "{name}={} is not UTF-8: raft-rs's build passes paths to cargo and the compiler as text and will not \
             read it as unset (which would build against another stack); use a path that is UTF-8",
            raw.to_string_lossy()
        )),
    }
}

/// A knob that names a directory ([`env_var_rerun`]), refused when relative: a build script
/// runs in its own package's directory, not the user's, so `RAFT_RS_CACHE=../cc` named another
/// place for the build than for `cargo xtask` (the nineteenth audit, helper 93).
///
/// # Panics
/// As [`env_var_rerun`], and for a relative path, with a message naming it.
pub fn path_knob(name: &str) -> Option<String> {
    absolute(name, env_var_rerun(name)).unwrap_or_else(|message| panic!("{message}"))
}

/// [`path_knob`]'s rule on a given value.
pub(crate) fn absolute(name: &str, value: Option<String>) -> Result<Option<String>, String> {
    match value {
        Some(v) if !std::path::Path::new(&v).is_absolute() => Err(format!(
            "{name}={v} is a relative path: a build script runs in its own package's directory, not yours, so it would \
             name another place than you mean; give an absolute path"
        )),
        v => Ok(v),
    }
}

/// The cache `cargo xtask deps` fills: `RAFT_RS_CACHE`, else `$XDG_CACHE_HOME/raft-rs` (an
/// absolute one: the XDG rule ignores a relative one), else `~/.cache/raft-rs`.
pub fn cache_dir() -> Option<PathBuf> {
    // Read one after the other, as before: a build script watches only the knobs that decided.
    if let Some(dir) = path_knob("RAFT_RS_CACHE") {
        return cache_dir_from(Some(dir), None, None);
    }
    if let Some(dir) = env_var_rerun("XDG_CACHE_HOME").filter(|d| std::path::Path::new(d).is_absolute()) {
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

    /// The nineteenth audit (helper 93): `RAFT_RS_CACHE=../cc` was resolved against raft-sys's
    /// package directory by the build and against the shell's by xtask.
    #[test]
    fn a_relative_path_knob_is_refused_by_name() {
        let e = absolute("RAFT_RS_CACHE", Some("../cc".into())).unwrap_err();
        assert!(e.starts_with("RAFT_RS_CACHE=../cc is a relative path"), "{e}");
        assert_eq!(absolute("RAFT_SYS_PREFIX", Some("/opt/rapids".into())), Ok(Some("/opt/rapids".into())));
        assert_eq!(absolute("RAFT_SYS_PREFIX", None), Ok(None));
    }

    /// The fifteenth audit (helper 72): a knob that is not UTF-8 was read as unset, so a
    /// `RAFT_SYS_PREFIX` naming a stack at such a path silently built against another one.
    #[test]
    fn a_knob_that_is_not_utf8_is_refused_by_name_not_read_as_unset() {
        use std::os::unix::ffi::OsStringExt;
        let raw = std::ffi::OsString::from_vec(b"/opt/st\xffck".to_vec());
        let err = knob_value("RAFT_SYS_PREFIX", Some(raw)).unwrap_err();
        assert!(err.starts_with("RAFT_SYS_PREFIX=/opt/st\u{fffd}ck is not UTF-8"), "{err}");
        assert_eq!(knob_value("X", None), Ok(None));
        assert_eq!(knob_value("X", Some("".into())), Ok(None), "empty is unset");
        assert_eq!(knob_value("X", Some("/p".into())), Ok(Some("/p".into())));
    }

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
