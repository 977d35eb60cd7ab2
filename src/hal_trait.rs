//! The backend-neutral HAL: [`Hal`] and [`HalBuffer`], which prover code is written
//! generically over. [`CpuHal`](crate::CpuHal) implements them everywhere; a GPU backend
//! implements them by delegating to its own buffers and kernels.
//!
//! Every backend computes exactly what [`cpu_ops`](crate::cpu_ops) defines (layouts, NTT
//! and LDE conventions, Poseidon2 parameters) and rejects bad arguments with the same
//! errors:
//!
//! | input | error |
//! |---|---|
//! | a buffer or slice of zero elements | [`Error::ZeroLength`] |
//! | an index or range outside a buffer | [`Error::OutOfRange`] |
//! | lengths that do not fit together | [`Error::LengthMismatch`] |
//! | an output overlapping an input | [`Error::Aliasing`] |
//! | a transform larger than `2^27` points | [`Error::InvalidArgument`] |
//! | an element range under an active `view_mut` | [`Error::BufferBorrowed`] |
//!
//! One difference is by design: [`FieldElement`] is open to other types, which `CpuHal`
//! computes with, but a GPU backend has kernels only for the crate's fields and refuses
//! any other type with [`Error::InvalidArgument`] rather than run a kernel over elements
//! of another size.
//!
//! ```
//! use cuda_hal::field::Elem;
//! use cuda_hal::{CpuHal, Hal, HalBuffer};
//!
//! fn double_all<H: Hal>(hal: &H, data: &[Elem]) -> cuda_hal::Result<Vec<Elem>> {
//!     let a = hal.copy_from("a", data)?;
//!     let out = hal.alloc::<Elem>("out", data.len())?;
//!     hal.eltwise_add(&out, &a, &a)?;
//!     out.to_vec()
//! }
//! assert_eq!(double_all(&CpuHal::new(), &[Elem::new(21)]).unwrap(), [Elem::new(42)]);
//! ```

use std::borrow::Cow;
use std::fmt::Debug;

use bytemuck::Pod;

use crate::field::{Elem, FieldElement};
use crate::poseidon2::Digest;
use crate::{Error, Result};

/// A typed buffer of a [`Hal`]: a whole allocation or a slice of one. Clones and slices share
/// the elements.
///
/// ```
/// use cuda_hal::{CpuHal, Hal, HalBuffer};
/// // Generic host-side checks work on any backend's buffers.
/// fn is_sorted<T: PartialOrd + Copy, B: HalBuffer<T>>(b: &B) -> cuda_hal::Result<bool> {
///     b.view(|s| s.windows(2).all(|w| w[0] <= w[1]))
/// }
/// let hal = CpuHal::new();
/// assert!(is_sorted(&hal.copy_from("asc", &[1u32, 2, 3]).unwrap()).unwrap());
/// if let Ok(gpu) = cuda_hal::CudaHal::new(0) {
///     assert!(!is_sorted(&Hal::copy_from(&gpu, "desc", &[3u32, 2, 1]).unwrap()).unwrap());
/// }
/// ```
pub trait HalBuffer<T>: Clone + Debug + Send + Sync {
    /// Number of elements.
    fn len(&self) -> usize;

    /// Always false: buffers have at least one element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name given at allocation (slices keep their parent's).
    fn name(&self) -> &str;

    /// Elements `offset..offset + len`, sharing the allocation. `ZeroLength` for `len == 0`,
    /// `OutOfRange` past the end.
    fn slice(&self, offset: usize, len: usize) -> Result<Self>;

    /// Element `i` (`OutOfRange` past the end).
    fn get_at(&self, i: usize) -> Result<T>;

    /// Runs `f` over the elements on the host.
    fn view<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R>;

    /// Runs `f` over the elements on the host with write access; the changes are the
    /// buffer's contents afterwards (also when `f` panics: its edits so far stay).
    fn view_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R>;

    /// The elements, copied into a new `Vec`.
    fn to_vec(&self) -> Result<Vec<T>>;

    /// Copies the elements into `dst` (same length, else `LengthMismatch`).
    fn copy_to_slice(&self, dst: &mut [T]) -> Result<()>;

    /// Overwrites the elements with `src` (same length, else `LengthMismatch`).
    fn copy_from_slice(&self, src: &[T]) -> Result<()>;

    /// Sets every element to `value`: elements of 1, 2, or a multiple of 4 bytes up to 32
    /// (every element type of the crate); other sizes are `UnsupportedElementSize` in
    /// both backends.
    fn fill(&self, value: T) -> Result<()>;
}

