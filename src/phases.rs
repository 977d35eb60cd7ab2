//! Which phases of the GB10 optimisation plan this build enables (one cargo feature each).

/// The phases compiled into this build.
///
/// ```
/// use cuda_hal::PHASES;
/// // Code that depends on a phase can ask at run time.
/// if PHASES.host_cache {
///     println!("repeated reads of a buffer are served from its host copy");
/// }
/// assert_eq!(PHASES.label() == "baseline", PHASES == cuda_hal::Phases { offset_get_at: false, host_cache: false, pool_alloc: false, async_copy: false });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phases {
    /// Phase 1 (`phase1-offset-get-at`): `get_at` copies one element from its offset.
    pub offset_get_at: bool,
    /// Phase 2 (`phase2-host-cache`): buffers cache a host copy with dirty tracking.
    pub host_cache: bool,
    /// Phase 3 (`phase3-pool-alloc`): allocations come from the HAL's own pool.
    pub pool_alloc: bool,
    /// Phase 4 (`phase4-async-copy`): copies are async, staged through reused pinned memory.
    pub async_copy: bool,
}

/// The phases of this build.
///
/// ```
/// let p = cuda_hal::PHASES;
/// println!("built with phases {}", p.label());
/// ```
pub const PHASES: Phases = Phases {
    offset_get_at: cfg!(feature = "phase1-offset-get-at"),
    host_cache: cfg!(feature = "phase2-host-cache"),
    pool_alloc: cfg!(feature = "phase3-pool-alloc"),
    async_copy: cfg!(feature = "phase4-async-copy"),
};

impl Phases {
    /// `baseline`, or the enabled phase numbers joined by `+`, such as `1+2+3`.
    ///
    /// ```
    /// use cuda_hal::Phases;
    /// let p = Phases { offset_get_at: true, host_cache: false, pool_alloc: true, async_copy: true };
    /// assert_eq!(p.label(), "1+3+4");
    /// let none = Phases { offset_get_at: false, host_cache: false, pool_alloc: false, async_copy: false };
    /// assert_eq!(none.label(), "baseline");
    /// ```
    pub fn label(&self) -> String {
        let on: Vec<&str> = [
            (self.offset_get_at, "1"),
            (self.host_cache, "2"),
            (self.pool_alloc, "3"),
            (self.async_copy, "4"),
        ]
        .iter()
        .filter(|(b, _)| *b)
        .map(|(_, n)| *n)
        .collect();
        if on.is_empty() {
            "baseline".into()
        } else {
            on.join("+")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_enabled_phases() {
        let none = Phases {
            offset_get_at: false,
            host_cache: false,
            pool_alloc: false,
            async_copy: false,
        };
        assert_eq!(none.label(), "baseline");
        let some = Phases {
            offset_get_at: true,
            pool_alloc: true,
            ..none
        };
        assert_eq!(some.label(), "1+3");
        assert_eq!(PHASES.offset_get_at, cfg!(feature = "phase1-offset-get-at"));
    }
}
