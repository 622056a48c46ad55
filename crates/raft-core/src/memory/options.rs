//! [`RmmOptions`]: a whole RMM setup for one device, as `rmm.reinitialize(...)` and dask-cuda's
//! `rmm_*` options describe it, read from the `RAFT_RMM_*` variables, and built.
use super::resource::{AsyncPoolOptions, MemoryResource, PoolOptions};
use crate::error::{Error, Result};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The memory a direct resource or a pool takes from: device memory or managed memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Base {
    /// `cuda_memory_resource` (cudaMalloc).
    #[default]
    Device,
    /// `managed_memory_resource` (cudaMallocManaged; `managed_memory=True`, `rmm_managed_memory`).
    Managed,
}

/// How allocations are served. Each setup RMM takes is one value here, and nothing else can
/// be written: the async pool has no base and no maximum; a pool's options belong to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Allocator {
    /// The base resource itself, one cudaMalloc (or cudaMallocManaged) per allocation.
    Direct(Base),
    /// A `pool_memory_resource` over the base (`pool_allocator=True`, `rmm_pool_size`).
    Pool(Base, PoolOptions),
    /// `cuda_async_memory_resource`, a cudaMallocAsync pool (`rmm_async`).
    Async(AsyncPoolOptions),
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::Direct(Base::Device)
    }
}

/// A whole RMM setup for one device, as `rmm.reinitialize(...)` and dask-cuda's `rmm_*` options
/// describe it: the allocator, then adaptors on top.
///
/// ```
/// use raft_core::memory::{Allocator, Base};
/// use raft_core::{PoolOptions, RmmOptions};
/// // rmm.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size=2**30)
/// let options = RmmOptions { allocator: Allocator::Pool(Base::Managed, PoolOptions::initial(1 << 30)), ..Default::default() };
/// # assert!(!options.statistics);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RmmOptions {
    /// How allocations are served.
    pub allocator: Allocator,
    /// RMM's CSV log of every allocation, to this file (`logging=True, log_file_name=…`;
    /// dask-cuda's `rmm_log_directory` names a directory: the file is `rmm_log_dev<N>.csv` there).
    pub log_file: Option<PathBuf>,
    /// A tracking adaptor on top (`rmm_track_allocations`).
    pub track_allocations: bool,
    /// A statistics adaptor on top (`rmm.statistics.enable_statistics()`).
    pub statistics: bool,
}

/// Parses `8GiB`, `512 MB`, `1.5GB`, `1073741824` (binary and decimal units, as dask-cuda does).
fn parse_bytes(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim().to_ascii_lowercase());
    // Exact scales (`powi`'s precision is unspecified: Miri rounds it differently, and `2GiB`
    // came out one byte short there); a whole number is multiplied as an integer, exact at any
    // size, a fraction as a float.
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        _ => return None,
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(scale).and_then(|b| usize::try_from(b).ok());
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * scale as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64).then_some(bytes as usize)
}

impl RmmOptions {
    /// The `RAFT_RMM_*` variables, read once per process: `RAFT_RMM_POOL_SIZE`,
    /// `RAFT_RMM_MAXIMUM_POOL_SIZE`, `RAFT_RMM_RELEASE_THRESHOLD` (bytes: `8GiB`, `500MB`, a
    /// number), `RAFT_RMM_POOL`, `RAFT_RMM_MANAGED`, `RAFT_RMM_ASYNC`, `RAFT_RMM_TRACK_ALLOCATIONS`,
    /// `RAFT_RMM_STATISTICS` (`1`/`0`, `true`/`false`), `RAFT_RMM_LOG_DIRECTORY` (a directory:
    /// `rmm_log_dev<N>.csv` in it). `None` when none is set.
    ///
    /// With `RAFT_RMM_ASYNC`, `RAFT_RMM_POOL_SIZE` is the async pool's initial size (as dask-cuda's
    /// `rmm_pool_size` with `rmm_async`).
    ///
    /// # Errors
    /// `Logic`, naming the variable, for a value that does not parse; naming both, for variables
    /// that contradict each other (the async pool with `RAFT_RMM_POOL`, `RAFT_RMM_MANAGED` or
    /// `RAFT_RMM_MAXIMUM_POOL_SIZE`; `RAFT_RMM_RELEASE_THRESHOLD` without the async pool;
    /// `RAFT_RMM_MAXIMUM_POOL_SIZE` without a pool).
    pub fn from_env() -> Result<Option<RmmOptions>> {
        static FROM_ENV: OnceLock<Result<Option<RmmOptions>>> = OnceLock::new();
        FROM_ENV.get_or_init(|| Self::from_env_os(|name| std::env::var_os(name))).clone()
    }

