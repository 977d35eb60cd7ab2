//! `CpuHal`: the [`Hal`] on the host, running the [`cpu_ops`] reference operations.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use parking_lot::RwLock;

use crate::cpu_ops;
use crate::field::{Elem, FieldElement};
use crate::hal_trait::{check, Hal, HalBuffer};
use crate::poseidon2::Digest;
use crate::{Error, Result};

/// A [`Hal`] that runs on the host, everywhere: buffers are `Vec`s, and every operation is
/// the [`cpu_ops`] reference function. Use it without a GPU, in tests, and as the oracle for
/// other backends.
///
/// Arguments are checked exactly as by the CUDA HAL, with the same errors. Operations run
/// synchronously on the calling thread.
///
/// ```
/// use cuda_hal::field::Elem;
/// use cuda_hal::{CpuHal, Hal, HalBuffer};
/// let hal = CpuHal::new();
/// // Two columns of 4 coefficients: x and 1.
/// let cols = [0, 1, 0, 0, 1, 0, 0, 0].map(Elem::new);
/// let io = hal.copy_from("columns", &cols).unwrap();
/// hal.batch_ntt(&io, 2, false).unwrap();
/// let w = Elem::root_of_unity(2).unwrap();
/// assert_eq!(io.to_vec().unwrap()[..4], [Elem::ONE, w, w * w, w * w * w]);
/// assert_eq!(io.get_at(5).unwrap(), Elem::ONE);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuHal {
    _private: (),
}

impl CpuHal {
    /// A host HAL. It holds no resources: every buffer owns its memory.
    ///
    /// ```
    /// use cuda_hal::{CpuHal, Hal, HalBuffer};
    /// let hal = CpuHal::new();
    /// let b = hal.copy_from("b", &[1u32, 2, 3]).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn new() -> CpuHal {
        CpuHal { _private: () }
    }
}

/// An active `view` / `view_mut` over some elements of an allocation.
struct ActiveView {
    id: u64,
    range: Range<usize>,
    exclusive: bool,
}

struct State<T> {
    data: Vec<T>,
    views: Vec<ActiveView>,
    next_view: u64,
}

impl<T> State<T> {
    /// Whether an access to `r` conflicts with an active view: any overlapping exclusive
    /// view, and with `with_shared` any overlapping view at all.
    fn conflicts(&self, r: &Range<usize>, with_shared: bool) -> bool {
        self.views
            .iter()
            .any(|v| (with_shared || v.exclusive) && v.range.start < r.end && r.start < v.range.end)
    }
}

struct Storage<T> {
    name: Cow<'static, str>,
    state: RwLock<State<T>>,
}

/// A buffer of a [`CpuHal`]: host memory shared by its clones and slices.
///
/// `view` and `view_mut` run the closure on a copy of the elements (written back after
/// `view_mut`), with no lock held, so a closure may use the HAL freely. While a `view_mut`
/// is active, any other access to its elements returns [`Error::BufferBorrowed`], as the CUDA
/// HAL does.
///
/// ```
/// use cuda_hal::field::Elem;
/// use cuda_hal::{CpuHal, Error, Hal, HalBuffer};
/// let hal = CpuHal::new();
/// let b = hal.copy_from("col", &[Elem::new(1), Elem::new(2)]).unwrap();
/// let head = b.slice(0, 1).unwrap(); // shares b's memory
/// head.view_mut(|s| s[0] = Elem::new(9)).unwrap();
/// assert_eq!(b.get_at(0).unwrap(), Elem::new(9));
/// let busy = b.view_mut(|_| b.get_at(0)).unwrap();
/// assert!(matches!(busy, Err(Error::BufferBorrowed { .. })), "as the CUDA HAL does");
/// ```
pub struct CpuBuffer<T> {
    store: Arc<Storage<T>>,
    offset: usize,
    len: usize,
}

