//! `impl Hal for CudaHal`: the prover operations on the embedded BabyBear kernels
//! (`kernels/babybear.cu`).
//!
//! Arguments are checked with the same helpers as [`CpuHal`](crate::CpuHal) (so the same
//! inputs fail with the same errors), aliasing by the launch builder, and every kernel runs
//! on the HAL's main stream, in issue order.
//!
//! Tables the kernels need are made once per HAL and kept until its last handle is dropped
//! (they show in [`CudaHal::memory_report`] under the names below):
//!
//! - `prover-twiddles`: for each NTT size and direction in use, `ω^k` for `k < n/2`, in
//!   Montgomery form, computed on the device (`powers_mont_bb`);
//! - `prover-shift-powers`: `31^j`, `j < n`, for the coset LDE of `n`-point columns;
//! - `prover-poseidon2`: the Poseidon2 round constants (in Montgomery form) and internal
//!   diagonal (with the quotients of its Shoup products), width 16 and 24, made from
//!   [`Poseidon2`] on the host and uploaded.
//!
//! The NTT runs as fused shared-memory passes (see `plan_ntt`): one pass for columns of up
//! to `2^12` points, else `⌈log_n / 9⌉` passes of up to 9 stages through a scratch buffer of
//! the batch's size (`prover-ntt-scratch`, taken from the pool for the call). Each pass
//! runs a kernel compiled for it (`HalConfig::ntt_fixed_passes`; a single pass when the
//! column count is a multiple of `min(32, 2^(12 - log_n))`).
//! [`CudaHal::batch_ntt_radix2`] is the simple reference path (one launch per stage).

use std::borrow::Cow;
use std::collections::HashMap;

use bytemuck::Pod;
use parking_lot::Mutex;

use crate::field::{Elem, FieldElement};
use crate::hal_trait::{check, Hal};
use crate::ntt_plan::{lde_pass_kernel, pass_kernel, plan_ntt, Loc, NttPass, REG_LOG};
use crate::poseidon2::{Digest, Poseidon2};
use crate::{Buffer, CudaHal, Error, LaunchDims, Result};

/// The name of the twiddle tables' allocations.
pub(crate) const PROVER_TWIDDLES: &str = "prover-twiddles";
/// The name of the coset shift powers' allocations.
pub(crate) const PROVER_SHIFT_POWERS: &str = "prover-shift-powers";
/// The name of the Poseidon2 constants' allocations.
pub(crate) const PROVER_POSEIDON2: &str = "prover-poseidon2";
/// The name of an NTT's scratch.
pub(crate) const PROVER_NTT_SCRATCH: &str = "prover-ntt-scratch";

/// Which table a [`ProverCache`] entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TableKey {
    Twiddles { log_n: u32, inverse: bool },
    ShiftPowers { log_n: u32 },
    Poseidon2 { width: usize },
}

/// Device tables of one HAL (see the module documentation). Cleared when the HAL's last
/// handle goes, which breaks the cycle HAL → table → buffer → HAL.
#[derive(Default)]
pub(crate) struct ProverCache {
    tables: Mutex<HashMap<TableKey, Buffer<u32>>>,
    /// Column groups whose NTT scratch fitted where a whole batch's did not, by (columns,
    /// log_n): the next NTT of that shape asks for that much first, rather than failing
    /// its way down again (each failure past the driver's memory trims the HAL and waits
    /// for its stream). Forgotten on `trim_pool`, which may have made room.
    ntt_groups: Mutex<HashMap<(usize, u32), usize>>,
}

/// The most NTT shapes whose column group is remembered (past that they start over).
const MAX_NTT_GROUPS: usize = 256;

impl ProverCache {
    /// Frees the tables and forgets the column groups that fitted.
    pub(crate) fn clear(&self) {
        self.free_tables();
        self.forget_ntt_groups();
    }

    /// Frees the tables (after the lock: a free may wait on the device); a table an
    /// operation holds stays until it lets go.
    pub(crate) fn free_tables(&self) {
        let tables = std::mem::take(&mut *self.tables.lock());
        drop(tables);
    }

    /// Forgets the column groups that fitted (memory may have been freed).
    fn forget_ntt_groups(&self) {
        self.ntt_groups.lock().clear();
    }

    /// The column group to try first for an NTT of `cols` columns of `2^log_n` points.
    fn ntt_group(&self, cols: usize, log_n: u32) -> usize {
        let remembered = self.ntt_groups.lock().get(&(cols, log_n)).copied();
        remembered.unwrap_or(cols).clamp(1, cols.max(1))
    }

    /// Remembers the column group whose scratch fitted, where it is not the whole batch.
    fn ntt_group_fitted(&self, cols: usize, log_n: u32, group: usize) {
        let mut groups = self.ntt_groups.lock();
        if group >= cols {
            groups.remove(&(cols, log_n));
            return;
        }
        if groups.len() >= MAX_NTT_GROUPS {
            groups.clear();
        }
        groups.insert((cols, log_n), group);
    }
}

