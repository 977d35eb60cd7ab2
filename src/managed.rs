//! Managed (unified) memory with prefetch and advice.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use cuda_sys::{CUdeviceptr, CUmemLocation, CUmemLocationType, CUmem_advise};

use crate::driver::api;
use crate::hal::HalInner;
use crate::kernels::DevicePtr;
use crate::{CudaHal, Error, Result};

/// Where managed memory should live or be read from.
///
/// ```
/// use cuda_hal::{CudaHal, ManagedAdvice};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let m = hal.alloc_managed::<u32>("constants", 1 << 16).unwrap();
/// // Tables the device reads often and the host seldom writes:
/// m.advise(ManagedAdvice::ReadMostly).unwrap();
/// m.advise(ManagedAdvice::AccessedByDevice).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagedAdvice {
    /// Mostly read: the driver may keep read-only copies on each processor.
    ReadMostly,
    /// Prefer the HAL's device as the home of the pages.
    PreferDevice,
    /// Prefer host memory as the home of the pages.
    PreferHost,
    /// The HAL's device will access the pages (keeps a mapping to avoid faults).
    AccessedByDevice,
}

/// Where managed pages are meant to live, or were last prefetched to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagedLocation {
    /// The device of this ordinal.
    Device(usize),
    /// Host memory (any NUMA node).
    Host,
}

/// What the driver holds for a whole managed buffer: its advice and its last prefetch
/// (`cuMemRangeGetAttribute`). See [`ManagedBuffer::range_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManagedRangeInfo {
    /// [`ManagedAdvice::ReadMostly`] is set on every page.
    pub read_mostly: bool,
    /// The preferred location every page shares ([`ManagedAdvice::PreferDevice`],
    /// [`ManagedAdvice::PreferHost`]); `None` where none is set or the pages differ.
    pub preferred_location: Option<ManagedLocation>,
    /// [`ManagedAdvice::AccessedByDevice`] is set for the HAL's device on every page.
    pub accessed_by_device: bool,
    /// Where every page was last prefetched to; `None` where never, or the pages differ.
    /// Not where the pages are now: touching them may have moved them since.
    pub last_prefetch_location: Option<ManagedLocation>,
}

/// A buffer in managed memory (`cuMemAllocManaged`): one address for CPU and GPU, pages
/// migrating on demand or by [`ManagedBuffer::prefetch_to_device`]. On coherent devices
/// (GB10, Grace Hopper) the CPU and GPU share the same physical memory.
///
/// ```
/// use cuda_hal::{CudaHal, ManagedAdvice};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut m = hal.alloc_managed::<u32>("shared", 1000).unwrap();
/// m.host_mut().unwrap().fill(3);
/// m.advise(ManagedAdvice::ReadMostly).unwrap();
/// m.prefetch_to_device().unwrap();
/// assert_eq!(m.host().unwrap()[999], 3);
/// ```
pub struct ManagedBuffer<T> {
    hal: Arc<HalInner>,
    name: String,
    ptr: CUdeviceptr,
    len: usize,
    ticket: crate::allocs::Ticket,
    _t: PhantomData<T>,
}

/// The alignment the driver gives managed allocations (at least; they share pages at
/// this granularity).
const MANAGED_ALIGN: usize = 256;

/// Managed bytes live per device ordinal, over every HAL of the process. Each device's
/// lock also makes each check and its allocation one step; devices do not wait for each
/// other (the outer lock is held only to find the device's).
static MANAGED_LIVE: parking_lot::Mutex<Vec<Arc<parking_lot::Mutex<usize>>>> =
    parking_lot::Mutex::new(Vec::new());

/// The managed bytes live on device `ordinal`, under their lock.
fn managed_live(ordinal: usize) -> Arc<parking_lot::Mutex<usize>> {
    let mut all = MANAGED_LIVE.lock();
    if all.len() <= ordinal {
        all.resize_with(ordinal + 1, Default::default);
    }
    all[ordinal].clone()
}

