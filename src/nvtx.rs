//! NVTX ranges for Nsight Systems and Nsight Compute (`nvtx` feature).
//!
//! With the feature on, `libnvToolsExt.so.1` (or `libnvtx3interop.so.1` from the
//! `nvidia-nvtx-cu12` wheel, which the toolchain script installs) is opened at run time
//! (`CUDA_HAL_NVTX_LIB` names another path), and every HAL operation and kernel launch pushes a range named
//! after the operation and its buffers, such as `get_at column-3[17]` or
//! `launch eltwise_add_u32 out=acc in=tmp,column-0`.
//!
//! Ranges are recorded only while a tool collects them: Nsight Systems and Nsight Compute
//! set `NVTX_INJECTION64_PATH` in the process they profile. Without one, the library's
//! calls do nothing, so the crate does not format the names either (formatting them made
//! a cached alloc+free several times slower). `CUDA_HAL_NVTX=1` records ranges regardless,
//! for a tool that attaches another way; `CUDA_HAL_NVTX=0` never does. Without the feature,
//! without the library or without a tool, a range costs nothing.

/// Pops the range when dropped.
///
/// Hold it for as long as the range should last; ranges nest:
/// ```
/// use cuda_hal::nvtx;
/// let outer = nvtx::range(|| "commit".to_string());
/// {
///     let _inner = nvtx::range(|| "commit: hash rows".to_string());
/// } // "commit: hash rows" ends here
/// drop(outer); // "commit" ends here
/// ```
#[must_use]
pub struct Range {
    #[cfg(feature = "nvtx")]
    active: bool,
}

/// Pushes a range named by `name()` (called only when NVTX is active), popped when the
/// returned [`Range`] drops: your own phases then read in the timeline around the HAL's.
///
/// ```
/// for round in 0..2 {
///     let _range = cuda_hal::nvtx::range(|| format!("fri fold round {round}"));
///     // ... the round's HAL calls, each a range inside this one ...
/// }
/// println!("recording: {}", cuda_hal::nvtx::enabled());
/// ```
#[inline]
pub fn range(name: impl FnOnce() -> String) -> Range {
    #[cfg(feature = "nvtx")]
    {
        if let Some(lib) = imp::lib() {
            let c = std::ffi::CString::new(name().replace('\0', " ")).unwrap_or_default();
            // SAFETY: c is a valid C string for the duration of the call; the library copies it.
            unsafe { (lib.push)(c.as_ptr()) };
            return Range { active: true };
        }
        Range { active: false }
    }
    #[cfg(not(feature = "nvtx"))]
    {
        let _ = name;
        Range {}
    }
}

/// Whether ranges are being recorded: the feature is on, the library was found and a tool
/// collects them (or `CUDA_HAL_NVTX=1`).
///
/// ```
/// // Outside Nsight (and without `CUDA_HAL_NVTX=1`) nothing is recorded.
/// if std::env::var_os("NVTX_INJECTION64_PATH").is_none()
///     && std::env::var_os("CUDA_HAL_NVTX").is_none()
/// {
///     assert!(!cuda_hal::nvtx::enabled());
/// }
/// ```
pub fn enabled() -> bool {
    #[cfg(feature = "nvtx")]
    {
        imp::lib().is_some()
    }
    #[cfg(not(feature = "nvtx"))]
    {
        false
    }
}

impl Drop for Range {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "nvtx")]
        if self.active {
            if let Some(lib) = imp::lib() {
                // SAFETY: pops the range this guard pushed, on the same thread.
                unsafe { (lib.pop)() };
            }
        }
    }
}

/// The buffer names `names` for a range's name: each once, in their order, comma-separated;
/// past [`LISTED_NAMES`] of them, a count of the rest (a batch may have thousands).
pub(crate) fn name_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut more = 0usize;
    for n in names {
        if seen.contains(&n) {
            continue;
        }
        if seen.len() < LISTED_NAMES {
            seen.push(n);
        } else {
            more += 1;
        }
    }
    let mut list = seen.join(",");
    if more > 0 {
        list.push_str(&format!(",+{more} more"));
    }
    list
}

