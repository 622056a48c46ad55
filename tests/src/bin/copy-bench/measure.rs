//! How copy-bench times a copy (repeats of one whole copy, or two paths in turns), how many
//! repeats a size gets, and the sizes' names and data.
use std::time::Instant;

pub const MIB: usize = 1 << 20;

#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Stat {
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    pub repeats: usize,
}

impl Stat {
    pub fn gbps(&self, bytes: usize) -> f64 {
        bytes as f64 / self.median_s / 1e9
    }
}

/// Times `f` `repeats` times after `warmup` calls.
pub fn measure(warmup: usize, repeats: usize, mut f: impl FnMut()) -> Stat {
    for _ in 0..warmup {
        f();
    }
    let mut t: Vec<f64> = (0..repeats)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    Stat { median_s: t[t.len() / 2], min_s: t[0], max_s: t[t.len() - 1], repeats }
}

/// `a` and `b` measured in turns, a sample of each per round, so both see the same host and
/// device state (a host whose speed drifts between two separate loops moved 1 MiB ratios by
/// ±10% between runs 54 and 58).
pub fn measure_alternating(warmup: usize, repeats: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Stat, Stat) {
    for _ in 0..warmup {
        a();
        b();
    }
    let (mut ta, mut tb) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    for _ in 0..repeats {
        let s = Instant::now();
        a();
        ta.push(s.elapsed().as_secs_f64());
        let s = Instant::now();
        b();
        tb.push(s.elapsed().as_secs_f64());
    }
    let stat = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        Stat { median_s: t[t.len() / 2], min_s: t[0], max_s: t[t.len() - 1], repeats }
    };
    (stat(ta), stat(tb))
}

pub fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

pub fn reps(bytes: usize, quick: bool) -> (usize, usize) {
    let (w, r) = if bytes <= MIB {
        (10, 101)
    } else if bytes <= 64 * MIB {
        (3, 21)
    } else {
        (1, 7)
    };
    // A 1 MiB copy takes microseconds: the quick run keeps all its samples there.
    if quick && bytes > MIB {
        (1, r.min(5))
    } else {
        (w, r)
    }
}

pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_shr(24) as u8).collect()
}