impl CudaHal {
    /// Allocates `len` elements of managed memory. Refused with `OutOfMemory` when the
    /// device's free memory, less the managed memory already handed out on it (by any
    /// HAL of the process, touched or not), is less than that (managed memory can
    /// oversubscribe; the HAL never asks it to), or past the HAL's limit (checked first,
    /// before the driver is asked). Where it does not fit what is free, or the driver
    /// refuses it for memory, room is made once as for a device buffer (prover tables,
    /// cached blocks and pools of every HAL of the device) and the driver asked again; a
    /// second refusal is `OutOfMemory` carrying the driver's error.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, Error};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let m = hal.alloc_managed::<u64>("witness", 1024).unwrap();
    /// assert_eq!(m.len(), 1024);
    /// // More than the device has free is refused, never oversubscribed.
    /// let too_big = hal.alloc_managed::<u8>("huge", hal.info().total_memory + 1);
    /// assert!(matches!(too_big, Err(Error::OutOfMemory { .. })));
    /// ```
    pub fn alloc_managed<T: Pod>(&self, name: &str, len: usize) -> Result<ManagedBuffer<T>> {
        let _range = crate::nvtx::range(|| {
            format!(
                "alloc_managed {name} ({len} x {} B)",
                std::mem::size_of::<T>()
            )
        });
        let h = &self.inner;
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Err(Error::ZeroLength {
                name: name.to_string(),
            });
        }
        if std::mem::align_of::<T>() > MANAGED_ALIGN {
            // `host` hands out `&[T]`, which must be aligned; the driver promises 256 bytes
            // (small managed allocations share pages at that granularity).
            return Err(Error::InvalidArgument(format!(
                "`{name}`: elements aligned to {} bytes; managed memory is aligned to {MANAGED_ALIGN}",
                std::mem::align_of::<T>()
            )));
        }
        h.enter()?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        // Past the HAL's limit: refused before the driver is asked or any room is made
        // (checked again, under the allocator's lock, when the request is tracked).
        if bytes > h.allocs.room_under_limit() {
            return Err(h.oom(name, bytes, None));
        }
        // The check and the allocation under the device's lock, which also holds the
        // managed bytes every HAL has live on it: a managed allocation takes no device
        // memory until its pages are touched, so the free memory the driver reports does
        // not count it, and two requests that each fit what is free must not both be made.
        let live = managed_live(h.info().ordinal);
        let mut handed_out = live.lock();
        let (mut free, mut total) = h.memory_info()?;
        // More than the device holds besides what is handed out can never fit: refused
        // before anything is trimmed (making room frees every HAL's caches and tables).
        let fits_at_all = bytes <= total.saturating_sub(*handed_out);
        let mut room_made = false;
        if fits_at_all && bytes > free.saturating_sub(*handed_out) {
            // Freed device buffers may be held back by this HAL's block cache and pool, or
            // by another HAL's of the device, which the driver counts as used (and prover
            // tables hold memory they would make again): room is made, as for a device
            // allocation, and the driver asked again.
            log::debug!("alloc_managed `{name}` of {bytes} bytes: not free; trimming");
            h.ledger.oom_retry();
            h.make_room_on_device()?;
            room_made = true;
            (free, total) = h.memory_info()?;
        }
        let oom = || h.oom_of(name, bytes, total, None);
        // Pages already touched count twice (in use and handed out): the check errs on the
        // side of refusing.
        if bytes > free.saturating_sub(*handed_out) {
            return Err(oom());
        }
        // (Before the request is tracked, which an early return here would leave.)
        let d = api()?;
        let Some(ticket) = h
            .allocs
            .track(&std::borrow::Cow::Owned(name.to_string()), bytes)
        else {
            return Err(oom());
        };
        let mut ptr: CUdeviceptr = 0;
        loop {
            // SAFETY: out-pointer is a valid local.
            let r = unsafe {
                d.cuMemAllocManaged(
                    &mut ptr,
                    bytes,
                    cuda_sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0,
                )
            };
            let Err(e) = r else { break };
            if e.is_out_of_memory() && !room_made {
                // Refused for memory all the same: room is made and the driver asked once
                // more, as for a device allocation.
                log::debug!("alloc_managed `{name}` of {bytes} bytes: {e}; trimming, retrying");
                h.ledger.oom_retry();
                if let Err(made) = h.make_room_on_device() {
                    h.allocs.untrack_refused(ticket, bytes);
                    return Err(made);
                }
                room_made = true;
                continue;
            }
            // Never made: not counted as an allocation of the name.
            h.allocs.untrack_refused(ticket, bytes);
            if e.is_out_of_memory() {
                return Err(h.oom_of(name, bytes, total, Some(e)));
            }
            return h.guard(Err(e.into()));
        }
        *handed_out += bytes;
        drop(handed_out);
        log::trace!("alloc `{name}`: {bytes} bytes of managed memory at {ptr:#x}");
        Ok(ManagedBuffer {
            hal: h.clone(),
            name: name.to_string(),
            ptr,
            len,
            ticket,
            _t: PhantomData,
        })
    }
}

