//! Several devices: peer access, copies between devices, and a set of HALs handed out
//! round-robin (seed 000's option 3).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use cuda_sys::CUresult;

use crate::driver::{api, device_count};
use crate::hal_trait::check;
use crate::{Buffer, CudaHal, Error, HalConfig, Result};

impl CudaHal {
    /// Whether this HAL's device can access `other`'s memory directly (NVLink or PCIe P2P).
    ///
    /// ```
    /// use cuda_hal::{driver::device_count, CudaHal};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(hal.can_access_peer(&hal).unwrap(), "a device always reaches its own memory");
    /// if device_count().unwrap() > 1 {
    ///     let hal1 = CudaHal::new(1).unwrap();
    ///     println!("0 -> 1 directly: {}", hal.can_access_peer(&hal1).unwrap());
    /// }
    /// ```
    pub fn can_access_peer(&self, other: &CudaHal) -> Result<bool> {
        if self.info().ordinal == other.info().ordinal {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: out-pointer is a valid local; both device handles are valid.
        unsafe {
            api()?.cuDeviceCanAccessPeer(
                &mut can,
                self.inner.ctx.device(),
                other.inner.ctx.device(),
            )?
        };
        Ok(can != 0)
    }

    /// Lets kernels and copies of this HAL's context read and write `other`'s memory.
    /// Returns false when the devices cannot access each other (copies are then staged
    /// through the host). The answer is remembered per pair of HALs: asking again makes no
    /// driver call.
    ///
    /// ```
    /// use cuda_hal::{driver::device_count, CudaHal};
    /// let Ok(hal0) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let hal1 = match device_count() {
    ///     Ok(n) if n > 1 => CudaHal::new(1).unwrap(),
    ///     _ => hal0.clone(), // one device: it can always access itself
    /// };
    /// let enabled = hal0.enable_peer_access(&hal1).unwrap();
    /// assert_eq!(enabled, hal0.can_access_peer(&hal1).unwrap());
    /// assert!(hal0.enable_peer_access(&hal1).is_ok(), "enabling twice is fine");
    /// ```
    pub fn enable_peer_access(&self, other: &CudaHal) -> Result<bool> {
        let _range = crate::nvtx::range(|| {
            let (a, b) = (self.info().ordinal, other.info().ordinal);
            format!("enable_peer_access device {a} -> device {b}")
        });
        if self.info().ordinal == other.info().ordinal {
            return Ok(true);
        }
        if let Some(known) = self.known_peer(other) {
            return Ok(known);
        }
        let enabled = self.enable_peer_access_uncached(other)?;
        let mut peers = self.inner.aside.peers.lock();
        peers.retain(|(hal, _)| hal.strong_count() > 0);
        peers.push((Arc::downgrade(&other.inner), enabled));
        Ok(enabled)
    }

    /// What [`CudaHal::enable_peer_access`] found for `other` before, if it was asked.
    fn known_peer(&self, other: &CudaHal) -> Option<bool> {
        let peers = self.inner.aside.peers.lock();
        peers
            .iter()
            .find(|(hal, _)| std::ptr::eq(hal.as_ptr(), Arc::as_ptr(&other.inner)))
            .map(|&(_, enabled)| enabled)
    }

    /// [`CudaHal::enable_peer_access`] without the memo: asks the driver. A pair the driver
    /// will not connect although it could (too many peers, the pool's access refused)
    /// gets `false`, and its copies go through the host; a sticky error fails.
    fn enable_peer_access_uncached(&self, other: &CudaHal) -> Result<bool> {
        if !self.can_access_peer(other)? {
            return Ok(false);
        }
        self.inner.enter()?;
        // SAFETY: the peer context is a live retained primary context.
        let enabled = match unsafe { api()?.cuCtxEnablePeerAccess(other.inner.ctx.raw(), 0) } {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) => Ok(()),
            Err(e) => self.inner.guard(Err(e.into())),
        }
        .and_then(|()| {
            // Pool allocations are not covered by context peer access: `other`'s pool must
            // grant this device access too.
            other.inner.enter()?;
            other.inner.pool_grant_access(self.info().ordinal)
        });
        self.inner.enter()?;
        match enabled {
            Ok(()) => Ok(true),
            Err(e @ Error::ContextPoisoned { .. }) => Err(e),
            Err(e) => {
                log::warn!(
                    "peer access from device {} to device {} refused ({e}): copies between \
                     them go through the host",
                    self.info().ordinal,
                    other.info().ordinal
                );
                Ok(false)
            }
        }
    }
}