/// An operation on columns of one point leaves `io` as it is, but checks what every call
/// does: a buffer of `hal`, a usable HAL, and no host view open on the elements (as
/// `CpuHal` does).
fn left_as_it_is(hal: &CudaHal, io: &Buffer<Elem>) -> Result<()> {
    if !hal.same(io.raw().hal()) {
        return Err(Error::ForeignBuffer {
            name: io.name().to_string(),
        });
    }
    io.device_ptr().map(drop)
}

/// What an NTT needs, made before it runs ([`CudaHal::ntt_prepare`]).
struct NttWork {
    tw: Buffer<u32>,
    log_n: u32,
    inverse: bool,
    /// For the fused passes: their scratch (if the plan has one) and how many columns it
    /// serves at a time. `None`: the radix-2 path.
    fused: Option<(Option<Buffer<Elem>>, usize)>,
}

/// What a coset LDE's NTT reads in its first pass instead of the expanded column
/// (`HalConfig::lde_fused_expand`): column `c`'s point `j` is `coeffs[c·2^log_small + j]`
/// times `shift[j]` below `2^log_small`, zero above.
#[derive(Clone, Copy)]
struct LdeSource<'a> {
    coeffs: &'a Buffer<Elem>,
    /// `shift^j` in Montgomery form, `j < 2^log_small` (`prover-shift-powers`).
    shift: &'a Buffer<u32>,
    log_small: u32,
}

impl CudaHal {
    fn dims(&self, n: usize) -> LaunchDims {
        LaunchDims::for_elements(n, self.info().multiprocessors)
    }

    /// A cached table, made by `make` on first use.
    fn table(
        &self,
        key: TableKey,
        make: impl FnOnce() -> Result<Buffer<u32>>,
    ) -> Result<Buffer<u32>> {
        if let Some(b) = self.inner.prover.tables.lock().get(&key) {
            return Ok(b.clone());
        }
        let b = make()?;
        let kept = self
            .inner
            .prover
            .tables
            .lock()
            .entry(key)
            .or_insert_with(|| b.clone())
            .clone();
        // Another thread's table may have come first: this one is freed after the lock,
        // whose other users a free (a synchronize without phase 3) would hold up.
        drop(b);
        Ok(kept)
    }

    /// `base^k` in Montgomery form for `k < count`, computed on the device.
    fn powers_table(&self, name: &'static str, base: Elem, count: usize) -> Result<Buffer<u32>> {
        let t = self.alloc::<u32>(name, count)?;
        // SAFETY: powers_mont_bb(out, base, count) writes out[0..count); `t` has count elements.
        unsafe {
            self.launch_embedded("powers_mont_bb", self.dims(count))
                .output(&t)
                .scalar(base.as_u32())
                .scalar(count as u64)
                .run()
        }?;
        Ok(t)
    }

    fn twiddles(&self, log_n: u32, inverse: bool) -> Result<Buffer<u32>> {
        self.table(TableKey::Twiddles { log_n, inverse }, || {
            let w = Elem::root_of_unity(log_n)
                .ok_or_else(|| Error::InvalidArgument(format!("no 2^{log_n}-th root of unity")))?;
            let w = if inverse { w.inv() } else { w };
            self.powers_table(PROVER_TWIDDLES, w, (1usize << log_n) / 2)
        })
    }

