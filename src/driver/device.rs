use std::ffi::CStr;

use cuda_sys::{CUdevice, CUdevice_attribute};

use super::api;
use crate::{Error, Result};

/// Number of CUDA devices the driver reports (0 without a driver is an error, not 0).
///
/// ```
/// match cuda_hal::driver::device_count() {
///     Ok(n) => println!("{n} CUDA devices"),
///     Err(e) => println!("no driver: {e}"),
/// }
/// ```
pub fn device_count() -> Result<usize> {
    let no_device =
        |e: &cuda_sys::Error| e.code() == Some(cuda_sys::CUresult::CUDA_ERROR_NO_DEVICE);
    let d = match api() {
        Ok(d) => d,
        // `cuInit` itself reports no device when none is visible (`CUDA_VISIBLE_DEVICES=`).
        Err(crate::Error::Cuda(e)) if no_device(&e) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    // SAFETY: out-pointer is a valid local.
    match unsafe { d.cuDeviceGetCount(&mut n) } {
        Ok(()) => Ok(n as usize),
        Err(e) if no_device(&e) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// What the HAL knows about its device, read once at creation.
///
/// ```
/// use cuda_hal::CudaHal;
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let info = hal.info();
/// let (major, minor) = info.compute_capability;
/// println!("{}: sm_{major}{minor}, {} SMs", info.name, info.multiprocessors);
/// if info.is_coherent_unified() {
///     println!("CPU and GPU share memory (GB10, Grace Hopper)");
/// }
/// assert!(info.total_memory > 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, such as `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor); GB10 is (12, 1).
    pub compute_capability: (u32, u32),
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Driver version as the driver reports it, such as 13000 for 13.0.
    pub driver_version: u32,
    /// Number of streaming multiprocessors.
    pub multiprocessors: u32,
    /// An integrated GPU sharing memory with the CPU (GB10, Jetson).
    pub integrated: bool,
    /// The GPU can access pageable host memory (`malloc`ed) coherently: through the
    /// host's page tables (GB10, Grace Hopper), or through a software mirror of them
    /// (x86_64 with Linux HMM and the open kernel modules, where a discrete GPU reports it
    /// too; the H200 test host, without HMM, reports false).
    pub pageable_memory_access: bool,
    /// The GPU reaches pageable host memory through the host's own page tables (address
    /// translation services): one set of page tables for CPU and GPU, kept coherent by
    /// the hardware (GB10, Grace Hopper). False under HMM's software mirror.
    pub pageable_access_uses_host_page_tables: bool,
    /// Managed memory can be accessed by CPU and GPU concurrently.
    pub concurrent_managed_access: bool,
    /// `cuMemAllocFromPoolAsync` and memory pools are supported.
    pub memory_pools_supported: bool,
    /// The device can map host memory into its address space.
    pub can_map_host_memory: bool,
}

impl DeviceInfo {
    /// Reads the device's properties. Fails with [`Error::NoDevice`] for a bad ordinal.
    ///
    /// ```
    /// use cuda_hal::driver::{device_count, DeviceInfo};
    /// use cuda_hal::Error;
    /// let Ok(n) = device_count() else {
    ///     println!("no CUDA driver here");
    ///     return;
    /// };
    /// if n > 0 {
    ///     println!("{}", DeviceInfo::query(0).unwrap().name);
    /// }
    /// assert!(matches!(DeviceInfo::query(n), Err(Error::NoDevice { .. })));
    /// ```
    pub fn query(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let d = api()?;
        let mut dev: CUdevice = 0;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut total = 0usize;
        let mut version = 0;
        // SAFETY: out-pointers are valid locals; name has the length passed.
        unsafe {
            d.cuDeviceGet(&mut dev, ordinal as i32)?;
            d.cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)?;
            d.cuDeviceTotalMem(&mut total, dev)?;
            d.cuDriverGetVersion(&mut version)?;
        }
        // SAFETY: the driver wrote a NUL-terminated string into `name`.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let attr = |a: CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: out-pointer is a valid local.
            unsafe { d.cuDeviceGetAttribute(&mut v, a, dev)? };
            Ok(v)
        };
        use CUdevice_attribute as A;
        Ok(DeviceInfo {
            ordinal,
            name,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            total_memory: total,
            driver_version: version as u32,
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            integrated: attr(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
            pageable_memory_access: attr(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0,
            pageable_access_uses_host_page_tables: attr(
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
            )? != 0,
            concurrent_managed_access: attr(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)? != 0,
            memory_pools_supported: attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
            can_map_host_memory: attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0,
        })
    }

    /// Whether CPU and GPU share memory coherently in hardware, as on GB10 and Grace
    /// Hopper: an integrated GPU, or one that reaches pageable memory through the host's
    /// page tables. Not a discrete GPU under Linux HMM, whose coherence is the driver's
    /// page migration (`pageable_memory_access` alone).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let info = hal.info();
    /// // (Not "NVIDIA GH200", a Grace Hopper.)
    /// if info.name.starts_with("NVIDIA H100") || info.name.starts_with("NVIDIA H200") {
    ///     assert!(!info.is_coherent_unified(), "a discrete GPU on PCIe or SXM");
    /// }
    /// ```
    pub fn is_coherent_unified(&self) -> bool {
        self.integrated || self.pageable_access_uses_host_page_tables
    }
}
