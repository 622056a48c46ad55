//! Who waits for whom: the blocking waits the library makes on another thread's progress (a
//! release waiting for a worker's jobs, a join waiting for a job, a second release waiting for
//! the first), recorded so that a wait which would close a circle is never entered.
//!
//! Every thread waits for at most one thing at a time, so the record is a map from a waiting
//! thread to the thread it waits for. Each wait is checked before it is recorded, under one
//! lock: the map never holds a circle, the walk along it ends, and of two threads about to wait
//! for each other exactly one sees the circle. What that thread does instead is its caller's
//! choice: a release hands the rest of its work to the worker it would have waited for, a join
//! is refused (`Logic`).
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;

/// The threads waiting for one release to finish (a second `release()` each), changed under the
/// release's own lock. Their count: with none, the release notifies nobody (a notify is a system
/// call even with no waiter). Their ids: a release that hands its rest to another thread moves
/// their recorded waits to it at once ([`retarget`]), so that none of them still seems to wait
/// for the thread that handed off when that thread goes on to wait for one of them.
#[derive(Default)]
pub(crate) struct Waiters {
    count: AtomicUsize,
    ids: Mutex<Vec<ThreadId>>,
}

impl Waiters {
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn ids(&self) -> MutexGuard<'_, Vec<ThreadId>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread counted among the waiters while the result lives: made under the
    /// release's lock, so that no notifier misses it.
    pub(crate) fn enter(&self) -> Counted<'_> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ids().push(std::thread::current().id());
        Counted(self)
    }
}

/// A waiter counted in (see [`Waiters::enter`]).
pub(crate) struct Counted<'a>(&'a Waiters);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let mut ids = self.0.ids();
        if let Some(at) = ids.iter().position(|id| *id == me) {
            ids.swap_remove(at);
        }
        drop(ids);
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

static WAITS: Mutex<Option<HashMap<ThreadId, ThreadId>>> = Mutex::new(None);

/// The calling thread's recorded wait, removed when dropped (after the wait ended).
#[must_use = "the wait is recorded only while this lives"]
pub(crate) struct Waiting(ThreadId);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(map) = WAITS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            map.remove(&self.0);
        }
    }
}

/// Records that the calling thread is about to block until thread `on` makes progress. `None`
/// when `on` is the calling thread or already waits, directly or through others, for the
/// calling thread: that wait would never end.
pub(crate) fn wait_for(on: ThreadId) -> Option<Waiting> {
    let me = std::thread::current().id();
    let mut guard = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    let mut at = on;
    loop {
        if at == me {
            return None;
        }
        match map.get(&at) {
            Some(&next) => at = next,
            None => break,
        }
    }
    map.insert(me, on);
    Some(Waiting(me))
}

/// Whether some thread waits, directly or through others, for thread `on`: a wait of `on` for
/// something that one of those threads holds (a read lock: see `resources.rs`) would never end.
pub(crate) fn awaited(on: ThreadId) -> bool {
    let guard = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(map) = guard.as_ref() else { return false };
    // The map holds no circle (`wait_for`), so every walk ends.
    map.keys().any(|&start| {
        let mut at = start;
        loop {
            match map.get(&at) {
                Some(&next) if next == on => return true,
                Some(&next) => at = next,
                None => return false,
            }
        }
    })
}

/// Why [`read_behind_writer`] gave up.
pub(crate) enum Behind {
    /// `closing` was raised: a release takes the objects.
    Closing,
    /// The writer waits for this thread (`refuse` said so): the wait would never end.
    Refused,
}

/// Takes a read guard of `lock` behind the writer now holding it, polling rather than blocking:
/// a reader blocked in the lock is in no recorded wait, so a writer that then waited for the
/// reader's thread (an exclusive lend joining the job making the read) waited for ever (the
/// fourteenth audit). Gives up when `closing` is raised, or once `refuse` says (after 2 ms) the
/// writer waits for this thread; behind any other writer it waits, as a blocking read would.
/// Polls every tenth of the time waited so far, 50 µs to 1 ms (a lend may last long).
pub(crate) fn read_behind_writer<'a, T>(
    lock: &'a std::sync::RwLock<T>,
    closing: &std::sync::atomic::AtomicBool,
    refuse: impl Fn() -> bool,
) -> Result<std::sync::RwLockReadGuard<'a, T>, Behind> {
    use std::sync::TryLockError::{Poisoned, WouldBlock};
    use std::time::{Duration, Instant};
    let start = Instant::now();
    loop {
        if closing.load(Ordering::Acquire) {
            return Err(Behind::Closing);
        }
        match lock.try_read() {
            Ok(guard) => return Ok(guard),
            Err(Poisoned(p)) => return Ok(p.into_inner()),
            Err(WouldBlock) if start.elapsed() >= Duration::from_millis(2) && refuse() => return Err(Behind::Refused),
            Err(WouldBlock) if start.elapsed() < Duration::from_millis(1) => std::thread::yield_now(),
            Err(WouldBlock) => std::thread::sleep((start.elapsed() / 10).clamp(Duration::from_micros(50), Duration::from_millis(1))),
        }
    }
}