/// A compute backend for prover work: allocation plus the prover operations, over buffers of
/// its own.
///
/// Layouts and conventions are those of [`cpu_ops`](crate::cpu_ops): batches are
/// column-major (column `c` of `n = 2^log_n` elements is `[c·n, (c+1)·n)`), the NTT is
/// natural order in and out with `ω_n = 31^((p-1)/n)` and the inverse includes `1/n`, the
/// LDE evaluates on the coset `31·H`, and hashing is Poseidon2 width 16 (see
/// [`poseidon2`](crate::poseidon2)).
///
/// Operations may complete asynchronously on a device; reading a buffer
/// ([`HalBuffer::to_vec`] and the like) always sees the results of every operation issued
/// before it. [`Hal::synchronize`] waits for all of them.
///
/// ```
/// use cuda_hal::field::Elem;
/// use cuda_hal::{cpu_ops, CpuHal, CudaHal, Hal, HalBuffer};
/// // One prover step, written once, checked against the reference on every backend.
/// fn lde<H: Hal>(hal: &H, coeffs: &[Elem]) -> cuda_hal::Result<Vec<Elem>> {
///     let input = hal.copy_from("coeffs", coeffs)?;
///     let out = hal.alloc::<Elem>("lde", coeffs.len() * 4)?;
///     hal.coset_lde(&out, &input, 3, 2)?; // one column of 2^3, blowup 2^2
///     out.to_vec()
/// }
/// let coeffs: Vec<Elem> = (1..=8).map(Elem::new).collect();
/// let mut want = vec![Elem::ZERO; 32];
/// cpu_ops::coset_lde(&mut want, &coeffs, 3, 2);
/// assert_eq!(lde(&CpuHal::new(), &coeffs).unwrap(), want);
/// if let Ok(gpu) = CudaHal::new(0) {
///     assert_eq!(lde(&gpu, &coeffs).unwrap(), want);
/// }
/// ```
pub trait Hal: Send + Sync {
    /// The backend's buffer type.
    type Buffer<T: Pod + Send + Sync>: HalBuffer<T>;

    /// A short description of the backend (`"cpu"`, or the device's name).
    fn name(&self) -> &str;

    /// A buffer of `len` elements with unspecified contents.
    fn alloc<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Self::Buffer<T>>;

    /// A buffer of `len` zeroed elements.
    fn alloc_zeroed<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Self::Buffer<T>>;

    /// A buffer holding a copy of `data`.
    fn copy_from<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        data: &[T],
    ) -> Result<Self::Buffer<T>>;

    /// Waits until every operation issued so far has completed.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// `out[i] = a[i] + b[i]`; all the same length, `out` overlapping neither input.
    fn eltwise_add<F: FieldElement>(
        &self,
        out: &Self::Buffer<F>,
        a: &Self::Buffer<F>,
        b: &Self::Buffer<F>,
    ) -> Result<()>;

    /// `out[i] = a[i] - b[i]`.
    fn eltwise_sub<F: FieldElement>(
        &self,
        out: &Self::Buffer<F>,
        a: &Self::Buffer<F>,
        b: &Self::Buffer<F>,
    ) -> Result<()>;

    /// `out[i] = a[i] * b[i]`.
    fn eltwise_mul<F: FieldElement>(
        &self,
        out: &Self::Buffer<F>,
        a: &Self::Buffer<F>,
        b: &Self::Buffer<F>,
    ) -> Result<()>;

    /// `out[i] = a[i] * scalar`.
    fn eltwise_mul_scalar<F: FieldElement>(
        &self,
        out: &Self::Buffer<F>,
        a: &Self::Buffer<F>,
        scalar: F,
    ) -> Result<()>;

    /// Bit-reverses every column of `2^log_n` elements in place
    /// ([`cpu_ops::bit_reverse`](crate::cpu_ops::bit_reverse)); the column count is
    /// `io.len() >> log_n`.
    fn batch_bit_reverse(&self, io: &Self::Buffer<Elem>, log_n: u32) -> Result<()>;

    /// Forward or inverse NTT of every column of `2^log_n` elements in place
    /// ([`cpu_ops::ntt`](crate::cpu_ops::ntt)).
    fn batch_ntt(&self, io: &Self::Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()>;

    /// Evaluates coefficient columns of `2^log_n` elements on the coset `31·H` of
    /// `2^(log_n + log_blowup)` points ([`cpu_ops::coset_lde`](crate::cpu_ops::coset_lde)).
    /// `out.len()` must be `coeffs.len() << log_blowup`.
    fn coset_lde(
        &self,
        out: &Self::Buffer<Elem>,
        coeffs: &Self::Buffer<Elem>,
        log_n: u32,
        log_blowup: u32,
    ) -> Result<()>;

    /// One Poseidon2 digest per row of the column-major `rows × cols` `matrix`
    /// ([`cpu_ops::hash_rows`](crate::cpu_ops::hash_rows)); `out.len()` must be `rows`.
    fn poseidon2_hash_rows(
        &self,
        out: &Self::Buffer<Digest>,
        matrix: &Self::Buffer<Elem>,
        rows: usize,
        cols: usize,
    ) -> Result<()>;

    /// One Merkle layer: `out[i] = compress(input[2i], input[2i+1])`
    /// ([`cpu_ops::merkle_layer`](crate::cpu_ops::merkle_layer)); `input.len()` must be
    /// `2 * out.len()`.
    fn merkle_layer(&self, out: &Self::Buffer<Digest>, input: &Self::Buffer<Digest>) -> Result<()>;
}

