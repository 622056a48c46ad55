//! RMM's per-device current resource as values (`current`, `set_current`, `reinitialize`), the
//! default this library installs on a device's first resources, and its exit teardown.
use super::kind::MemoryResourceKind;
use super::options::RmmOptions;
use super::resource::{self, route_releases, MemoryResource};
use crate::device::check_device;
use crate::error::{Error, Result};
use crate::result;
use crate::result::mr::{self, NativeMr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, OnceLock};

/// `device`'s current RMM resource, shared (see [`MemoryResource::current`]).
pub fn current(device: usize) -> Result<MemoryResource> {
    MemoryResource::current(device).map_err(|e| e.with_who("raft::memory::current"))
}

/// Makes `resource` `device`'s current RMM resource (`rmm::mr::set_per_device_resource`) and
/// returns the one it replaced. Allocations already made keep their own resource alive.
///
/// RAFT's and cuVS's own allocations (an index's graph, the workspace of resources lent to
/// RAFT) hold a reference into RMM's map entry rather than the resource, and RMM replaces the
/// entry's object in place: so the current resource is not replaced while resources of the
/// device that were lent to RAFT or cuVS code are alive and not released. Choose the resource
/// before that work, as RMM's own documentation asks of any replacement. Any lend counts,
/// however short (RAFT keeps what it made in the object, a workspace say), until the resources
/// are released; resources released or dropped just before are waited for (their release may
/// still be running on a release thread, up to 5 s).
///
/// # Errors
/// `Logic` when `resource` was made for another device, the device does not exist, or
/// resources on the device were lent to RAFT or cuVS code ([`DeviceResources::with_raft_resources`](crate::DeviceResources::with_raft_resources),
/// raft-cuvs, raft-comms) and are not released.
pub fn set_current(device: usize, resource: &MemoryResource) -> Result<MemoryResource> {
    const WHO: &str = "raft::memory::set_current";
    check_device(WHO, device)?;
    if resource.device() != device {
        return Err(Error::logic(WHO, format!("a memory resource of device {} cannot serve device {device}", resource.device())));
    }
    // Lent resources released or dropped a moment ago may still be on a release thread, and
    // count until destroyed: the device's pending releases run first.
    if result::lent::lent_to_raft_on(device) > 0 {
        crate::release::drain_device(device, false);
    }
    let previous = MemoryResource::wrap(WHO, resource.native.set_current(WHO)?)?;
    let _ = forget_ours_if_replaced(device, &previous, resource);
    Ok(previous)
}

/// Lets go of the copy of the default pool this library keeps for the exit's teardown once that
/// pool is replaced: the caller's handle (`previous`) is then its last but the arrays', so the
/// pool is retired and its memory given back when they go, instead of staying reserved to the
/// exit (its release threshold is the device's size). Returns whether it was.
fn forget_ours_if_replaced(device: usize, previous: &MemoryResource, now: &MemoryResource) -> bool {
    let Some(slot) = per_device().get(device) else { return false };
    let mut ours = slot.ours.lock().unwrap_or_else(|e| e.into_inner());
    let is_ours = |r: &MemoryResource| ours.as_ref().is_some_and(|o| o.same_as(r).unwrap_or(false));
    // Replaced by another resource (`set_current(d, &current(d)?)` replaces it by itself).
    if !is_ours(previous) || is_ours(now) {
        return false;
    }
    let gone = ours.take();
    drop(ours); // the lock first: the last handle of a resource queues its release
    drop(gone);
    true
}

/// What [`trim_retired_pools`] did: bytes given back to the driver, and bytes the retired pools
/// still hold (memory whose stream-ordered free has not run yet: it goes back at the next
/// synchronisation, or the next trim).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetiredPoolsTrim {
    pub released: usize,
    pub still_held: usize,
}

/// Gives the unused memory of every retired CUDA async pool back to the driver now, without
/// waiting for anything (the closest thing to `torch.cuda.empty_cache()` for pools this library
/// made and let go).
///
/// An async pool whose last copy (handle, array, adaptor, RMM's map entry) has gone is never
/// destroyed: the driver crashes or hangs when a pool is destroyed while a stream-ordered free
/// into it is still queued on a stream that goes on working (GPU runs 42, 45, 46, 48). It is
/// retired instead: its release threshold set to 0 and trimmed, and the next async pool made on
/// its device is that pool again (see [`crate::Stats::async_pools_reused`]). Allocations that fail
/// with `OutOfMemory` trim them on their own before their retry.
///
/// # Errors
/// `Cuda` when the driver refuses a trim (every pool is still tried).
pub fn trim_retired_pools() -> Result<RetiredPoolsTrim> {
    let (released, held) = mr::trim_retired("raft::memory::trim_retired_pools")?;
    Ok(RetiredPoolsTrim { released: released as usize, still_held: held as usize })
}

