//! Seed 2.2.5 "Exiting while jobs run": each scenario re-runs in a fresh process and is judged
//! by its exit status, signal, wall time and log lines. The CPU variants run everywhere (the
//! registry and hook are generic); the GPU variants run real resources and GPU work in the jobs.
use raft_tests::{gpu, run_scenario, Child};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn variants() -> Vec<&'static str> {
    // Without a GPU only the CPU variant runs (gpu() prints the skip or, under
    // RAFT_REQUIRE_GPU=1, fails).
    if gpu() {
        vec!["0", "1"]
    } else {
        vec!["0"]
    }
}

fn scenario(name: &str, gpu: &str, wait: &str, job_secs: &str) -> Child {
    run_scenario!(name, &[("SCENARIO_GPU", gpu), ("SCENARIO_WAIT", wait), ("SCENARIO_JOB_SECS", job_secs)], LIMIT)
}

fn secs(c: &Child) -> f64 {
    c.elapsed.as_secs_f64()
}

/// The eighteenth audit (helper 82): the child of a `fork()` inherited the exit hook and the
/// parent's jobs, which never end there; its `exit` waited out their bound (for ever here).
/// Now the child is marked at the fork: its exit ends at once, and a library call there is
/// refused (`Cuda`, GPU variant) rather than made with CUDA's state copied from the parent.
#[test]
fn the_child_of_a_fork_exits_at_once_and_is_refused_the_library() {
    for g in variants() {
        let c = scenario("fork-then-exit", g, "inf", "7");
        c.assert_code(0);
        assert_eq!(c.result("child_ended").as_deref(), Some("true"), "gpu={g}: the child hung in its exit: {}", c.stdout);
        let took: u64 = c.result("child_ms").and_then(|v| v.parse().ok()).expect("child_ms");
        assert!(took < 2000, "gpu={g}: the child took {took} ms to exit");
        assert_eq!(c.result("child_status").as_deref(), Some("0"), "gpu={g}: {}", c.stdout);
        let asked = if g == "1" { "refused" } else { "not-asked" };
        assert_eq!(c.result("child_new").as_deref(), Some(asked), "gpu={g}: {}", c.stdout);
    }
}

#[test]
fn a_job_ending_within_its_bound_is_waited_for_and_torn_down() {
    for g in variants() {
        let c = scenario("job-then-return", g, "10", "0.7");
        c.assert_code(0);
        assert_eq!(c.result("job").as_deref(), Some("finished"), "the job's work was not lost");
        assert!(secs(&c) >= 0.7 && secs(&c) < 5.0, "gpu={g}: exit took {:.2} s", secs(&c));
        assert!(c.stderr.contains("exit: jobs in flight: job"), "gpu={g}: {}", c.stderr);
        assert!(c.stderr.contains("tearing down"), "gpu={g}: {}", c.stderr);
        assert!(!c.stderr.contains("WARN"), "gpu={g}: {}", c.stderr);
    }
}

#[test]
fn a_job_longer_than_its_bound_skips_the_teardown_after_about_the_bound() {
    for g in variants() {
        let c = scenario("job-then-return", g, "0.5", "20");
        c.assert_code(0);
        assert!(c.result("job").is_none());
        assert!(secs(&c) >= 0.5 && secs(&c) < 4.0, "gpu={g}: exit took {:.2} s", secs(&c));
        assert!(c.stderr.contains("teardown skipped"), "gpu={g}: {}", c.stderr);
        assert!(c.stderr.contains("jobs still running: job"), "gpu={g}: {}", c.stderr);
    }
}

#[test]
fn an_infinite_wait_waits_for_a_finite_job() {
    for g in variants() {
        let c = scenario("job-then-return", g, "inf", "1.0");
        c.assert_code(0);
        assert_eq!(c.result("job").as_deref(), Some("finished"));
        assert!(secs(&c) >= 1.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("tearing down"));
    }
}

#[test]
fn a_zero_wait_does_not_wait() {
    for g in variants() {
        let c = scenario("job-then-return", g, "0", "20");
        c.assert_code(0);
        assert!(secs(&c) < 3.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("teardown skipped"), "gpu={g}: {}", c.stderr);
    }
}

