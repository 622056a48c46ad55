//! Jobs: closures run on a resources object's worker thread, joined or awaited as a `Future`.
use crate::error::{Error, ErrorKind, Result};
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

pub(crate) type Task = Box<dyn FnOnce() + Send + 'static>;

/// The worker thread of one resources object, started on its first job.
pub(crate) struct Worker {
    tx: mpsc::Sender<Task>,
    thread: JoinHandle<()>,
    id: ThreadId,
}

impl Worker {
    /// Starts the worker and waits until it has bound the device's context: a worker that could
    /// not bind it would run jobs with no context, or on another device.
    pub(crate) fn start(who: &'static str, device: usize, ctx: Arc<cudarc::driver::CudaContext>) -> Result<Worker> {
        let watch = watch_time(who)?;
        let (tx, rx) = mpsc::channel::<Task>();
        let (bound_tx, bound_rx) = mpsc::sync_channel::<Result<()>>(1);
        let thread = std::thread::Builder::new()
            .name(format!("raft-worker-{device}"))
            .spawn(move || {
                raft_exit::mark_library_thread();
                // Jobs start on the resources' device, as RAFT code in them expects.
                let bound = crate::result::bind(who, &ctx);
                let ok = bound.is_ok();
                let _ = bound_tx.send(bound);
                if !ok {
                    return;
                }
                run_tasks(&rx, watch, Some(&ctx));
            })
            .map_err(|e| Error::new(ErrorKind::Generic, who, format!("no worker thread could be started: {e}")))?;
        match bound_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => return Err(Error::new(ErrorKind::Generic, who, "the worker thread ended before it started")),
        }
        let id = thread.thread().id();
        Ok(Worker { tx, thread, id })
    }

    pub(crate) fn thread_id(&self) -> ThreadId {
        self.id
    }

    pub(crate) fn send(&self, task: Task) -> std::result::Result<(), Task> {
        self.tx.send(task).map_err(|e| e.0)
    }

    /// Queues `last` behind the jobs already queued and lets the thread end after it, without
    /// joining it: nobody waits for a worker whose resources were dropped. Gives `last` back
    /// when the worker has stopped.
    pub(crate) fn retire(self, last: Task) -> std::result::Result<(), Task> {
        self.tx.send(last).map_err(|e| e.0)
        // `tx` drops here: the worker ends after `last`; the JoinHandle drops, detaching it.
    }

    /// Lets the queued jobs finish, then joins the thread; a worker cannot join itself (a job
    /// releasing its own resources), so then it is detached and ends after that job.
    pub(crate) fn finish(self) {
        drop(self.tx);
        if std::thread::current().id() != self.id {
            let _ = self.thread.join();
        }
    }
}

/// How long a worker keeps watching for the next job after its last one before it sleeps:
/// `RAFT_WORKER_SPIN_US` (microseconds, 0 to 1 000 000; 0 sleeps at once), 50 µs by default.
/// Read once. Jobs come in runs (a loop spawning and joining); a worker that went to sleep
/// costs the next job a futex wake and a scheduler wake-up, several µs, while a `spawn` that
/// takes longer than std's channel spins before parking (a few hundred ns) finds it asleep
/// every time (run 110: a no-op job's round trip 6.1 µs against 1.1 µs for the bare wait).
///
/// # Errors
/// `Logic`, naming the variable, for a value that does not parse or is out of range.
pub(crate) fn watch_time(who: &'static str) -> Result<Duration> {
    static WATCH: OnceLock<std::result::Result<Duration, String>> = OnceLock::new();
    WATCH
        .get_or_init(|| {
            // Lossily: a value that is not UTF-8 is refused, never taken for unset.
            let v = std::env::var_os("RAFT_WORKER_SPIN_US").map(|v| v.to_string_lossy().into_owned());
            crate::result::crew::parse_micros("RAFT_WORKER_SPIN_US", v.as_deref(), Duration::from_micros(50))
        })
        .clone()
        .map_err(|m| Error::logic(who, m))
}

