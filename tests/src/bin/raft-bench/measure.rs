//! How raft-bench times a case: samples of batched calls, or several functions measured in turns
//! so that drifts of the machine reach all sides alike; and how a time is printed.
use std::time::Instant;

#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Stat {
    pub median_ns: f64,
    pub min_ns: f64,
    pub max_ns: f64,
    pub samples: usize,
}

/// Times `f` `batch` times per sample, `samples` samples after `warmup` calls.
pub fn measure(warmup: usize, samples: usize, batch: usize, mut f: impl FnMut()) -> Stat {
    for _ in 0..warmup {
        f();
    }
    let mut per: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    Stat { median_ns: per[per.len() / 2], min_ns: per[0], max_ns: per[per.len() - 1], samples }
}

/// Several functions measured in turns of `TURN` (50) calls each (every call timed), so that
/// drifts of the machine (clock, other tenants) reach all of them alike, while each runs warm
/// within its turn as a loop would (run 65 alternated single calls: that cools each one's
/// caches for the other's and read pool allocations 1.43x where loops read 1.13x).
pub fn measure_turns<const N: usize>(warmup: usize, samples: usize, mut fs: [&mut dyn FnMut(); N]) -> [Stat; N] {
    const TURN: usize = 50;
    for f in fs.iter_mut() {
        for _ in 0..warmup {
            f();
        }
    }
    let mut per: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(samples));
    for _ in 0..samples.div_ceil(TURN) {
        for (f, v) in fs.iter_mut().zip(per.iter_mut()) {
            for _ in 0..TURN {
                let t = Instant::now();
                f();
                v.push(t.elapsed().as_nanos() as f64);
            }
        }
    }
    per.map(stat_of)
}

pub fn stat_of(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat { median_ns: v[v.len() / 2], min_ns: v[0], max_ns: v[v.len() - 1], samples: v.len() }
}

pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

pub fn show(s: &Stat) -> String {
    format!("{} [{}, {}]", fmt_ns(s.median_ns), fmt_ns(s.min_ns), fmt_ns(s.max_ns))
}