impl<T> Clone for CpuBuffer<T> {
    fn clone(&self) -> Self {
        CpuBuffer {
            store: self.store.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl<T> fmt::Debug for CpuBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("name", &self.store.name)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// Removes a view registration when the view ends, also if its closure panics.
struct ViewGuard<'a, T> {
    store: &'a Storage<T>,
    id: u64,
}

impl<T> Drop for ViewGuard<'_, T> {
    fn drop(&mut self) {
        self.store.state.write().views.retain(|v| v.id != self.id);
    }
}

/// The copy a `view_mut` edits, written back when the view ends: when its closure returns
/// or unwinds (a panicking closure leaves its edits, as with the CUDA HAL's host copy and
/// any `&mut [T]`). Then the view ends.
struct WriteBack<'a, T: Pod + Send + Sync> {
    buffer: &'a CpuBuffer<T>,
    copy: Vec<T>,
    _view: ViewGuard<'a, T>,
}

impl<T: Pod + Send + Sync> Drop for WriteBack<'_, T> {
    fn drop(&mut self) {
        // The exclusive view, still open, keeps every other access to these elements out.
        let range = self.buffer.range();
        self.buffer.store.state.write().data[range].copy_from_slice(&self.copy);
    }
}

impl<T: Pod + Send + Sync> CpuBuffer<T> {
    fn new(name: Cow<'static, str>, len: usize) -> Result<Self> {
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Err(Error::ZeroLength {
                name: name.into_owned(),
            });
        }
        let oom = |name: &str| Error::OutOfMemory {
            name: name.to_string(),
            requested: len.saturating_mul(std::mem::size_of::<T>()),
            in_use: 0,
            limit: None,
            device_total: 0,
            largest: Vec::new(),
            driver: None,
        };
        if len.checked_mul(std::mem::size_of::<T>()).is_none() {
            return Err(oom(&name));
        }
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| oom(&name))?;
        data.resize(len, T::zeroed());
        Ok(CpuBuffer {
            store: Arc::new(Storage {
                name,
                state: RwLock::new(State {
                    data,
                    views: Vec::new(),
                    next_view: 0,
                }),
            }),
            offset: 0,
            len,
        })
    }

    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }

    fn borrowed(&self) -> Error {
        Error::BufferBorrowed {
            name: self.store.name.to_string(),
        }
    }

    fn overlaps(&self, other: &CpuBuffer<T>) -> bool {
        let (a, b) = (self.range(), other.range());
        Arc::ptr_eq(&self.store, &other.store) && a.start < b.end && b.start < a.end
    }

    /// `Aliasing` when this output overlaps `input`.
    fn no_alias(&self, input: &CpuBuffer<T>) -> Result<()> {
        if self.overlaps(input) {
            return Err(Error::Aliasing {
                output: self.name().to_string(),
                other: input.name().to_string(),
            });
        }
        Ok(())
    }

    /// Runs `f` over the elements under the read lock (HAL code only, never a user closure).
    fn read_with<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let s = self.store.state.read();
        let r = self.range();
        if s.conflicts(&r, false) {
            return Err(self.borrowed());
        }
        Ok(f(&s.data[r]))
    }

    /// Runs `f` over the elements under the write lock (HAL code only).
    fn write_with<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let mut s = self.store.state.write();
        let r = self.range();
        if s.conflicts(&r, false) {
            return Err(self.borrowed());
        }
        Ok(f(&mut s.data[r]))
    }

    /// Registers a view and returns a copy of the elements.
    fn begin_view(&self, exclusive: bool) -> Result<(ViewGuard<'_, T>, Vec<T>)> {
        let mut s = self.store.state.write();
        let r = self.range();
        if s.conflicts(&r, exclusive) {
            return Err(self.borrowed());
        }
        s.next_view += 1;
        let id = s.next_view;
        s.views.push(ActiveView {
            id,
            range: r.clone(),
            exclusive,
        });
        let copy = s.data[r].to_vec();
        Ok((
            ViewGuard {
                store: &self.store,
                id,
            },
            copy,
        ))
    }
}

