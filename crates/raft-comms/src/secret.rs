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
    /// `Logic` for fewer than [`MIN_SECRET_BYTES`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(Error::logic(
                "Secret::new",
                format!("a rendezvous secret of {} byte(s): use at least {MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)", bytes.len()),
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

    /// `RAFT_COMMS_SECRET` when set and not empty, for the job `RAFT_COMMS_JOB`; when that is
    /// unset and Slurm started the ranks (`srun`: a job step, and no `RANK`,
    /// `OMPI_COMM_WORLD_RANK` or `PMI_RANK` of a launcher inside it), the step
    /// (`slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>`); else empty. Without a secret the job is not used.
    ///
    /// The step's default keeps the steps of one allocation apart: the batch script's one
    /// exported secret reaches every `srun` step, and two steps running at once would otherwise
    /// admit each other's ranks (the nineteenth audit).
    ///
    /// # Errors
    /// `Logic` when it is set but too short or not UTF-8.
    pub fn from_env() -> Result<Option<Secret>> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`from_env`](Self::from_env) over any lookup (a test's table).
    fn from_lookup(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Option<Secret>> {
        match var(SECRET_VAR) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => {
                let text = v.into_string().map_err(|_| Error::logic(SECRET_VAR, "is not UTF-8"))?;
                let secret = Secret::new(text).map_err(|e| e.with_who(SECRET_VAR))?;
                // Slurm started the ranks itself (`srun`) when no launcher inside it names them:
                // under mpirun or torchrun in an allocation, ranks of one job can see different
                // steps (mpirun's own ranks the batch script's, the others their daemons' step).
                let inner = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"].iter().any(|n| var(n).is_some_and(|v| !v.is_empty()));
                let job = match (var(JOB_VAR), var("SLURM_JOB_ID"), var("SLURM_STEP_ID")) {
                    (Some(job), _, _) => job.into_encoded_bytes(),
                    (None, Some(job), Some(step)) if !inner => {
                        let mut id = b"slurm:".to_vec();
                        id.extend_from_slice(job.as_encoded_bytes());
                        id.push(b'.');
                        id.extend_from_slice(step.as_encoded_bytes());
                        id
                    }
                    _ => Vec::new(),
                };
                Ok(Some(secret.with_job(job)))
            }
        }
    }

    /// The secret as text, to hand to the ranks in `RAFT_COMMS_SECRET` (lossy for bytes that
    /// are not UTF-8; a generated secret is hex).
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
        let (a, b) = (Secret::generate().unwrap(), Secret::generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.to_env_value().len(), 64);
        assert_eq!(Secret::new(a.to_env_value()).unwrap(), a);
        assert!(!format!("{a:?}").contains(&a.to_env_value()[..8]), "{a:?}");
    }

    /// The nineteenth audit (helper 91): the steps of one Slurm allocation share the batch
    /// script's secret and, without `RAFT_COMMS_JOB`, had the same (empty) job: a rank of one
    /// step could be admitted by another step's rank 0. Each step is now a job of its own, unless
    /// `RAFT_COMMS_JOB` says otherwise.
    #[test]
    fn each_slurm_step_is_a_job_of_its_own_unless_raft_comms_job_is_set() {
        let secret = "s".repeat(32);
        let with = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Secret::from_lookup(move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.into())).unwrap().unwrap()
        };
        let step = |id: &str| with(&[(SECRET_VAR, &secret), ("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", id)]);
        let (a, b) = (step("0"), step("1"));
        assert_eq!(a.job(), b"slurm:4242.0");
        assert_ne!(a.key(), b.key(), "two steps of one job admit each other's ranks");
        let named = |id: &str| with(&[(SECRET_VAR, &secret), ("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", id), (JOB_VAR, "mine")]);
        assert_eq!(named("0").key(), named("1").key(), "RAFT_COMMS_JOB wins");
        assert_eq!(with(&[(SECRET_VAR, &secret), ("SLURM_JOB_ID", "4242")]).job(), b"", "no step: no job");
        // mpirun inside an allocation: its own ranks see the batch script's step, the others
        // their daemons' step; the launcher's job is one, so no step is bound.
        let under_mpirun =
            |id: &str| with(&[(SECRET_VAR, &secret), ("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", id), ("OMPI_COMM_WORLD_RANK", "1")]);
        assert_eq!(under_mpirun("0").key(), under_mpirun("1").key());
    }

    #[test]
    fn the_job_changes_every_key() {
        let s = Secret::new("s".repeat(32)).unwrap();
        let (a, b) = (s.clone().with_job("a"), s.clone().with_job("b"));
        assert_ne!(a.key(), b.key());
        assert_ne!(a.key(), s.key());
        assert_eq!(s.clone().with_job("").key(), s.key(), "no job is the empty job");
        assert_eq!((a.job(), a.to_env_value()), (&b"a"[..], s.to_env_value()));
    }
}
