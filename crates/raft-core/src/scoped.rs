//! Scoped lifetime: `with_device_resources` releases its resources when the body returns, errs
//! or panics (the seed's `call-with-device-resources`).
use crate::resources::DeviceResources;

/// Resources released together at the end of [`with_device_resources`]: one object, a tuple,
/// an array or a `Vec` of them.
pub trait Scoped {
    /// Releases every resources object held.
    fn release_all(&self);
}

const WHO: &str = "with_device_resources";

impl Scoped for DeviceResources {
    fn release_all(&self) {
        self.release_logged(WHO)
    }
}

impl<const N: usize> Scoped for [DeviceResources; N] {
    fn release_all(&self) {
        self.iter().for_each(|r| r.release_logged(WHO))
    }
}

impl Scoped for Vec<DeviceResources> {
    fn release_all(&self) {
        self.iter().for_each(|r| r.release_logged(WHO))
    }
}

macro_rules! scoped_tuple {
    ($($t:ident . $i:tt),+) => {
        impl<$($t: Scoped),+> Scoped for ($($t,)+) {
            fn release_all(&self) {
                $(self.$i.release_all();)+
            }
        }
    };
}
scoped_tuple!(A.0, B.1);
scoped_tuple!(A.0, B.1, C.2);
scoped_tuple!(A.0, B.1, C.2, D.3);

/// Runs `body` with `resources`, then releases them: when `body` returns, also with an error,
/// and when it panics. Several resources (a tuple, an array, a `Vec`) are released together.
/// This gives their lifetime a clear timeline: GPU and driver state is freed at a known point,
/// not whenever the last handle happens to be dropped. A release error is logged (target
/// `raft`); call [`DeviceResources::release`] yourself to receive it.
///
/// ```no_run
/// # use raft_core::{with_device_resources, DeviceResources};
/// let finished = with_device_resources(DeviceResources::new()?, |r| r.clone());
/// assert!(finished.is_released());
/// # Ok::<(), raft_core::Error>(())
/// ```
pub fn with_device_resources<S: Scoped, R>(resources: S, body: impl FnOnce(&S) -> R) -> R {
    struct ReleaseOnExit<'a, S: Scoped>(&'a S);
    impl<S: Scoped> Drop for ReleaseOnExit<'_, S> {
        fn drop(&mut self) {
            self.0.release_all();
        }
    }
    let _release = ReleaseOnExit(&resources);
    body(&resources)
}
