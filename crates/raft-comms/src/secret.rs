//! `Secret`: the per-job key of the unique id's rendezvous, and the HMAC-SHA256 pieces the
//! handshake is made of (fresh nonces, tags checked in constant time, the id's keystream).
use hmac::{Hmac, Mac};
use raft_error::{Error, Result};
use sha2::Sha256;
use std::fmt;

/// The variable a launcher sets to the job's secret (`raft-run` makes a fresh one per job).
pub const SECRET_VAR: &str = "RAFT_COMMS_SECRET";

/// The variable a launcher sets to the job's id (`raft-run` makes a fresh one per job): bound
/// into every tag with the secret, so that jobs sharing a secret still refuse each other's ranks.
pub const JOB_VAR: &str = "RAFT_COMMS_JOB";

/// The fewest bytes a secret may have. Anyone who reaches rank 0's port gets an HMAC under the
/// secret of a nonce of their choosing, and can then guess offline: the secret must be random and
/// long enough that guessing is hopeless (`raft-run` generates 32 random bytes; 32 characters of
/// hex are 128 bits).
pub const MIN_SECRET_BYTES: usize = 32;

/// The fewest different bytes a secret may have: a placeholder (32 spaces, `xxxx…`, `0000…`,
/// `abab…`, `abcabc…`) is long enough and guessed at once. Random text has more: 32 random hex
/// digits have fewer than 4 different ones with a probability of 3·10^-21 (8 would refuse one
/// random 32-digit secret in 28 million: the review, helper 99).
pub const MIN_DISTINCT_SECRET_BYTES: usize = 4;

pub(crate) const TAG: usize = 32;
pub(crate) const NONCE: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// The rendezvous's per-job secret: rank 0 and every other rank prove to each other that they
/// hold it (HMAC-SHA256 over fresh nonces from both sides) before rank 0 says anything about the
/// job, and the unique id travels encrypted and authenticated under it. A process that reaches
/// rank 0's port without it learns nothing (not even the world size) and cannot take a rank; a
/// process that listens on the port without it (a squatter, another job's rank 0) is refused by
/// the ranks.
///
/// Read from `RAFT_COMMS_SECRET` by [`Communicator::from_env`](crate::Communicator::from_env),
/// [`Communicator::init`](crate::Communicator::init), [`UniqueId::serve`](crate::UniqueId::serve)
/// and [`UniqueId::fetch`](crate::UniqueId::fetch); `raft-run` sets a fresh one for every job.
/// Without one, the rendezvous runs only on a loopback address (any other is refused with
/// `Logic`), unauthenticated: on a host shared with other users, set one anyway.
///
/// The secret must be random (at least [`MIN_SECRET_BYTES`]; a password can be guessed offline).
/// A job id ([`with_job`](Self::with_job), `RAFT_COMMS_JOB`; empty when unset) is bound into every
/// tag with it: ranks of two jobs that share a secret but not a job id refuse each other.
///
/// `Debug` does not show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    raw: Vec<u8>,
    job: Vec<u8>,
    /// The key of every tag: HMAC(secret, job), so that no tag of one job verifies in another.
    key: [u8; TAG],
}

