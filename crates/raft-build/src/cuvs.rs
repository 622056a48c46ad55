//! Where cuVS may be, relative to the stack: raft-cuvs bakes these roots into its crate for its
//! run-time loader, and `cargo xtask deps --cuvs` unpacks cuVS where they point.
use std::env;
use std::path::{Path, PathBuf};

use crate::cache::env_var_rerun;

/// Where `cargo xtask deps --cuvs` unpacks cuVS for the stack at `root`: beside it
/// (`<cache>/26.08.00/cuvs` for the prefix `<cache>/26.08.00/prefix`), in the wheels' own layout.
/// `None` for a root with no parent.
pub fn cuvs_beside(root: &Path) -> Option<PathBuf> {
    root.parent().map(|p| p.join("cuvs"))
}

/// The roots to look in for `libcuvs_c.so`, in order: the user's install (`RAFT_CUVS_PREFIX`:
/// unpacked wheels or a conda-style prefix); beside the stack raft-sys built against (where
/// `cargo xtask deps --cuvs` puts it, [`cuvs_beside`]); that stack's root itself (a Python
/// environment's site-packages, where `pip install libcuvs-cu13` puts `libcuvs/` beside
/// `libraft/`); `CONDA_PREFIX`.
pub fn cuvs_roots(user_prefix: Option<&Path>, stack_root: Option<&Path>, conda_prefix: Option<&Path>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = user_prefix.map(Path::to_path_buf).into_iter().collect();
    if let Some(root) = stack_root {
        roots.extend(cuvs_beside(root));
        roots.push(root.to_path_buf());
    }
    roots.extend(conda_prefix.map(Path::to_path_buf));
    roots
}

/// [`cuvs_roots`] from a build script's environment: `RAFT_CUVS_PREFIX`, raft-sys's
/// `DEP_RAFTRS_ROOT` (absent in documentation builds), `CONDA_PREFIX`.
pub fn cuvs_roots_from_env() -> Vec<PathBuf> {
    let user = crate::cache::path_knob("RAFT_CUVS_PREFIX").map(PathBuf::from);
    let stack = env::var_os("DEP_RAFTRS_ROOT").map(PathBuf::from);
    let conda = env_var_rerun("CONDA_PREFIX").map(PathBuf::from);
    cuvs_roots(user.as_deref(), stack.as_deref(), conda.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn cuvs_goes_beside_the_cache_prefix() {
        assert_eq!(cuvs_beside(Path::new("/c/26.08.00/prefix")), Some(p("/c/26.08.00/cuvs")));
        assert_eq!(cuvs_beside(Path::new("/")), None);
    }

    #[test]
    fn the_users_prefix_first_then_beside_the_stack_the_stack_and_conda() {
        let all = cuvs_roots(Some(Path::new("/u")), Some(Path::new("/c/26.08.00/prefix")), Some(Path::new("/conda")));
        assert_eq!(all, [p("/u"), p("/c/26.08.00/cuvs"), p("/c/26.08.00/prefix"), p("/conda")]);
        assert_eq!(cuvs_roots(None, None, Some(Path::new("/conda"))), [p("/conda")]);
        assert_eq!(cuvs_roots(None, None, None), Vec::<PathBuf>::new());
    }
}
