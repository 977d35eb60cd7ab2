//! Operations built on the HAL's own kernels: fill and element-wise arithmetic.

use bytemuck::Pod;

use crate::hal_trait::check;
use crate::{Buffer, Error, LaunchDims, Result};

/// Element types with element-wise add and mul kernels: `u32` (wrapping) and `f32`.
///
/// ```
/// use cuda_hal::{ops, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.copy_from("a", &[u32::MAX, 2]).unwrap();
/// let b = hal.copy_from("b", &[2u32, 3]).unwrap();
/// let out = hal.alloc::<u32>("out", 2).unwrap();
/// ops::add(&out, &a, &b).unwrap();
/// assert_eq!(out.to_vec().unwrap(), vec![1, 5], "u32 addition wraps");
/// ```
pub trait EltwiseElement: Pod {
    /// Kernel name suffix, such as `u32`.
    const SUFFIX: &'static str;
}

impl EltwiseElement for u32 {
    const SUFFIX: &'static str = "u32";
}

impl EltwiseElement for f32 {
    const SUFFIX: &'static str = "f32";
}

impl<T: Pod> Buffer<T> {
    /// Sets every element to `value` on the device: elements of 1 and 2 bytes by memset,
    /// of any multiple of 4 bytes up to 32 by kernel (every element type of the crate:
    /// `u8` to `u64`, `f32`, `Elem`, `ExtElem`, `Digest`). Other sizes are
    /// `UnsupportedElementSize`, as with [`CpuHal`](crate::CpuHal).
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.alloc::<u64>("ones", 1000).unwrap();
    /// b.fill(1).unwrap();
    /// assert_eq!(b.view(|s| s.iter().sum::<u64>()).unwrap(), 1000);
    /// ```
    pub fn fill(&self, value: T) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("fill {}", self.name()));
        check::fill(std::mem::size_of::<T>())?;
        let hal = self.hal_internal();
        let n = self.len() as u64;
        let dims = LaunchDims::for_elements(self.len(), hal.info().multiprocessors);
        let bytes = bytemuck::bytes_of(&value);
        // SAFETY (both kernels): fill_uN(out: *uN, value: uN, n: u64) writes out[0..n], and
        // n is the buffer's length.
        match bytes.len() {
            4 => unsafe {
                hal.launch_embedded("fill_u32", dims)
                    .output(self)
                    .scalar(u32::from_ne_bytes(bytes.try_into().unwrap_or_default()))
                    .scalar(n)
                    .run()
            },
            8 => unsafe {
                hal.launch_embedded("fill_u64", dims)
                    .output(self)
                    .scalar(u64::from_ne_bytes(bytes.try_into().unwrap_or_default()))
                    .scalar(n)
                    .run()
            },
            1 | 2 => self.memset(bytes),
            size => {
                // The pattern's words, zero past the element's.
                let mut words = [0u32; 8];
                bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..size].copy_from_slice(bytes);
                let (lo, hi) = (
                    [words[0], words[1], words[2], words[3]],
                    [words[4], words[5], words[6], words[7]],
                );
                // SAFETY: fill_words_u32(out: *u32, lo: uint4, hi: uint4, words: u32, n: u64)
                // writes out[0..n * words), the buffer's words (`check::fill`: size is a
                // multiple of 4 up to 32).
                unsafe {
                    hal.launch_embedded("fill_words_u32", dims)
                        .output(self)
                        .scalar(lo)
                        .scalar(hi)
                        .scalar((size / 4) as u32)
                        .scalar(n)
                        .run()
                }
            }
        }
    }

    fn memset(&self, bytes: &[u8]) -> Result<()> {
        let h = &self.raw().hal().clone();
        h.enter()?;
        let r = self.byte_range();
        self.raw().prepare_device_access(r.clone(), true)?;
        let ptr = self.raw_ptr();
        let d = crate::driver::api()?;
        // SAFETY: ptr..ptr+size_bytes is this buffer's range of a live allocation.
        let res = h.stream.queue(|st| unsafe {
            if bytes.len() == 1 {
                d.cuMemsetD8Async(ptr, bytes[0], self.len(), st)
            } else {
                let pair = u16::from_ne_bytes([bytes[0], bytes[1]]);
                d.cuMemsetD16Async(ptr, pair, self.len(), st)
            }
        });
        h.guard(res.map_err(Error::from))?;
        self.raw().invalidate_host(r);
        Ok(())
    }
}

fn eltwise<T: EltwiseElement>(
    op: &str,
    out: &Buffer<T>,
    a: &Buffer<T>,
    b: &Buffer<T>,
) -> Result<()> {
    for x in [a, b] {
        if x.len() != out.len() {
            return Err(Error::LengthMismatch {
                name: x.name().to_string(),
                expected: out.len(),
                actual: x.len(),
            });
        }
    }
    // `EltwiseElement` is open to other types: only the embedded kernels' element types,
    // by size, reach them.
    if !matches!(T::SUFFIX, "u32" | "f32") || std::mem::size_of::<T>() != 4 {
        return Err(Error::UnsupportedElementSize {
            op: "eltwise",
            size: std::mem::size_of::<T>(),
        });
    }
    let hal = out.hal_internal();
    // SAFETY: eltwise_{op}_{u32,f32}(out, a, b, n) touch [0..n) of each, of 4-byte
    // elements (checked above); the three buffers have n elements (checked above).
    unsafe {
        hal.launch_embedded(
            &format!("eltwise_{op}_{}", T::SUFFIX),
            LaunchDims::for_elements(out.len(), hal.info().multiprocessors),
        )
        .output(out)
        .input(a)
        .input(b)
        .scalar(out.len() as u64)
        .run()
    }
}

/// `out[i] = a[i] + b[i]` (u32 wraps). All three must have the same length, and `out` must
/// not overlap `a` or `b`.
///
/// ```
/// use cuda_hal::{ops, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.copy_from("a", &[u32::MAX, 1]).unwrap();
/// let b = hal.copy_from("b", &[2u32, 2]).unwrap();
/// let out = hal.alloc::<u32>("out", 2).unwrap();
/// ops::add(&out, &a, &b).unwrap();
/// assert_eq!(out.to_vec().unwrap(), vec![1, 3]); // wraps
/// assert!(ops::add(&a, &a, &b).is_err(), "out must not overlap an input");
/// ```
pub fn add<T: EltwiseElement>(out: &Buffer<T>, a: &Buffer<T>, b: &Buffer<T>) -> Result<()> {
    eltwise("add", out, a, b)
}

/// `out[i] = a[i] * b[i]` (u32 wraps).
///
/// ```
/// use cuda_hal::{ops, CudaHal};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let a = hal.copy_from("a", &[1.5f32, -2.0]).unwrap();
/// let b = hal.copy_from("b", &[2.0f32, 4.0]).unwrap();
/// let out = hal.alloc::<f32>("out", 2).unwrap();
/// ops::mul(&out, &a, &b).unwrap();
/// assert_eq!(out.to_vec().unwrap(), vec![3.0, -8.0]);
/// ```
pub fn mul<T: EltwiseElement>(out: &Buffer<T>, a: &Buffer<T>, b: &Buffer<T>) -> Result<()> {
    eltwise("mul", out, a, b)
}
