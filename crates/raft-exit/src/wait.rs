//! The exit wait: how long the exit hook may wait for a job, read when the job is made.
//!
//! A process default (10 s, or `RAFT_EXIT_WAIT`) and a scoped override for the calling
//! thread's dynamic extent, carried into threads started through [`spawn_thread`].
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The default when `RAFT_EXIT_WAIT` is not set.
pub const DEFAULT_EXIT_WAIT: f64 = 10.0;

/// An exit wait that is not a non-negative number of seconds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{who}: expected a non-negative real number of seconds, given {given}")]
pub struct InvalidExitWait {
    /// The API that refused the value.
    pub who: &'static str,
    /// What it was given, as text (`-1`, `NaN`, or the raw environment value).
    pub given: String,
}

/// A refused exit wait is a `Logic` error of the API that refused it (`with_exit_wait: expected
/// a non-negative real number of seconds, given -1`).
impl From<InvalidExitWait> for raft_error::Error {
    fn from(e: InvalidExitWait) -> Self {
        raft_error::Error::logic(e.who, format!("expected a non-negative real number of seconds, given {}", e.given))
    }
}

/// An exit wait as given: seconds (the seed's real number, `f64::INFINITY` for "as long as it
/// takes") or a [`Duration`]. [`with_exit_wait`] and [`set_default_exit_wait`] take either:
/// `with_exit_wait(2.5, …)` and `with_exit_wait(Duration::from_millis(2500), …)` are the same.
/// A number of seconds is checked where it is used (negative and NaN are refused, with the
/// seed's text); a `Duration` is always valid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExitWait(f64);

impl ExitWait {
    /// No bound: the exit waits for the job as long as it runs.
    pub const FOREVER: ExitWait = ExitWait(f64::INFINITY);

    /// The wait in seconds, as given.
    pub fn seconds(self) -> f64 {
        self.0
    }

    /// The wait as a `Duration`; `None` for [`FOREVER`](Self::FOREVER) and for a value that is
    /// not a valid wait (negative, NaN) or does not fit.
    pub fn duration(self) -> Option<Duration> {
        Duration::try_from_secs_f64(self.0).ok()
    }
}

impl From<f64> for ExitWait {
    fn from(seconds: f64) -> Self {
        ExitWait(seconds)
    }
}

impl From<Duration> for ExitWait {
    fn from(wait: Duration) -> Self {
        ExitWait(wait.as_secs_f64())
    }
}

/// Checks a wait in seconds: finite or `+inf`, never negative or NaN.
pub fn validate(who: &'static str, seconds: f64) -> Result<f64, InvalidExitWait> {
    if seconds.is_nan() || seconds < 0.0 {
        Err(InvalidExitWait { who, given: format!("{seconds}") })
    } else {
        Ok(seconds)
    }
}

/// Bits of the process default set by [`set_default_exit_wait`]; `u64::MAX` (a NaN pattern
/// never stored) means "not set: use the environment".
static DEFAULT_BITS: AtomicU64 = AtomicU64::new(u64::MAX);
static FROM_ENV: OnceLock<Result<f64, InvalidExitWait>> = OnceLock::new();

thread_local! {
    /// The calling thread's override, if inside [`with_exit_wait`] (const: no destructor, so it
    /// stays readable while the thread exits).
    static OVERRIDE: Cell<Option<f64>> = const { Cell::new(None) };
}

fn from_env() -> Result<f64, InvalidExitWait> {
    FROM_ENV
        // Read lossily: a value that is not UTF-8 is refused like any other bad value, never
        // taken for unset (`std::env::var`'s error did, and the 10 s default ran in silence).
        .get_or_init(|| match std::env::var_os("RAFT_EXIT_WAIT").map(|v| v.to_string_lossy().into_owned()) {
            None => Ok(DEFAULT_EXIT_WAIT),
            Some(text) => match text.trim().parse::<f64>() {
                Ok(v) => validate("RAFT_EXIT_WAIT", v),
                Err(_) => Err(InvalidExitWait { who: "RAFT_EXIT_WAIT", given: text }),
            },
        })
        .clone()
}

/// The process default: the last [`set_default_exit_wait`], else `RAFT_EXIT_WAIT`, else 10 s.
/// A bad `RAFT_EXIT_WAIT` is an error here, at first use, not a silent default.
pub fn default_exit_wait() -> Result<f64, InvalidExitWait> {
    let bits = DEFAULT_BITS.load(Ordering::Relaxed);
    if bits == u64::MAX {
        from_env()
    } else {
        Ok(f64::from_bits(bits))
    }
}

/// Sets the process default (the seed's `(current-exit-wait 5)` outside any `parameterize`), in
/// seconds or as a [`Duration`] (see [`ExitWait`]).
pub fn set_default_exit_wait(wait: impl Into<ExitWait>) -> Result<(), InvalidExitWait> {
    let seconds = validate("set_default_exit_wait", wait.into().seconds())?;
    DEFAULT_BITS.store(seconds.to_bits(), Ordering::Relaxed);
    Ok(())
}