/// The worker's loop: every task queued, in order, until every sender is gone. A task that
/// panics ends neither the loop nor the thread (a backstop: a job's own panic is caught inside
/// its task, `job_task`): a dead worker would drop the tasks queued behind it, leaving their
/// handles' joins waiting for ever and their releases never settled. The second panic a
/// payload's `Drop` may raise is not unwound either: the payload is leaked, never dropped here.
///
/// Each task starts on `ctx` (the unit tests' workers have none), whatever the task before it
/// left current (a job that made resources of another device, or another library's context):
/// jobs of the same resources are unrelated (the sixteenth audit: a later job's
/// `DeviceResources::new()` and RAFT code lent there followed the drifted device). Within a job
/// the library's calls put the context back as on a user's thread (`result::as_caller`), so only
/// the job's own code can leave another context bound for the next.
fn run_tasks(rx: &mpsc::Receiver<Task>, watch: Duration, ctx: Option<&cudarc::driver::CudaContext>) {
    while let Some(task) = next_task(rx, watch) {
        // Every log line here through `log_guarded`: a panicking logger must not end the worker
        // either (the sixteenth audit: it did, and the joins of the jobs queued behind waited for
        // ever).
        if let Some(Err(e)) = ctx.map(|ctx| crate::result::bind("raft::DeviceResources::spawn", ctx)) {
            raft_exit::log_guarded(|| log::warn!(target: "raft", "a resources' worker could not bind its device for the next job: {e}"));
        }
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task)) {
            let message = panic_message(&*payload);
            std::mem::forget(payload);
            raft_exit::log_guarded(
                || log::error!(target: "raft", "a task on a resources' worker panicked: {message} (the worker goes on)"),
            );
        }
    }
}

/// The task that runs `job` on a worker and completes `done` with its value or its panic;
/// `token` (the exit's record of the job) is let go once the result can be seen. When the handle
/// was dropped (a detached job), this task holds the last `done`, so the result is dropped here:
/// its `Drop` (or a panic payload's) is user code, and a panic there is caught and the payload
/// leaked (the thirteenth audit: it unwound out of the task and ended the worker thread, and the
/// jobs queued behind it were dropped unrun, their joins waiting for ever). Not covered: an
/// awaiting executor's `Waker::wake` that panics inside `complete` unwinds through this task
/// (`run_tasks` catches it), and a result whose `Drop` then panics too aborts the process.
pub(crate) fn job_task<T, F, K>(job: F, done: Arc<Shared<T>>, token: K) -> Task
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
    K: Send + 'static,
{
    Box::new(move || {
        let result = crate::result::as_caller(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)));
        done.complete(result);
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(done))) {
            let message = panic_message(&*payload);
            std::mem::forget(payload);
            raft_exit::log_guarded(|| log::error!(target: "raft", "a detached job's result panicked when dropped: {message}"));
        }
        drop(token); // the job ends once its result can be seen (detached: once it was dropped)
    })
}

/// The next job: watched for during `watch`, then waited for asleep. `None` once every sender
/// is gone (the resources were released or dropped) and nothing is queued.
fn next_task(rx: &mpsc::Receiver<Task>, watch: Duration) -> Option<Task> {
    if !watch.is_zero() {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                match rx.try_recv() {
                    Ok(task) => return Some(task),
                    Err(mpsc::TryRecvError::Disconnected) => return None,
                    Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
            if start.elapsed() >= watch {
                break;
            }
        }
    }
    rx.recv().ok()
}

pub(crate) struct Shared<T> {
    done: AtomicBool,
    state: Mutex<State<T>>,
    cv: Condvar,
}

struct State<T> {
    result: Option<std::thread::Result<T>>,
    waker: Option<Waker>,
    /// Joiners parked (or about to park) on `cv`: counted under the lock, as `done` is set.
    parked: usize,
}

impl<T> Shared<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Shared {
            done: AtomicBool::new(false),
            state: Mutex::new(State { result: None, waker: None, parked: 0 }),
            cv: Condvar::new(),
        })
    }

    pub(crate) fn complete(&self, result: std::thread::Result<T>) {
        let (waker, parked) = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.result = Some(result);
            self.done.store(true, Ordering::Release);
            (st.waker.take(), st.parked)
        };
        // Only a joiner that parked needs the wake: a notify is a system call even with nobody
        // waiting, which the worker would make before it looks for its next job. A joiner counts
        // itself under the lock before it checks `done` and parks, so one counted after this
        // critical section sees `done` and never parks. (Run 118 tried this while the worker
        // slept between jobs, which hid it; with the worker watching it is on the round trip.)
        if parked > 0 {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A job queued or running on a resources object's worker thread.
///
/// Join it with [`JobHandle::join`], or `.await` it: as a `Future` it never blocks the
/// executor (the seed's "waiting in a thread of its own"). Dropping the handle detaches the
/// job; it still runs, and the exit waits for it as for any job.
///
/// # Thread safety
/// `Send` (and `Sync`) when the job's result is `Send`: it can be joined from another thread.
#[must_use = "a job's result and its panics are only seen through its handle"]
pub struct JobHandle<T> {
    pub(crate) shared: Arc<Shared<T>>,
    pub(crate) device: usize,
    /// The worker thread it runs on: a join there would wait for a job queued behind the one
    /// joining, forever.
    pub(crate) worker: ThreadId,
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into())
}

