//! Growing and shrinking buffers while keeping their contents (one device-to-device copy).

use bytemuck::Pod;

use crate::{Buffer, CudaHal, Error, Result};

impl<T: Pod> Buffer<T> {
    /// A new buffer of `new_len` elements (same name) holding this buffer's first
    /// `min(len, new_len)` elements, copied on the device. The caller drops the old one.
    ///
    /// ```
    /// use cuda_hal::CudaHal;
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let b = hal.copy_from("b", &[1u32, 2, 3]).unwrap();
    /// let b = b.resized(5).unwrap();
    /// assert_eq!(b.slice(0, 3).unwrap().to_vec().unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn resized(&self, new_len: usize) -> Result<Buffer<T>> {
        let _range =
            crate::nvtx::range(|| format!("resize {} {} -> {new_len}", self.name(), self.len()));
        let hal = self.hal_internal();
        let out = hal.alloc::<T>(self.name().to_string(), new_len)?;
        let keep = self.len().min(new_len);
        out.slice(0, keep)?
            .copy_from_buffer(&self.slice(0, keep)?)?;
        Ok(out)
    }
}

/// A buffer with a length and a larger capacity that grows by a factor, like `Vec`
/// (seed 004's dynamic buffer). Growing copies the contents on the device.
///
/// ```
/// use cuda_hal::{CudaHal, GrowableBuffer};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let mut g = GrowableBuffer::<u32>::new(&hal, "rows", 4, 2.0).unwrap();
/// g.extend_from_slice(&[1, 2, 3, 4, 5]).unwrap();
/// assert_eq!(g.capacity(), 8);
/// assert_eq!(g.buffer().unwrap().to_vec().unwrap(), vec![1, 2, 3, 4, 5]);
/// ```
pub struct GrowableBuffer<T> {
    buf: Buffer<T>,
    len: usize,
    growth: f64,
    reallocations: u64,
}