#[test]
fn a_panicking_logger_in_the_exit_hook_still_ends_the_process_before_the_static_destructors() {
    // The user's logger panics at the hook's warning (teardown skipped, the job outlives its
    // 0 s bound). The hook must still end the process with its own status, before the C
    // library's handlers: the user's handler registered before the first job must not run,
    // since the C++ static destructors that come with it would run under the job.
    for g in variants() {
        let c = run_scenario!(
            "logger-panics-at-exit",
            &[("SCENARIO_GPU", g), ("SCENARIO_WAIT", "0"), ("SCENARIO_JOB_SECS", "20"), ("SCENARIO_STATUS", "5")],
            LIMIT
        );
        assert!(c.stderr.contains("the user's logger panicked on: exit: teardown skipped"), "gpu={g}: {}", c.stderr);
        c.assert_code(5);
        assert!(c.result("user_atexit").is_none(), "gpu={g}: the exit went on to the static destructors:\n{}", c.stdout);
        assert!(c.result("job").is_none(), "gpu={g}: {}", c.stdout);
        assert!(secs(&c) < 3.0, "gpu={g}: {:.2} s", secs(&c));
    }
}

#[test]
fn a_job_that_calls_exit_skips_the_teardown_at_once() {
    for g in variants() {
        let c = scenario("job-calls-exit", g, "10", "0");
        c.assert_code(3);
        assert!(secs(&c) < 5.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("exit called from a job or release thread"), "gpu={g}: {}", c.stderr);
        // The fourteenth audit: with no other job or release in flight the exit went on into
        // the handlers registered before the hook (libcudart's and RMM's static destructors),
        // under whatever another thread was doing in CUDA (a lend, a sync). Ended at once now.
        assert!(c.result("user_atexit").is_none(), "gpu={g}: the exit went on to the static destructors:\n{}", c.stdout);
    }
}

#[test]
fn exit_from_another_thread_waits_like_main_returning() {
    for g in variants() {
        let c = scenario("exit-from-thread", g, "10", "0.7");
        c.assert_code(0);
        assert_eq!(c.result("job").as_deref(), Some("finished"));
        assert!(secs(&c) >= 0.7 && secs(&c) < 5.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("tearing down"), "gpu={g}: {}", c.stderr);
    }
}

#[test]
fn a_release_in_flight_holds_the_exit_for_up_to_a_second() {
    // No job runs at exit, only a release: on the GPU, that of dropped resources waiting for
    // their stream's work; on the CPU, a release registered like the library's.
    for g in variants() {
        // What the release waits for: the stream's work (GPU), or the release itself (CPU).
        let done = if g == "1" { "stream_work" } else { "release" };
        // A short release is waited for ...
        let c = scenario("release-in-flight", g, "10", "0.3");
        c.assert_code(0);
        assert_eq!(c.result("jobs_at_exit").as_deref(), Some("0"), "gpu={g}: a job held the exit");
        assert_eq!(c.result("releases_at_exit").as_deref(), Some("1"), "gpu={g}: no release in flight at exit");
        assert_eq!(c.result(done).as_deref(), Some("finished"), "gpu={g}: {}", c.stdout);
        assert!(secs(&c) >= 0.3 && secs(&c) < 5.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("exit: jobs in flight: none; waited"), "gpu={g}: {}", c.stderr);
        assert!(c.stderr.contains("tearing down"), "gpu={g}: {}", c.stderr);
        // ... a long one only for about a second.
        let c = scenario("release-in-flight", g, "10", "20");
        c.assert_code(0);
        assert_eq!(c.result("jobs_at_exit").as_deref(), Some("0"), "gpu={g}: a job held the exit");
        assert!(c.result(done).is_none(), "gpu={g}: {}", c.stdout);
        assert!(secs(&c) >= 1.0 && secs(&c) < 4.0, "gpu={g}: {:.2} s", secs(&c));
        assert!(c.stderr.contains("teardown skipped"), "gpu={g}: {}", c.stderr);
        assert!(c.stderr.contains("jobs still running: none; releases still running: release"), "gpu={g}: {}", c.stderr);
    }
}

#[test]
fn two_hundred_resources_alive_at_exit_are_torn_down() {
    if !gpu() {
        return;
    }
    let c = run_scenario!("many-resources", &[("SCENARIO_COUNT", "200")], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("alive").as_deref(), Some("200"));
    assert!(c.stderr.contains("tearing down"), "{}", c.stderr);
}

#[test]
fn nothing_made_no_hook() {
    // A process that made no job or release registers no exit hook: it exits at once, silently.
    let c = run_scenario!("no-jobs", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("hook").as_deref(), Some("false"));
    assert_eq!(c.result("abi").as_deref(), Some("26.08.00"));
    assert!(!c.stderr.contains("exit:"), "{}", c.stderr);
}

