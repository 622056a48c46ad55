//! The C headers the bindings are generated from, and their fingerprint. The fingerprint is
//! recorded in the bindings, so plain `cargo test` sees that cuVS's headers changed without
//! running bindgen (which only `bindings.sh` needs).
use std::path::{Path, PathBuf};

/// The header bindgen reads, relative to the crate.
pub const WRAPPER: &str = "include/raft_cuvs.h";
/// The stand-ins of `cuda_runtime.h` and `dlpack/dlpack.h`, relative to the crate.
pub const STUBS: &str = "include/stubs";
/// How the bindings record the fingerprint (the rest of that line is it).
pub const MARK: &str = "// Headers' fingerprint (FNV-1a 64 of their names and contents): ";

/// Every header `WRAPPER` includes, transitively, that is found in the stubs or in
/// `cuvs_include` (system headers are not): `(name as included, file)`, sorted by name.
pub fn closure(manifest: &Path, cuvs_include: &Path) -> Vec<(String, PathBuf)> {
    let dirs = [manifest.join(STUBS), cuvs_include.to_path_buf()];
    let mut found: Vec<(String, PathBuf)> = vec![("raft_cuvs.h".into(), manifest.join(WRAPPER))];
    let mut next = 0;
    while next < found.len() {
        let file = found[next].1.clone();
        next += 1;
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("#include") else { continue };
            let rest = rest.trim();
            let Some(name) = rest.get(1..).and_then(|r| r.split(['>', '"']).next()) else { continue };
            let quoted = rest.starts_with('"');
            let local = file.parent().filter(|_| quoted).map(|d| d.join(name));
            let Some(path) = local.into_iter().chain(dirs.iter().map(|d| d.join(name))).find(|p| p.is_file()) else { continue };
            if !found.iter().any(|(n, _)| n == name) {
                found.push((name.to_string(), path));
            }
        }
    }
    found.sort();
    found
}

/// FNV-1a 64 over every header's name and contents, as 16 hex digits.
pub fn fingerprint(manifest: &Path, cuvs_include: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, file) in closure(manifest, cuvs_include) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        for b in name.as_bytes().iter().chain([0u8].iter()).chain(bytes.iter()) {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// cuVS's C headers: `RAFT_CUVS_INCLUDE`, else under the roots the build found.
pub fn cuvs_include() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RAFT_CUVS_INCLUDE").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::split_paths(env!("RAFT_CUVS_ROOTS"))
        .flat_map(|root| [root.join("libcuvs/include"), root.join("include")])
        .find(|dir| dir.join("cuvs/core/c_api.h").is_file())
}
