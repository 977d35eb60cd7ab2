//! Safe wrappers over the raw driver API: one type per driver object, each released on
//! drop, each call checked. Everything above this layer is free of `unsafe` except where it
//! hands device pointers to these wrappers.

mod context;
mod device;
mod event;
mod module;
mod pinned;
mod pool;
mod stream;

pub use context::PrimaryContext;
pub use device::{device_count, DeviceInfo};
pub use event::Event;
pub use module::{Function, Module};
pub use pinned::{PinnedFlags, PinnedMemory};
pub use pool::{MemPool, PoolStats};
pub use stream::Stream;

use once_cell::sync::OnceCell;

use crate::Result;

/// The loaded driver, initialised once per process.
pub(crate) fn api() -> Result<&'static cuda_sys::Driver> {
    static INIT: OnceCell<Result<(), cuda_sys::Error>> = OnceCell::new();
    let driver = cuda_sys::driver()?;
    INIT.get_or_init(|| {
        // SAFETY: cuInit takes a flags word, which must be 0.
        unsafe { driver.cuInit(0) }
    })
    .clone()?;
    Ok(driver)
}
