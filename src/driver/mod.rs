//! Safe wrappers over the raw driver API: one type per driver object, each released on
//! drop, each call checked. Everything above this layer is free of `unsafe` except where it
//! hands device pointers to these wrappers.

mod context;
mod device;
mod event;
mod module;
mod per_context;
mod pinned;
mod poisoning;
mod pool;
mod stream;

pub use context::PrimaryContext;
pub use device::{device_count, DeviceInfo};
pub use event::Event;
pub use module::{Function, Module};
pub(crate) use per_context::PerContext;
pub(crate) use pinned::is_page_locked;
pub use pinned::{PinnedFlags, PinnedMemory};
pub(crate) use poisoning::{note_sticky, Poisoning};
pub use pool::{MemPool, PoolStats};
pub use stream::Stream;
use stream::StreamMark;

use once_cell::sync::OnceCell;

use crate::Result;

/// Compiles only for a type with its own `Drop`.
#[allow(drop_bounds)]
const fn released_on_drop<T: Drop>() {}

// Every wrapper of a driver object gives it back when dropped. A build without one of
// these `Drop`s fails here: 1995303 lost `Stream`'s, and every stream leaked until the
// fault-injection run found the memory missing.
const _: () = {
    released_on_drop::<PrimaryContext>();
    released_on_drop::<Event>();
    released_on_drop::<Module>();
    released_on_drop::<PinnedMemory>();
    released_on_drop::<MemPool>();
    released_on_drop::<Stream>();
};

/// The loaded driver, initialised once per process. After the first call this is one
/// load of a ready flag: it runs several times in every HAL operation.
#[inline]
pub(crate) fn api() -> Result<&'static cuda_sys::Driver> {
    static READY: OnceCell<Result<&'static cuda_sys::Driver, cuda_sys::Error>> = OnceCell::new();
    match READY.get_or_init(load_and_init) {
        Ok(driver) => Ok(driver),
        Err(e) => Err(e.clone().into()),
    }
}

/// Loads the driver and calls `cuInit`; a failure of either is kept for every later call.
#[cold]
fn load_and_init() -> Result<&'static cuda_sys::Driver, cuda_sys::Error> {
    let driver = cuda_sys::driver()?;
    // SAFETY: cuInit takes a flags word, which must be 0.
    unsafe { driver.cuInit(0) }?;
    Ok(driver)
}