/// What a finished job gave: its value, its panic's payload, or an error.
enum Outcome<T> {
    Value(T),
    Panicked(Box<dyn Any + Send + 'static>),
    Failed(Error),
}

impl<T> JobHandle<T> {
    fn take(&self) -> Result<T> {
        match self.take_outcome() {
            Outcome::Value(v) => Ok(v),
            Outcome::Panicked(p) => Err(self.panicked(&*p)),
            Outcome::Failed(e) => Err(e),
        }
    }

    fn take_outcome(&self) -> Outcome<T> {
        let result = self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).result.take();
        match result {
            Some(Ok(v)) => Outcome::Value(v),
            Some(Err(p)) => Outcome::Panicked(p),
            None => Outcome::Failed(Error::logic("JobHandle::join", "the job's result was already taken")),
        }
    }

    /// The `Generic` error (reason `Panicked`) of a job that panicked with `payload`.
    fn panicked(&self, payload: &(dyn Any + Send)) -> Error {
        Error::new(ErrorKind::Generic, "JobHandle::join", format!("the job on device {} panicked: {}", self.device, panic_message(payload)))
            .with_reason(crate::error::Reason::Panicked)
    }

    /// [`join`](Self::join), except that a panic of the job carries on in the caller with the
    /// job's own payload (`std::panic::resume_unwind`), as `std::thread::JoinHandle::join` lets
    /// a caller do: a test's `#[should_panic(expected = …)]`, a payload type the program
    /// downcasts, or a panic hook, sees the job's panic as if it had happened here.
    ///
    /// # Errors
    /// As [`join`](Self::join), less the panic.
    ///
    /// # Panics
    /// With the job's payload when the job panicked.
    pub fn join_unwind(self) -> Result<T> {
        self.wait()?;
        match self.take_outcome() {
            Outcome::Value(v) => Ok(v),
            Outcome::Panicked(p) => std::panic::resume_unwind(p),
            Outcome::Failed(e) => Err(e),
        }
    }

    /// Whether the job has finished.
    pub fn is_finished(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    /// Blocks until the job ends and returns its value.
    ///
    /// # Errors
    /// `Generic` (reason `Panicked`) when the job panicked (the panic is caught on the worker,
    /// which keeps running; [`join_unwind`](Self::join_unwind) gives its payload back);
    /// `Logic` when called by a job of the same resources on an unfinished job (it would wait
    /// for a job queued behind itself, forever), or when the job's worker is itself waiting,
    /// through a chain of joins and releases, for the calling thread.
    pub fn join(self) -> Result<T> {
        self.wait()?;
        self.take()
    }

    /// Blocks until the job has finished.
    fn wait(&self) -> Result<()> {
        if !self.is_finished() && std::thread::current().id() == self.worker {
            return Err(Error::logic(
                "JobHandle::join",
                format!("a job on device {} cannot join a later job of the same resources: it runs only after this one", self.device),
            ));
        }
        // In a fork's child the job's worker was not copied: it never ends there.
        if !self.is_finished() && raft_exit::forked() {
            return Err(Error::forked("JobHandle::join"));
        }
        // A short spin first: most jobs this waits for are short, and parking costs a few µs.
        for _ in 0..2000 {
            if self.is_finished() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        // The worker may itself be waiting, through releases and joins, for this thread.
        let Some(_waiting) = crate::waits::wait_for(self.worker) else {
            if self.is_finished() {
                return Ok(());
            }
            return Err(Error::logic(
                "JobHandle::join",
                format!(
                    "the job on device {} waits, through other jobs or releases, for this thread: joining it would never end",
                    self.device
                ),
            ));
        };
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.parked += 1;
        while !self.shared.done.load(Ordering::Acquire) {
            st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.parked -= 1;
        Ok(())
    }
}

impl<T> Future for JobHandle<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.is_finished() {
            return Poll::Ready(self.take());
        }
        // The executor's waker is user code (`std::task::Wake`, a `RawWakerVTable`): cloned before
        // the lock, and the waker it replaces dropped after it. A waker's `Drop` run under the
        // lock would hold up `complete` on the worker, so one that waits for this job, or for a
        // job queued behind it on the same worker, would never return.
        let waker = cx.waker().clone();
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.shared.done.load(Ordering::Acquire) {
            drop(st);
            drop(waker);
            return Poll::Ready(self.take());
        }
        let replaced = st.waker.replace(waker);
        drop(st);
        drop(replaced);
        Poll::Pending
    }
}

impl<T> std::fmt::Debug for JobHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle").field("device", &self.device).field("finished", &self.is_finished()).finish()
    }
}

