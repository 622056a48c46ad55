//! `cargo xtask abi-check [--bless] [--tag FILE]`: builds the shim, reads this build's ABI tag
//! and compares it, field by field, with the tag committed in the repository.
use crate::{cargo, workspace_root, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Where the committed tag lives.
pub fn committed_tag() -> PathBuf {
    workspace_root().join("crates/raft-abi/abi-tag.json")
}

/// This build's tag, from the `raft-abi-tag` binary (build facts only: it loads nothing native).
fn current_tag() -> Result<Value> {
    let out = cargo()
        .args(["run", "--quiet", "-p", "raft-abi", "--bin", "raft-abi-tag"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("raft-abi-tag failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("raft-abi-tag printed no JSON tag: {e}"))
}

/// One row of the comparison.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub field: String,
    pub committed: String,
    pub current: String,
}

impl Row {
    pub fn same(&self) -> bool {
        self.committed == self.current
    }
}

fn text(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Compares two tags field by field (the union of their fields, current order first).
pub fn compare(committed: &Map<String, Value>, current: &Map<String, Value>) -> Vec<Row> {
    let mut fields: Vec<&String> = current.keys().collect();
    fields.extend(committed.keys().filter(|k| !current.contains_key(*k)));
    fields
        .into_iter()
        .map(|f| Row { field: f.replace('_', "-"), committed: text(committed.get(f)), current: text(current.get(f)) })
        .collect()
}

/// Compares the tag file at `path` with `current`; `Err` names the fields that differ.
pub fn check(path: &Path, current: &Value) -> Result<Vec<Row>> {
    let raw = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e} (run `cargo xtask abi-check --bless` to record this build's tag)", path.display()))?;
    let committed: Value = serde_json::from_str(&raw).map_err(|e| format!("{} is not a JSON tag: {e}", path.display()))?;
    let (Some(c), Some(n)) = (committed.as_object(), current.as_object()) else {
        return Err(format!("{} is not a JSON object", path.display()));
    };
    let rows = compare(c, n);
    println!("{:<20} {:<14} {:<14}", "field", "committed", "this build");
    for r in &rows {
        println!("{:<20} {:<14} {:<14} {}", r.field, r.committed, r.current, if r.same() { "same" } else { "DIFFERENT" });
    }
    let differing: Vec<&str> = rows.iter().filter(|r| !r.same()).map(|r| r.field.as_str()).collect();
    if differing.is_empty() {
        Ok(rows)
    } else {
        Err(format!(
            "the native ABI moved: {} differ(s) from {}.\n\
             The RAFT/RMM/CCCL/CUDA headers this build compiled against are not the ones the repository \
             was tested with. If the change is intended, check the binding against the new release and run \
             `cargo xtask abi-check --bless`; otherwise fix the environment (RAFT_SYS_PREFIX, CONDA_PREFIX, \
             `cargo xtask deps`).",
            differing.join(", "),
            path.display()
        ))
    }
}

pub fn run(bless: bool) -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.iter().position(|a| a == "--tag").and_then(|i| args.get(i + 1)).map(PathBuf::from).unwrap_or_else(committed_tag);
    let current = current_tag()?;
    if bless {
        let text = serde_json::to_string_pretty(&current).map_err(|e| e.to_string())? + "\n";
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("recorded this build's ABI tag in {}", path.display());
        return Ok(());
    }
    check(&path, &current).map(|_| println!("abi-check: this build matches {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tag() -> Value {
        json!({"version": 1, "raft": "26.08.00", "rmm": "26.08.00", "cccl": "3.4.3", "cuda_runtime": "13.2", "handle_size": 32, "rmm_abi_namespace": "_RMM_26_8", "headers": "f8d1a1068f4bc2ab"})
    }

    #[test]
    fn an_edited_tag_file_fails_and_names_the_fields() {
        let dir = std::env::temp_dir().join(format!("raft-abi-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("abi-tag.json");
        let mut edited = tag();
        edited["raft"] = json!("26.10.00");
        edited["handle_size"] = json!(40);
        std::fs::write(&path, edited.to_string()).unwrap();
        let err = check(&path, &tag()).unwrap_err();
        assert!(err.contains("handle-size, raft differ"), "{err}");
        std::fs::write(&path, tag().to_string()).unwrap();
        let rows = check(&path, &tag()).unwrap();
        assert!(rows.iter().all(Row::same));
        assert_eq!(rows.len(), 8);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_field_missing_from_the_committed_tag_differs() {
        let mut old = tag();
        old.as_object_mut().unwrap().remove("rmm_abi_namespace");
        let rows = compare(old.as_object().unwrap(), tag().as_object().unwrap());
        let row = rows.iter().find(|r| r.field == "rmm-abi-namespace").unwrap();
        assert_eq!(row.committed, "(absent)");
        assert!(!row.same());
    }

    #[test]
    fn the_committed_tag_matches_this_build() {
        // The same check CI runs, as a test, so plain `cargo test` catches drift.
        let current = current_tag().unwrap();
        check(&committed_tag(), &current).unwrap();
    }
}
