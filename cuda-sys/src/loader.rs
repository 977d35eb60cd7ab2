//! Opens `libcuda` with `dlopen` and resolves the [`DriverApi`] table with `dlsym`.

use std::ffi::{CStr, CString};
use std::ops::Deref;

use once_cell::sync::OnceCell;

use crate::{DriverApi, Error};

/// Library names tried in order by [`Driver::load`], after [`LIBRARY_ENV`] if set.
pub const DEFAULT_LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Environment variable naming a driver library to try first (a path or a soname).
pub const LIBRARY_ENV: &str = "CUDA_HAL_LIBCUDA";

/// An opened driver library and its resolved entry points.
///
/// Dereferences to [`DriverApi`], so `driver.cuInit(0)` calls the driver.
///
/// The library is never closed, even when the `Driver` is dropped: once initialised, the
/// driver runs threads of its own in its code for the rest of the process.
pub struct Driver {
    path: String,
    api: DriverApi,
}

// SAFETY: the table holds plain function pointers, into a library that stays loaded, that
// the driver documents as callable from any thread.
unsafe impl Send for Driver {}
// SAFETY: see `Send`; nothing in `Driver` is mutated after construction.
unsafe impl Sync for Driver {}

impl Driver {
    /// Opens the system driver: `$CUDA_HAL_LIBCUDA` if set, then [`DEFAULT_LIBRARY_NAMES`].
    pub fn load() -> Result<Self, Error> {
        let mut names: Vec<String> = Vec::new();
        if let Ok(p) = std::env::var(LIBRARY_ENV) {
            if !p.is_empty() {
                names.push(p);
            }
        }
        names.extend(DEFAULT_LIBRARY_NAMES.iter().map(|s| s.to_string()));
        Self::load_from(&names)
    }

    /// Opens the first library of `names` that `dlopen` accepts and that exports `cuInit`.
    /// The error gives every name's reason.
    ///
    /// ```
    /// let err = cuda_sys::Driver::load_from(&["libdoes-not-exist.so"]).err().unwrap();
    /// assert!(matches!(err, cuda_sys::Error::DriverNotFound { .. }));
    /// // A library that is no CUDA driver is passed over.
    /// let err = cuda_sys::Driver::load_from(&["libm.so.6"]).err().unwrap();
    /// assert!(err.to_string().contains("not a CUDA driver"), "{err}");
    /// ```
    pub fn load_from<S: AsRef<str>>(names: &[S]) -> Result<Self, Error> {
        let mut tried = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        for name in names {
            let name = name.as_ref();
            tried.push(name.to_string());
            let Ok(c_name) = CString::new(name) else {
                reasons.push(format!("{name:?} contains a NUL byte"));
                continue;
            };
            // SAFETY: c_name is a valid C string; RTLD_NOW resolves the library's own
            // dependencies up front so failures show here, not at a later call.
            let handle =
                unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                reasons.push(last_dlerror());
                continue;
            }
            // A library that is no CUDA driver (a wrong `CUDA_HAL_LIBCUDA`) would make every
            // call a missing symbol: the next name is tried instead.
            // SAFETY: handle is a live dlopen handle and the name a valid C string.
            if unsafe { libc::dlsym(handle, c"cuInit".as_ptr()) }.is_null() {
                reasons.push(format!("{name} exports no cuInit: not a CUDA driver"));
                // SAFETY: nothing of this library was resolved or used.
                unsafe { libc::dlclose(handle) };
                continue;
            }
            let api = DriverApi::resolve(|symbol: &CStr| {
                // SAFETY: handle is a live dlopen handle and symbol a valid C string.
                let found = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
                match older_name(symbol) {
                    // SAFETY: as above.
                    Some(older) if found.is_null() => unsafe {
                        libc::dlsym(handle, older.as_ptr())
                    },
                    _ => found,
                }
            });
            // (The handle is dropped, not closed: see `Driver`.)
            return Ok(Driver {
                path: name.to_string(),
                api,
            });
        }
        let reason = match reasons.is_empty() {
            true => String::from("no library names were given"),
            false => reasons.join("; "),
        };
        Err(Error::DriverNotFound { tried, reason })
    }

    /// The name or path the library was opened under.
    pub fn library(&self) -> &str {
        &self.path
    }

    /// Symbols of `cuda.h` that this driver does not export.
    pub fn missing_symbols(&self) -> Vec<&'static str> {
        self.api
            .presence()
            .iter()
            .filter(|(_, present)| !present)
            .map(|(name, _)| *name)
            .collect()
    }
}

impl Deref for Driver {
    type Target = DriverApi;
    fn deref(&self) -> &DriverApi {
        &self.api
    }
}

/// Versioned entry points `cuda.h` maps a name to whose older version has the same
/// signature and meaning: a driver from before the newer one (`cuEventElapsedTime_v2`
/// came with 12.8) is asked for the older. (Others, such as `cuMemAdvise_v2`, changed
/// their arguments: a driver without them reports them missing.)
const OLDER_NAMES: [(&CStr, &CStr); 1] = [(c"cuEventElapsedTime_v2", c"cuEventElapsedTime")];

/// The older name to look up when a driver lacks `symbol`, if it has one.
fn older_name(symbol: &CStr) -> Option<&'static CStr> {
    OLDER_NAMES
        .iter()
        .find(|(newer, _)| *newer == symbol)
        .map(|(_, older)| *older)
}

fn last_dlerror() -> String {
    // SAFETY: dlerror returns null or a pointer to a thread-local C string that stays
    // valid until the next dl* call on this thread; it is copied at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "dlopen failed without a message".to_string()
    } else {
        // SAFETY: non-null dlerror results are NUL-terminated strings.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The process-wide driver, loaded on first use. A load failure is remembered and returned
/// again to every caller; it never panics.
pub fn driver() -> Result<&'static Driver, Error> {
    static DRIVER: OnceCell<Result<Driver, Error>> = OnceCell::new();
    DRIVER
        .get_or_init(Driver::load)
        .as_ref()
        .map_err(Clone::clone)
}