#[test]
fn bad_exit_waits_are_refused_with_the_seed_text() {
    for (v, text) in [(-1.0, "-1"), (f64::NAN, "NaN")] {
        let e: raft::Error = raft::exit::with_exit_wait(v, || ()).unwrap_err().into();
        assert_eq!(e.kind(), raft::ErrorKind::Logic);
        assert_eq!(e.to_string(), format!("with_exit_wait: expected a non-negative real number of seconds, given {text}"));
        assert_eq!(
            raft::exit::set_default_exit_wait(v).unwrap_err().to_string(),
            format!("set_default_exit_wait: expected a non-negative real number of seconds, given {text}")
        );
    }
    assert_eq!(raft::exit::with_exit_wait(f64::INFINITY, raft::exit::current_exit_wait).unwrap().unwrap(), f64::INFINITY);
    assert_eq!(raft::exit::with_exit_wait(1e300, raft::exit::current_exit_wait).unwrap().unwrap(), 1e300);
}

/// Issue 34, item 8: a `Duration` is the same wait as its seconds, in the scope and as the
/// default; the seconds of the seed still work beside it.
#[test]
fn exit_waits_can_be_given_as_durations() {
    use std::time::Duration;
    let scoped = raft::exit::with_exit_wait(Duration::from_millis(1500), raft::exit::current_exit_wait).unwrap().unwrap();
    assert_eq!(scoped, 1.5);
    let forever = raft::exit::with_exit_wait(raft::exit::ExitWait::FOREVER, raft::exit::current_exit_wait).unwrap().unwrap();
    assert_eq!(forever, f64::INFINITY);
    let before = raft::exit::default_exit_wait().unwrap();
    raft::exit::set_default_exit_wait(Duration::from_secs(7)).unwrap();
    assert_eq!(raft::exit::default_exit_wait().unwrap(), 7.0);
    raft::exit::set_default_exit_wait(before).unwrap();
}

#[test]
fn a_thread_made_inside_the_scope_keeps_the_value() {
    let (tx, rx) = std::sync::mpsc::channel();
    raft::exit::with_exit_wait(f64::INFINITY, || {
        raft::exit::spawn_thread(move || tx.send(raft::exit::current_exit_wait().unwrap()).unwrap());
    })
    .unwrap();
    assert_eq!(rx.recv().unwrap(), f64::INFINITY);
}

#[test]
fn raft_exit_wait_sets_the_default_and_a_bad_value_is_an_error_at_first_use() {
    let c = run_scenario!("read-wait", &[("RAFT_EXIT_WAIT", "2.5")], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("wait").as_deref(), Some("2.5"));
    let c = run_scenario!("read-wait", &[], LIMIT);
    assert_eq!(c.result("wait").as_deref(), Some("10"), "the default is 10 seconds");
    for bad in ["soon", "-1", "NaN"] {
        let c = run_scenario!("read-wait", &[("RAFT_EXIT_WAIT", bad)], LIMIT);
        c.assert_code(0);
        assert!(
            c.stdout.contains(&format!("ERROR RAFT_EXIT_WAIT: expected a non-negative real number of seconds, given {bad}")),
            "{}",
            c.stdout
        );
    }
}

/// The sixteenth audit (helper 73): a `RegisteredSlice` whose scope ended after the exit's
/// teardown skipped its unregistration and handed the slice back page-locked, where a copy into
/// it runs on past the host (which may then free the memory). Now it is made pageable all the
/// same (a driver call; a driver already shut down unlocks everything). (Before:
/// `page_locked_after=true`.)
#[test]
fn a_slice_registered_before_the_exit_decided_is_pageable_when_handed_back_after_it() {
    if !gpu() {
        return;
    }
    let c = run_scenario!("registered-slice-at-exit", &[], LIMIT);
    c.assert_code(0); // main returned: a crash in the teardown is no pass
    assert_eq!(c.result("scoped").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("page_locked_after").as_deref(), Some("false"), "the slice came back page-locked:\n{c:?}");
}

/// The sixteenth audit (helper 73): the user's logger panicked at the teardown's warning of
/// resources still lent on another thread, which the teardown logged before recording that
/// thread as left running: the exit went on into the C library's handlers and the static
/// destructors under the lend. Now the record comes first and the line is logged guarded.
/// (Before: `user_atexit=ran`.)
#[test]
fn a_panicking_logger_at_the_teardown_s_lend_warning_still_ends_the_process_before_the_static_destructors() {
    if !gpu() {
        return;
    }
    let c = run_scenario!("logger-panics-teardown-lend", &[], LIMIT);
    // Main returned, and the hook ends the process with that status (`_exit(0)`): a process
    // killed by a signal in the teardown (the panicking logger) also skips the user's handler.
    c.assert_code(0);
    assert_eq!(c.result("main_returns").as_deref(), Some("1"), "{c:?}");
    assert!(c.result("user_atexit").is_none(), "the exit went on to the static destructors under the lend:\n{c:?}");
}

