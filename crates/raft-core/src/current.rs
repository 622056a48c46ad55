//! Per-thread default resources: each thread gets its own for each device, made on first use
//! and dropped when the thread ends. Also `AsResources` ("a device number or resources"), for
//! numbers and resources; `DeviceVec`'s impl is beside its type, a layer above.
use crate::error::{Error, Result};
use crate::resources::DeviceResources;
use std::cell::RefCell;

thread_local! {
    static DEFAULTS: RefCell<Vec<Option<DeviceResources>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's default resources for `device`.
///
/// The same thread gets the same resources on every call; another thread gets its own. Once
/// they are released, the next call makes new ones. When the thread ends its defaults are
/// dropped, and released (on the library release thread) unless another handle still holds
/// them. A repeated call is a thread-local read: no lock, no CUDA call.
///
/// # Errors
/// `Logic` for a device that does not exist; `Cuda` when there is no driver or CUDA fails.
pub fn current_device_resources(device: usize) -> Result<DeviceResources> {
    const WHO: &str = "current_device_resources";
    let hit = DEFAULTS.try_with(|d| match d.borrow().get(device) {
        Some(Some(r)) if !r.is_released() => Some(r.clone()),
        _ => None,
    });
    match hit {
        Ok(Some(r)) => return Ok(r),
        Ok(None) => {}
        Err(_) => return Err(Error::logic(WHO, "the calling thread is exiting")),
    }
    let fresh = DeviceResources::create(WHO, device)?;
    let stored = fresh.clone();
    let old = DEFAULTS.try_with(|d| {
        let mut d = d.borrow_mut();
        if d.len() <= device {
            d.resize(device + 1, None);
        }
        d[device].replace(stored)
    });
    drop(old); // a released default, dropped outside the borrow
    Ok(fresh)
}

/// "A device number or resources": APIs taking `impl AsResources` accept either (and a
/// [`DeviceVec`](crate::DeviceVec), meaning its resources). A number yields the calling thread's
/// default resources for that device ([`current_device_resources`]); resources yield
/// themselves. APIs that need only the device (page-locked host memory, which belongs to no
/// stream) ask [`as_device`](Self::as_device), which makes no resources for a number.
pub trait AsResources {
    /// The resources meant.
    fn as_resources(&self) -> Result<DeviceResources>;

    /// The device meant. The default asks [`as_resources`](Self::as_resources); a number
    /// answers itself, making nothing.
    ///
    /// # Errors
    /// Those of `as_resources` where it is asked.
    fn as_device(&self) -> Result<usize> {
        self.as_resources().map(|r| r.device())
    }
}

impl AsResources for usize {
    fn as_resources(&self) -> Result<DeviceResources> {
        current_device_resources(*self)
    }

    fn as_device(&self) -> Result<usize> {
        Ok(*self)
    }
}

impl AsResources for DeviceResources {
    fn as_resources(&self) -> Result<DeviceResources> {
        Ok(self.clone())
    }

    fn as_device(&self) -> Result<usize> {
        Ok(self.device())
    }
}

impl<T: AsResources + ?Sized> AsResources for &T {
    fn as_resources(&self) -> Result<DeviceResources> {
        (**self).as_resources()
    }

    fn as_device(&self) -> Result<usize> {
        (**self).as_device()
    }
}

#[cfg(test)]
mod tests {
    use super::AsResources;

    #[test]
    fn a_number_names_its_device_without_making_resources() {
        // No driver here: making resources would fail, so an answer proves none were made.
        assert_eq!(3usize.as_device().unwrap(), 3);
        assert_eq!((&&2usize).as_device().unwrap(), 2);
    }
}