impl<T: Pod> Buffer<T> {
    /// Copies `src` (same length) from any HAL, on any device, into this buffer: a device
    /// copy on one device, a peer copy between devices that can access each other, and a
    /// copy staged through the host otherwise. Returns once the data is in place or queued
    /// on this buffer's stream in order with its later work.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// // The first and the last device (the same one on a machine with one GPU).
    /// let (first, last) = (set.get(0).unwrap(), set.get(set.len() - 1).unwrap());
    /// println!("peer access: {}", set.peer_access(set.len() - 1, 0));
    /// let a = first.copy_from("on-first", &[1u32, 2, 3]).unwrap();
    /// let b = last.alloc::<u32>("on-last", 3).unwrap();
    /// b.copy_from_device(&a).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn copy_from_device(&self, src: &Buffer<T>) -> Result<()> {
        check::lengths(self.len(), &[(self.name(), src.len())])?;
        let (dst_hal, src_hal) = (self.hal_internal(), src.hal_internal());
        if dst_hal.same(src.raw().hal()) {
            return self.copy_from_buffer(src);
        }
        let _range = crate::nvtx::range(|| {
            format!(
                "copy_from_device {} (dev {}) <- {} (dev {})",
                self.name(),
                dst_hal.info().ordinal,
                src.name(),
                src_hal.info().ordinal
            )
        });
        // (Asks the driver once per pair of HALs, then remembers.)
        if !dst_hal.enable_peer_access(&src_hal)? {
            return self.copy_from_device_via_host(src);
        }
        let (d, s) = (&dst_hal.inner, &src_hal.inner);
        // The source's stream must be done writing it: the destination's queue waits for
        // it. Not when that stream is known to have done everything queued on it (the host
        // has waited for it since, or found it idle: no driver call), nor, between devices,
        // when it has done so by the driver's word: a wait across devices costs a few
        // microseconds on the device, more than asking (`cuStreamQuery`, about 1.5 us on
        // the host). Between two HALs of one device the wait is cheaper than asking.
        s.enter()?;
        src.raw().prepare_device_access(src.byte_range(), false)?;
        let one_device = d.info().ordinal == s.info().ordinal;
        let idle = s.stream.known_idle() || (!one_device && s.guard(s.stream.is_idle())?);
        let ready = if idle {
            None
        } else {
            let ready = s.event()?;
            ready.record(&s.stream)?;
            Some(ready)
        };
        d.enter()?;
        let r = self.byte_range();
        self.raw().prepare_device_access(r.clone(), true)?;
        if let Some(ready) = &ready {
            d.stream.wait_event(ready)?;
        }
        // Taken before the copy is queued (see `Launch::run`).
        let done = d.event()?;
        // SAFETY: both ranges lie in live allocations of their contexts; the copy is queued
        // after the source's writes (event) and before the destination's later work.
        let drv = d.guard(api())?;
        let queued = d.stream.queue(|st| unsafe {
            drv.cuMemcpyPeerAsync(
                self.raw_ptr(),
                d.ctx.raw(),
                src.raw_ptr(),
                s.ctx.raw(),
                self.size_bytes(),
                st,
            )
        });
        d.guard(queued.map_err(Error::from))?;
        d.ledger.copy(crate::ledger::Dir::D2D, self.size_bytes());
        // The host copy is stale once the copy is queued, even where recording it fails.
        self.raw().invalidate_host(r.clone());
        // The source is not freed or overwritten until the copy has read it.
        d.record_use(&done, &d.stream)?;
        src.raw().side.add(d.aside.copy_id, done, false);
        self.raw().invalidate_host(r);
        if !crate::PHASES.async_copy {
            d.guard(d.stream.synchronize())?;
        }
        Ok(())
    }

    /// Copies `src` (same length), from any HAL, into this buffer through host memory:
    /// the route [`Buffer::copy_from_device`] takes between devices that cannot access
    /// each other, here taken whatever the devices. It needs no peer mapping: the data goes
    /// through pinned slots of this HAL's pinned pool, 4 MiB at a time, downloads on the
    /// source's stream overlapping uploads on this one, and the host thread only queues
    /// them. Returns once the data is in place or queued.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let a = set.get(0).unwrap().copy_from("on-0", &[1u32, 2, 3]).unwrap();
    /// let b = set.get(set.len() - 1).unwrap().alloc::<u32>("elsewhere", 3).unwrap();
    /// b.copy_from_device_via_host(&a).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn copy_from_device_via_host(&self, src: &Buffer<T>) -> Result<()> {
        check::lengths(self.len(), &[(self.name(), src.len())])?;
        let (rd, rs) = (self.byte_range(), src.byte_range());
        if Arc::ptr_eq(self.raw(), src.raw()) && rd.start < rs.end && rs.start < rd.end {
            // Chunk by chunk, an upload would overwrite bytes a later download reads.
            return Err(Error::Aliasing {
                output: self.name().to_string(),
                other: src.name().to_string(),
            });
        }
        let _range = crate::nvtx::range(|| {
            format!(
                "copy_from_device_via_host {} (dev {}) <- {} (dev {})",
                self.name(),
                self.hal_internal().info().ordinal,
                src.name(),
                src.hal_internal().info().ordinal
            )
        });
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let (dst_hal, src_hal) = (self.hal_internal(), src.hal_internal());
        let (d, s) = (&dst_hal.inner, &src_hal.inner);
        s.enter()?;
        src.raw().prepare_device_access(src.byte_range(), false)?;
        // Recorded on the source's stream: made in its context.
        let chunk = TRANSIT_CHUNK.min(bytes);
        let slots = bytes.div_ceil(chunk).min(TRANSIT_SLOTS);
        let filled = (0..slots).map(|_| s.event()).collect::<Result<Vec<_>>>()?;
        d.enter()?;
        let r = self.byte_range();
        self.raw().prepare_device_access(r.clone(), true)?;
        let drained = (0..slots).map(|_| d.event()).collect::<Result<Vec<_>>>()?;
        let mut blocks = Vec::with_capacity(slots);
        for _ in 0..slots {
            blocks.push(d.pinned.take(chunk)?);
        }
        let queued = (|| -> Result<()> {
            for (i, offset) in (0..bytes).step_by(chunk).enumerate() {
                let (len, k) = (chunk.min(bytes - offset), i % slots);
                let host = blocks[k].mem.as_ptr().cast::<std::ffi::c_void>();
                s.enter()?;
                if i >= slots {
                    // The slot's last upload has read it.
                    s.stream.wait_event(&drained[k])?;
                }
                // SAFETY: the source range lies in a live allocation of its context; the
                // pinned slot holds `chunk` bytes and no copy in flight uses it (above).
                let drv = s.guard(api())?;
                let queued = s.stream.queue(|st| unsafe {
                    drv.cuMemcpyDtoHAsync(host, src.raw_ptr() + offset as u64, len, st)
                });
                s.guard(queued.map_err(Error::from))?;
                filled[k].record(&s.stream)?;
                d.enter()?;
                d.stream.wait_event(&filled[k])?;
                // SAFETY: the destination range lies in a live allocation of this context;
                // the slot was filled by the download the stream now waits for.
                let drv = d.guard(api())?;
                let queued = d.stream.queue(|st| unsafe {
                    drv.cuMemcpyHtoDAsync(self.raw_ptr() + offset as u64, host, len, st)
                });
                d.guard(queued.map_err(Error::from))?;
                drained[k].record(&d.stream)?;
            }
            Ok(())
        })();
        if let Err(e) = queued {
            // Copies may be in flight: let them finish before the slots go back. (Some may
            // have written the destination: its host copy is stale.)
            let _ = s.enter().and_then(|()| s.stream.synchronize());
            let _ = d.enter().and_then(|()| d.stream.synchronize());
            for b in blocks {
                d.pinned.give(b);
            }
            self.raw().invalidate_host(r);
            return Err(e);
        }
        // The last upload comes after every download (its stream waited for each) and
        // after the other uploads: once it is done, so are all the copies.
        let last = drained[(bytes.div_ceil(chunk) - 1) % slots].clone();
        for b in blocks {
            d.pinned.give_after(b, last.clone());
        }
        s.ledger.copy(crate::ledger::Dir::D2H, bytes);
        d.ledger.copy(crate::ledger::Dir::H2D, bytes);
        // The source is not freed or overwritten until the downloads have read it.
        src.raw().side.add(d.aside.copy_id, last, false);
        self.raw().invalidate_host(r);
        if !crate::PHASES.async_copy {
            d.guard(d.stream.synchronize())?;
        }
        Ok(())
    }
}