    fn poseidon2_constants(&self, width: usize) -> Result<Buffer<u32>> {
        self.table(TableKey::Poseidon2 { width }, || {
            let t = match width {
                16 => Poseidon2::babybear16().device_table(),
                24 => Poseidon2::babybear24().device_table(),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "Poseidon2 width {width} (16 or 24)"
                    )))
                }
            };
            CudaHal::copy_from(self, PROVER_POSEIDON2, &t)
        })
    }

    /// Makes what an NTT of `len` elements in columns of `2^log_n` (`log_n >= 1`, checked)
    /// needs, before anything touches the data: an allocation that fails leaves it as it
    /// was. The fused passes' scratch serves the whole batch, or where memory does not hold
    /// that, fewer columns at a time (columns are independent), halved until it fits; the
    /// group that fitted is asked for first by the next NTT of that shape, until
    /// `trim_pool`.
    fn ntt_prepare(&self, len: usize, log_n: u32, inverse: bool) -> Result<NttWork> {
        let tw = self.twiddles(log_n, inverse)?;
        let cols = len >> log_n;
        let plan = (log_n >= REG_LOG).then(|| plan_ntt(log_n, cols, inverse));
        // Columns of fewer than 16 points, and more tiles than a grid holds (over 2^31
        // columns of 16 points), take the radix-2 path and its grid-stride launches.
        let Some(plan) =
            plan.filter(|plan| plan.iter().all(|p| len >> (p.k + p.c) <= i32::MAX as usize))
        else {
            return Ok(NttWork {
                tw,
                log_n,
                inverse,
                fused: None,
            });
        };
        let cache = &self.inner.prover;
        let mut group = cols;
        let scratch = if plan.iter().any(NttPass::uses_scratch) {
            group = cache.ntt_group(cols, log_n);
            loop {
                match self.alloc::<Elem>(PROVER_NTT_SCRATCH, group << log_n) {
                    Ok(s) => {
                        cache.ntt_group_fitted(cols, log_n, group);
                        break Some(s);
                    }
                    Err(Error::OutOfMemory { .. }) if group > 1 => group = group.div_ceil(2),
                    Err(e) => return Err(e),
                }
            }
        } else {
            None
        };
        Ok(NttWork {
            tw,
            log_n,
            inverse,
            fused: Some((scratch, group)),
        })
    }

    /// Runs the NTT `work` was prepared for over `io`; with `lde`, its first pass reads
    /// `io`'s columns from there (only with the fused passes: see `NttWork::fused`).
    fn ntt_run(&self, io: &Buffer<Elem>, work: &NttWork, lde: Option<LdeSource>) -> Result<()> {
        let NttWork {
            tw, log_n, inverse, ..
        } = work;
        let Some((scratch, group)) = &work.fused else {
            debug_assert!(lde.is_none(), "the radix-2 path reads the expanded column");
            return self.ntt_radix2_unchecked(io, *log_n, *inverse, tw);
        };
        let cols = io.len() >> log_n;
        for first in (0..cols).step_by(*group) {
            let n = (*group).min(cols - first);
            let columns = |b: &Buffer<Elem>, log: u32| {
                if n == cols {
                    Ok(b.clone())
                } else {
                    b.slice(first << log, n << log)
                }
            };
            let part = columns(io, *log_n)?;
            let coeffs = lde.map(|l| columns(l.coeffs, l.log_small)).transpose()?;
            let lde = lde
                .zip(coeffs.as_ref())
                .map(|(l, coeffs)| LdeSource { coeffs, ..l });
            let scratch = match scratch {
                Some(s) if n != *group => Some(s.slice(0, n << log_n)?),
                s => s.clone(),
            };
            let plan = plan_ntt(*log_n, n, *inverse);
            self.ntt_passes(&part, scratch.as_ref(), &plan, tw, *log_n, lde)?;
        }
        Ok(())
    }

    /// The fused passes of `plan` over `io` (its columns of `2^log_n` points), with
    /// `scratch` of `io`'s length where the plan uses one; with `lde`, the first pass reads
    /// from there instead of `io`.
    fn ntt_passes(
        &self,
        io: &Buffer<Elem>,
        scratch: Option<&Buffer<Elem>>,
        plan: &[NttPass],
        tw: &Buffer<u32>,
        log_n: u32,
        lde: Option<LdeSource>,
    ) -> Result<()> {
        let scale = Elem::inv_pow2(log_n).to_montgomery();
        let pick = |loc: Loc| -> Result<&Buffer<Elem>> {
            match loc {
                Loc::Io => Ok(io),
                Loc::Scratch => {
                    scratch.ok_or_else(|| Error::InvalidArgument("NTT plan without scratch".into()))
                }
            }
        };
        for (i, p) in plan.iter().enumerate() {
            let tile_log = p.k + p.c;
            let tiles = io.len() >> tile_log;
            let grid = u32::try_from(tiles)
                .ok()
                .filter(|&g| g <= i32::MAX as u32)
                .ok_or_else(|| Error::InvalidArgument(format!("NTT of {} elements", io.len())))?;
            let dims = LaunchDims {
                grid: (grid, 1, 1),
                block: (1 << (tile_log - REG_LOG), 1, 1),
                shared_bytes: 4 << tile_log,
            };
            let fixed = self.config().ntt_fixed_passes;
            let lde = lde.filter(|_| i == 0);
            let kernel = match lde {
                Some(_) => lde_pass_kernel(plan, log_n, fixed).into(),
                None => pass_kernel(plan, i, log_n, fixed),
            };
            let launch = self.launch_embedded(&kernel, dims);
            let launch = match lde {
                Some(l) => launch.output(pick(p.dst)?).input(l.coeffs),
                // In place: the kernel reads and writes `dst` (a null `src`).
                None if p.src == p.dst => launch.inout(pick(p.dst)?).scalar(0u64),
                None => launch.output(pick(p.dst)?).input(pick(p.src)?),
            };
            let launch = launch
                .input(tw)
                .scalar(log_n)
                .scalar(p.s0)
                .scalar(p.c)
                .scalar(p.cpos)
                .scalar(u32::from(p.bitrev))
                .scalar(p.p_load)
                .scalar(p.p_store)
                .scalar(u32::from(p.scale))
                .scalar(scale)
                .scalar(tiles as u64);
            let launch = match lde {
                Some(l) => launch.input(l.shift).scalar(l.log_small),
                None => launch,
            };
            // SAFETY: ntt_pass_k*_bb(dst, src, tw, log_n, s0, c, cpos, bitrev, p_load, p_store, do_scale,
            // scale, num_tiles), src 0 for in place; the plan's tiles cover `io`'s (or the
            // scratch's, of the same length) elements exactly, and `tw` holds the 2^(log_n-1)
            // twiddles the passes read. An LDE's first pass, ntt_lde_pass_*(..., num_tiles,
            // shift, log_small) (only a first pass: bit-reversed, from stage 0), reads instead
            // column c's points j < 2^log_small of `coeffs` and `shift`: `check::lde` matched
            // `coeffs` with `io`'s columns (the same slice of columns), and the shift table
            // holds 2^log_small powers.
            unsafe { launch.run() }?;
        }
        Ok(())
    }

    /// [`Hal::batch_ntt`] the simple way: a bit-reversal launch, then one launch per radix-2
    /// stage over all columns (the inverse's `1/n` on the last). Slower than `batch_ntt`;
    /// kept as the reference path to cross-check the fused kernels on a device.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// use cuda_hal::{CudaHal, Hal, HalBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let data: Vec<Elem> = (0..2 * 1024).map(|i| Elem::new(i * 7 + 1)).collect();
    /// let (fused, simple) = (hal.copy_from("fused", &data).unwrap(), hal.copy_from("simple", &data).unwrap());
    /// hal.batch_ntt(&fused, 10, false).unwrap(); // two columns of 2^10
    /// hal.batch_ntt_radix2(&simple, 10, false).unwrap();
    /// assert_eq!(HalBuffer::to_vec(&fused).unwrap(), HalBuffer::to_vec(&simple).unwrap());
    /// ```
    pub fn batch_ntt_radix2(&self, io: &Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        if log_n == 0 {
            return left_as_it_is(self, io);
        }
        let tw = self.twiddles(log_n, inverse)?;
        self.ntt_radix2_unchecked(io, log_n, inverse, &tw)
    }

    /// [`CudaHal::batch_ntt_radix2`] with its arguments checked (`log_n >= 1`) and its
    /// twiddles `tw` made.
    fn ntt_radix2_unchecked(
        &self,
        io: &Buffer<Elem>,
        log_n: u32,
        inverse: bool,
        tw: &Buffer<u32>,
    ) -> Result<()> {
        self.bit_reverse_unchecked(io, log_n)?;
        let scale = Elem::inv_pow2(log_n).to_montgomery();
        let butterflies = io.len() / 2;
        for stage in 0..log_n {
            let last = stage + 1 == log_n;
            // SAFETY: ntt_stage_bb(io, tw, log_n, stage, total, scale, do_scale) touches io[0..2*total)
            // and tw[0..2^(log_n-1)); total is half of `io`'s length (a multiple of 2^log_n).
            unsafe {
                self.launch_embedded("ntt_stage_bb", self.dims(butterflies))
                    .inout(io)
                    .input(tw)
                    .scalar(log_n)
                    .scalar(stage)
                    .scalar(butterflies as u64)
                    .scalar(scale)
                    .scalar(u32::from(last && inverse))
                    .run()
            }?;
        }
        Ok(())
    }

    fn bit_reverse_unchecked(&self, io: &Buffer<Elem>, log_n: u32) -> Result<()> {
        if log_n == 0 {
            return left_as_it_is(self, io);
        }
        // SAFETY: batch_bit_reverse_bb(io, log_n, total) permutes io[0..total) within columns of
        // 2^log_n; total is `io`'s length, a multiple of 2^log_n (checked by the callers).
        unsafe {
            self.launch_embedded("batch_bit_reverse_bb", self.dims(io.len()))
                .inout(io)
                .scalar(log_n)
                .scalar(io.len() as u64)
                .run()
        }
    }

    /// Applies the Poseidon2 permutation of width `width` (16 or 24) to every state of
    /// `states` in place: state `i` is `states[i·width .. (i+1)·width]`. `InvalidArgument`
    /// for another width, `LengthMismatch` when the length is not a multiple of it.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// use cuda_hal::poseidon2::Poseidon2;
    /// use cuda_hal::{CudaHal, HalBuffer};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let state: [Elem; 16] = std::array::from_fn(|i| Elem::new(i as u32));
    /// let b = hal.copy_from("states", &state).unwrap();
    /// hal.poseidon2_permute(&b, 16).unwrap();
    /// assert_eq!(b.to_vec().unwrap(), Poseidon2::babybear16().permuted(state));
    /// ```
    pub fn poseidon2_permute(&self, states: &Buffer<Elem>, width: usize) -> Result<()> {
        let consts = self.poseidon2_constants(width)?;
        if states.len() % width != 0 {
            return Err(Error::LengthMismatch {
                name: states.name().to_string(),
                expected: states.len().div_ceil(width) * width,
                actual: states.len(),
            });
        }
        let n = states.len() / width;
        // SAFETY: poseidon2_permute_bb{16,24}(states, consts, n) permutes states[0..n*width) with
        // the width's constant table; width is 16 or 24 (the table lookup above failed
        // otherwise) and states holds n*width elements.
        unsafe {
            self.launch_embedded(&format!("poseidon2_permute_bb{width}"), self.dims(n))
                .inout(states)
                .input(&consts)
                .scalar(n as u64)
                .run()
        }
    }

    fn eltwise_op<F: FieldElement>(
        &self,
        op: &str,
        out: &Buffer<F>,
        a: &Buffer<F>,
        b: &Buffer<F>,
    ) -> Result<()> {
        check::lengths(out.len(), &[(a.name(), a.len()), (b.name(), b.len())])?;
        let _range = crate::nvtx::range(|| {
            format!("eltwise_{op} {} <- {}, {}", out.name(), a.name(), b.name())
        });
        let kernel = field_kernel::<F>(&format!("eltwise_{op}"))?;
        // SAFETY: eltwise_{op}_{bb,bb4}(out, a, b, n) touches [0..n) of each; the three have n
        // elements (checked) of the tag's size (checked by `field_kernel`).
        unsafe {
            self.launch_embedded(&kernel, self.dims(out.len()))
                .output(out)
                .input(a)
                .input(b)
                .scalar(out.len() as u64)
                .run()
        }
    }
}