static_assertions::assert_impl_all!(JobHandle<u32>: Send, Sync, Unpin);

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle on a job that has finished with `result`, as the worker leaves it.
    fn finished<T>(result: std::thread::Result<T>) -> JobHandle<T> {
        let shared = Shared::new();
        shared.complete(result);
        JobHandle { shared, device: 0, worker: std::thread::spawn(|| ()).thread().id() }
    }

    #[derive(Debug, PartialEq)]
    struct Payload(u32);

    #[test]
    fn join_unwind_resumes_with_the_job_s_own_payload() {
        let caught = std::panic::catch_unwind(|| finished::<u8>(Err(Box::new(Payload(7)))).join_unwind()).unwrap_err();
        assert_eq!(caught.downcast_ref::<Payload>(), Some(&Payload(7)));
        assert_eq!(finished(Ok(5u8)).join_unwind().unwrap(), 5);
    }

    /// A join that parks (the job outlasts its spin) is woken by the completion, and one that
    /// ends while spinning needs no notify: both return the value, many times over (a lost
    /// wake-up would hang this test).
    #[test]
    fn joins_that_park_and_joins_that_spin_are_both_completed() {
        for i in 0..200u32 {
            let shared = Shared::new();
            let done = shared.clone();
            let late = i % 2 == 0;
            let worker = std::thread::spawn(move || {
                if late {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                done.complete(Ok(i));
            });
            let h = JobHandle { shared, device: 0, worker: worker.thread().id() };
            assert_eq!(h.join().unwrap(), i);
            worker.join().unwrap();
        }
    }

    /// A detached job whose result panics when dropped, one whose panic's payload does, and a
    /// task that panics end neither the worker nor the jobs queued behind them (the thirteenth
    /// audit: the result was dropped outside the job's catch, the panic ended the worker thread,
    /// and the next job's join waited for ever).
    #[test]
    fn a_detached_job_whose_result_panics_when_dropped_ends_no_worker() {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("a detached job's result panicked when dropped");
            }
        }
        let (tx, rx) = mpsc::channel::<Task>();
        let worker = std::thread::spawn(move || run_tasks(&rx, Duration::ZERO, None));
        // Detached: no handle holds these results.
        tx.send(job_task(|| Bomb, Shared::new(), ())).unwrap();
        tx.send(job_task(|| std::panic::panic_any(Bomb), Shared::<()>::new(), ())).unwrap();
        tx.send(Box::new(|| panic!("a task's own panic"))).unwrap();
        let shared = Shared::new();
        tx.send(job_task(|| 7u32, shared.clone(), ())).unwrap();
        let h = JobHandle { shared, device: 0, worker: worker.thread().id() };
        // Joined on a thread of its own, bounded: behind a dead worker it waits for ever.
        let (got_tx, got_rx) = mpsc::channel();
        std::thread::spawn(move || got_tx.send(h.join().map_err(|e| e.to_string())));
        assert_eq!(got_rx.recv_timeout(Duration::from_secs(30)), Ok(Ok(7)), "the job queued behind them never ran");
        drop(tx);
        worker.join().expect("the worker thread ended by a panic");
    }

    /// The worker's wait hands over every job, whether it comes while the worker watches or
    /// after it went to sleep, in order, and ends once the senders are gone.
    #[test]
    fn next_task_hands_over_jobs_while_watching_and_after_sleeping() {
        for watch in [Duration::ZERO, Duration::from_micros(50)] {
            let (tx, rx) = mpsc::channel::<Task>();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let worker = std::thread::spawn(move || {
                run_tasks(&rx, watch, None);
            });
            for i in 0..40u32 {
                if i % 4 == 0 {
                    std::thread::sleep(Duration::from_millis(1)); // past the watch: asleep
                }
                let seen = seen.clone();
                tx.send(Box::new(move || seen.lock().unwrap().push(i))).unwrap();
            }
            drop(tx);
            worker.join().unwrap();
            assert_eq!(*seen.lock().unwrap(), (0..40).collect::<Vec<_>>(), "watch {watch:?}");
        }
    }

    #[test]
    fn the_worker_watch_reads_microseconds_and_names_the_variable() {
        let parse = |v| crate::result::crew::parse_micros("RAFT_WORKER_SPIN_US", v, Duration::from_micros(50));
        assert_eq!(parse(None), Ok(Duration::from_micros(50)));
        assert_eq!(parse(Some("0")), Ok(Duration::ZERO));
        assert!(parse(Some("-1")).unwrap_err().starts_with("RAFT_WORKER_SPIN_US: expected microseconds"));
    }

    /// An executor's waker whose `Drop` waits for the job (here, for its completion on the
    /// worker, bounded at 10 s): `poll` replaced the stored waker under the job's lock, so the
    /// old one's `Drop` ran there and the worker's `complete` waited behind it; a drop that
    /// waits for this job (or, through a join, for a job queued behind it on the same worker)
    /// never returned. The drop must see the completion.
    #[test]
    fn a_waker_dropped_by_poll_runs_outside_the_job_s_lock() {
        use std::task::Wake;
        struct WaitsForTheJob {
            /// Told when this waker's `Drop` begins (the worker then completes the job).
            dropping: Mutex<Option<mpsc::Sender<()>>>,
            /// Told once `complete` has returned on the worker.
            completed: Mutex<Option<mpsc::Receiver<()>>>,
            /// Whether the drop saw the completion within its bound.
            saw: Arc<AtomicBool>,
        }
        impl Wake for WaitsForTheJob {
            fn wake(self: Arc<Self>) {}
        }
        impl Drop for WaitsForTheJob {
            fn drop(&mut self) {
                let (Some(dropping), Some(completed)) = (self.dropping.get_mut().unwrap().take(), self.completed.get_mut().unwrap().take())
                else {
                    return;
                };
                let _ = dropping.send(());
                let seen = completed.recv_timeout(Duration::from_secs(10)).is_ok();
                self.saw.store(seen, Ordering::SeqCst);
            }
        }
        struct Quiet;
        impl Wake for Quiet {
            fn wake(self: Arc<Self>) {}
        }
        let (dropping_tx, dropping_rx) = mpsc::channel();
        let (completed_tx, completed_rx) = mpsc::channel();
        let saw = Arc::new(AtomicBool::new(false));
        let shared = Shared::<u32>::new();
        let done = shared.clone();
        let worker = std::thread::spawn(move || {
            // The job ends while the old waker is being dropped.
            dropping_rx.recv().unwrap();
            done.complete(Ok(7));
            let _ = completed_tx.send(());
        });
        let mut handle = JobHandle { shared, device: 0, worker: worker.thread().id() };
        let first = std::task::Waker::from(Arc::new(WaitsForTheJob {
            dropping: Mutex::new(Some(dropping_tx)),
            completed: Mutex::new(Some(completed_rx)),
            saw: saw.clone(),
        }));
        assert!(Pin::new(&mut handle).poll(&mut Context::from_waker(&first)).is_pending());
        drop(first); // the handle's clone is now the last: the next poll drops it
        let second = std::task::Waker::from(Arc::new(Quiet));
        let _ = Pin::new(&mut handle).poll(&mut Context::from_waker(&second));
        worker.join().unwrap();
        assert!(saw.load(Ordering::SeqCst), "the worker's completion waited for the waker dropped under the job's lock");
        assert_eq!(handle.join().unwrap(), 7);
    }

    #[test]
    fn join_reports_a_panic_as_a_generic_error_with_its_text() {
        let e = finished::<u8>(Err(Box::new("boom"))).join().unwrap_err();
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Generic, crate::Reason::Panicked));
        assert_eq!(e.to_string(), "JobHandle::join: the job on device 0 panicked: boom");
    }
}