impl<T: Pod> GrowableBuffer<T> {
    /// An empty buffer with room for `capacity` (> 0) elements, growing by `growth` (>= 1.0).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let g = GrowableBuffer::<u64>::new(&hal, "leaves", 1024, 1.5).unwrap();
    /// assert_eq!((g.len(), g.capacity()), (0, 1024));
    /// assert!(GrowableBuffer::<u64>::new(&hal, "bad", 16, 0.5).is_err(), "it must not shrink as it grows");
    /// ```
    pub fn new(hal: &CudaHal, name: &str, capacity: usize, growth: f64) -> Result<Self> {
        if !(growth >= 1.0 && growth.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "growth factor {growth} (must be >= 1)"
            )));
        }
        Ok(GrowableBuffer {
            buf: hal.alloc::<T>(name.to_string(), capacity)?,
            len: 0,
            growth,
            reallocations: 0,
        })
    }

    /// Elements in use.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 8, 2.0).unwrap();
    /// g.extend_from_slice(&[1, 2, 3]).unwrap();
    /// assert_eq!(g.len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no element is in use.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let g = GrowableBuffer::<u32>::new(&hal, "g", 8, 2.0).unwrap();
    /// assert!(g.is_empty());
    /// assert!(g.buffer().is_err(), "no buffer of zero elements");
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements that fit without growing.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 4, 2.0).unwrap();
    /// g.extend_from_slice(&[0; 4]).unwrap();
    /// assert_eq!(g.capacity(), 4, "full, not grown");
    /// g.extend_from_slice(&[0]).unwrap();
    /// assert_eq!(g.capacity(), 8);
    /// ```
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Times the buffer was reallocated.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 1, 2.0).unwrap();
    /// for i in 0..100u32 {
    ///     g.extend_from_slice(&[i]).unwrap();
    /// }
    /// assert_eq!(g.reallocations(), 7, "1 -> 2 -> 4 -> ... -> 128");
    /// ```
    pub fn reallocations(&self) -> u64 {
        self.reallocations
    }

    /// The elements in use (a slice of the allocation); `ZeroLength` while empty.
    ///
    /// The handle is of the allocation as it is now: a later `reserve`, `extend_from_slice`,
    /// `resize` or `shrink_to_fit` that moves the elements to a new allocation leaves it on
    /// the old one, where writes no longer reach this buffer. Ask for it again after those.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u16>::new(&hal, "g", 16, 2.0).unwrap();
    /// g.extend_from_slice(&[4, 5]).unwrap();
    /// let b = g.buffer().unwrap();
    /// assert_eq!(b.len(), 2);
    /// assert_eq!(b.to_vec().unwrap(), vec![4, 5]);
    /// ```
    pub fn buffer(&self) -> Result<Buffer<T>> {
        self.buf.slice(0, self.len)
    }

    /// Moves the elements in use (only those: the rest was never written) into a new
    /// allocation of `capacity` elements.
    fn regrow(&mut self, capacity: usize) -> Result<()> {
        let next = self
            .buf
            .hal_internal()
            .alloc::<T>(self.buf.name().to_string(), capacity)?;
        if self.len > 0 {
            next.slice(0, self.len)?
                .copy_from_buffer(&self.buf.slice(0, self.len)?)?;
        }
        self.buf = next;
        self.reallocations += 1;
        Ok(())
    }

    /// Makes room for `additional` more elements, growing by the factor (at least enough).
    /// Where memory does not hold the grown capacity beside the old buffer, it grows to
    /// exactly enough instead.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 4, 2.0).unwrap();
    /// g.reserve(100).unwrap(); // more than doubling gives: exactly enough
    /// assert_eq!(g.capacity(), 100);
    /// g.reserve(50).unwrap(); // fits already
    /// assert_eq!(g.reallocations(), 1);
    /// ```
    pub fn reserve(&mut self, additional: usize) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("reserve {} +{additional}", self.buf.name()));
        let need = self
            .len
            .checked_add(additional)
            .ok_or_else(|| Error::InvalidArgument("capacity overflow".into()))?;
        if need <= self.capacity() {
            return Ok(());
        }
        let grown = (self.capacity() as f64 * self.growth).ceil() as usize;
        if grown <= need || !self.fits_as_is(grown)? {
            return self.regrow(need);
        }
        // (Refused all the same where memory went meanwhile: the driver's refusal made
        // room, which exactly enough then has.)
        match self.regrow(grown) {
            Err(Error::OutOfMemory { .. }) => self.regrow(need),
            r => r,
        }
    }

    /// Whether `capacity` elements fit beside the buffer as memory stands. The growth past
    /// what is needed is asked for only then: a driver refusal makes room first (frees
    /// prover tables, empties caches and pools, in every HAL of the device), which
    /// exactly enough might not have needed.
    fn fits_as_is(&self, capacity: usize) -> Result<bool> {
        let Some(bytes) = capacity.checked_mul(std::mem::size_of::<T>()) else {
            return Ok(false);
        };
        let h = self.buf.raw().hal();
        h.enter()?;
        h.fits_as_is(bytes)
    }

    /// Sets the length; new elements are unspecified until written.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 4, 2.0).unwrap();
    /// g.extend_from_slice(&[1, 2, 3]).unwrap();
    /// g.resize(1).unwrap();
    /// assert_eq!(g.buffer().unwrap().to_vec().unwrap(), vec![1]);
    /// g.resize(6).unwrap(); // grows to 8, keeping the first element
    /// assert_eq!((g.len(), g.capacity()), (6, 8));
    /// assert_eq!(g.buffer().unwrap().get_at(0).unwrap(), 1);
    /// ```
    pub fn resize(&mut self, new_len: usize) -> Result<()> {
        if new_len > self.capacity() {
            self.reserve(new_len - self.len)?;
        }
        self.len = new_len;
        Ok(())
    }

    /// Appends `data`, growing if needed.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u8>::new(&hal, "log", 2, 2.0).unwrap();
    /// g.extend_from_slice(b"hello").unwrap();
    /// g.extend_from_slice(b", gpu").unwrap();
    /// assert_eq!(g.buffer().unwrap().to_vec().unwrap(), b"hello, gpu".to_vec());
    /// ```
    pub fn extend_from_slice(&mut self, data: &[T]) -> Result<()> {
        let _range =
            crate::nvtx::range(|| format!("extend_from_slice {} +{}", self.buf.name(), data.len()));
        if data.is_empty() {
            return Ok(());
        }
        self.reserve(data.len())?;
        self.buf
            .slice(self.len, data.len())?
            .copy_from_slice(data)?;
        self.len += data.len();
        Ok(())
    }

    /// Reallocates to exactly the length (at least one element).
    ///
    /// ```
    /// use cuda_hal::{CudaHal, GrowableBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let mut g = GrowableBuffer::<u32>::new(&hal, "g", 1024, 2.0).unwrap();
    /// g.extend_from_slice(&[1, 2, 3]).unwrap();
    /// g.shrink_to_fit().unwrap();
    /// assert_eq!(g.capacity(), 3);
    /// assert_eq!(g.buffer().unwrap().to_vec().unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        let _range = crate::nvtx::range(|| format!("shrink_to_fit {}", self.buf.name()));
        let target = self.len.max(1);
        if target < self.capacity() {
            self.regrow(target)?;
        }
        Ok(())
    }
}
