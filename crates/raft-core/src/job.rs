//! Jobs: closures run on a resources object's worker thread, joined or awaited as a `Future`.
use crate::error::{Error, ErrorKind, Result};
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::{JoinHandle, ThreadId};

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
        let (tx, rx) = mpsc::channel::<Task>();
        let (bound_tx, bound_rx) = mpsc::sync_channel::<Result<()>>(1);
        let thread = std::thread::Builder::new()
            .name(format!("raft-worker-{device}"))
            .spawn(move || {
                raft_exit::mark_library_thread();
                // Jobs start on the resources' device, as RAFT code in them expects.
                let bound = crate::result::bind(who, &ctx);
                drop(ctx);
                let ok = bound.is_ok();
                let _ = bound_tx.send(bound);
                if !ok {
                    return;
                }
                while let Ok(task) = rx.recv() {
                    task();
                }
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

struct State<T> {
    result: Option<std::thread::Result<T>>,
    waker: Option<Waker>,
}

pub(crate) struct Shared<T> {
    done: AtomicBool,
    state: Mutex<State<T>>,
    cv: Condvar,
}

impl<T> Shared<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Shared { done: AtomicBool::new(false), state: Mutex::new(State { result: None, waker: None }), cv: Condvar::new() })
    }

    pub(crate) fn complete(&self, result: std::thread::Result<T>) {
        let waker = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.result = Some(result);
            self.done.store(true, Ordering::Release);
            st.waker.take()
        };
        self.cv.notify_all();
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

impl<T> JobHandle<T> {
    fn take(&self) -> Result<T> {
        let result = self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).result.take();
        match result {
            Some(Ok(v)) => Ok(v),
            Some(Err(p)) => Err(Error::new(
                ErrorKind::Generic,
                "JobHandle::join",
                format!("the job on device {} panicked: {}", self.device, panic_message(&*p)),
            )),
            None => Err(Error::logic("JobHandle::join", "the job's result was already taken")),
        }
    }

    /// Whether the job has finished.
    pub fn is_finished(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    /// Blocks until the job ends and returns its value.
    ///
    /// # Errors
    /// `Generic` when the job panicked (the panic is caught on the worker, which keeps running);
    /// `Logic` when called by a job of the same resources on an unfinished job (it would wait
    /// for a job queued behind itself, forever), or when the job's worker is itself waiting,
    /// through a chain of joins and releases, for the calling thread.
    pub fn join(self) -> Result<T> {
        if !self.is_finished() && std::thread::current().id() == self.worker {
            return Err(Error::logic(
                "JobHandle::join",
                format!("a job on device {} cannot join a later job of the same resources: it runs only after this one", self.device),
            ));
        }
        // A short spin first: most jobs this waits for are short, and parking costs a few µs.
        for _ in 0..2000 {
            if self.is_finished() {
                return self.take();
            }
            std::hint::spin_loop();
        }
        // The worker may itself be waiting, through releases and joins, for this thread.
        let Some(_waiting) = crate::waits::wait_for(self.worker) else {
            if self.is_finished() {
                return self.take();
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
        while !self.shared.done.load(Ordering::Acquire) {
            st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        drop(st);
        self.take()
    }
}

impl<T> Future for JobHandle<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.is_finished() {
            return Poll::Ready(self.take());
        }
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.shared.done.load(Ordering::Acquire) {
            drop(st);
            return Poll::Ready(self.take());
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> std::fmt::Debug for JobHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle").field("device", &self.device).field("finished", &self.is_finished()).finish()
    }
}

static_assertions::assert_impl_all!(JobHandle<u32>: Send, Sync, Unpin);