impl<T: Pod> ManagedBuffer<T> {
    /// Number of elements.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(hal.alloc_managed::<u32>("m", 10).unwrap().len(), 10);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: managed buffers have at least one element.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert!(!hal.alloc_managed::<u32>("m", 1).unwrap().is_empty());
    /// assert!(hal.alloc_managed::<u32>("none", 0).is_err());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The name given at creation.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// assert_eq!(hal.alloc_managed::<u8>("staging", 64).unwrap().name(), "staging");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The device address, for kernels (pass it as a scalar argument).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut m = hal.alloc_managed::<u32>("m", 256).unwrap();
    /// let p = m.device_ptr();
    /// // fill_u32(out, value, n), with the managed address as the pointer argument
    /// // SAFETY: fill_u32 writes the 256 managed elements; no host slice of them is alive.
    /// unsafe { hal.launch("fill_u32", LaunchDims::for_elements(256, 1))
    ///     .scalar(p.addr).scalar(6u32).scalar(256u64)
    ///     .run() }
    ///     .unwrap();
    /// assert!(m.host_mut().unwrap().iter().all(|&x| x == 6)); // waits for the stream
    /// ```
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr {
            addr: self.ptr,
            bytes: self.bytes(),
        }
    }

    fn device_location(&self) -> CUmemLocation {
        CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.hal.info().ordinal as i32,
        }
    }

    fn host_location() -> CUmemLocation {
        CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            ..Default::default()
        }
    }

    fn prefetch(&self, loc: CUmemLocation) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let to = match loc.type_ {
                CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => "device",
                _ => "host",
            };
            format!("prefetch {} to {to}", self.name)
        });
        let h = &self.hal;
        h.enter()?;
        let d = h.guard(api())?;
        // SAFETY: the range is this live managed allocation; the prefetch is stream-ordered.
        let queued = h
            .stream
            .queue(|st| unsafe { d.cuMemPrefetchAsync(self.ptr, self.bytes(), loc, 0, st) });
        h.guard(queued.map_err(Error::from))
    }

    /// Migrates the pages to the device, ordered on the HAL's stream.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut m = hal.alloc_managed::<u32>("m", 1 << 20).unwrap();
    /// m.host_mut().unwrap().fill(1); // pages on the host
    /// m.prefetch_to_device().unwrap(); // moved before the kernels that read them
    /// ```
    pub fn prefetch_to_device(&self) -> Result<()> {
        self.prefetch(self.device_location())
    }

    /// Migrates the pages to host memory, ordered on the HAL's stream.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let m = hal.alloc_managed::<u32>("m", 1 << 20).unwrap();
    /// m.prefetch_to_host().unwrap();
    /// assert_eq!(m.host().unwrap().len(), 1 << 20);
    /// ```
    pub fn prefetch_to_host(&self) -> Result<()> {
        self.prefetch(Self::host_location())
    }

    /// Gives the driver a hint about how the memory is used.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, ManagedAdvice};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let m = hal.alloc_managed::<u32>("m", 4096).unwrap();
    /// m.advise(ManagedAdvice::PreferDevice).unwrap();
    /// m.advise(ManagedAdvice::PreferHost).unwrap(); // a later hint replaces the preference
    /// ```
    pub fn advise(&self, advice: ManagedAdvice) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("advise {} {advice:?}", self.name));
        let h = &self.hal;
        h.enter()?;
        let (a, loc) = match advice {
            ManagedAdvice::ReadMostly => (
                CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY,
                self.device_location(),
            ),
            ManagedAdvice::PreferDevice => (
                CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                self.device_location(),
            ),
            ManagedAdvice::PreferHost => (
                CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                Self::host_location(),
            ),
            ManagedAdvice::AccessedByDevice => (
                CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY,
                self.device_location(),
            ),
        };
        // SAFETY: the range is this live managed allocation.
        h.guard(unsafe { api()?.cuMemAdvise(self.ptr, self.bytes(), a, loc) }.map_err(Error::from))
    }

    /// The advice and last prefetch the driver holds for the whole buffer, once the HAL's
    /// stream is idle (so that prefetches queued on it have been made).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, ManagedAdvice, ManagedLocation};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let m = hal.alloc_managed::<u32>("m", 1 << 16).unwrap();
    /// m.advise(ManagedAdvice::PreferDevice).unwrap();
    /// m.prefetch_to_host().unwrap();
    /// let info = m.range_info().unwrap();
    /// let device = ManagedLocation::Device(hal.info().ordinal);
    /// assert_eq!(info.preferred_location, Some(device));
    /// assert_eq!(info.last_prefetch_location, Some(ManagedLocation::Host));
    /// assert!(!info.read_mostly);
    /// ```
    pub fn range_info(&self) -> Result<ManagedRangeInfo> {
        let _range = crate::nvtx::range(|| format!("range_info {}", self.name));
        use cuda_sys::CUmem_range_attribute as R;
        let h = &self.hal;
        h.enter()?;
        h.guard(h.stream.synchronize())?;
        let d = h.guard(api())?;
        let int_of = |attribute: R| -> Result<i32> {
            let mut v: i32 = 0;
            // SAFETY: `v` is a valid place for the one int these attributes write; the
            // range is this live managed allocation.
            let r = unsafe {
                d.cuMemRangeGetAttribute(
                    (&mut v as *mut i32).cast(),
                    std::mem::size_of::<i32>(),
                    attribute,
                    self.ptr,
                    self.bytes(),
                )
            };
            h.guard(r.map_err(Error::from)).map(|()| v)
        };
        let location_of = |kind: R, id: R| -> Result<Option<ManagedLocation>> {
            type L = CUmemLocationType;
            let kind = int_of(kind)? as u32;
            let host = [
                L::CU_MEM_LOCATION_TYPE_HOST,
                L::CU_MEM_LOCATION_TYPE_HOST_NUMA,
                L::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
            ];
            Ok(if kind == L::CU_MEM_LOCATION_TYPE_DEVICE.0 {
                Some(ManagedLocation::Device(int_of(id)? as usize))
            } else if host.iter().any(|l| l.0 == kind) {
                Some(ManagedLocation::Host)
            } else {
                None
            })
        };
        // The devices set as accessing the range, unused entries holding an invalid id.
        let mut accessing = [-2i32; 64];
        // SAFETY: `accessing` has room for the bytes passed; the range is this live
        // managed allocation.
        let r = unsafe {
            d.cuMemRangeGetAttribute(
                accessing.as_mut_ptr().cast(),
                std::mem::size_of_val(&accessing),
                R::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY,
                self.ptr,
                self.bytes(),
            )
        };
        h.guard(r.map_err(Error::from))?;
        let ordinal = h.info().ordinal as i32;
        Ok(ManagedRangeInfo {
            read_mostly: int_of(R::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY)? != 0,
            preferred_location: location_of(
                R::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE,
                R::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID,
            )?,
            accessed_by_device: accessing.contains(&ordinal),
            last_prefetch_location: location_of(
                R::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
                R::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID,
            )?,
        })
    }

    /// Waits until the host may touch the memory: the HAL's stream (which may be using
    /// it) is idle. Refused on a device without concurrent managed access (`DeviceInfo::
    /// concurrent_managed_access`: older GPUs, Windows, WSL): there a host access faults
    /// while any kernel of the context runs, and the slice handed out would outlive a wait
    /// for the context, since safe calls (a `fill`, another thread's launch) start kernels
    /// (found by review). Kernels on such a device still use the memory.
    fn host_ready(&self) -> Result<()> {
        self.hal.enter()?;
        if !self.hal.info().concurrent_managed_access {
            return Err(Error::InvalidArgument(format!(
                "host access to managed `{}`: device {} has no concurrent managed access, \
                 where the host may not touch managed memory while any kernel runs",
                self.name,
                self.hal.info().ordinal
            )));
        }
        self.hal.guard(self.hal.stream.synchronize())
    }

    /// The elements on the host, once the HAL's stream (which may be using them) is idle.
    /// An error on a device without concurrent managed access (see
    /// [`DeviceInfo::concurrent_managed_access`](crate::DeviceInfo)).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut m = hal.alloc_managed::<u32>("m", 4).unwrap();
    /// m.host_mut().unwrap().copy_from_slice(&[1, 2, 3, 4]);
    /// assert_eq!(m.host().unwrap(), &[1, 2, 3, 4]);
    /// ```
    pub fn host(&self) -> Result<&[T]> {
        self.host_ready()?;
        // SAFETY: managed memory is host-addressable and the stream is idle. Host writers
        // need `&mut self`; device writers are kernels given the address, whose `unsafe`
        // launch promises no host reference to what they write lives while they run.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) })
    }

    /// The elements on the host for writing, once the HAL's stream is idle.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut m = hal.alloc_managed::<f32>("m", 3).unwrap();
    /// for (i, x) in m.host_mut().unwrap().iter_mut().enumerate() {
    ///     *x = i as f32 * 0.5;
    /// }
    /// assert_eq!(m.host().unwrap()[2], 1.0);
    /// ```
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        self.host_ready()?;
        // SAFETY: as in `host`, with the unique borrow of `self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) })
    }
}

impl<T> Drop for ManagedBuffer<T> {
    fn drop(&mut self) {
        // A failed bind does not stop the release: the stream and the pointer name their
        // context (skipping the free would leak the memory for the process's life).
        let bound = self.hal.ctx.bind();
        // SAFETY: ptr came from cuMemAllocManaged in the HAL's context, only its stream
        // uses it (a launch's `managed` argument queues there), and it is freed once, here.
        let freed = unsafe { self.hal.free_after_stream(self.ptr) };
        let r = bound.and(freed);
        // After the free (not holding the lock through the stream's wait): until then a
        // request meanwhile still counts these bytes, erring on the side of refusing.
        let live = managed_live(self.hal.info().ordinal);
        let mut handed_out = live.lock();
        *handed_out = handed_out.saturating_sub(self.len * std::mem::size_of::<T>());
        drop(handed_out);
        self.hal
            .allocs
            .untrack(self.ticket, self.len * std::mem::size_of::<T>());
        match r {
            Ok(()) => log::trace!(
                "free `{}`: {} bytes of managed memory at {:#x}",
                self.name,
                self.len * std::mem::size_of::<T>(),
                self.ptr
            ),
            Err(e) => log::warn!("freeing managed `{}` failed: {e}", self.name),
        }
    }
}