    /// [`from_vars`](Self::from_vars) over values that may not be UTF-8: a size or a flag that is
    /// not is refused by name, and the log directory is taken as the path it is. `std::env::var`
    /// took either for unset (helper 111): a pool size or a log directory was dropped in silence.
    fn from_env_os(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Option<RmmOptions>> {
        const LOG: &str = "RAFT_RMM_LOG_DIRECTORY";
        let options = Self::from_vars(|name| get(name).map(|v| v.to_string_lossy().into_owned()))?;
        Ok(options.map(|mut o| {
            // Set (not blank) exactly when `from_vars` took it: its bytes, not the lossy text,
            // which would name another file.
            if o.log_file.is_some() {
                o.log_file = get(LOG).map(PathBuf::from);
            }
            o
        }))
    }

    /// The same from any lookup (tests, config files).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<RmmOptions>> {
        const WHO: &str = "RmmOptions::from_env";
        let mut any = false;
        let mut get = |name: &str| {
            let v = get(name).filter(|v| !v.trim().is_empty());
            any |= v.is_some();
            v
        };
        let size = |name: &str, v: Option<String>| -> Result<Option<usize>> {
            v.map(|t| {
                parse_bytes(&t).ok_or_else(|| {
                    Error::logic(WHO, format!("{name}: expected a size in bytes (e.g. 8GiB, 500MB, 1073741824), given {t:?}"))
                })
            })
            .transpose()
        };
        let flag = |name: &str, v: Option<String>| -> Result<bool> {
            match v.as_deref().map(|t| t.trim().to_ascii_lowercase()) {
                None => Ok(false),
                Some(t) if ["1", "true", "yes", "on"].contains(&t.as_str()) => Ok(true),
                Some(t) if ["0", "false", "no", "off"].contains(&t.as_str()) => Ok(false),
                Some(t) => Err(Error::logic(WHO, format!("{name}: expected 1 or 0 (true or false), given {t:?}"))),
            }
        };
        // Pool sizes rounded down to RMM's 256-byte multiple, as dask-cuda rounds them
        // (`parse_device_memory_limit(.., alignment_size=256)`): RMM's pool refuses another
        // size, and the setup was then dropped with a warning (the fifteenth audit).
        let aligned = |b: Option<usize>| b.map(|b| b & !255);
        let pool_size = aligned(size("RAFT_RMM_POOL_SIZE", get("RAFT_RMM_POOL_SIZE"))?);
        let pool = flag("RAFT_RMM_POOL", get("RAFT_RMM_POOL"))?;
        let maximum = aligned(size("RAFT_RMM_MAXIMUM_POOL_SIZE", get("RAFT_RMM_MAXIMUM_POOL_SIZE"))?);
        let managed = flag("RAFT_RMM_MANAGED", get("RAFT_RMM_MANAGED"))?;
        let async_pool = flag("RAFT_RMM_ASYNC", get("RAFT_RMM_ASYNC"))?;
        let release_threshold = size("RAFT_RMM_RELEASE_THRESHOLD", get("RAFT_RMM_RELEASE_THRESHOLD"))?;
        let contradiction = |a: &str, b: &str, why: &str| Error::logic(WHO, format!("{a} and {b} exclude each other: {why}"));
        let base = if managed { Base::Managed } else { Base::Device };
        let allocator = if async_pool {
            if pool {
                return Err(contradiction("RAFT_RMM_ASYNC", "RAFT_RMM_POOL", "the async pool is not a pool_memory_resource"));
            }
            if managed {
                return Err(contradiction("RAFT_RMM_ASYNC", "RAFT_RMM_MANAGED", "the async pool takes device memory only"));
            }
            if maximum.is_some() {
                return Err(contradiction("RAFT_RMM_ASYNC", "RAFT_RMM_MAXIMUM_POOL_SIZE", "the async pool has no maximum"));
            }
            Allocator::Async(AsyncPoolOptions { initial: pool_size, release_threshold })
        } else if release_threshold.is_some() {
            return Err(Error::logic(WHO, "RAFT_RMM_RELEASE_THRESHOLD needs RAFT_RMM_ASYNC: only the async pool has a release threshold"));
        } else if pool || pool_size.is_some() {
            Allocator::Pool(base, PoolOptions { initial: pool_size, maximum })
        } else if maximum.is_some() {
            return Err(Error::logic(WHO, "RAFT_RMM_MAXIMUM_POOL_SIZE needs a pool: set RAFT_RMM_POOL_SIZE or RAFT_RMM_POOL as well"));
        } else {
            Allocator::Direct(base)
        };
        let options = RmmOptions {
            allocator,
            log_file: get("RAFT_RMM_LOG_DIRECTORY").map(PathBuf::from),
            track_allocations: flag("RAFT_RMM_TRACK_ALLOCATIONS", get("RAFT_RMM_TRACK_ALLOCATIONS"))?,
            statistics: flag("RAFT_RMM_STATISTICS", get("RAFT_RMM_STATISTICS"))?,
        };
        Ok(any.then_some(options))
    }

