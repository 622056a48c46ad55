//! Helpers of raft-cuvs's integration tests: GPU gating (cuVS loaded first), a seeded PRNG, the
//! exact k-NN answer on the CPU, and child processes (the test binary re-run with an env var).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Loads cuVS before anything touches raft (what a program using cuVS should do, for the order
/// of static destructors at exit; the nvJitLink order no longer needs it); every test calls it
/// first.
pub fn load_cuvs() -> &'static Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(|| raft_cuvs::load().map(drop).map_err(|e| e.to_string()))
}

/// Whether a GPU and cuVS are there. Without either, prints a visible skip line (straight to
/// stderr, past the harness's capture) and returns false. `RAFT_REQUIRE_GPU=1` makes a missing
/// GPU a failure, `RAFT_REQUIRE_CUVS=1` a missing cuVS (apart, so that GPU runs of the rest of
/// the workspace, which do not carry cuVS's 260 MiB, skip these tests visibly).
pub fn gpu() -> bool {
    let loaded = load_cuvs();
    let required = |var: &str| std::env::var(var).as_deref() == Ok("1");
    let reason = match (raft_core::device_count(), loaded) {
        (Ok(n), Ok(())) if n > 0 => return true,
        (Ok(n), Err(e)) if n > 0 => {
            if required("RAFT_REQUIRE_CUVS") {
                panic!("RAFT_REQUIRE_CUVS=1 but cuVS could not be loaded: {e}");
            }
            format!("cuVS could not be loaded: {e}")
        }
        (Ok(_), _) => {
            assert!(!required("RAFT_REQUIRE_GPU"), "RAFT_REQUIRE_GPU=1 but there is no CUDA device");
            "no CUDA device".to_string()
        }
        (Err(e), _) => {
            assert!(!required("RAFT_REQUIRE_GPU"), "RAFT_REQUIRE_GPU=1 but no GPU is usable: {e}");
            e.to_string()
        }
    };
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
    false
}

/// Returns from the test when there is no GPU or no cuVS (see [`gpu`]).
macro_rules! require_gpu {
    () => {
        if !crate::common::gpu() {
            return;
        }
    };
}

/// SplitMix64: a tiny, seeded, reproducible generator (no dependency).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.uniform() as f64).max(1e-12);
        let u2 = self.uniform() as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    pub fn uniform_vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// The exact `k` nearest rows (squared L2, in f64) of each query, nearest first: (ids,
/// distances) per query. Spread over the CPU's threads.
pub fn exact_knn(dataset: &[f32], dim: usize, queries: &[f32], k: usize) -> Vec<(Vec<usize>, Vec<f64>)> {
    let n_queries = queries.len() / dim;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4).min(n_queries.max(1));
    let per = n_queries.div_ceil(threads);
    let mut out = vec![(Vec::new(), Vec::new()); n_queries];
    std::thread::scope(|s| {
        for (chunk_no, chunk) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, slot) in chunk.iter_mut().enumerate() {
                    let q = &queries[(chunk_no * per + i) * dim..][..dim];
                    let mut all: Vec<(f64, usize)> = dataset
                        .chunks_exact(dim)
                        .enumerate()
                        .map(|(row, x)| (x.iter().zip(q).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum(), row))
                        .collect();
                    all.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
                    all.truncate(k);
                    all.sort_by(|a, b| a.0.total_cmp(&b.0));
                    *slot = (all.iter().map(|p| p.1).collect(), all.iter().map(|p| p.0).collect());
                }
            });
        }
    });
    out
}

/// Squared L2 distance of two rows, in f64.
pub fn l2(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum()
}

/// The scenario this process runs as a child (`RAFT_CUVS_CHILD`), if any.
pub fn child_scenario() -> Option<String> {
    std::env::var("RAFT_CUVS_CHILD").ok().filter(|s| !s.is_empty())
}

/// What a child did.
#[derive(Debug)]
pub struct Child {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Wall-clock ms since the epoch when the parent saw it end.
    pub ended_ms: u128,
    pub stdout: String,
    pub stderr: String,
}

impl Child {
    /// The value of `key` in the child's `RESULT key=value ...` lines.
    pub fn result(&self, key: &str) -> Option<String> {
        self.stdout
            .lines()
            // libtest's "test name ... " may precede the child's first line.
            .filter_map(|l| l.find("RESULT ").map(|i| &l[i + "RESULT ".len()..]))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }

    /// The text after `MESSAGE key=` (one line).
    pub fn message(&self, key: &str) -> Option<String> {
        let prefix = format!("MESSAGE {key}=");
        self.stdout.lines().find_map(|l| l.find(&prefix).map(|i| l[i + prefix.len()..].to_string()))
    }

    pub fn assert_code(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "child ended with {:?} / signal {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.signal,
            self.stdout,
            self.stderr
        );
    }
}

/// Re-runs this test binary for the one test `test` (`concat!(module_path!(), "::name")`) with `RAFT_CUVS_CHILD=scenario` and `envs`
/// (`None` removes a variable), killing it after `limit`.
pub fn rerun(test: &str, scenario: &str, envs: &[(&str, Option<&str>)], limit: Duration) -> Child {
    use std::os::unix::process::ExitStatusExt;
    // `module_path!()` of a test module starts with the crate's name, which libtest's names omit.
    let test = test.split_once("::").map_or(test, |(_, rest)| rest);
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]).env("RAFT_CUVS_CHILD", scenario);
    for (k, v) in envs {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn the test binary");
    // Drain the pipes meanwhile: a chatty child must not block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "child {test}/{scenario} hung past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                out_reader.join().unwrap_or_default(),
                err_reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Child {
        code: status.code(),
        signal: status.signal(),
        ended_ms: now_ms(),
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Wall-clock milliseconds since the epoch.
pub fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// A logger for children: every record of target `raft` to stderr (the exit hook's lines).
pub struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("raft")
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let _ = writeln!(std::io::stderr(), "{} {}: {}", r.level(), r.target(), r.args());
        }
    }

    fn flush(&self) {}
}

pub fn install_logger() {
    static LOGGER: StderrLogger = StderrLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// Prints one call's outcome for the parent: `RESULT key=<kind|ok>` and `MESSAGE key=<error>`.
pub fn report<T>(key: &str, outcome: &raft_core::Result<T>) {
    match outcome {
        Ok(_) => println!("RESULT {key}=ok"),
        Err(e) => {
            println!("RESULT {key}={} {key}_who={} {key}_reason={}", e.kind(), e.who(), e.reason());
            println!("MESSAGE {key}={}", e.to_string().replace('\n', " "));
        }
    }
}

/// Ends the capture begun on `stream` (on this thread), and says whether the driver ended it
/// (an invalidated capture does not) and how many nodes its graph held, destroyed here.
pub fn end_capture_counting_nodes(stream: &cudarc::driver::CudaStream) -> (Result<(), cudarc::driver::DriverError>, usize) {
    use cudarc::driver::sys;
    stream.context().bind_to_thread().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun on the same stream; the graph comes back owned.
    let ended = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.result();
    let mut nodes = 0usize;
    if !graph.is_null() {
        // SAFETY: `graph` is the captured graph, destroyed once after its nodes are counted.
        unsafe {
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes).result().unwrap();
            sys::cuGraphDestroy(graph).result().unwrap();
        }
    }
    (ended, nodes)
}