/// The address of RMM's per-device resource map as this library binds it. Every library in the
/// process that uses RMM (librmm itself, cuVS, a Python extension) should see the same address:
/// then a resource one of them installs is the one the others allocate from.
pub fn rmm_map_address() -> Result<usize> {
    result::rmm_map_address("raft::memory::rmm_map_address")
}

struct PerDevice {
    once: Once,
    installed: AtomicBool,
    /// The pool this library installed, to recognise it at exit (and only it).
    ours: Mutex<Option<MemoryResource>>,
}

fn per_device() -> &'static [PerDevice] {
    static DEVICES: OnceLock<Vec<PerDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let n = crate::device::device_count_for("memory").unwrap_or(0);
        (0..n).map(|_| PerDevice { once: Once::new(), installed: AtomicBool::new(false), ours: Mutex::new(None) }).collect()
    })
}

/// Applies the default-resource rule on the first resources of `device` (once per process):
/// the `RAFT_RMM_*` setup when any of those variables is set, else the async pool. A bad
/// `RAFT_RMM_*` value is the `Logic` error of every `new()`.
pub(crate) fn ensure_default(who: &'static str, device: usize) -> Result<()> {
    route_releases(); // the default path's copies of the current resource are released there too
    if per_device().get(device).is_some_and(|slot| slot.once.is_completed()) {
        return Ok(()); // applied already (so the variables read well: they are read once)
    }
    let configured = RmmOptions::from_env().map_err(|e| e.with_who(who))?;
    let Some(slot) = per_device().get(device) else { return Ok(()) };
    // A failure is logged once the `Once` is done: a logger that panics inside `call_once`
    // would poison it, and every later `new()` on the device would panic (the fourteenth audit).
    let mut failed = None;
    slot.once.call_once(|| {
        let installed = match &configured {
            Some(options) if still_initial(device) => reinitialize(device, options).map(|_| true),
            Some(_) => Ok(false),
            None => result::install_default(who, device),
        };
        match installed {
            Ok(true) => {
                *slot.ours.lock().unwrap_or_else(|e| e.into_inner()) = MemoryResource::current(device).ok();
                slot.installed.store(true, Ordering::Release);
            }
            Ok(false) => {}
            Err(e) => failed = Some(e),
        }
    });
    if let Some(e) = failed {
        log::warn!(target: "raft", "keeping the memory resource of device {device}: {e}");
    }
    Ok(())
}

/// Whether RMM's initial resource is still current on `device` (nobody chose another).
fn still_initial(device: usize) -> bool {
    let initial = MemoryResource::cuda(device);
    match (MemoryResource::current(device), initial) {
        (Ok(current), Ok(initial)) => current.kind == MemoryResourceKind::Cuda && current.same_as(&initial).unwrap_or(false),
        _ => false,
    }
}

/// `rmm.reinitialize(...)` for one device: builds the resource `options` describe and makes it
/// `device`'s current; returns the one it replaced. Arrays already allocated keep theirs.
/// Refused as [`set_current`] is.
pub fn reinitialize(device: usize, options: &RmmOptions) -> Result<MemoryResource> {
    const WHO: &str = "raft::memory::reinitialize";
    let mr = options.build(device).map_err(|e| e.with_who(WHO))?;
    set_current(device, &mr).map_err(|e| e.with_who(WHO))
}

/// Whether this library installed the async pool on `device`.
pub fn installed_default(device: usize) -> bool {
    per_device().get(device).is_some_and(|s| s.installed.load(Ordering::Acquire))
}

/// The exit teardown: where the pool this library installed is still current, puts RMM's
/// initial resource back; then lets go of the pool, destroying it while CUDA is still up. A
/// resource the user installed is left as it is.
fn teardown() {
    for (device, slot) in per_device().iter().enumerate() {
        mr::forget_current(device); // the kept copy of the current resource goes first
        let ours = slot.ours.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(ours) = ours else { continue };
        let still_current = MemoryResource::current(device).and_then(|c| c.same_as(&ours)).unwrap_or(false);
        if still_current {
            let _ = NativeMr::reset_current("exit", device);
        }
        drop(ours);
    }
}

/// [`resource::register_teardown`], with the step that releases every live resources object
/// and the per-device defaults' step of this file.
pub(crate) fn register_teardown_releasing(release_all_live: fn()) {
    resource::set_defaults_teardown(teardown);
    resource::register_teardown_releasing(release_all_live);
}
