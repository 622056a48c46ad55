//! An exit while a cuVS search runs as a job (`DeviceResources::spawn`) follows raft-rs's exit
//! rule (GPU; skips without one or without cuVS, fails under `RAFT_REQUIRE_GPU=1`): a job that
//! ends within its exit wait is waited for and the teardown runs; one that outlives it is left
//! running, the teardown is skipped (nothing destroyed under cuVS's kernels) and the process
//! ends with its own status at about the bound, with no crash. Each case is this test binary
//! re-run as a child (`RAFT_CUVS_CHILD`), judged by its status, timing and log.
use crate::common::{child_scenario, install_logger, now_ms, rerun, Child, Rng};
use raft_core::{DeviceMatrix, DeviceResources, Layout};
use std::time::{Duration, Instant};

const TEST: &str = concat!(module_path!(), "::an_exit_while_a_cuvs_search_runs_as_a_job_follows_the_exit_rule");
const N_ROWS: usize = 20_000;
const DIM: usize = 64;
const N_QUERIES: usize = 256;

/// The child: a job on the resources' worker searches with cuVS, over and over, for
/// `SCENARIO_JOB_SECS`; the test function (and so `main`) returns at once.
fn searching_job_then_return() {
    install_logger();
    crate::common::load_cuvs().as_ref().expect("cuVS");
    let secs: f64 = std::env::var("SCENARIO_JOB_SECS").unwrap().parse().unwrap();
    let res = DeviceResources::new().unwrap();
    let mut rng = Rng::new(0x5eed_0005);
    let d = DeviceMatrix::from_host(&res, &rng.uniform_vec(N_ROWS * DIM), N_ROWS, DIM, Layout::RowMajor).unwrap();
    let q = DeviceMatrix::from_host(&res, &rng.uniform_vec(N_QUERIES * DIM), N_QUERIES, DIM, Layout::RowMajor).unwrap();
    // One search before the job: cuBLAS's handle and cuVS's kernels are loaded, so the job's
    // searches start at once.
    raft_cuvs::brute_force_knn(&res, d.view(), q.view(), 10).unwrap();
    res.sync().unwrap();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let job = res
        .spawn({
            let res = res.clone();
            move || {
                let mut searches = 0u64;
                while Instant::now() < until {
                    let ids = raft_cuvs::brute_force_knn(&res, d.view(), q.view(), 10).expect("search").neighbors;
                    ids.to_host().expect("results"); // waits for the search
                    searches += 1;
                }
                println!("RESULT job=finished searches={searches} job_end_ms={}", now_ms());
            }
        })
        .unwrap();
    drop(job); // not joined: the exit decides
    println!("RESULT returning_ms={}", now_ms());
}

fn scenario(wait: &str, job_secs: &str) -> Child {
    rerun(
        TEST,
        "searching-job",
        &[("RAFT_EXIT_WAIT", Some(wait)), ("SCENARIO_JOB_SECS", Some(job_secs)), ("RAFT_CUVS_LIB_PATH", None)],
        Duration::from_secs(120),
    )
}

/// Seconds from the child's return to the end of its process.
fn exit_secs(c: &Child) -> f64 {
    let returned: u128 = c.result("returning_ms").expect("the child returned").parse().unwrap();
    (c.ended_ms.saturating_sub(returned)) as f64 / 1000.0
}

#[test]
fn an_exit_while_a_cuvs_search_runs_as_a_job_follows_the_exit_rule() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "searching-job");
        return searching_job_then_return();
    }
    require_gpu!();

    // Within its bound: waited for, every search finished, then the teardown.
    let c = scenario("30", "1.5");
    c.assert_code(0);
    assert_eq!(c.result("job").as_deref(), Some("finished"), "{}\n{}", c.stdout, c.stderr);
    assert!(c.result("searches").unwrap().parse::<u64>().unwrap() > 0);
    assert!(c.stderr.contains("exit: jobs in flight: job"), "{}", c.stderr);
    assert!(c.stderr.contains("tearing down"), "{}", c.stderr);
    assert!(!c.stderr.contains("WARN"), "{}", c.stderr);
    let job_end: u128 = c.result("job_end_ms").unwrap().parse().unwrap();
    assert!(job_end <= c.ended_ms, "the process ended before its job");
    assert!(exit_secs(&c) < 20.0, "exit took {:.2} s", exit_secs(&c));

    // Past its bound: left running inside cuVS, teardown skipped, the process ends at about
    // the bound with its own status (no signal, no crash in the static destructors).
    let c = scenario("0.5", "30");
    c.assert_code(0);
    assert_eq!(c.signal, None);
    assert!(c.result("job").is_none(), "the job cannot have finished: {}", c.stdout);
    assert!(c.stderr.contains("teardown skipped"), "{}", c.stderr);
    assert!(c.stderr.contains("jobs still running: job"), "{}", c.stderr);
    let secs = exit_secs(&c);
    assert!((0.4..5.0).contains(&secs), "exit took {secs:.2} s for a 0.5 s bound");
}