/// Whether thread `from` waits, directly or through others, for thread `on`.
pub(crate) fn waits_for(from: ThreadId, on: ThreadId) -> bool {
    let guard = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(map) = guard.as_ref() else { return false };
    // The map holds no circle (`wait_for`), so the walk ends.
    let mut at = from;
    while let Some(&next) = map.get(&at) {
        if next == on {
            return true;
        }
        at = next;
    }
    false
}

/// Moves the recorded waits of `waiters` that are for thread `from` to thread `to` (the thread
/// that now does `from`'s work). A wait whose move would close a circle (`to` waits, directly or
/// through others, for that waiter) is forgotten instead: the map never holds a circle, `from`
/// no longer looks awaited, and the waiter, woken by its caller, checks its wait again and finds
/// the circle itself.
pub(crate) fn retarget(waiters: &[ThreadId], from: ThreadId, to: ThreadId) {
    let mut guard = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(map) = guard.as_mut() else { return };
    for w in waiters {
        if map.get(w) != Some(&from) {
            continue;
        }
        let mut at = to;
        let circle = loop {
            if at == *w {
                break true;
            }
            match map.get(&at) {
                Some(&next) => at = next,
                None => break false,
            }
        };
        if circle {
            map.remove(w);
        } else {
            map.insert(*w, to);
        }
    }
}

/// A thread polling for the uses in flight of resources `polls_for` (a release, an exclusive
/// lend: they poll rather than queue for the write lock; or a use waiting for the read lock
/// while a writer holds it), holding uses of `holds` meanwhile.
struct Poll {
    thread: ThreadId,
    polls_for: u64,
    holds: Vec<u64>,
}

static POLLS: Mutex<Vec<Poll>> = Mutex::new(Vec::new());

/// The calling thread's recorded poll, removed when dropped.
#[must_use = "the poll is recorded only while this lives"]
pub(crate) struct Polling(ThreadId);

impl Drop for Polling {
    fn drop(&mut self) {
        POLLS.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p.thread != self.0);
    }
}

/// Records that the calling thread polls for the uses in flight of resources `id` while it
/// holds uses of `held` (its own, `holding::held_ids`). `None` when that poll would never end:
/// a thread polling for one of `held` holds a use of `id`, directly or through other polling
/// threads (two threads, each inside a lend of one object, releasing the other's). A poll is
/// only seen by polls: a use is held by a thread that is either running (it will let go),
/// polling or waiting for a read lock (recorded here), or waiting in `wait_for` (`awaited`
/// covers that for a release and an exclusive lend).
/// Checked and recorded under one lock, so of two polls closing a circle exactly one is refused.
pub(crate) fn poll_for(id: u64, held: &[u64]) -> Option<Polling> {
    let me = std::thread::current().id();
    let mut polls = POLLS.lock().unwrap_or_else(|e| e.into_inner());
    // The polling threads this one waits for, through the resources each polls for in turn.
    let mut reached = vec![false; polls.len()];
    let mut waiting_on = vec![id];
    while let Some(x) = waiting_on.pop() {
        for (i, p) in polls.iter().enumerate() {
            if !reached[i] && p.holds.contains(&x) {
                if held.contains(&p.polls_for) {
                    return None;
                }
                reached[i] = true;
                waiting_on.push(p.polls_for);
            }
        }
    }
    polls.push(Poll { thread: me, polls_for: id, holds: held.to_vec() });
    Some(Polling(me))
}