impl<T: Pod + Send + Sync> HalBuffer<T> for CpuBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn name(&self) -> &str {
        &self.store.name
    }

    fn slice(&self, offset: usize, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::ZeroLength {
                name: self.name().to_string(),
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(CpuBuffer {
                store: self.store.clone(),
                offset: self.offset + offset,
                len,
            }),
            _ => Err(Error::OutOfRange {
                name: self.name().to_string(),
                start: offset,
                end: offset.saturating_add(len),
                len: self.len,
            }),
        }
    }

    fn get_at(&self, i: usize) -> Result<T> {
        if i >= self.len {
            return Err(Error::OutOfRange {
                name: self.name().to_string(),
                start: i,
                end: i.saturating_add(1),
                len: self.len,
            });
        }
        self.slice(i, 1)?.read_with(|s| s[0])
    }

    fn view<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let (_guard, copy) = self.begin_view(false)?;
        Ok(f(&copy))
    }

    fn view_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let (view, copy) = self.begin_view(true)?;
        let mut edits = WriteBack {
            buffer: self,
            copy,
            _view: view,
        };
        Ok(f(&mut edits.copy))
    }

    fn to_vec(&self) -> Result<Vec<T>> {
        self.read_with(|s| s.to_vec())
    }

    fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len,
                actual: dst.len(),
            });
        }
        self.read_with(|s| dst.copy_from_slice(s))
    }

    fn copy_from_slice(&self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::LengthMismatch {
                name: self.name().to_string(),
                expected: self.len,
                actual: src.len(),
            });
        }
        self.write_with(|d| d.copy_from_slice(src))
    }

    fn fill(&self, value: T) -> Result<()> {
        check::fill(std::mem::size_of::<T>())?;
        self.write_with(|d| d.fill(value))
    }
}

impl CpuHal {
    fn eltwise<F: FieldElement>(
        &self,
        out: &CpuBuffer<F>,
        a: &CpuBuffer<F>,
        b: &CpuBuffer<F>,
        op: fn(&mut [F], &[F], &[F]),
    ) -> Result<()> {
        check::lengths(out.len(), &[(a.name(), a.len()), (b.name(), b.len())])?;
        out.no_alias(a)?;
        out.no_alias(b)?;
        // Inputs are copied first, so no two locks are ever held at once (inputs and output
        // may be disjoint slices of one allocation).
        let a = a.to_vec()?;
        let b = b.to_vec()?;
        out.write_with(|o| op(o, &a, &b))
    }
}

impl Hal for CpuHal {
    type Buffer<T: Pod + Send + Sync> = CpuBuffer<T>;

    fn name(&self) -> &str {
        "cpu"
    }

    /// Host buffers start zeroed.
    fn alloc<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<CpuBuffer<T>> {
        CpuBuffer::new(name.into(), len)
    }

    fn alloc_zeroed<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<CpuBuffer<T>> {
        CpuBuffer::new(name.into(), len)
    }

