//! How groups nest, checked before any collective (NCCL loaded, no GPU needed): a scoped group
//! refuses an unsafe `group` inside it (whose calls would be launched only at the scope's end,
//! after the inner closure's arrays may be gone), refuses to open inside another group, and the
//! thread is left with no group open afterwards. Skips where NCCL cannot be loaded.
mod common;

use raft_comms::{group, group_scope};
use raft_core::ErrorKind;

#[test]
fn groups_nest_only_where_every_array_outlives_the_launch() {
    if !common::have_nccl("groups_nest_only_where_every_array_outlives_the_launch") {
        return;
    }
    // An unsafe group inside a scoped one.
    // SAFETY: no collective is made inside.
    let e = group_scope(|_g| unsafe { group(|| Ok(())) }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().contains("group_scope"), "{e}");
    // A scoped group inside an unsafe one, and inside another scoped one.
    // SAFETY: as above.
    let e = unsafe { group(|| group_scope(|_g| Ok(()))) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    let e = group_scope(|_g| group_scope(|_h| Ok(()))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    // Nothing is left open: both forms work again, and nest the way they may.
    assert_eq!(group_scope(|_g| Ok(5)).unwrap(), 5);
    // SAFETY: as above.
    assert_eq!(unsafe { group(|| group(|| Ok(6))) }.unwrap(), 6);
}
