//! The library release thread: releases started by `Drop` run here, so a dropping thread never
//! blocks on the GPU. Each queued release is registered with the exit machinery.
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Release = Box<dyn FnOnce() + Send + 'static>;

struct Queued {
    release: Release,
    _token: raft_exit::ReleaseToken,
}

fn queue() -> Option<&'static Mutex<mpsc::Sender<Queued>>> {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Queued>>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Queued>();
            std::thread::Builder::new()
                .name("raft-release".into())
                .spawn(move || {
                    raft_exit::mark_library_thread();
                    while let Ok(q) = rx.recv() {
                        // A failing release must not stop the ones behind it.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(q.release));
                        // `_token` drops here: the release has ended.
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Queues `release` on the release thread. Never blocks on the GPU, never panics; when no
/// thread can run it (none could be started), the native objects are leaked instead.
pub(crate) fn enqueue(label: raft_exit::Label, release: Release) {
    let queued = Queued { release, _token: raft_exit::ReleaseToken::register(label) };
    let Some(q) = queue() else {
        log::warn!(target: "raft", "no release thread could be started: {label} leaked");
        std::mem::forget(queued.release);
        return;
    };
    let sent = q.lock().unwrap_or_else(|e| e.into_inner()).send(queued);
    if let Err(mpsc::SendError(q)) = sent {
        std::mem::forget(q.release);
    }
}
