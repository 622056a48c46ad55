use loom::sync::atomic::Ordering;
use loom::sync::{Arc, Condvar, Mutex};
use models::release::Pool;

/// The out-of-memory wait against one release finishing on its own thread: the wait ends on the
/// notification alone (no deadline needed), whatever the interleaving.
#[test]
fn drain_vs_one_settle() {
    models::check("drain_vs_one_settle", || {
        let pool = Arc::new(Pool::new());
        pool.add_own_thread(0);
        let p = pool.clone();
        let t = loom::thread::spawn(move || p.finish_own_thread(0));
        pool.drain();
        t.join().unwrap();
        assert_eq!(pool.ledger.releases.load(Ordering::SeqCst), 0);
    });
}

/// R1 pending at the call finishes on its thread; meanwhile another thread queues R2, a long
/// release that ends only after the drain returned (a flag the drain's caller raises). The drain
/// was owed only R1: it must return once R1 finished. A loom deadlock here is a drain that in
/// the real code sleeps until its deadline (OOM_WAIT, 5 s) although everything it waited for
/// has finished.
#[test]
fn drain_owed_one_release_while_another_is_queued() {
    models::check("drain_owed_one_release_while_another_is_queued", || {
        let pool = Arc::new(Pool::new());
        pool.add_own_thread(0); // R1
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pool.clone();
        let t1 = loom::thread::spawn(move || p.finish_own_thread(0)); // R1 ends
        let called = Arc::new((Mutex::new(false), Condvar::new()));
        let (p, g, c) = (pool.clone(), go.clone(), called.clone());
        let t2 = loom::thread::spawn(move || {
            let mut open = c.0.lock().unwrap();
            while !*open {
                open = c.1.wait(open).unwrap(); // R2 is queued after the drain's call
            }
            drop(open);
            p.add_own_thread(0); // R2 queued
            let mut up = g.0.lock().unwrap();
            while !*up {
                up = g.1.wait(up).unwrap(); // R2 runs long: until the drain returned
            }
            drop(up);
            p.finish_own_thread(0);
        });
        pool.drain_with(&|| {
            *called.0.lock().unwrap() = true;
            called.1.notify_all();
        });
        *go.0.lock().unwrap() = true;
        go.1.notify_all();
        t1.join().unwrap();
        t2.join().unwrap();
    });
}