    /// The resource this setup describes, on `device` (the log file of a directory setting is
    /// `rmm_log_dev<device>.csv`).
    pub fn build(&self, device: usize) -> Result<MemoryResource> {
        let base = |b: Base| match b {
            Base::Device => MemoryResource::cuda(device),
            Base::Managed => MemoryResource::managed(device),
        };
        let mut mr = match self.allocator {
            Allocator::Direct(b) => base(b)?,
            Allocator::Pool(b, options) => base(b)?.pool(options)?,
            Allocator::Async(options) => MemoryResource::cuda_async_with(device, options)?,
        };
        if self.track_allocations {
            mr = mr.with_tracking()?;
        }
        if let Some(log) = &self.log_file {
            let path = if log.is_dir() { log.join(format!("rmm_log_dev{device}.csv")) } else { log.clone() };
            mr = mr.with_logging(path, false)?;
        }
        if self.statistics {
            mr = mr.with_statistics()?;
        }
        Ok(mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| owned.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn sizes_parse_like_dask_cuda() {
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("500MB"), Some(500_000_000));
        assert_eq!(parse_bytes("1.5 GB"), Some(1_500_000_000));
        assert_eq!(parse_bytes("1073741824"), Some(1 << 30));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(parse_bytes("-1GB"), None);
        assert_eq!(parse_bytes(""), None);
        // Whole numbers exactly, past f64's 2^53 (rounded to 2^53 when every size went through a
        // float), and an overflow refused rather than saturated.
        assert_eq!(parse_bytes("9007199254740993"), Some(9_007_199_254_740_993));
        assert_eq!(parse_bytes("16777217 GiB"), Some(16_777_217 << 30));
        assert_eq!(parse_bytes("18446744073709551615 KiB"), None);
    }

    #[test]
    fn no_variable_means_no_setup() {
        assert_eq!(RmmOptions::from_vars(vars(&[])).unwrap(), None);
    }

    #[test]
    fn variables_describe_a_pool_with_adaptors() {
        let o = RmmOptions::from_vars(vars(&[
            ("RAFT_RMM_POOL_SIZE", "2GiB"),
            ("RAFT_RMM_MAXIMUM_POOL_SIZE", "4GiB"),
            ("RAFT_RMM_MANAGED", "true"),
            ("RAFT_RMM_TRACK_ALLOCATIONS", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.allocator, Allocator::Pool(Base::Managed, PoolOptions::initial(2 << 30).maximum(4 << 30)));
        assert!(o.track_allocations && !o.statistics && o.log_file.is_none());
        let o =
            RmmOptions::from_vars(vars(&[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_POOL_SIZE", "1GiB"), ("RAFT_RMM_RELEASE_THRESHOLD", "2GiB")]))
                .unwrap()
                .unwrap();
        assert_eq!(o.allocator, Allocator::Async(AsyncPoolOptions::initial(1 << 30).release_threshold(2 << 30)));
        let o = RmmOptions::from_vars(vars(&[("RAFT_RMM_MANAGED", "1")])).unwrap().unwrap();
        assert_eq!(o.allocator, Allocator::Direct(Base::Managed));
    }

    /// The fifteenth audit: `1.23GB` is no multiple of 256, which RMM's pool requires; the
    /// setup was dropped with a warning and the device left on `cudaMalloc`. Rounded down, as
    /// dask-cuda does. (Before: 1 230 000 000.)
    #[test]
    fn pool_sizes_are_rounded_down_to_rmm_s_256_bytes() {
        let o = RmmOptions::from_vars(vars(&[("RAFT_RMM_POOL_SIZE", "1.23GB"), ("RAFT_RMM_MAXIMUM_POOL_SIZE", "2000000100")]))
            .unwrap()
            .unwrap();
        assert_eq!(o.allocator, Allocator::Pool(Base::Device, PoolOptions::initial(1_229_999_872).maximum(2_000_000_000)));
    }

    #[test]
    fn a_bad_value_is_a_logic_error_naming_the_variable() {
        let e = RmmOptions::from_vars(vars(&[("RAFT_RMM_POOL_SIZE", "lots")])).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Logic);
        assert!(e.to_string().contains("RAFT_RMM_POOL_SIZE") && e.to_string().contains("\"lots\""), "{e}");
        let e = RmmOptions::from_vars(vars(&[("RAFT_RMM_ASYNC", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("RAFT_RMM_ASYNC"), "{e}");
    }

    /// Issue 34, item 4: what the async pool would have ignored is refused, naming both variables.
    #[test]
    fn contradictory_variables_are_a_logic_error_naming_them() {
        type Case = (&'static [(&'static str, &'static str)], [&'static str; 2]);
        let cases: [Case; 5] = [
            (&[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_POOL", "1")], ["RAFT_RMM_ASYNC", "RAFT_RMM_POOL"]),
            (&[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_MANAGED", "1")], ["RAFT_RMM_ASYNC", "RAFT_RMM_MANAGED"]),
            (&[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_MAXIMUM_POOL_SIZE", "4GiB")], ["RAFT_RMM_ASYNC", "RAFT_RMM_MAXIMUM_POOL_SIZE"]),
            (&[("RAFT_RMM_POOL_SIZE", "1GiB"), ("RAFT_RMM_RELEASE_THRESHOLD", "1GiB")], ["RAFT_RMM_RELEASE_THRESHOLD", "RAFT_RMM_ASYNC"]),
            (&[("RAFT_RMM_MAXIMUM_POOL_SIZE", "4GiB")], ["RAFT_RMM_MAXIMUM_POOL_SIZE", "RAFT_RMM_POOL_SIZE"]),
        ];
        for (set, named) in cases {
            let e = RmmOptions::from_vars(vars(set)).unwrap_err();
            assert_eq!((e.kind(), e.reason()), (crate::ErrorKind::Logic, crate::Reason::InvalidArgument), "{e}");
            assert!(named.iter().all(|n| e.message().contains(n)), "{set:?}: {e}");
        }
    }

    /// The `RAFT_RMM_*` variables, mutated (seeded, 8000 cases: sizes and flags with bytes
    /// flipped, cut, inserted, repeated, units and edge numbers spliced in, variables dropped or
    /// added): `from_vars` never panics, every refusal is `Logic` naming a variable, and every
    /// setup it accepts is one RMM takes (pool sizes in 256-byte multiples, an async pool with no
    /// base or maximum, a maximum only with a pool).
    #[test]
    #[cfg_attr(miri, ignore = "thousands of cases of string handling: Miri adds nothing")]
    fn mutated_rmm_variables_never_panic_and_accepted_setups_are_rmms() {
        const NAMES: [&str; 9] = [
            "RAFT_RMM_POOL_SIZE",
            "RAFT_RMM_MAXIMUM_POOL_SIZE",
            "RAFT_RMM_RELEASE_THRESHOLD",
            "RAFT_RMM_POOL",
            "RAFT_RMM_MANAGED",
            "RAFT_RMM_ASYNC",
            "RAFT_RMM_TRACK_ALLOCATIONS",
            "RAFT_RMM_STATISTICS",
            "RAFT_RMM_LOG_DIRECTORY",
        ];
        const PIECES: [&str; 22] = [
            "0",
            "1",
            "-1",
            ".",
            "1.5",
            "1e3",
            "NaN",
            "inf",
            " ",
            "GiB",
            "gb",
            "K",
            "t",
            "TiB",
            "b",
            "18446744073709551615",
            "18446744073709551616",
            "9007199254740993",
            "0.000001",
            "true",
            "off",
            "\u{e9}",
        ];
        let seeds: [&[(&str, &str)]; 4] = [
            &[("RAFT_RMM_POOL_SIZE", "2GiB"), ("RAFT_RMM_MAXIMUM_POOL_SIZE", "4GiB"), ("RAFT_RMM_MANAGED", "true")],
            &[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_POOL_SIZE", "1.23GB"), ("RAFT_RMM_RELEASE_THRESHOLD", "512 MB")],
            &[("RAFT_RMM_POOL", "yes"), ("RAFT_RMM_STATISTICS", "on"), ("RAFT_RMM_LOG_DIRECTORY", "/tmp/logs")],
            &[("RAFT_RMM_TRACK_ALLOCATIONS", "1"), ("RAFT_RMM_POOL_SIZE", "1073741824")],
        ];
        let mut state = 0x5eed_0111_0000_0005u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d) as usize
        };
        let (mut accepted, mut refused) = (0, 0);
        for case in 0..8000 {
            let mut set: Vec<(String, String)> = seeds[next() % seeds.len()].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            for _ in 0..1 + next() % 3 {
                let n = set.len();
                match next() % 5 {
                    0 | 1 if n > 0 => {
                        let mut b = std::mem::take(&mut set[next() % n].1).into_bytes();
                        let at = next() % (b.len() + 1);
                        match next() % 4 {
                            0 if at < b.len() => b[at] ^= (next() as u8).max(1),
                            1 => b.truncate(at),
                            2 => {
                                let piece = PIECES[next() % PIECES.len()].as_bytes();
                                b.splice(at..at, piece.iter().copied());
                            }
                            _ => {
                                let copy = b[at..].to_vec();
                                b.extend_from_slice(&copy);
                            }
                        }
                        let i = next() % n;
                        set[i].1 = String::from_utf8_lossy(&b).into_owned();
                    }
                    2 if n > 0 => {
                        set.remove(next() % n);
                    }
                    _ => {
                        let name = NAMES[next() % NAMES.len()];
                        set.retain(|(k, _)| k != name);
                        set.push((name.to_string(), PIECES[next() % PIECES.len()].to_string()));
                    }
                }
            }
            let lookup = |name: &str| set.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            match RmmOptions::from_vars(lookup) {
                Ok(None) => assert!(set.iter().all(|(_, v)| v.trim().is_empty()), "case {case}: {set:?} read as no setup"),
                Ok(Some(o)) => {
                    accepted += 1;
                    match o.allocator {
                        Allocator::Pool(_, p) => {
                            assert!(p.initial.is_none_or(|b| b % 256 == 0) && p.maximum.is_none_or(|b| b % 256 == 0), "case {case}: {o:?}")
                        }
                        Allocator::Async(_) => {
                            assert!(lookup("RAFT_RMM_MAXIMUM_POOL_SIZE").is_none_or(|v| v.trim().is_empty()), "case {case}")
                        }
                        Allocator::Direct(_) => assert!(
                            ["RAFT_RMM_MAXIMUM_POOL_SIZE", "RAFT_RMM_RELEASE_THRESHOLD"]
                                .iter()
                                .all(|n| lookup(n).is_none_or(|v| v.trim().is_empty())),
                            "case {case}: {set:?} gave {o:?}"
                        ),
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert_eq!(e.kind(), crate::ErrorKind::Logic, "case {case}: {e}");
                    assert!(NAMES.iter().any(|n| e.message().contains(n)), "case {case}: {e}");
                }
            }
        }
        assert!(accepted > 1000 && refused > 1000, "{accepted} accepted, {refused} refused");
    }

    /// What the environment says is read as it is said: a size, flag or watch that is not UTF-8
    /// is refused by name, and a log directory that is not is taken as its bytes. Each was
    /// taken for unset (`std::env::var(..).ok()`): a pool size, the log, a spin setting
    /// dropped in silence (helper 111). Child processes: each setting is read once per process.
    #[test]
    #[cfg_attr(miri, ignore = "spawns a process")]
    fn settings_that_are_not_utf8_are_refused_or_taken_as_bytes_never_dropped() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        const CHILD: &str = "RAFT_CORE_TEST_SETTINGS_BYTES_CHILD";
        const NAME: &str = "memory::options::tests::settings_that_are_not_utf8_are_refused_or_taken_as_bytes_never_dropped";
        if std::env::var_os(CHILD).is_some() {
            match RmmOptions::from_env() {
                Ok(Some(o)) => println!("RMM LOG {:?}", o.log_file.map(|p| p.into_os_string().into_vec())),
                Ok(None) => println!("RMM NONE"),
                Err(e) => println!("RMM REFUSED {e}"),
            }
            match crate::result::crew::watch_time("staging") {
                Ok(w) => println!("STAGING TAKEN {w:?}"),
                Err(e) => println!("STAGING REFUSED {e}"),
            }
            match crate::job::watch_time("worker") {
                Ok(w) => println!("WORKER TAKEN {w:?}"),
                Err(e) => println!("WORKER REFUSED {e}"),
            }
            return;
        }
        let run = |vars: &[(&str, &[u8])]| {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", NAME, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
            for (k, v) in vars {
                cmd.env(k, std::ffi::OsStr::from_bytes(v));
            }
            String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
        };
        let out = run(&[("RAFT_RMM_POOL_SIZE", b"8G\xff"), ("RAFT_STAGING_SPIN_US", b"5\xff"), ("RAFT_WORKER_SPIN_US", b"\xff")]);
        assert!(out.contains("RMM REFUSED RmmOptions::from_env: RAFT_RMM_POOL_SIZE"), "{out}");
        assert!(out.contains("STAGING REFUSED staging: RAFT_STAGING_SPIN_US"), "{out}");
        assert!(out.contains("WORKER REFUSED worker: RAFT_WORKER_SPIN_US"), "{out}");
        let dir = b"/tmp/rmm-logs-caf\xe9";
        let out = run(&[("RAFT_RMM_LOG_DIRECTORY", dir)]);
        assert!(out.contains(&format!("RMM LOG {:?}", Some(dir.to_vec()))), "{out}");
    }
}