/// The sixteenth audit (helper 73): a worker's own log lines (a detached job's result that
/// panicked when dropped) went to the user's logger unguarded; a logger that panics ended the
/// worker thread and the job queued behind was never run. (Before: `joined=false`.)
#[test]
fn a_panicking_logger_does_not_end_a_resources_worker() {
    if !gpu() {
        return;
    }
    let c = run_scenario!("logger-panics-worker", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("joined").as_deref(), Some("true"), "the job queued behind was never run:\n{c:?}");
}

/// The text of the child's `MESSAGE key=...` line (an error's `who: message`).
fn message(c: &Child, key: &str) -> Option<String> {
    let prefix = format!("MESSAGE {key}=");
    c.stdout.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_string)
}

/// Asserts that the child's call `key` was refused because the exit's teardown had run: kind
/// `Logic`, reason `exiting`, a message that says so (not a missing driver, not released
/// resources, not RMM's map).
fn assert_refused_for_the_exit(c: &Child, key: &str, context: &str) {
    let text = message(c, key).unwrap_or_default();
    assert_eq!(c.result(key).as_deref(), Some("logic"), "{context}: {key} was not refused as Logic ({text}):\n{c:?}");
    assert_eq!(c.result(&format!("{key}_reason")).as_deref(), Some("exiting"), "{context}: {key}: {text}");
    assert!(text.contains("the process is exiting: the library's exit teardown has run"), "{context}: {key}: {text}");
}

/// The twenty-third audit's open item (helper 112), closed by helper 118: a user's `atexit`
/// handler registered before the library's exit hook runs after the hook's teardown, and the
/// library still accepted calls there (resources, arrays, `memory::set_current`), making native
/// objects under the C++ static destructors and the CUDA runtime's teardown. Now every
/// constructor is refused with a `Logic` error that names the exit, and main's status stands.
/// Without a GPU the calls reach no driver either way: before, they failed with `Cuda` (no
/// driver); the refusal now comes first and names the exit.
#[test]
fn a_user_exit_handler_after_the_teardown_is_refused_the_library_and_the_status_stands() {
    let c = run_scenario!("library-after-teardown", &[("SCENARIO_GPU", "0"), ("SCENARIO_STATUS", "9")], LIMIT);
    c.assert_code(9);
    assert_eq!(c.result("hook_registered").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("handler").as_deref(), Some("ran"), "the handler did not run to its end:\n{c:?}");
    assert_eq!(c.result("phase").as_deref(), Some("TornDown"), "the handler ran before the teardown:\n{c:?}");
    for key in ["new", "on_device", "current", "mr_cuda", "mr_current"] {
        assert_refused_for_the_exit(&c, key, "cpu");
    }
    assert!(secs(&c) < 10.0, "the exit took {:.2} s", secs(&c));
}

/// The GPU half of the test above: resources, arrays (of the default async pool and of
/// `cudaMalloc`), a memory resource and pinned memory made before the exit are used and dropped
/// in a user's exit handler that runs after the teardown, registered first thing (it then runs
/// after RMM's per-device map and the CUDA runtime are torn down too), after the shim's load
/// (after the map's destruction, the runtime alive: new resources lent to RAFT there would read
/// the destroyed map) or after the first resources (before both). Every new object and use is
/// refused as `Logic` naming the exit,
/// every drop leaves its native object to the OS without a crash or a wait, and main's status
/// stands. (Before: new resources, `set_current` and allocations were accepted there.)
#[test]
fn a_user_exit_handler_after_the_teardown_is_refused_new_gpu_objects_and_drops_what_it_kept() {
    if !gpu() {
        return;
    }
    for order in ["first", "after-shim", "after-first-use"] {
        let c =
            run_scenario!("library-after-teardown", &[("SCENARIO_GPU", "1"), ("SCENARIO_STATUS", "9"), ("SCENARIO_HANDLER", order)], LIMIT);
        let context = format!("handler registered {order}");
        assert!(!c.stderr.contains("CRASH"), "{context}: {c:?}");
        c.assert_code(9);
        assert_eq!(c.result("handler").as_deref(), Some("ran"), "{context}: the handler did not run to its end:\n{c:?}");
        assert_eq!(c.result("phase").as_deref(), Some("TornDown"), "{context}: {c:?}");
        assert!(c.stderr.contains("tearing down"), "{context}: {}", c.stderr);
        for key in
            ["new", "on_device", "current", "mr_cuda", "mr_current", "alloc", "alloc_in", "pinned_new", "set_current", "spawn", "sync"]
        {
            assert_refused_for_the_exit(&c, key, &context);
        }
        assert_eq!(c.result("dropped").as_deref(), Some("ok"), "{context}: {c:?}");
        assert!(secs(&c) < 20.0, "{context}: the exit took {:.2} s", secs(&c));
    }
}