    fn copy_from<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        data: &[T],
    ) -> Result<CpuBuffer<T>> {
        let b = CpuBuffer::new(name.into(), data.len())?;
        b.copy_from_slice(data)?;
        Ok(b)
    }

    fn eltwise_add<F: FieldElement>(
        &self,
        out: &CpuBuffer<F>,
        a: &CpuBuffer<F>,
        b: &CpuBuffer<F>,
    ) -> Result<()> {
        self.eltwise(out, a, b, cpu_ops::eltwise_add)
    }

    fn eltwise_sub<F: FieldElement>(
        &self,
        out: &CpuBuffer<F>,
        a: &CpuBuffer<F>,
        b: &CpuBuffer<F>,
    ) -> Result<()> {
        self.eltwise(out, a, b, cpu_ops::eltwise_sub)
    }

    fn eltwise_mul<F: FieldElement>(
        &self,
        out: &CpuBuffer<F>,
        a: &CpuBuffer<F>,
        b: &CpuBuffer<F>,
    ) -> Result<()> {
        self.eltwise(out, a, b, cpu_ops::eltwise_mul)
    }

    fn eltwise_mul_scalar<F: FieldElement>(
        &self,
        out: &CpuBuffer<F>,
        a: &CpuBuffer<F>,
        scalar: F,
    ) -> Result<()> {
        check::lengths(out.len(), &[(a.name(), a.len())])?;
        out.no_alias(a)?;
        let a = a.to_vec()?;
        out.write_with(|o| cpu_ops::eltwise_mul_scalar(o, &a, scalar))
    }

    fn batch_bit_reverse(&self, io: &CpuBuffer<Elem>, log_n: u32) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        io.write_with(|d| cpu_ops::bit_reverse(d, log_n))
    }

    fn batch_ntt(&self, io: &CpuBuffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        io.write_with(|d| cpu_ops::ntt(d, log_n, inverse))
    }

    fn coset_lde(
        &self,
        out: &CpuBuffer<Elem>,
        coeffs: &CpuBuffer<Elem>,
        log_n: u32,
        log_blowup: u32,
    ) -> Result<()> {
        check::lde(
            out.len(),
            out.name(),
            coeffs.len(),
            coeffs.name(),
            log_n,
            log_blowup,
        )?;
        out.no_alias(coeffs)?;
        let coeffs = coeffs.to_vec()?;
        out.write_with(|o| cpu_ops::coset_lde(o, &coeffs, log_n, log_blowup))
    }

    fn poseidon2_hash_rows(
        &self,
        out: &CpuBuffer<Digest>,
        matrix: &CpuBuffer<Elem>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check::hash_rows(out, matrix, rows, cols)?;
        let matrix = matrix.to_vec()?;
        out.write_with(|o| cpu_ops::hash_rows(o, &matrix, rows, cols))
    }

    fn merkle_layer(&self, out: &CpuBuffer<Digest>, input: &CpuBuffer<Digest>) -> Result<()> {
        check::merkle(out, input)?;
        out.no_alias(input)?;
        let input = input.to_vec()?;
        out.write_with(|o| cpu_ops::merkle_layer(o, &input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_copy_and_guard() {
        let hal = CpuHal::new();
        let b = hal.copy_from("b", &[1u32, 2, 3, 4]).unwrap();
        let tail = b.slice(2, 2).unwrap();
        tail.view_mut(|s| s[0] = 30).unwrap();
        assert_eq!(b.to_vec().unwrap(), [1, 2, 30, 4]);
        // Inside a view_mut, its elements are out of bounds for everything else, but other
        // elements of the same allocation are not (and nothing deadlocks).
        tail.view_mut(|_| {
            assert!(matches!(b.to_vec(), Err(Error::BufferBorrowed { .. })));
            assert!(matches!(
                tail.view(|_| ()),
                Err(Error::BufferBorrowed { .. })
            ));
            assert_eq!(b.get_at(0).unwrap(), 1);
            b.slice(0, 2).unwrap().copy_from_slice(&[7, 8]).unwrap();
        })
        .unwrap();
        // Shared views nest; a view_mut inside a view of the same elements is refused.
        b.view(|outer| {
            assert!(b.view(|inner| inner == outer).unwrap());
            assert!(matches!(
                b.view_mut(|_| ()),
                Err(Error::BufferBorrowed { .. })
            ));
        })
        .unwrap();
        assert_eq!(b.to_vec().unwrap(), [7, 8, 30, 4]);
        // A panicking closure ends its view.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = b.view_mut(|_| panic!("boom"));
        }));
        assert!(r.is_err());
        b.fill(5).unwrap();
        assert_eq!(b.to_vec().unwrap(), [5; 4]);
    }

    #[test]
    fn send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<CpuHal>();
        assert_send_sync::<CpuBuffer<Elem>>();
        assert_send_sync::<CpuBuffer<Digest>>();
    }

    #[test]
    fn impossible_allocations_are_out_of_memory() {
        let hal = CpuHal::new();
        let e = hal.alloc::<u64>("huge", usize::MAX / 4).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    }
}