impl Secret {
    /// A secret from its bytes (the text of `RAFT_COMMS_SECRET`, say).
    ///
    /// # Errors
    /// `Logic` for fewer than [`MIN_SECRET_BYTES`] bytes, fewer than
    /// [`MIN_DISTINCT_SECRET_BYTES`] different ones (a placeholder, not a random secret), or
    /// bytes that are not UTF-8 text (a secret travels to the ranks in an environment variable:
    /// [`to_env_value`](Self::to_env_value) would hand them another one).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret> {
        let bytes = bytes.into();
        if std::str::from_utf8(&bytes).is_err() {
            return Err(Error::logic(
                "Secret::new",
                "a rendezvous secret must be UTF-8 text (it travels to the ranks in RAFT_COMMS_SECRET): e.g. `openssl rand -hex 32`",
            ));
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(Error::logic(
                "Secret::new",
                format!("a rendezvous secret of {} byte(s): use at least {MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)", bytes.len()),
            ));
        }
        let mut seen = [false; 256];
        bytes.iter().for_each(|&b| seen[usize::from(b)] = true);
        let distinct = seen.iter().filter(|&&s| s).count();
        if distinct < MIN_DISTINCT_SECRET_BYTES {
            return Err(Error::logic(
                "Secret::new",
                format!(
                    "a rendezvous secret of {} byte(s) with only {distinct} different one(s) is a placeholder, not a random \
                     secret: use at least {MIN_DISTINCT_SECRET_BYTES} (e.g. `openssl rand -hex 32`)",
                    bytes.len()
                ),
            ));
        }
        Ok(Secret::keyed(bytes, Vec::new()))
    }

    fn keyed(raw: Vec<u8>, job: Vec<u8>) -> Secret {
        let key = tag(&raw, &[b"raft-comms job", &job]);
        Secret { raw, job, key }
    }

    /// This secret for the job `job` (any bytes, not secret; `raft-run` passes a fresh random one
    /// in `RAFT_COMMS_JOB`): only ranks given the same secret and the same job id admit each
    /// other.
    pub fn with_job(self, job: impl Into<Vec<u8>>) -> Secret {
        Secret::keyed(self.raw, job.into())
    }

    /// The job id (empty when none was given).
    pub fn job(&self) -> &[u8] {
        &self.job
    }

    /// A fresh random secret (32 bytes from the OS, written as 64 hex digits so that it can
    /// travel in an environment variable).
    ///
    /// # Errors
    /// `Generic` when the OS gives no random bytes.
    pub fn generate() -> Result<Secret> {
        let mut raw = [0u8; 32];
        random_bytes("Secret::generate", &mut raw)?;
        Ok(Secret::keyed(hex(&raw).into_bytes(), Vec::new()))
    }

    /// `RAFT_COMMS_SECRET` when set and not empty, for the job `RAFT_COMMS_JOB` (empty when unset;
    /// without a secret it is not used). [`Communicator::from_env`](crate::Communicator::from_env)
    /// binds the Slurm step as the job when `srun` numbered the ranks and `RAFT_COMMS_JOB` is
    /// unset; this function does not (a program naming its ranks itself may start them in
    /// several steps).
    ///
    /// # Errors
    /// `Logic` when it is set but refused by [`new`](Self::new) (too short, a placeholder of
    /// fewer than [`MIN_DISTINCT_SECRET_BYTES`] different bytes) or not UTF-8.
    pub fn from_env() -> Result<Option<Secret>> {
        match std::env::var_os(SECRET_VAR) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => {
                let text = v.into_string().map_err(|_| Error::logic(SECRET_VAR, "is not UTF-8"))?;
                let secret = Secret::new(text).map_err(|e| e.with_who(SECRET_VAR))?;
                let job = std::env::var_os(JOB_VAR).unwrap_or_default();
                Ok(Some(secret.with_job(job.into_encoded_bytes())))
            }
        }
    }

    /// The secret as text, to hand to the ranks in `RAFT_COMMS_SECRET`: exactly its bytes
    /// ([`new`](Self::new) takes only UTF-8 text; a generated secret is hex).
    pub fn to_env_value(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, job {:?})", self.raw.len(), String::from_utf8_lossy(&self.job))
    }
}

/// `bytes` as lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fills `buf` from the OS's random source (the kernel's CSPRNG, through `/dev/urandom`: no
/// `unsafe` needed, and it does not block once the pool is initialised, which it is long before a
/// program can run).
pub(crate) fn random_bytes(who: &'static str, buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| Error::new(raft_error::ErrorKind::Generic, who, format!("no random bytes from the OS (/dev/urandom): {e}")))
}

/// HMAC-SHA256 under `key` of the parts, each prefixed by its length (so that no two lists of
/// parts give the same message).
pub(crate) fn tag(key: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        mac.update(&(p.len() as u64).to_le_bytes());
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Whether `given` is the tag of the parts under `key`, compared in constant time.
pub(crate) fn verify(key: &[u8], parts: &[&[u8]], given: &[u8]) -> bool {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        mac.update(&(p.len() as u64).to_le_bytes());
        mac.update(p);
    }
    mac.verify_slice(given).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // RFC 4231 test case 2, through the raw MAC (our `tag` adds length prefixes).
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn tags_verify_only_under_their_key_and_parts() {
        let t = tag(b"k1", &[b"a", b"bc"]);
        assert!(verify(b"k1", &[b"a", b"bc"], &t));
        assert!(!verify(b"k2", &[b"a", b"bc"], &t));
        assert!(!verify(b"k1", &[b"ab", b"c"], &t), "the length prefixes keep the parts apart");
        assert!(!verify(b"k1", &[b"a", b"bc"], &t[..31]));
    }

    #[test]
    fn secrets_are_long_enough_fresh_and_not_printed() {
        assert!(Secret::new("short").is_err());
        // Long enough, yet placeholders (helper 91: 32 spaces were taken).
        for placeholder in [" ".repeat(32), "x".repeat(64), "ab".repeat(16), "abc".repeat(11)] {
            let e = Secret::new(placeholder.clone()).unwrap_err();
            assert!(e.to_string().contains("is a placeholder"), "{placeholder:?}: {e}");
        }
        assert!(Secret::new("0123".repeat(8)).is_ok(), "four different bytes are enough");
        // Bytes that are not UTF-8: `to_env_value` handed the ranks another secret (helper 97).
        let e = Secret::new((0x80u8..0xA0).collect::<Vec<u8>>()).unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
        let (a, b) = (Secret::generate().unwrap(), Secret::generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.to_env_value().len(), 64);
        assert_eq!(Secret::new(a.to_env_value()).unwrap(), a);
        assert!(!format!("{a:?}").contains(&a.to_env_value()[..8]), "{a:?}");
    }

    #[test]
    fn the_job_changes_every_key() {
        let s = Secret::new("s0123456789abcdef".repeat(2)).unwrap();
        let (a, b) = (s.clone().with_job("a"), s.clone().with_job("b"));
        assert_ne!(a.key(), b.key());
        assert_ne!(a.key(), s.key());
        assert_eq!(s.clone().with_job("").key(), s.key(), "no job is the empty job");
        assert_eq!((a.job(), a.to_env_value()), (&b"a"[..], s.to_env_value()));
    }
}
