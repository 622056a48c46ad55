//! crates/raft-core/src/job.rs: `Shared::complete`, `JobHandle::wait` (spin, then count itself in
//! `parked` under the lock and wait on the condvar), `Future::poll`, `job_task`, and the worker's
//! `next_task` (watch with `try_recv`, then `recv`). Stubbed: the spin count (2000 -> SPINS, each
//! spin a loom yield), the waits registry (`wait_for` always `Some`), `as_caller`/`catch_unwind`
//! (the job is a closure returning a value), the exit token (a counter), `Instant` (the watch is a
//! number of rounds).
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};

/// std's mpsc, trusted, as a loom-visible stand-in (loom's own stub does not model a
/// disconnect when the last sender drops).
pub mod mpsc {
    use loom::sync::{Arc, Condvar, Mutex};
    use std::collections::VecDeque;
    struct Ch<T> {
        q: Mutex<(VecDeque<T>, usize)>,
        cv: Condvar,
    }
    pub struct Sender<T>(Arc<Ch<T>>);
    pub struct Receiver<T>(Arc<Ch<T>>);
    pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
        let c = Arc::new(Ch { q: Mutex::new((VecDeque::new(), 1)), cv: Condvar::new() });
        (Sender(c.clone()), Receiver(c))
    }
    impl<T> Sender<T> {
        pub fn send(&self, t: T) -> Result<(), T> {
            self.0.q.lock().unwrap().0.push_back(t);
            self.0.cv.notify_one();
            Ok(())
        }
    }
    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            self.0.q.lock().unwrap().1 -= 1;
            self.0.cv.notify_all();
        }
    }
    impl<T> Receiver<T> {
        pub fn try_recv(&self) -> Result<T, std::sync::mpsc::TryRecvError> {
            let mut g = self.0.q.lock().unwrap();
            match g.0.pop_front() {
                Some(t) => Ok(t),
                None if g.1 == 0 => Err(std::sync::mpsc::TryRecvError::Disconnected),
                None => Err(std::sync::mpsc::TryRecvError::Empty),
            }
        }
        pub fn recv(&self) -> Result<T, ()> {
            let mut g = self.0.q.lock().unwrap();
            loop {
                if let Some(t) = g.0.pop_front() {
                    return Ok(t);
                }
                if g.1 == 0 {
                    return Err(());
                }
                g = self.0.cv.wait(g).unwrap();
            }
        }
    }
}
use std::task::{Context, Poll, Waker};

pub const SPINS: usize = 1;

pub type Task = Box<dyn FnOnce() + Send + 'static>;

pub struct Shared<T> {
    pub done: AtomicBool,
    pub state: Mutex<State<T>>,
    pub cv: Condvar,
}

pub struct State<T> {
    pub result: Option<T>,
    pub waker: Option<Waker>,
    pub parked: usize,
}

impl<T> Shared<T> {
    pub fn new() -> Arc<Self> {
        Arc::new(Shared {
            done: AtomicBool::new(false),
            state: Mutex::new(State { result: None, waker: None, parked: 0 }),
            cv: Condvar::new(),
        })
    }

    pub fn complete(&self, result: T) {
        #[cfg(feature = "mutant_job_parked_outside_lock")]
        let early = self.state.lock().unwrap().parked; // mutant: the count read before `done` is set
        let (waker, parked) = {
            let mut st = self.state.lock().unwrap();
            st.result = Some(result);
            self.done.store(true, Ordering::Release);
            (st.waker.take(), st.parked)
        };
        #[cfg(feature = "mutant_job_parked_outside_lock")]
        let parked = early + 0 * parked;
        if parked > 0 {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

pub struct JobHandle<T> {
    pub shared: Arc<Shared<T>>,
}

impl<T> JobHandle<T> {
    pub fn is_finished(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    fn take(&self) -> Option<T> {
        self.shared.state.lock().unwrap().result.take()
    }

    pub fn join(self) -> Option<T> {
        self.wait();
        self.take()
    }

    fn wait(&self) {
        for _ in 0..SPINS {
            if self.is_finished() {
                return;
            }
            loom::thread::yield_now();
        }
        // waits::wait_for(self.worker): Some (no circle in these models).
        let mut st = self.shared.state.lock().unwrap();
        st.parked += 1;
        while !self.shared.done.load(Ordering::Acquire) {
            st = self.shared.cv.wait(st).unwrap();
        }
        st.parked -= 1;
    }
}

impl<T> std::future::Future for JobHandle<T> {
    type Output = Option<T>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.is_finished() {
            return Poll::Ready(self.take());
        }
        // As the real poll since the twenty-third audit: the waker cloned before the lock, the
        // replaced one dropped after it.
        let waker = cx.waker().clone();
        let mut st = self.shared.state.lock().unwrap();
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

/// `job_task`: runs the job, completes `done`, drops `done`, then the exit token.
pub fn job_task<T: Send + 'static, F: FnOnce() -> T + Send + 'static, K: Send + 'static>(job: F, done: Arc<Shared<T>>, token: K) -> Task {
    Box::new(move || {
        let result = job();
        done.complete(result);
        drop(done);
        drop(token);
    })
}

/// `next_task`: watched for `watch` rounds of `try_recv`, then `recv`.
pub fn next_task(rx: &mpsc::Receiver<Task>, watch: usize) -> Option<Task> {
    for _ in 0..watch {
        match rx.try_recv() {
            Ok(task) => return Some(task),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) => loom::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

pub fn run_tasks(rx: &mpsc::Receiver<Task>, watch: usize) {
    while let Some(task) = next_task(rx, watch) {
        task();
    }
}