/// The thread `waiter`'s recorded wait is for, if any.
#[cfg(test)]
fn recorded(waiter: ThreadId) -> Option<ThreadId> {
    WAITS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&waiter).copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc, Barrier};

    #[test]
    fn a_thread_is_awaited_by_a_direct_waiter_and_through_a_chain_and_no_longer_once_the_wait_ended() {
        let me = std::thread::current().id();
        assert!(!awaited(me));
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        // B waits for this thread; C waits for B.
        let b = std::thread::spawn(move || {
            let w = wait_for(me);
            tx.send((std::thread::current().id(), w.is_some())).unwrap();
            go_rx.recv().unwrap();
            drop(w);
        });
        let (bid, entered) = rx.recv().unwrap();
        assert!(entered);
        assert!(awaited(me), "B waits for this thread");
        assert!(!awaited(bid), "nobody waits for B yet");
        let (ctx, crx) = mpsc::channel();
        let (cgo_tx, cgo_rx) = mpsc::channel::<()>();
        let c = std::thread::spawn(move || {
            let w = wait_for(bid);
            ctx.send(w.is_some()).unwrap();
            cgo_rx.recv().unwrap();
            drop(w);
        });
        assert!(crx.recv().unwrap());
        assert!(awaited(bid) && awaited(me), "C waits for B, and through B for this thread");
        cgo_tx.send(()).unwrap();
        c.join().unwrap();
        go_tx.send(()).unwrap();
        b.join().unwrap();
        assert!(!awaited(me), "both waits ended");
    }

    #[test]
    fn a_retargeted_wait_is_for_the_new_thread_and_only_the_named_waiters_move() {
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let mut threads = Vec::new();
        let go_rx = Arc::new(std::sync::Mutex::new(go_rx));
        // Two threads wait for this one.
        for _ in 0..2 {
            let (tx, go_rx) = (tx.clone(), go_rx.clone());
            threads.push(std::thread::spawn(move || {
                let w = wait_for(me);
                tx.send(std::thread::current().id()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
                drop(w);
            }));
        }
        let (a, b) = (rx.recv().unwrap(), rx.recv().unwrap());
        let (ntx, nrx) = mpsc::channel();
        let (ngo_tx, ngo_rx) = mpsc::channel::<()>();
        let new = std::thread::spawn(move || {
            ntx.send(std::thread::current().id()).unwrap();
            ngo_rx.recv().unwrap();
        });
        let to = nrx.recv().unwrap();
        retarget(&[a], me, to);
        assert!(awaited(to), "a waits for the new thread now");
        assert!(awaited(me), "b still waits for this thread");
        retarget(&[b], me, to);
        assert!(!awaited(me), "nobody waits for this thread any more");
        assert!(wait_for(a).is_some(), "this thread may wait for a: a waits for the new thread, not for it");
        go_tx.send(()).unwrap();
        go_tx.send(()).unwrap();
        ngo_tx.send(()).unwrap();
        for t in threads {
            t.join().unwrap();
        }
        new.join().unwrap();
    }

    #[test]
    fn a_wait_whose_move_would_close_a_circle_is_forgotten_not_moved() {
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        // W waits for this thread.
        let w = std::thread::spawn(move || {
            let rec = wait_for(me);
            tx.send((std::thread::current().id(), rec.is_some())).unwrap();
            go_rx.recv().unwrap();
            drop(rec);
        });
        let (wid, entered) = rx.recv().unwrap();
        assert!(entered);
        // T waits for W: moving W's wait to T would make W → T → W.
        let (ttx, trx) = mpsc::channel();
        let (tgo_tx, tgo_rx) = mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let rec = wait_for(wid);
            ttx.send((std::thread::current().id(), rec.is_some())).unwrap();
            tgo_rx.recv().unwrap();
            drop(rec);
        });
        let (tid, entered) = trx.recv().unwrap();
        assert!(entered);
        retarget(&[wid], me, tid);
        assert_eq!(recorded(wid), None, "the move would close a circle: W's wait is forgotten, not moved");
        assert!(!awaited(tid), "nobody waits for T");
        assert!(!awaited(me), "nor for this thread any more");
        tgo_tx.send(()).unwrap();
        t.join().unwrap();
        go_tx.send(()).unwrap();
        w.join().unwrap();
    }

    /// Keeps a poll recorded on a thread of its own until told.
    fn poll_on_a_thread(id: u64, held: Vec<u64>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let p = poll_for(id, &held);
            tx.send(p.is_some()).unwrap();
            go_rx.recv().unwrap();
            drop(p);
        });
        assert!(rx.recv().unwrap(), "the poll was recorded");
        (go_tx, t)
    }

    #[test]
    fn a_poll_for_a_use_held_by_a_thread_polling_for_one_of_ours_is_refused_directly_and_through_others() {
        // Ids of their own: other tests' polls share the record.
        let (a, b, c, d) = (1 << 40, (1 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3);
        // T1 polls for a while holding b.
        let (go1, t1) = poll_on_a_thread(a, vec![b]);
        assert!(poll_for(b, &[a]).is_none(), "this thread holds a and waits for b, which T1 holds while it waits for a");
        assert!(poll_for(b, &[c]).is_some(), "holding c only: T1 does not wait for this thread");
        // T2 polls for c while holding d: this thread, holding a, polling for d waits for T2,
        // which waits (for c) for nobody polling; no circle.
        let (go2, t2) = poll_on_a_thread(c, vec![d]);
        assert!(poll_for(d, &[a]).is_some());
        // Through two: T3 polls for b holding c; polling for d while holding a now reaches
        // T2 (holds d) → c → T3 (holds c) → b → T1 (holds b) → a, which this thread holds.
        let (go3, t3) = poll_on_a_thread(b, vec![c]);
        assert!(poll_for(d, &[a]).is_none(), "a circle through T2, T3 and T1");
        for (go, t) in [(go1, t1), (go2, t2), (go3, t3)] {
            go.send(()).unwrap();
            t.join().unwrap();
        }
        assert!(poll_for(b, &[a]).is_some(), "the polls ended: no circle");
    }

    #[test]
    fn waiting_for_oneself_is_a_circle() {
        assert!(wait_for(std::thread::current().id()).is_none());
    }

    #[test]
    fn of_two_threads_waiting_for_each_other_exactly_one_is_refused() {
        for _ in 0..50 {
            let barrier = Arc::new(Barrier::new(2));
            let (id_tx, id_rx) = mpsc::channel();
            let (ok_tx, ok_rx) = mpsc::channel();
            let spawn =
                |barrier: Arc<Barrier>, id_tx: mpsc::Sender<ThreadId>, ok_tx: mpsc::Sender<bool>, peer: mpsc::Receiver<ThreadId>| {
                    std::thread::spawn(move || {
                        id_tx.send(std::thread::current().id()).unwrap();
                        let other = peer.recv().unwrap();
                        barrier.wait();
                        let w = wait_for(other);
                        ok_tx.send(w.is_some()).unwrap();
                        // Hold the record until both decided, as a real wait would.
                        barrier.wait();
                        drop(w);
                    })
                };
            let (a_peer_tx, a_peer_rx) = mpsc::channel();
            let (b_peer_tx, b_peer_rx) = mpsc::channel();
            let a = spawn(barrier.clone(), id_tx.clone(), ok_tx.clone(), a_peer_rx);
            let b = spawn(barrier, id_tx, ok_tx, b_peer_rx);
            let (x, y) = (id_rx.recv().unwrap(), id_rx.recv().unwrap());
            // Each learns the other's id.
            let (ida, idb) = if x == a.thread().id() { (x, y) } else { (y, x) };
            a_peer_tx.send(idb).unwrap();
            b_peer_tx.send(ida).unwrap();
            let entered = [ok_rx.recv().unwrap(), ok_rx.recv().unwrap()];
            a.join().unwrap();
            b.join().unwrap();
            assert_eq!(entered.iter().filter(|e| **e).count(), 1, "exactly one of the two waits is entered: {entered:?}");
        }
    }

    #[test]
    fn a_chain_through_a_third_thread_is_a_circle_and_an_ended_wait_is_forgotten() {
        let me = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        // Thread B waits for thread C, which waits for this thread.
        let c = std::thread::spawn(move || {
            let w = wait_for(me);
            tx.send((std::thread::current().id(), w.is_some())).unwrap();
            go_rx.recv().unwrap();
            drop(w);
        });
        let (cid, entered) = rx.recv().unwrap();
        assert!(entered);
        let (btx, brx) = mpsc::channel();
        let (bgo_tx, bgo_rx) = mpsc::channel::<()>();
        let b = std::thread::spawn(move || {
            let w = wait_for(cid);
            btx.send((std::thread::current().id(), w.is_some())).unwrap();
            bgo_rx.recv().unwrap();
            drop(w);
        });
        let (bid, entered) = brx.recv().unwrap();
        assert!(entered);
        assert!(wait_for(bid).is_none(), "this thread → B → C → this thread");
        go_tx.send(()).unwrap();
        c.join().unwrap();
        let w = wait_for(bid);
        assert!(w.is_some(), "C's wait ended: no circle any more");
        drop(w);
        bgo_tx.send(()).unwrap();
        b.join().unwrap();
    }
}