/// Bytes of one pinned slot of [`Buffer::copy_from_device_via_host`]: one download and
/// one upload each.
const TRANSIT_CHUNK: usize = 4 << 20;
/// Slots in turn: while one is uploaded, the next ones are downloaded.
const TRANSIT_SLOTS: usize = 4;

/// One HAL per device, handed out round-robin, with peer access enabled between every pair
/// of devices that supports it.
///
/// ```
/// use cuda_hal::HalSet;
/// let Ok(set) = HalSet::all() else {
///     println!("no CUDA device here");
///     return;
/// };
/// let hal = set.next();                  // device 0, then 1, ..., then 0 again
/// println!("{} devices, using {}", set.len(), hal.info().name);
/// ```
pub struct HalSet {
    hals: Vec<CudaHal>,
    peer: Vec<Vec<bool>>,
    next: AtomicUsize,
}

impl HalSet {
    /// A HAL on every device, with the default configuration.
    ///
    /// ```
    /// use cuda_hal::{driver::device_count, HalSet};
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(set.len(), device_count().unwrap());
    /// ```
    pub fn all() -> Result<Self> {
        Self::with_config(HalConfig::default())
    }

    /// A HAL on every device with `config`.
    ///
    /// ```
    /// use cuda_hal::{HalConfig, HalSet};
    /// let config = HalConfig { memory_limit: Some(8 << 30), ..HalConfig::default() };
    /// let Ok(set) = HalSet::with_config(config) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(set.get(0).unwrap().config().memory_limit == Some(8 << 30));
    /// ```
    pub fn with_config(config: HalConfig) -> Result<Self> {
        let n = device_count()?;
        if n == 0 {
            return Err(Error::NoDevice {
                ordinal: 0,
                count: 0,
            });
        }
        let hals = (0..n)
            .map(|i| CudaHal::with_config(i, config.clone()))
            .collect::<Result<Vec<_>>>()?;
        let mut peer = vec![vec![false; n]; n];
        for i in 0..n {
            for j in 0..n {
                peer[i][j] = hals[i].enable_peer_access(&hals[j])?;
            }
        }
        Ok(HalSet {
            hals,
            peer,
            next: AtomicUsize::new(0),
        })
    }

