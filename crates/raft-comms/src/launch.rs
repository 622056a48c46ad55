//! Where this process stands among its ranks, from the environment a launcher sets: `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` (torchrun's names, which `raft-run`,
//! torchrun and most cluster launchers set), the rendezvous port (`RAFT_COMMS_PORT`), and the
//! communicators' time bound (`RAFT_COMMS_TIMEOUT`).
use raft_error::{Error, Result};
use std::time::Duration;

/// The default bound of a communicator's waits: initialisation, a collective that does not
/// finish, a finalize (`RAFT_COMMS_TIMEOUT` overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// This process's place among the ranks, as a launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// `RANK`: this process's rank, from 0.
    pub rank: usize,
    /// `WORLD_SIZE`: the number of ranks.
    pub world_size: usize,
    /// `LOCAL_RANK`: the rank among the processes of this host (the GPU to use), when set.
    pub local_rank: Option<usize>,
    /// `MASTER_ADDR`: rank 0's host.
    pub master_addr: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// The port rank 0 serves the unique id on: `RAFT_COMMS_PORT` when set; else, under
    /// torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`, whose agent already listens on
    /// `MASTER_PORT`), `MASTER_PORT + 1`; else `MASTER_PORT`.
    pub rendezvous_port: u16,
}

impl Launch {
    /// Reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (all required) and `LOCAL_RANK`.
    ///
    /// # Errors
    /// `Logic` naming the variable that is missing or not a number, a rank not below the world
    /// size, or a world size above `i32::MAX` (NCCL's limit).
    pub fn from_env() -> Result<Launch> {
        Self::from_vars("Launch::from_env", |name| std::env::var(name).ok())
    }

    /// The same, from any lookup (the environment of another process, a test's table).
    pub fn from_vars(who: &'static str, var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let need = |name: &str| {
            var(name).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                Error::logic(
                    who,
                    format!(
                        "{name} is not set: start the program with a launcher (raft-run -n N ./prog, torchrun, srun with \
                         those variables) or call Communicator::init with the rank, world size and address"
                    ),
                )
            })
        };
        let number = |name: &str, text: String| {
            text.trim().parse::<usize>().map_err(|_| Error::logic(who, format!("{name}={text} is not a non-negative integer")))
        };
        let rank = number("RANK", need("RANK")?)?;
        let world_size = number("WORLD_SIZE", need("WORLD_SIZE")?)?;
        if world_size > crate::rendezvous::MAX_WORLD {
            return Err(Error::logic(
                who,
                format!("WORLD_SIZE={world_size} is more ranks than NCCL takes (at most {})", crate::rendezvous::MAX_WORLD),
            ));
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::logic(who, format!("RANK={rank} is not a rank of WORLD_SIZE={world_size}")));
        }
        let local_rank = var("LOCAL_RANK").filter(|v| !v.trim().is_empty()).map(|v| number("LOCAL_RANK", v)).transpose()?;
        let master_addr = need("MASTER_ADDR")?.trim().to_string();
        let port_text = need("MASTER_PORT")?;
        let master_port =
            port_text.trim().parse::<u16>().map_err(|_| Error::logic(who, format!("MASTER_PORT={port_text} is not a port number")))?;
        let rendezvous_port = match var("RAFT_COMMS_PORT").filter(|v| !v.trim().is_empty()) {
            Some(p) => p.trim().parse::<u16>().map_err(|_| Error::logic(who, format!("RAFT_COMMS_PORT={p} is not a port number")))?,
            None if var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) => {
                master_port.checked_add(1).ok_or_else(|| {
                    Error::logic(who, "MASTER_PORT=65535 is torchrun's store: set RAFT_COMMS_PORT to a free port for the rendezvous")
                })?
            }
            None => master_port,
        };
        Ok(Launch { rank, world_size, local_rank, master_addr, master_port, rendezvous_port })
    }

    /// `MASTER_ADDR:<rendezvous port>` (brackets around an IPv6 address).
    pub fn rendezvous_addr(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.rendezvous_port)
        } else {
            format!("{}:{}", self.master_addr, self.rendezvous_port)
        }
    }
}

