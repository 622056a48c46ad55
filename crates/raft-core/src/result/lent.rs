//! Resources lent to RAFT or cuVS code, counted per device: while any is alive, the device's
//! entry in RMM's map is not replaced (see [`LENT_TO_RAFT`]). Names only the error layer, so
//! both the native resources (`mod.rs`, which count themselves in) and the memory resources
//! (`mr.rs`, which replace the entry) name it.
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Resources objects whose `raft::resources` was lent to RAFT or cuVS code (`lend.rs`: every
/// cuVS call, index and communicator goes through a lend) and is not destroyed yet, per device.
///
/// RAFT's and cuVS's own allocations hold `rmm::mr::get_current_device_resource_ref()` (RAFT's
/// `device_container_policy`, the workspace resource a `raft::resources` makes at its first
/// use): a reference to the object inside RMM's map entry (CCCL's `resource_ref` binds the
/// object an `any_resource` holds, stored inline), which `set_per_device_resource` replaces in
/// place (`std::exchange`). An index's graph freed after that went to the new resource, or to
/// an object of another type; a call in flight raced the exchange (the eighth audit). So the
/// entry is replaced (`set_current`, `reset_current`, the default's install) only while no such
/// object is alive on the device: checked and changed under this lock, which a lend takes to
/// count itself in before RAFT sees the pointer.
static LENT_TO_RAFT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn lent_to_raft() -> MutexGuard<'static, Vec<usize>> {
    LENT_TO_RAFT.lock().unwrap_or_else(|e| e.into_inner())
}

/// The count of `device` in the locked counts.
fn on(lent: &[usize], device: usize) -> usize {
    lent.get(device).copied().unwrap_or(0)
}

/// Counts resources on `device` in as lent to RAFT (once each, before the first lend).
pub(crate) fn count_lent_to_raft(device: usize, mark: &AtomicBool) {
    if mark.load(Ordering::Acquire) {
        return;
    }
    let mut lent = lent_to_raft();
    if !mark.swap(true, Ordering::AcqRel) {
        if lent.len() <= device {
            lent.resize(device + 1, 0);
        }
        lent[device] += 1;
    }
}

/// How many resources lent to RAFT are alive on `device` now.
pub(crate) fn lent_to_raft_on(device: usize) -> usize {
    on(&lent_to_raft(), device)
}

/// Counts lent resources out once their `raft::resources` is destroyed (or left to the OS).
pub(crate) fn count_out_lent_to_raft(device: usize) {
    if let Some(n) = lent_to_raft().get_mut(device) {
        *n = n.saturating_sub(1);
    }
}

/// The lock under which `device`'s map entry may be replaced: refused (`Logic`) while resources
/// lent to RAFT or cuVS code are alive there.
pub(crate) fn entry_free_to_replace(who: &'static str, device: usize) -> Result<MutexGuard<'static, Vec<usize>>> {
    let lent = lent_to_raft();
    match on(&lent, device) {
        0 => Ok(lent),
        n => Err(Error::logic(
            who,
            format!(
                "device {device}'s current resource cannot be replaced while RAFT or cuVS code may hold references to it: {n} resources object(s) on device {device} were lent to RAFT or cuVS (with_raft_resources, raft-cuvs, raft-comms) and are not released; set the current resource before lending resources, or release them first"
            ),
        )),
    }
}

/// Runs `install` (the default's install on `device`) unless resources lent to RAFT are alive
/// there (`Ok(false)`: the map keeps what it holds).
pub(crate) fn unless_lent_to_raft(device: usize, install: impl FnOnce() -> Result<bool>) -> Result<bool> {
    let lent = lent_to_raft();
    if on(&lent, device) > 0 {
        return Ok(false);
    }
    install() // under the lock: `lent` lives to the end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn the_entry_is_not_replaced_while_resources_lent_to_raft_are_counted_in() {
        // A device number of its own: no other test counts there.
        let device = 61;
        assert!(entry_free_to_replace("t", device).is_ok());
        let (a, b) = (AtomicBool::new(false), AtomicBool::new(false));
        count_lent_to_raft(device, &a);
        count_lent_to_raft(device, &a); // a second lend of the same resources counts once
        count_lent_to_raft(device, &b);
        let e = entry_free_to_replace("t", device).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert!(e.to_string().contains("2 resources object(s) on device 61 were lent"), "{e}");
        assert!(!unless_lent_to_raft(device, || Ok(true)).unwrap(), "no install while lent");
        assert!(entry_free_to_replace("t", device - 1).is_ok(), "other devices are free");
        count_out_lent_to_raft(device);
        assert!(entry_free_to_replace("t", device).is_err());
        count_out_lent_to_raft(device);
        assert!(entry_free_to_replace("t", device).is_ok());
        assert!(unless_lent_to_raft(device, || Ok(true)).unwrap());
    }
}