/// The embedded kernel `{base}_{tag}` for elements of `F`, if `F`'s tag names one of the
/// crate's fields and `F` has that field's size: `FieldElement` is open to other types,
/// which must not reach a kernel that reads another size.
fn field_kernel<F: FieldElement>(base: &str) -> Result<String> {
    let size = match F::TAG {
        "bb" => 4,
        "bb4" => 16,
        _ => 0,
    };
    if size == 0 || std::mem::size_of::<F>() != size {
        return Err(Error::InvalidArgument(format!(
            "no {base} kernel for {}-byte elements tagged `{}`",
            std::mem::size_of::<F>(),
            F::TAG
        )));
    }
    Ok(format!("{base}_{}", F::TAG))
}

impl Hal for CudaHal {
    type Buffer<T: Pod + Send + Sync> = Buffer<T>;

    fn name(&self) -> &str {
        &self.info().name
    }

    fn alloc<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Buffer<T>> {
        CudaHal::alloc(self, name, len)
    }

    fn alloc_zeroed<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        len: usize,
    ) -> Result<Buffer<T>> {
        CudaHal::alloc_zeroed(self, name, len)
    }

    fn copy_from<T: Pod + Send + Sync>(
        &self,
        name: impl Into<Cow<'static, str>>,
        data: &[T],
    ) -> Result<Buffer<T>> {
        CudaHal::copy_from(self, name, data)
    }

    fn synchronize(&self) -> Result<()> {
        CudaHal::synchronize(self)
    }

    fn eltwise_add<F: FieldElement>(
        &self,
        out: &Buffer<F>,
        a: &Buffer<F>,
        b: &Buffer<F>,
    ) -> Result<()> {
        self.eltwise_op("add", out, a, b)
    }

    fn eltwise_sub<F: FieldElement>(
        &self,
        out: &Buffer<F>,
        a: &Buffer<F>,
        b: &Buffer<F>,
    ) -> Result<()> {
        self.eltwise_op("sub", out, a, b)
    }

    fn eltwise_mul<F: FieldElement>(
        &self,
        out: &Buffer<F>,
        a: &Buffer<F>,
        b: &Buffer<F>,
    ) -> Result<()> {
        self.eltwise_op("mul", out, a, b)
    }

    fn eltwise_mul_scalar<F: FieldElement>(
        &self,
        out: &Buffer<F>,
        a: &Buffer<F>,
        scalar: F,
    ) -> Result<()> {
        let _range =
            crate::nvtx::range(|| format!("eltwise_mul_scalar {} <- {}", out.name(), a.name()));
        check::lengths(out.len(), &[(a.name(), a.len())])?;
        let kernel = field_kernel::<F>("eltwise_mul_scalar")?;
        // SAFETY: eltwise_mul_scalar_{bb,bb4}(out, a, s, n) touches [0..n) of both; both have n
        // elements (checked) of the tag's size (checked by `field_kernel`).
        unsafe {
            self.launch_embedded(&kernel, self.dims(out.len()))
                .output(out)
                .input(a)
                .scalar(scalar)
                .scalar(out.len() as u64)
                .run()
        }
    }

    fn batch_bit_reverse(&self, io: &Buffer<Elem>, log_n: u32) -> Result<()> {
        let _range =
            crate::nvtx::range(|| format!("batch_bit_reverse {} log_n={log_n}", io.name()));
        check::batch(io.len(), io.name(), log_n)?;
        self.bit_reverse_unchecked(io, log_n)
    }

    fn batch_ntt(&self, io: &Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let dir = if inverse { " inverse" } else { "" };
            format!("batch_ntt {} log_n={log_n}{dir}", io.name())
        });
        check::batch(io.len(), io.name(), log_n)?;
        if log_n == 0 {
            return left_as_it_is(self, io);
        }
        let work = self.ntt_prepare(io.len(), log_n, inverse)?;
        self.ntt_run(io, &work, None)
    }

    fn coset_lde(
        &self,
        out: &Buffer<Elem>,
        coeffs: &Buffer<Elem>,
        log_n: u32,
        log_blowup: u32,
    ) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            format!(
                "coset_lde {} <- {} log_n={log_n} log_blowup={log_blowup}",
                out.name(),
                coeffs.name()
            )
        });
        check::lde(
            out.len(),
            out.name(),
            coeffs.len(),
            coeffs.name(),
            log_n,
            log_blowup,
        )?;
        // Checked here for every path (as `CpuHal` does): an NTT whose first pass writes
        // the scratch would launch nothing that overlaps.
        if out.overlaps(coeffs) {
            return Err(Error::Aliasing {
                output: out.name().to_string(),
                other: coeffs.name().to_string(),
            });
        }
        let shift = self.table(TableKey::ShiftPowers { log_n }, || {
            self.powers_table(PROVER_SHIFT_POWERS, Elem::GENERATOR, 1 << log_n)
        })?;
        let log_big = log_n + log_blowup;
        // Made first: if it cannot be, `out` is left as it was.
        let ntt = (log_big > 0)
            .then(|| self.ntt_prepare(out.len(), log_big, false))
            .transpose()?;
        if let Some(work) = ntt
            .as_ref()
            .filter(|w| w.fused.is_some() && self.config().lde_fused_expand)
        {
            let lde = LdeSource {
                coeffs,
                shift: &shift,
                log_small: log_n,
            };
            return self.ntt_run(out, work, Some(lde));
        }
        // SAFETY: lde_expand_bb(out, coeffs, shift_pows, log_n, log_blowup, total_out) writes
        // out[0..total_out) and reads coeffs by column of 2^log_n and shift_pows[0..2^log_n);
        // `check::lde` matched the lengths.
        unsafe {
            self.launch_embedded("lde_expand_bb", self.dims(out.len()))
                .output(out)
                .input(coeffs)
                .input(&shift)
                .scalar(log_n)
                .scalar(log_blowup)
                .scalar(out.len() as u64)
                .run()
        }?;
        match &ntt {
            Some(work) => self.ntt_run(out, work, None),
            None => Ok(()),
        }
    }

    fn poseidon2_hash_rows(
        &self,
        out: &Buffer<Digest>,
        matrix: &Buffer<Elem>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let _range = crate::nvtx::range(|| {
            let (o, m) = (out.name(), matrix.name());
            format!("poseidon2_hash_rows {o} <- {m} ({rows} x {cols})")
        });
        check::hash_rows(out, matrix, rows, cols)?;
        let consts = self.poseidon2_constants(16)?;
        // SAFETY: poseidon2_hash_rows_bb(out, matrix, consts, rows, cols) reads matrix[0..rows*cols)
        // and writes rows digests; `check::hash_rows` matched the lengths.
        unsafe {
            self.launch_embedded("poseidon2_hash_rows_bb", self.dims(rows))
                .output(out)
                .input(matrix)
                .input(&consts)
                .scalar(rows as u64)
                .scalar(cols as u64)
                .run()
        }
    }

    fn merkle_layer(&self, out: &Buffer<Digest>, input: &Buffer<Digest>) -> Result<()> {
        let _range =
            crate::nvtx::range(|| format!("merkle_layer {} <- {}", out.name(), input.name()));
        check::merkle(out, input)?;
        let consts = self.poseidon2_constants(16)?;
        // SAFETY: poseidon2_merkle_layer_bb(out, in, consts, n_out) reads 2*n_out digests of `input`
        // and writes n_out; `check::merkle` matched the lengths.
        unsafe {
            self.launch_embedded("poseidon2_merkle_layer_bb", self.dims(out.len()))
                .output(out)
                .input(input)
                .input(&consts)
                .scalar(out.len() as u64)
                .run()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_ops;
    use crate::field::P;
    use crate::ntt_plan::TILE_LOG;

    #[test]
    fn an_ntt_shape_asks_first_for_the_column_group_that_fitted() {
        let cache = ProverCache::default();
        assert_eq!(
            cache.ntt_group(8, 20),
            8,
            "nothing remembered: the whole batch"
        );
        cache.ntt_group_fitted(8, 20, 2);
        assert_eq!(cache.ntt_group(8, 20), 2);
        assert_eq!(cache.ntt_group(8, 21), 8, "another shape");
        assert_eq!(cache.ntt_group(16, 20), 16, "another batch");
        cache.ntt_group_fitted(8, 20, 8);
        assert_eq!(
            cache.ntt_group(8, 20),
            8,
            "the whole batch fitted: forgotten"
        );
        cache.ntt_group_fitted(8, 20, 4);
        cache.forget_ntt_groups();
        assert_eq!(cache.ntt_group(8, 20), 8, "trim_pool forgets");
        for cols in 0..=MAX_NTT_GROUPS {
            cache.ntt_group_fitted(cols + 2, 20, 1);
        }
        assert!(cache.ntt_groups.lock().len() <= MAX_NTT_GROUPS, "bounded");
    }

    include!("../kernels/host_check/build_host_check.rs");

    /// `kernels/host_check` (the device code compiled for the host) as a child process, or
    /// `None` with a message when no C++ compiler is found.
    struct HostCheck {
        child: std::process::Child,
        out: std::io::BufReader<std::process::ChildStdout>,
    }

    impl HostCheck {
        fn start() -> Option<Self> {
            use std::process::{Command, Stdio};
            use std::sync::atomic::{AtomicUsize, Ordering};
            // One executable per start: tests start theirs at once, and running a file
            // another test's compiler is writing fails ("text file busy").
            static STARTS: AtomicUsize = AtomicUsize::new(0);
            let exe = std::env::temp_dir().join(format!(
                "cuda-hal-ntt-host-check-{}-{}",
                std::process::id(),
                STARTS.fetch_add(1, Ordering::Relaxed)
            ));
            build_host_check(&exe)?;
            let mut child = Command::new(&exe)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start the host check");
            let _ = std::fs::remove_file(&exe);
            let out = std::io::BufReader::new(child.stdout.take().unwrap());
            Some(Self { child, out })
        }

        /// Runs one pass of the kernel's code on the host; returns the destination.
        fn pass(
            &mut self,
            p: &NttPass,
            log_n: u32,
            src: &[u32],
            dst: Option<&[u32]>,
            tw: &[u32],
        ) -> Vec<u32> {
            let scale = Elem::inv_pow2(log_n).to_montgomery();
            let [k, s0, c, cpos, bitrev, p_load, p_store] = p.shape();
            let mut cmd = format!(
                "nttpass {k} {log_n} {s0} {c} {cpos} {bitrev} {p_load} {p_store} {} {scale} {} {}\n",
                u32::from(p.scale),
                u32::from(dst.is_none()),
                src.len()
            );
            for v in src.iter().chain(dst.unwrap_or(&[])).chain(tw) {
                cmd.push_str(&v.to_string());
                cmd.push(' ');
            }
            self.answer(cmd)
        }

        /// Runs an LDE's first pass (`ntt_lde_pass_k*_bb`) on the host: `coeffs` in columns
        /// of `2^log_small`, `shift` their `2^log_small` powers, `tw` the `2^(log_n - 1)`
        /// twiddles; returns the destination.
        fn lde_pass(
            &mut self,
            p: &NttPass,
            coeffs: &[u32],
            shift: &[u32],
            dst: &[u32],
            tw: &[u32],
        ) -> Vec<u32> {
            let (log_n, log_small) = (tw.len().ilog2() + 1, shift.len().ilog2());
            let [k, s0, c, cpos, bitrev, p_load, p_store] = p.shape();
            let mut cmd = format!(
                "ldepass {k} {log_n} {s0} {c} {cpos} {bitrev} {p_load} {p_store} 0 0 {log_small} {}\n",
                dst.len()
            );
            for v in coeffs.iter().chain(shift).chain(dst).chain(tw) {
                cmd.push_str(&v.to_string());
                cmd.push(' ');
            }
            self.answer(cmd)
        }

        /// Sends one command and reads its answer line.
        fn answer(&mut self, mut cmd: String) -> Vec<u32> {
            use std::io::{BufRead, Write};
            cmd.push('\n');
            let stdin = self.child.stdin.as_mut().unwrap();
            stdin.write_all(cmd.as_bytes()).unwrap();
            stdin.flush().unwrap();
            let mut line = String::new();
            self.out.read_line(&mut line).unwrap();
            line.split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect()
        }
    }

    impl Drop for HostCheck {
        fn drop(&mut self) {
            drop(self.child.stdin.take());
            let _ = self.child.wait();
        }
    }

    /// Pseudo-random elements (xorshift64) from `seed`.
    fn xorshift(mut seed: u64) -> impl FnMut() -> Elem {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            Elem::from_u64(seed)
        }
    }

    /// The twiddle table the passes read: `ω^k` (`ω` inverted for the inverse), `k < n/2`,
    /// in Montgomery form.
    fn twiddles(log_n: u32, inverse: bool) -> Vec<u32> {
        let w = Elem::root_of_unity(log_n).unwrap();
        let w = if inverse { w.inv() } else { w };
        (0..1u64 << (log_n - 1))
            .map(|k| w.pow(k).to_montgomery())
            .collect()
    }

    /// The fused NTT's plan and its kernels' own code (every pass run on the host, thread by
    /// thread and phase by phase) against `cpu_ops::ntt`, forward and inverse, for every
    /// column size the fused kernels take and column counts with and without a
    /// power-of-two factor.
    #[test]
    fn fused_ntt_kernels_match_the_reference_on_the_host() {
        let Some(mut host) = HostCheck::start() else {
            return;
        };
        let mut rand = xorshift(0x1234_5678_9abc_def1);
        let cases: Vec<(u32, usize)> = (REG_LOG..=TILE_LOG)
            .flat_map(|l| [(l, 1), (l, 3), (l, 4), (l, 64)])
            .chain([
                (14, 1),
                (14, 2),
                (15, 1),
                (16, 2),
                (17, 1),
                (17, 2),
                (18, 1),
                (18, 3),
                (19, 1),
                (20, 1),
            ])
            .filter(|&(log_n, cols)| cols << log_n <= 1 << 20)
            .collect();
        for (log_n, cols) in cases {
            for inverse in [false, true] {
                let v: Vec<Elem> = (0..cols << log_n).map(|_| rand()).collect();
                let mut want = v.clone();
                cpu_ops::ntt(&mut want, log_n, inverse);
                let tw = twiddles(log_n, inverse);
                let mut io: Vec<u32> = v.iter().map(|e| e.as_u32()).collect();
                // Poisoned scratch: a position a pass fails to write shows up in the output.
                let mut scratch = vec![u32::MAX; io.len()];
                let plan = plan_ntt(log_n, cols, inverse);
                assert!(plan.iter().all(|p| p.k + p.c <= TILE_LOG && p.k >= REG_LOG));
                assert_eq!(plan.iter().map(|p| p.k).sum::<u32>(), log_n);
                for p in &plan {
                    match (p.src, p.dst) {
                        (Loc::Io, Loc::Io) => io = host.pass(p, log_n, &io, None, &tw),
                        (Loc::Scratch, Loc::Scratch) => {
                            scratch = host.pass(p, log_n, &scratch, None, &tw)
                        }
                        (Loc::Io, Loc::Scratch) => {
                            scratch = host.pass(p, log_n, &io, Some(&scratch), &tw)
                        }
                        (Loc::Scratch, Loc::Io) => {
                            io = host.pass(p, log_n, &scratch, Some(&io), &tw)
                        }
                    }
                }
                let got: Vec<Elem> = io.iter().map(|&v| Elem::new(v)).collect();
                assert!(
                    got == want,
                    "log_n {log_n} cols {cols} inverse {inverse}: plan {plan:?}"
                );
            }
        }
    }

    /// The coset LDE's first pass reading the coefficients (`ntt_lde_pass_*`), then the
    /// plan's other passes, all run on the host with the kernels' code, against
    /// `cpu_ops::coset_lde`: single- and multi-pass plans, blowups up to 2^6 (past 16 the
    /// zero registers differ from thread to thread), one column and several.
    #[test]
    fn the_lde_first_pass_matches_the_reference_on_the_host() {
        let Some(mut host) = HostCheck::start() else {
            return;
        };
        let mut rand = xorshift(0x0bad_5eed_1234_5678);
        let cases = [
            (2, 2, 1),
            (3, 1, 3),
            (4, 0, 2),
            (4, 2, 2),
            (6, 6, 1),
            (8, 3, 1),
            (10, 2, 4),
            (12, 1, 1),
            (11, 4, 2),
            (14, 2, 1),
            (12, 5, 1),
            (16, 2, 1),
            (14, 3, 2),
        ];
        for (log_small, log_blowup, cols) in cases {
            let log_n = log_small + log_blowup;
            let c: Vec<Elem> = (0..cols << log_small).map(|_| rand()).collect();
            let mut want = vec![Elem::ZERO; cols << log_n];
            cpu_ops::coset_lde(&mut want, &c, log_small, log_blowup);
            let tw = twiddles(log_n, false);
            let shift: Vec<u32> = (0..1u64 << log_small)
                .map(|j| Elem::GENERATOR.pow(j).to_montgomery())
                .collect();
            let coeffs: Vec<u32> = c.iter().map(|e| e.as_u32()).collect();
            // Poisoned: a position a pass fails to write shows up in the output.
            let mut io = vec![u32::MAX; cols << log_n];
            let mut scratch = io.clone();
            let plan = plan_ntt(log_n, cols, false);
            for (i, p) in plan.iter().enumerate() {
                let (src, dst) = match (p.src, p.dst) {
                    (Loc::Io, Loc::Io) => (&io, &io),
                    (Loc::Scratch, Loc::Scratch) => (&scratch, &scratch),
                    (Loc::Io, Loc::Scratch) => (&io, &scratch),
                    (Loc::Scratch, Loc::Io) => (&scratch, &io),
                };
                let got = if i == 0 {
                    host.lde_pass(p, &coeffs, &shift, dst, &tw)
                } else if p.src == p.dst {
                    host.pass(p, log_n, src, None, &tw)
                } else {
                    host.pass(p, log_n, src, Some(dst), &tw)
                };
                match p.dst {
                    Loc::Io => io = got,
                    Loc::Scratch => scratch = got,
                }
            }
            let got: Vec<Elem> = io.iter().map(|&v| Elem::new(v)).collect();
            assert!(
                got == want,
                "2^{log_small} x {cols} blown up 2^{log_blowup}: plan {plan:?}"
            );
        }
    }

    #[test]
    fn montgomery_form() {
        // x·R·R⁻¹ = x, with R = 2^32 mod p.
        let r_inv = Elem::from_u64(1 << 32).inv();
        for x in [0, 1, 2, 11, P / 2, P - 1] {
            let m = Elem::new(x).to_montgomery();
            assert!(m < P);
            assert_eq!(Elem::new(m) * r_inv, Elem::new(x));
        }
        let t = Poseidon2::babybear16().device_table();
        assert_eq!(t.len(), 10 * 16 + 13);
        let t = Poseidon2::babybear24().device_table();
        assert_eq!(t.len(), 10 * 24 + 21);
    }
}