    /// Number of devices.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// for i in 0..set.len() {
    ///     assert_eq!(set.get(i).unwrap().info().ordinal, i);
    /// }
    /// ```
    pub fn len(&self) -> usize {
        self.hals.len()
    }

    /// Always false: a set has at least one device.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(!set.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.hals.is_empty()
    }

    /// The HAL of device `i`.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(set.get(0).unwrap().info().ordinal, 0);
    /// assert!(set.get(set.len()).is_none());
    /// ```
    pub fn get(&self, i: usize) -> Option<&CudaHal> {
        self.hals.get(i)
    }

    /// The next HAL in round-robin order (thread-safe).
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let ordinals: Vec<usize> = (0..2 * set.len()).map(|_| set.next().info().ordinal).collect();
    /// let expected: Vec<usize> = (0..2 * set.len()).map(|i| i % set.len()).collect();
    /// assert_eq!(ordinals, expected);
    /// ```
    pub fn next(&self) -> CudaHal {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.hals.len();
        self.hals[i].clone()
    }

    /// Whether device `i` can access device `j`'s memory directly.
    ///
    /// ```
    /// use cuda_hal::HalSet;
    /// let Ok(set) = HalSet::all() else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(set.peer_access(0, 0));
    /// assert!(!set.peer_access(0, set.len()), "no such device");
    /// if set.len() > 1 {
    ///     let (a, b) = (set.get(0).unwrap(), set.get(1).unwrap());
    ///     assert_eq!(set.peer_access(0, 1), a.can_access_peer(b).unwrap());
    /// }
    /// ```
    pub fn peer_access(&self, i: usize, j: usize) -> bool {
        self.peer
            .get(i)
            .and_then(|r| r.get(j))
            .copied()
            .unwrap_or(false)
    }
}