/// How many buffer names a range's name lists at most.
const LISTED_NAMES: usize = 8;

#[cfg(feature = "nvtx")]
mod imp {
    use std::ffi::{c_char, c_int, CString};

    use once_cell::sync::OnceCell;

    pub(super) struct Lib {
        pub(super) push: unsafe extern "C" fn(*const c_char) -> c_int,
        pub(super) pop: unsafe extern "C" fn() -> c_int,
    }

    pub(super) fn lib() -> Option<&'static Lib> {
        static LIB: OnceCell<Option<Lib>> = OnceCell::new();
        LIB.get_or_init(load).as_ref()
    }

    /// Whether ranges are wanted: `CUDA_HAL_NVTX` (`force`) says so, or else a tool set
    /// its injection library (`injected`).
    pub(super) fn wanted(force: Option<&str>, injected: bool) -> bool {
        match force.map(str::trim) {
            Some("1") => true,
            Some("0") => false,
            _ => injected,
        }
    }

    fn load() -> Option<Lib> {
        let force = std::env::var("CUDA_HAL_NVTX").ok();
        let injected = std::env::var_os("NVTX_INJECTION64_PATH").is_some();
        if !wanted(force.as_deref(), injected) {
            log::debug!("no NVTX tool attached (NVTX_INJECTION64_PATH unset): ranges off");
            return None;
        }
        let mut names: Vec<String> = Vec::new();
        if let Ok(p) = std::env::var("CUDA_HAL_NVTX_LIB") {
            names.push(p);
        }
        // NVTX v2's library, or the compiled NVTX v3 of the `nvidia-nvtx-cu12` wheel.
        names.extend(
            [
                "libnvToolsExt.so.1",
                "libnvToolsExt.so",
                "libnvtx3interop.so.1",
            ]
            .map(String::from),
        );
        for name in names {
            let c = CString::new(name.clone()).ok()?;
            // SAFETY: c is a valid C string; the handle is kept for the process's life.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if h.is_null() {
                continue;
            }
            // SAFETY: h is a live handle and the names are C strings.
            let (push, pop) = unsafe {
                (
                    libc::dlsym(h, c"nvtxRangePushA".as_ptr()),
                    libc::dlsym(h, c"nvtxRangePop".as_ptr()),
                )
            };
            if push.is_null() || pop.is_null() {
                log::warn!("{name} lacks nvtxRangePushA/nvtxRangePop");
                continue;
            }
            log::debug!("NVTX ranges through {name}");
            // SAFETY: both symbols have these C signatures in every NVTX v2/v3 library.
            return Some(unsafe {
                Lib {
                    push: std::mem::transmute::<
                        *mut libc::c_void,
                        unsafe extern "C" fn(*const c_char) -> c_int,
                    >(push),
                    pop: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> c_int>(
                        pop,
                    ),
                }
            });
        }
        log::warn!("nvtx feature on but libnvToolsExt.so.1 not found (set CUDA_HAL_NVTX_LIB)");
        None
    }

    #[cfg(test)]
    mod tests {
        use super::wanted;

        #[test]
        fn ranges_follow_the_tool_unless_forced() {
            assert!(wanted(None, true), "nsys or ncu attached");
            assert!(!wanted(None, false), "no tool: names are not formatted");
            assert!(wanted(Some("1"), false));
            assert!(!wanted(Some("0"), true));
            assert!(wanted(Some(" 1 "), false));
            assert!(
                !wanted(Some("yes"), false),
                "anything else leaves it to the tool"
            );
            assert!(wanted(Some(""), true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::name_list;

    #[test]
    fn a_name_list_names_each_buffer_once_and_counts_past_eight() {
        assert_eq!(name_list(["a", "b", "a", "c"]), "a,b,c");
        assert_eq!(name_list([]), "");
        let many: Vec<String> = (0..11).map(|i| format!("col-{i}")).collect();
        let list = name_list(many.iter().map(String::as_str).chain(["col-0"]));
        assert_eq!(
            list,
            "col-0,col-1,col-2,col-3,col-4,col-5,col-6,col-7,+3 more"
        );
    }
}
