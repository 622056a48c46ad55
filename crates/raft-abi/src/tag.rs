//! The ABI tag: what the shim was compiled against, as a plain serde struct.
use serde::{Deserialize, Serialize};
use std::fmt;

/// The format number of [`Abi`] itself: bumped when a field changes meaning or goes. A field
/// added reads as its default (`""`) from older tags, which then differ in it from any build
/// (`rmm_abi_namespace`, `headers`): no bump.
pub const TAG_FORMAT: u32 = 1;

/// The native stack a build was compiled against (the seed's `raft-abi`).
///
/// A plain struct with public fields: match it with struct patterns
/// (`Abi { raft, .. }`) and copy it with struct update syntax
/// (`Abi { raft: "26.10.00".into(), ..raft::abi() }`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Abi {
    /// The tag's own format number ([`TAG_FORMAT`]).
    pub version: u32,
    /// RAFT release, `"26.08.00"`.
    pub raft: String,
    /// RMM release, `"26.08.00"`.
    pub rmm: String,
    /// CCCL release, `"3.4.3"`.
    pub cccl: String,
    /// CUDA runtime headers, `"13.2"`.
    pub cuda_runtime: String,
    /// `sizeof(raft::device_resources)` in bytes.
    pub handle_size: usize,
    /// RMM's inline ABI namespace, `"_RMM_26_8"`: code built against another one fails to link.
    /// Tags written before this field existed read as `""` (which differs from any build's).
    #[serde(default)]
    pub rmm_abi_namespace: String,
    /// A digest of every RAFT, RMM, CCCL and CUDA header the shim was compiled with (16 hex
    /// digits; `raft_build::depfile`): headers edited in place or mixed from two packages of one
    /// release show here where every version agrees. Which headers are read can depend on the
    /// compiler too (CCCL and RMM branch on its macros), so another compiler over the same
    /// stack may give another digest. Empty for a documentation build, and in tags written
    /// before this field existed (which then differ from any build's).
    #[serde(default)]
    pub headers: String,
}

/// A field of [`Abi`], named as the seed names it. Non-exhaustive: a field may be added.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbiField {
    /// `version`
    Version,
    /// `raft`
    Raft,
    /// `rmm`
    Rmm,
    /// `cccl`
    Cccl,
    /// `cuda-runtime`
    CudaRuntime,
    /// `handle-size`
    HandleSize,
    /// `rmm-abi-namespace`
    RmmAbiNamespace,
    /// `headers`
    Headers,
}

impl fmt::Display for AbiField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AbiField::Version => "version",
            AbiField::Raft => "raft",
            AbiField::Rmm => "rmm",
            AbiField::Cccl => "cccl",
            AbiField::CudaRuntime => "cuda-runtime",
            AbiField::HandleSize => "handle-size",
            AbiField::RmmAbiNamespace => "rmm-abi-namespace",
            AbiField::Headers => "headers",
        })
    }
}

impl Abi {
    /// Every field with its value as text, in order.
    pub fn fields(&self) -> [(AbiField, String); 8] {
        [
            (AbiField::Version, self.version.to_string()),
            (AbiField::Raft, self.raft.clone()),
            (AbiField::Rmm, self.rmm.clone()),
            (AbiField::Cccl, self.cccl.clone()),
            (AbiField::CudaRuntime, self.cuda_runtime.clone()),
            (AbiField::HandleSize, self.handle_size.to_string()),
            (AbiField::RmmAbiNamespace, self.rmm_abi_namespace.clone()),
            (AbiField::Headers, self.headers.clone()),
        ]
    }

    /// The fields where `other` differs from `self`, in order. A changed handle layout shows
    /// as `handle-size` even when every version is the same.
    pub fn mismatches(&self, other: &Abi) -> Vec<AbiField> {
        self.fields().into_iter().zip(other.fields()).filter(|(a, b)| a.1 != b.1).map(|(a, _)| a.0).collect()
    }

    /// The one-line support report: `raft=26.08.00 rmm=26.08.00 cccl=3.4.3`.
    pub fn report_line(&self) -> String {
        format!("raft={} rmm={} cccl={}", self.raft, self.rmm, self.cccl)
    }

    /// The tag as pretty JSON (the format of the committed tag file).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a struct of strings and numbers always serialises")
    }

    /// Reads a tag from JSON.
    ///
    /// # Errors
    /// `Logic` naming what is wrong with the text.
    pub fn from_json(text: &str) -> raft_error::Result<Abi> {
        serde_json::from_str(text).map_err(|e| raft_error::Error::logic("Abi::from_json", format!("not an ABI tag: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> Abi {
        Abi {
            version: TAG_FORMAT,
            raft: "26.08.00".into(),
            rmm: "26.08.00".into(),
            cccl: "3.4.3".into(),
            cuda_runtime: "13.2".into(),
            handle_size: 32,
            rmm_abi_namespace: "_RMM_26_8".into(),
            headers: "f8d1a1068f4bc2ab".into(),
        }
    }

    #[test]
    fn a_tag_without_the_rmm_abi_namespace_still_reads() {
        // The format of tags committed before the field was added.
        let old = r#"{"version": 1, "raft": "26.08.00", "rmm": "26.08.00", "cccl": "3.4.3", "cuda_runtime": "13.2", "handle_size": 32}"#;
        let read = Abi::from_json(old).unwrap();
        assert_eq!(read.rmm_abi_namespace, "");
        assert_eq!(read, Abi { rmm_abi_namespace: String::new(), headers: String::new(), ..tag() });
        // ... and it is reported as a difference, not taken for a match.
        assert_eq!(tag().mismatches(&read), [AbiField::RmmAbiNamespace, AbiField::Headers]);
    }

    #[test]
    fn headers_that_differ_are_named_where_every_version_agrees() {
        let edited = Abi { headers: "0123456789abcdef".into(), ..tag() };
        assert_eq!(tag().mismatches(&edited), [AbiField::Headers]);
        assert_eq!(AbiField::Headers.to_string(), "headers");
        assert_eq!(Abi::from_json(&edited.to_json()).unwrap(), edited);
    }

    #[test]
    fn a_tag_round_trips_and_a_missing_required_field_is_a_logic_error() {
        assert_eq!(Abi::from_json(&tag().to_json()).unwrap(), tag());
        let e = Abi::from_json(r#"{"version": 1, "raft": "26.08.00"}"#).unwrap_err();
        assert_eq!(e.kind(), raft_error::ErrorKind::Logic);
        assert!(e.message().contains("missing field"), "{e}");
    }
}