/// `RAFT_COMMS_TIMEOUT` (seconds, a positive number) or [`DEFAULT_TIMEOUT`].
///
/// # Errors
/// `Logic` when the variable is set to something else than a positive number of seconds.
pub fn timeout_from_env() -> Result<Duration> {
    timeout_from(std::env::var("RAFT_COMMS_TIMEOUT").ok())
}

pub(crate) fn timeout_from(text: Option<String>) -> Result<Duration> {
    match text.filter(|t| !t.trim().is_empty()) {
        None => Ok(DEFAULT_TIMEOUT),
        Some(t) => match t.trim().parse::<f64>() {
            Ok(s) if s > 0.0 => Duration::try_from_secs_f64(s)
                .map_err(|_| Error::logic("RAFT_COMMS_TIMEOUT", format!("{t} seconds is beyond any wait (the most is about 1.8e19)"))),
            _ => Err(Error::logic("RAFT_COMMS_TIMEOUT", format!("expected a positive number of seconds, given {t}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn table(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn reads_torchrun_variables() {
        let l = Launch::from_vars(
            "t",
            table(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]),
        )
        .unwrap();
        assert_eq!(
            l,
            Launch {
                rank: 1,
                world_size: 2,
                local_rank: Some(1),
                master_addr: "127.0.0.1".into(),
                master_port: 29500,
                rendezvous_port: 29500
            }
        );
        assert_eq!(l.rendezvous_addr(), "127.0.0.1:29500");
    }

    #[test]
    fn under_torchrun_the_rendezvous_moves_off_the_agents_port() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            Launch::from_vars("t", table(&all))
        };
        assert_eq!(with(&[("TORCHELASTIC_USE_AGENT_STORE", "True")]).unwrap().rendezvous_addr(), "h:29501");
        assert_eq!(with(&[("TORCHELASTIC_USE_AGENT_STORE", "True"), ("RAFT_COMMS_PORT", "4000")]).unwrap().rendezvous_addr(), "h:4000");
        assert_eq!(with(&[("RAFT_COMMS_PORT", "4000")]).unwrap().rendezvous_port, 4000);
        assert!(with(&[("RAFT_COMMS_PORT", "x")]).is_err());
    }

    #[test]
    fn names_what_is_missing_or_wrong() {
        let e = Launch::from_vars("t", table(&[("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.message().starts_with("RANK is not set"), "{e}");
        let e =
            Launch::from_vars("t", table(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")])).unwrap_err();
        assert!(e.message().contains("RANK=2 is not a rank of WORLD_SIZE=2"), "{e}");
        let e = Launch::from_vars("t", table(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")]))
            .unwrap_err();
        assert!(e.message().contains("MASTER_PORT=99999"), "{e}");
        let e = Launch::from_vars("t", table(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.message().contains("RANK=x"), "{e}");
    }

    #[test]
    fn a_world_beyond_an_int_is_refused() {
        let vars = |world: &'static str| table(&[("RANK", "0"), ("WORLD_SIZE", world), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
        assert_eq!(Launch::from_vars("t", vars("2147483647")).unwrap().world_size, i32::MAX as usize);
        let e = Launch::from_vars("t", vars("2147483648")).unwrap_err();
        assert!(e.message().contains("WORLD_SIZE=2147483648") && e.message().contains("2147483647"), "{e}");
    }

    #[test]
    fn ipv6_addresses_get_brackets() {
        let l = Launch { rank: 0, world_size: 1, local_rank: None, master_addr: "::1".into(), master_port: 7, rendezvous_port: 7 };
        assert_eq!(l.rendezvous_addr(), "[::1]:7");
    }

    #[test]
    fn timeout_is_positive_seconds() {
        assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(timeout_from(Some("2.5".into())).unwrap(), Duration::from_millis(2500));
        assert!(timeout_from(Some("0".into())).is_err());
        assert!(timeout_from(Some("-1".into())).is_err());
        assert!(timeout_from(Some("soon".into())).is_err());
        // Too large for a Duration: an error, not a panic.
        for huge in ["1e20", "inf", "NaN"] {
            assert_eq!(timeout_from(Some(huge.into())).unwrap_err().kind(), raft_error::ErrorKind::Logic, "{huge}");
        }
        assert_eq!(timeout_from(Some("1e9".into())).unwrap(), Duration::from_secs(1_000_000_000));
    }
}