/// The wait in force on the calling thread: its override, else the process default.
pub fn current_exit_wait() -> Result<f64, InvalidExitWait> {
    match OVERRIDE.try_with(Cell::get).ok().flatten() {
        Some(v) => Ok(v),
        None => default_exit_wait(),
    }
}

/// Runs `body` with the exit wait set to `seconds` on this thread (the seed's `parameterize`):
/// jobs made in `body`, and in threads started there through [`spawn_thread`], read it.
/// The previous value comes back when `body` returns or panics. The wait is seconds or a
/// [`Duration`] (see [`ExitWait`]).
pub fn with_exit_wait<R>(wait: impl Into<ExitWait>, body: impl FnOnce() -> R) -> Result<R, InvalidExitWait> {
    let seconds = validate("with_exit_wait", wait.into().seconds())?;
    struct Restore(Option<f64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = OVERRIDE.try_with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDE.try_with(|o| o.replace(Some(seconds))).ok().flatten());
    Ok(body())
}

/// `std::thread::spawn` that carries the caller's exit-wait override into the new thread, as a
/// Racket thread inherits its parameterization.
pub fn spawn_thread<F, T>(f: F) -> std::thread::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let inherited = OVERRIDE.try_with(Cell::get).ok().flatten();
    std::thread::spawn(move || {
        let _ = OVERRIDE.try_with(|o| o.set(inherited));
        f()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_negative_and_nan_with_the_seed_text() {
        assert_eq!(
            with_exit_wait(-1.0, || ()).unwrap_err().to_string(),
            "with_exit_wait: expected a non-negative real number of seconds, given -1"
        );
        assert_eq!(
            set_default_exit_wait(f64::NAN).unwrap_err().to_string(),
            "set_default_exit_wait: expected a non-negative real number of seconds, given NaN"
        );
    }

    #[test]
    fn override_is_scoped_and_inherited_by_spawn_thread() {
        let outside = current_exit_wait().unwrap();
        let (inner, child) = with_exit_wait(f64::INFINITY, || {
            let child = spawn_thread(current_exit_wait).join().unwrap().unwrap();
            (current_exit_wait().unwrap(), child)
        })
        .unwrap();
        assert_eq!(inner, f64::INFINITY);
        assert_eq!(child, f64::INFINITY);
        assert_eq!(current_exit_wait().unwrap(), outside);
        // A plain std thread does not inherit it.
        let plain = with_exit_wait(3.0, || std::thread::spawn(current_exit_wait).join().unwrap().unwrap()).unwrap();
        assert_eq!(plain, outside);
    }

    #[test]
    fn a_duration_is_the_same_wait_as_its_seconds() {
        let by_duration = with_exit_wait(Duration::from_millis(2500), current_exit_wait).unwrap().unwrap();
        assert_eq!(by_duration, 2.5);
        assert_eq!(with_exit_wait(Duration::ZERO, current_exit_wait).unwrap().unwrap(), 0.0);
        assert_eq!(with_exit_wait(ExitWait::FOREVER, current_exit_wait).unwrap().unwrap(), f64::INFINITY);
        assert_eq!(ExitWait::from(Duration::from_secs(3)).duration(), Some(Duration::from_secs(3)));
        assert_eq!((ExitWait::FOREVER.duration(), ExitWait::from(-1.0).duration()), (None, None));
        // Seconds keep the seed's checks and text, also through ExitWait.
        assert_eq!(
            with_exit_wait(ExitWait::from(f64::NAN), || ()).unwrap_err().to_string(),
            "with_exit_wait: expected a non-negative real number of seconds, given NaN"
        );
    }

    /// `RAFT_EXIT_WAIT` is refused at first use when it is no wait, also when it is not UTF-8
    /// (it was taken for unset: the default 10 s in silence, helper 111). A child process, since
    /// the variable is read once per process.
    #[test]
    #[cfg_attr(miri, ignore = "spawns a process")]
    fn an_exit_wait_that_is_not_text_is_refused_not_taken_for_unset() {
        use std::os::unix::ffi::OsStrExt;
        const CHILD: &str = "RAFT_EXIT_TEST_WAIT_BYTES_CHILD";
        if std::env::var_os(CHILD).is_some() {
            match default_exit_wait() {
                Ok(w) => println!("WAIT TAKEN {w}"),
                Err(e) => println!("WAIT REFUSED {e}"),
            }
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "wait::tests::an_exit_wait_that_is_not_text_is_refused_not_taken_for_unset",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("RAFT_EXIT_WAIT", std::ffi::OsStr::from_bytes(b"3\xff"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("WAIT REFUSED RAFT_EXIT_WAIT: "), "{stdout}");
    }

    #[test]
    fn override_survives_a_panic_in_the_body() {
        let before = current_exit_wait().unwrap();
        let r = std::panic::catch_unwind(|| with_exit_wait(2.5, || panic!("body failed")));
        assert!(r.is_err());
        assert_eq!(current_exit_wait().unwrap(), before);
    }
}