/// Argument checks shared by the backends, so that they all reject the same inputs with the
/// same errors. Aliasing is checked by each backend, which knows its storage.
pub(crate) mod check {
    use super::*;

    /// `fill` takes elements of 1, 2, or a multiple of 4 bytes up to 32.
    pub(crate) fn fill(size: usize) -> Result<()> {
        match size {
            1 | 2 => Ok(()),
            4..=32 if size % 4 == 0 => Ok(()),
            _ => Err(Error::UnsupportedElementSize { op: "fill", size }),
        }
    }

    /// Every `(name, len)` argument has `expected` elements (element-wise operations).
    pub(crate) fn lengths(expected: usize, args: &[(&str, usize)]) -> Result<()> {
        match args.iter().find(|(_, len)| *len != expected) {
            Some((name, actual)) => Err(Error::LengthMismatch {
                name: name.to_string(),
                expected,
                actual: *actual,
            }),
            None => Ok(()),
        }
    }

    /// A batch of columns of `2^log_n`: returns the column count.
    pub(crate) fn batch(len: usize, name: &str, log_n: u32) -> Result<usize> {
        if log_n > Elem::TWO_ADICITY {
            return Err(Error::InvalidArgument(format!(
                "a transform of 2^{log_n} points: BabyBear has roots of unity up to 2^{}",
                Elem::TWO_ADICITY
            )));
        }
        let n = 1usize << log_n;
        if len % n != 0 {
            return Err(Error::LengthMismatch {
                name: name.to_string(),
                expected: len.div_ceil(n) * n,
                actual: len,
            });
        }
        Ok(len >> log_n)
    }

    /// `coset_lde`: the domain size, the input's column shape and the output's length.
    pub(crate) fn lde(
        out_len: usize,
        out_name: &str,
        coeffs_len: usize,
        coeffs_name: &str,
        log_n: u32,
        log_blowup: u32,
    ) -> Result<()> {
        let log_big = log_n.saturating_add(log_blowup);
        if log_big > Elem::TWO_ADICITY {
            return Err(Error::InvalidArgument(format!(
                "an LDE onto 2^{log_big} points: BabyBear has roots of unity up to 2^{}",
                Elem::TWO_ADICITY
            )));
        }
        batch(coeffs_len, coeffs_name, log_n)?;
        let expected = coeffs_len.saturating_mul(1 << log_blowup);
        if out_len != expected {
            return Err(Error::LengthMismatch {
                name: out_name.to_string(),
                expected,
                actual: out_len,
            });
        }
        Ok(())
    }

    /// `poseidon2_hash_rows`.
    pub(crate) fn hash_rows(
        out: &impl HalBuffer<Digest>,
        matrix: &impl HalBuffer<Elem>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if rows == 0 {
            return Err(Error::ZeroLength {
                name: out.name().to_string(),
            });
        }
        if cols == 0 {
            return Err(Error::ZeroLength {
                name: matrix.name().to_string(),
            });
        }
        if out.len() != rows {
            return Err(Error::LengthMismatch {
                name: out.name().to_string(),
                expected: rows,
                actual: out.len(),
            });
        }
        let expected = rows.saturating_mul(cols);
        if matrix.len() != expected {
            return Err(Error::LengthMismatch {
                name: matrix.name().to_string(),
                expected,
                actual: matrix.len(),
            });
        }
        Ok(())
    }

    /// `merkle_layer`.
    pub(crate) fn merkle(
        out: &impl HalBuffer<Digest>,
        input: &impl HalBuffer<Digest>,
    ) -> Result<()> {
        let expected = out.len().saturating_mul(2);
        if input.len() != expected {
            return Err(Error::LengthMismatch {
                name: input.name().to_string(),
                expected,
                actual: input.len(),
            });
        }
        Ok(())
    }
}

/// The CUDA HAL's buffers are HAL buffers: every method delegates to the inherent method of
/// the same name (which keeps the host cache and the phase features in charge).
impl<T: Pod + Send + Sync> HalBuffer<T> for crate::Buffer<T> {
    fn len(&self) -> usize {
        crate::Buffer::len(self)
    }
    fn name(&self) -> &str {
        crate::Buffer::name(self)
    }
    fn slice(&self, offset: usize, len: usize) -> Result<Self> {
        crate::Buffer::slice(self, offset, len)
    }
    fn get_at(&self, i: usize) -> Result<T> {
        crate::Buffer::get_at(self, i)
    }
    fn view<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        crate::Buffer::view(self, f)
    }
    fn view_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        crate::Buffer::view_mut(self, f)
    }
    fn to_vec(&self) -> Result<Vec<T>> {
        crate::Buffer::to_vec(self)
    }
    fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        crate::Buffer::copy_to_slice(self, dst)
    }
    fn copy_from_slice(&self, src: &[T]) -> Result<()> {
        crate::Buffer::copy_from_slice(self, src)
    }
    fn fill(&self, value: T) -> Result<()> {
        crate::Buffer::fill(self, value)
    }
}
