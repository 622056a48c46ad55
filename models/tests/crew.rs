use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use models::crew::Crew;

/// The copy's stack frame, as the crew sees it (loom tracks every access).
struct Frame(UnsafeCell<u32>);
unsafe impl Sync for Frame {}

/// Two copies posted one after the other to a crew of `max` threads (started by the first
/// copy). Each copy's `work` reads its own frame (a loom `UnsafeCell`), which the poster
/// overwrites the moment `run` returns: a crew thread still inside `work` then is a data race
/// loom reports (a use after the frame is gone). Checked too: no more callers than seats, and
/// nobody inside once `run` returned.
fn two_copies(max: usize, seats: usize) {
    models::check(&format!("two_copies(max {max}, seats {seats})"), move || {
        let crew: &'static Crew = Box::leak(Box::new(Crew::new(max)));
        for round in 0..2u32 {
            let frame = Frame(UnsafeCell::new(round));
            let inside = AtomicUsize::new(0);
            let calls = AtomicUsize::new(0);
            let work = || {
                inside.fetch_add(1, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::SeqCst);
                let fr = &frame;
                assert_eq!(fr.0.with(|f| unsafe { *f }), round);
                inside.fetch_sub(1, Ordering::SeqCst);
            };
            let r = crew.run(seats, &work, || 5u8);
            assert_eq!(r, Some(5));
            assert_eq!(inside.load(Ordering::SeqCst), 0);
            assert!(calls.load(Ordering::SeqCst) <= seats.min(max));
            frame.0.with_mut(|f| unsafe { *f = 99 }); // the frame is reused
        }
        crew.shutdown();
    });
}

#[test]
fn one_thread_two_copies() {
    two_copies(1, 1);
}

#[test]
fn two_threads_two_copies() {
    two_copies(2, 2);
}

/// A crew thread that went to sleep wakes for the next copy: `main` waits (spinning) until a crew
/// thread joined, so a lost wake-up is a loom deadlock / livelock.
#[test]
fn a_sleeping_thread_wakes_for_the_next_copy() {
    models::check(&format!("a_sleeping_thread_wakes_for_the_next_copy{}", ""), || {
        let crew: &'static Crew = Box::leak(Box::new(Crew::new(1)));
        for _ in 0..2 {
            let joined = AtomicUsize::new(0);
            let work = || {
                joined.fetch_add(1, Ordering::SeqCst);
            };
            crew.run(1, &work, || {
                while joined.load(Ordering::SeqCst) == 0 {
                    loom::thread::yield_now();
                }
            })
            .unwrap();
        }
        crew.shutdown();
    });
}
