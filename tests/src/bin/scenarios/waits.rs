//! Audit finding 4b: jobs of two resources waiting for each other through releases and joins.
//! Each scenario prints `RESULT` lines; the parent kills it if it hangs (the deadlock of old).
use raft::{DeviceResources, JobHandle};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

fn two() -> (DeviceResources, DeviceResources) {
    (DeviceResources::new().expect("resources"), DeviceResources::new().expect("resources"))
}

/// A job of `a` releases `b` while a job of `b` releases `a`, both at once.
pub fn jobs_release_each_other() {
    let (a, b) = two();
    let start = Instant::now();
    let barrier = Arc::new(Barrier::new(2));
    let (ja, jb) = {
        let (bar, victim) = (barrier.clone(), b.clone());
        let ja = a.spawn(move || {
            bar.wait();
            victim.release()
        });
        let (bar, victim) = (barrier, a.clone());
        let jb = b.spawn(move || {
            bar.wait();
            victim.release()
        });
        (ja.expect("spawn on a"), jb.expect("spawn on b"))
    };
    let ra = ja.join().expect("job on a ran");
    let rb = jb.join().expect("job on b ran");
    println!("RESULT release_a={} release_b={}", ra.is_ok(), rb.is_ok());
    // A release handed to the worker is finished by it: a later release waits for that.
    a.release().expect("second release of a");
    b.release().expect("second release of b");
    println!("RESULT released_a={} released_b={} ms={}", a.is_released(), b.is_released(), start.elapsed().as_millis());
}

fn describe<T: std::fmt::Debug>(r: raft::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok:{v:?}"),
        Err(e) => format!("{:?}:{e}", e.kind()),
    }
}

/// A job of `a` joins a job of `b` which joins that very job of `a`: whichever joins second is
/// refused (`Logic`), so its job ends and the first join returns.
pub fn jobs_join_each_other() {
    let (a, b) = two();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (to_a, for_a) = mpsc::channel::<JobHandle<()>>();
    let (to_b, for_b) = mpsc::channel::<JobHandle<()>>();
    let out = out_tx.clone();
    let ja = a
        .spawn(move || {
            let other = for_a.recv().expect("b's job");
            out.send(format!("a={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on a");
    let jb = b
        .spawn(move || {
            let other = for_b.recv().expect("a's job");
            out_tx.send(format!("b={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on b");
    to_a.send(jb).expect("send");
    to_b.send(ja).expect("send");
    report_two(&out_rx);
}

/// A job of `a` releases `b` while a job of `b` joins a job of `a`.
pub fn release_and_join_cross() {
    let (a, b) = two();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (to_b, for_b) = mpsc::channel::<JobHandle<()>>();
    let barrier = Arc::new(Barrier::new(2));
    let (bar, victim, out) = (barrier.clone(), b.clone(), out_tx.clone());
    let ja = a
        .spawn(move || {
            bar.wait();
            out.send(format!("a={}", describe(victim.release()))).expect("send");
        })
        .expect("spawn on a");
    let _jb = b
        .spawn(move || {
            let other = for_b.recv().expect("a's job");
            barrier.wait();
            out_tx.send(format!("b={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on b");
    to_b.send(ja).expect("send");
    report_two(&out_rx);
    b.release().expect("b's release ends");
    println!("RESULT b_released={}", b.is_released());
}

fn report_two(out_rx: &mpsc::Receiver<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match out_rx.recv_timeout(left) {
            Ok(s) => seen.push(s.replace(' ', "_")),
            Err(_) => {
                println!("RESULT outcome=timeout seen={}", seen.join(","));
                return;
            }
        }
    }
    seen.sort();
    println!("RESULT outcome=done");
    for s in seen {
        println!("RESULT {s}");
    }
}
