use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use models::job::mpsc;
use models::job::*;
use std::task::{Context, Poll, Wake};

/// A joiner and the worker: the join always returns the value (a lost wake-up is a loom
/// deadlock), whether it parks or sees `done` while spinning.
#[test]
fn join_vs_complete() {
    models::check(&format!("join_vs_complete{}", ""), || {
        let shared = Shared::<u32>::new();
        let done = shared.clone();
        let w = loom::thread::spawn(move || done.complete(7));
        let h = JobHandle { shared };
        assert_eq!(h.join(), Some(7));
        w.join().unwrap();
    });
}

struct Unpark(loom::thread::Thread);
impl Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// An awaiting executor (poll, park until woken): the waker stored under the lock is always
/// taken by the completion.
#[test]
fn poll_vs_complete() {
    models::check(&format!("poll_vs_complete{}", ""), || {
        let shared = Shared::<u32>::new();
        let done = shared.clone();
        let w = loom::thread::spawn(move || done.complete(9));
        let mut h = JobHandle { shared };
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(loom::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let v = loop {
            match std::pin::Pin::new(&mut h).poll(&mut cx) {
                Poll::Ready(v) => break v,
                Poll::Pending => loom::thread::park(),
            }
        };
        assert_eq!(v, Some(9));
        w.join().unwrap();
    });
}

/// The whole hand-over: a caller queues two jobs on a watching worker (watch = 1 round), joins
/// the second while a third thread joins the first; the senders drop and the worker ends; the
/// exit tokens are all dropped once both joins returned... eventually (the token drops after
/// the completion).
#[test]
fn worker_hand_over() {
    models::check(&format!("worker_hand_over{}", ""), || {
        let (tx, rx) = mpsc::channel::<Task>();
        let worker = loom::thread::spawn(move || run_tasks(&rx, 1));
        let tokens = Arc::new(AtomicUsize::new(0));
        struct Token(Arc<AtomicUsize>);
        impl Drop for Token {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let mut hs = Vec::new();
        for i in 0..2u32 {
            let s = Shared::new();
            tokens.fetch_add(1, Ordering::SeqCst);
            tx.send(job_task(move || i, s.clone(), Token(tokens.clone()))).ok().unwrap();
            hs.push(JobHandle { shared: s });
        }
        let h1 = hs.pop().unwrap();
        let h0 = hs.pop().unwrap();
        let j = loom::thread::spawn(move || h0.join());
        assert_eq!(h1.join(), Some(1));
        assert_eq!(j.join().unwrap(), Some(0));
        drop(tx);
        worker.join().unwrap();
        assert_eq!(tokens.load(Ordering::SeqCst), 0);
    });
}
