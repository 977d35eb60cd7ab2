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
//! - `prover-poseidon2`: the Poseidon2 round constants and internal diagonal (width 16 and
//!   24), from [`Poseidon2`], converted to Montgomery form on the host and uploaded.
//!
//! The NTT runs as fused shared-memory passes (see [`plan_ntt`]): one pass for columns of up
//! to `2^13` points, else `⌈log_n / 8⌉` passes of up to 8 stages through a scratch buffer of
//! the batch's size (`prover-ntt-scratch`, taken from the pool for the call).
//! [`CudaHal::batch_ntt_radix2`] is the simple reference path (one launch per stage).

use std::borrow::Cow;
use std::collections::HashMap;

use bytemuck::Pod;
use parking_lot::Mutex;

use crate::field::{Elem, FieldElement, P};
use crate::hal_trait::{check, Hal};
use crate::poseidon2::{Digest, Poseidon2};
use crate::{Buffer, CudaHal, Error, LaunchDims, Result};

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
}

impl ProverCache {
    pub(crate) fn clear(&self) {
        let tables = std::mem::take(&mut *self.tables.lock());
        drop(tables);
    }
}

/// `x·2^32 mod p`: the Montgomery form the kernels use for tables.
fn to_mont(x: u32) -> u32 {
    ((u64::from(x) << 32) % u64::from(P)) as u32
}

/// The Montgomery-form constant table of the width-`W` permutation, in the layout of
/// `kernels/babybear.cuh`: initial full-round constants, partial-round constants, final
/// full-round constants, internal diagonal.
fn poseidon2_table<const W: usize>(p: &Poseidon2<W>) -> Vec<u32> {
    let mut t = Vec::new();
    for rc in p.external_initial_constants() {
        t.extend(rc.iter().map(|e| to_mont(e.as_u32())));
    }
    t.extend(p.internal_constants().iter().map(|e| to_mont(e.as_u32())));
    for rc in p.external_final_constants() {
        t.extend(rc.iter().map(|e| to_mont(e.as_u32())));
    }
    t.extend(p.internal_diag_m_1().iter().map(|e| to_mont(e.as_u32())));
    t
}

/// Stages per tile, points per tile and coalescing bits of the fused NTT passes.
const TILE_LOG: u32 = 13;
const COALESCE_LOG: u32 = 5;
const MAX_PASS_STAGES: u32 = TILE_LOG - COALESCE_LOG;

/// Where a pass reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// The caller's buffer.
    Io,
    /// The scratch buffer.
    Scratch,
}

/// One launch of `ntt_pass_bb` (parameters as in `kernels/babybear.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NttPass {
    pub(crate) s0: u32,
    pub(crate) k: u32,
    pub(crate) c: u32,
    pub(crate) cpos: u32,
    pub(crate) bitrev: bool,
    pub(crate) load_bfast: bool,
    pub(crate) store_bfast: bool,
    pub(crate) src: Loc,
    pub(crate) dst: Loc,
    pub(crate) scale: bool,
}

/// The passes of a `2^log_n`-point NTT over `cols` columns (`log_n >= 1`).
///
/// - `log_n <= 13`: one in-place pass whose tiles hold whole columns (and `2^c` of them at
///   once, `c` limited by the column count's power-of-two factor), bit reversal on load.
/// - else: `⌈log_n / 8⌉` passes of up to 8 stages with 32 consecutive points per row of a
///   tile; the first reads the bit-reversed input from `Io` into `Scratch` (its tiles read
///   other positions than they write), the middle ones work in place on `Scratch`, the last
///   writes back to `Io`.
///
/// The inverse's `1/n` is applied on the last pass's stores.
pub(crate) fn plan_ntt(log_n: u32, cols: usize, inverse: bool) -> Vec<NttPass> {
    debug_assert!(log_n >= 1);
    if log_n <= TILE_LOG {
        let c = (TILE_LOG - log_n)
            .min(COALESCE_LOG)
            .min(cols.trailing_zeros());
        return vec![NttPass {
            s0: 0,
            k: log_n,
            c,
            cpos: log_n,
            bitrev: true,
            load_bfast: true,
            store_bfast: true,
            src: Loc::Io,
            dst: Loc::Io,
            scale: inverse,
        }];
    }
    let passes = log_n.div_ceil(MAX_PASS_STAGES);
    let mut out = Vec::new();
    let mut s0 = 0;
    for i in 0..passes {
        // Spread the stages evenly, the larger shares first.
        let k = log_n / passes + u32::from(i < log_n % passes);
        let first = i == 0;
        let last = i + 1 == passes;
        out.push(NttPass {
            s0,
            k,
            c: COALESCE_LOG,
            cpos: if first { log_n - COALESCE_LOG } else { 0 },
            bitrev: first,
            load_bfast: false,
            store_bfast: first,
            src: if first { Loc::Io } else { Loc::Scratch },
            dst: if last { Loc::Io } else { Loc::Scratch },
            scale: last && inverse,
        });
        s0 += k;
    }
    out
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
        Ok(self
            .inner
            .prover
            .tables
            .lock()
            .entry(key)
            .or_insert(b)
            .clone())
    }

    /// `base^k` in Montgomery form for `k < count`, computed on the device.
    fn powers_table(&self, name: &'static str, base: Elem, count: usize) -> Result<Buffer<u32>> {
        let t = self.alloc::<u32>(name, count)?;
        self.launch("powers_mont_bb", self.dims(count))
            .output(&t)
            .scalar(base.as_u32())
            .scalar(count as u64)
            .run()?;
        Ok(t)
    }

    fn twiddles(&self, log_n: u32, inverse: bool) -> Result<Buffer<u32>> {
        self.table(TableKey::Twiddles { log_n, inverse }, || {
            let w = Elem::root_of_unity(log_n)
                .ok_or_else(|| Error::InvalidArgument(format!("no 2^{log_n}-th root of unity")))?;
            let w = if inverse { w.inv() } else { w };
            self.powers_table("prover-twiddles", w, (1usize << log_n) / 2)
        })
    }

    fn poseidon2_constants(&self, width: usize) -> Result<Buffer<u32>> {
        self.table(TableKey::Poseidon2 { width }, || {
            let t = match width {
                16 => poseidon2_table(Poseidon2::babybear16()),
                24 => poseidon2_table(Poseidon2::babybear24()),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "Poseidon2 width {width} (16 or 24)"
                    )))
                }
            };
            CudaHal::copy_from(self, "prover-poseidon2", &t)
        })
    }

    /// The fused NTT (arguments already checked, `log_n >= 1`).
    fn ntt_fused(&self, io: &Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        let cols = io.len() >> log_n;
        let tw = self.twiddles(log_n, inverse)?;
        let scale = to_mont(Elem::inv_pow2(log_n).as_u32());
        let plan = plan_ntt(log_n, cols, inverse);
        let scratch = if plan
            .iter()
            .any(|p| p.src == Loc::Scratch || p.dst == Loc::Scratch)
        {
            Some(self.alloc::<Elem>("prover-ntt-scratch", io.len())?)
        } else {
            None
        };
        let pick = |loc: Loc| -> Result<&Buffer<Elem>> {
            match loc {
                Loc::Io => Ok(io),
                Loc::Scratch => scratch
                    .as_ref()
                    .ok_or_else(|| Error::InvalidArgument("NTT plan without scratch".into())),
            }
        };
        for p in &plan {
            let tile_log = p.k + p.c;
            let tiles = (io.len() >> tile_log) as u64;
            let threads = (1u32 << tile_log.saturating_sub(1)).clamp(1, 512);
            let dims = LaunchDims {
                grid: (tiles.min(1 << 20) as u32, 1, 1),
                block: (threads, 1, 1),
                shared_bytes: 4 << tile_log,
            };
            let launch = self.launch("ntt_pass_bb", dims).output(pick(p.dst)?);
            let launch = if p.src == p.dst {
                launch.scalar(0u64) // in place
            } else {
                launch.input(pick(p.src)?)
            };
            launch
                .input(&tw)
                .scalar(log_n)
                .scalar(p.s0)
                .scalar(p.k)
                .scalar(p.c)
                .scalar(p.cpos)
                .scalar(u32::from(p.bitrev))
                .scalar(u32::from(p.load_bfast))
                .scalar(u32::from(p.store_bfast))
                .scalar(scale)
                .scalar(u32::from(p.scale))
                .scalar(tiles)
                .run()?;
        }
        Ok(())
    }

    /// [`Hal::batch_ntt`] the simple way: a bit-reversal launch, then one launch per radix-2
    /// stage over all columns (the inverse's `1/n` on the last). Slower than `batch_ntt`;
    /// kept as the reference path to cross-check the fused kernels on a device.
    pub fn batch_ntt_radix2(&self, io: &Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        if log_n == 0 {
            return Ok(());
        }
        self.bit_reverse_unchecked(io, log_n)?;
        let tw = self.twiddles(log_n, inverse)?;
        let scale = to_mont(Elem::inv_pow2(log_n).as_u32());
        let butterflies = io.len() / 2;
        for stage in 0..log_n {
            let last = stage + 1 == log_n;
            self.launch("ntt_stage_bb", self.dims(butterflies))
                .inout(io)
                .input(&tw)
                .scalar(log_n)
                .scalar(stage)
                .scalar(butterflies as u64)
                .scalar(scale)
                .scalar(u32::from(last && inverse))
                .run()?;
        }
        Ok(())
    }

    fn bit_reverse_unchecked(&self, io: &Buffer<Elem>, log_n: u32) -> Result<()> {
        if log_n == 0 {
            return Ok(());
        }
        self.launch("batch_bit_reverse_bb", self.dims(io.len()))
            .inout(io)
            .scalar(log_n)
            .scalar(io.len() as u64)
            .run()
    }

    /// Applies the Poseidon2 permutation of width `width` (16 or 24) to every state of
    /// `states` in place: state `i` is `states[i·width .. (i+1)·width]`. `InvalidArgument`
    /// for another width, `LengthMismatch` when the length is not a multiple of it.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// use cuda_hal::poseidon2::Poseidon2;
    /// use cuda_hal::{CudaHal, HalBuffer};
    /// let Ok(hal) = CudaHal::new(0) else { return };
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
        self.launch(&format!("poseidon2_permute_bb{width}"), self.dims(n))
            .inout(states)
            .input(&consts)
            .scalar(n as u64)
            .run()
    }

    fn eltwise_op<F: FieldElement>(
        &self,
        op: &str,
        out: &Buffer<F>,
        a: &Buffer<F>,
        b: &Buffer<F>,
    ) -> Result<()> {
        check::lengths(out.len(), &[(a.name(), a.len()), (b.name(), b.len())])?;
        self.launch(&format!("eltwise_{op}_{}", F::TAG), self.dims(out.len()))
            .output(out)
            .input(a)
            .input(b)
            .scalar(out.len() as u64)
            .run()
    }
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
        check::lengths(out.len(), &[(a.name(), a.len())])?;
        self.launch(
            &format!("eltwise_mul_scalar_{}", F::TAG),
            self.dims(out.len()),
        )
        .output(out)
        .input(a)
        .scalar(scalar)
        .scalar(out.len() as u64)
        .run()
    }

    fn batch_bit_reverse(&self, io: &Buffer<Elem>, log_n: u32) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        self.bit_reverse_unchecked(io, log_n)
    }

    fn batch_ntt(&self, io: &Buffer<Elem>, log_n: u32, inverse: bool) -> Result<()> {
        check::batch(io.len(), io.name(), log_n)?;
        if log_n == 0 {
            return Ok(());
        }
        self.ntt_fused(io, log_n, inverse)
    }

    fn coset_lde(
        &self,
        out: &Buffer<Elem>,
        coeffs: &Buffer<Elem>,
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
        let shift = self.table(TableKey::ShiftPowers { log_n }, || {
            self.powers_table("prover-shift-powers", Elem::GENERATOR, 1 << log_n)
        })?;
        self.launch("lde_expand_bb", self.dims(out.len()))
            .output(out)
            .input(coeffs)
            .input(&shift)
            .scalar(log_n)
            .scalar(log_blowup)
            .scalar(out.len() as u64)
            .run()?;
        let log_big = log_n + log_blowup;
        if log_big == 0 {
            return Ok(());
        }
        self.ntt_fused(out, log_big, false)
    }

    fn poseidon2_hash_rows(
        &self,
        out: &Buffer<Digest>,
        matrix: &Buffer<Elem>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check::hash_rows(out, matrix, rows, cols)?;
        let consts = self.poseidon2_constants(16)?;
        self.launch("poseidon2_hash_rows_bb", self.dims(rows))
            .output(out)
            .input(matrix)
            .input(&consts)
            .scalar(rows as u64)
            .scalar(cols as u64)
            .run()
    }

    fn merkle_layer(&self, out: &Buffer<Digest>, input: &Buffer<Digest>) -> Result<()> {
        check::merkle(out, input)?;
        let consts = self.poseidon2_constants(16)?;
        self.launch("poseidon2_merkle_layer_bb", self.dims(out.len()))
            .output(out)
            .input(input)
            .input(&consts)
            .scalar(out.len() as u64)
            .run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_ops;

    fn bit_rev(x: u64, bits: u32) -> u64 {
        if bits == 0 {
            0
        } else {
            x.reverse_bits() >> (64 - bits)
        }
    }

    /// Runs one `ntt_pass_bb` launch on the host with the kernel's index arithmetic, tile by
    /// tile, checking that its shared-memory layout is a bijection, that an in-place pass's
    /// tiles read exactly the positions they write, and that every position is written once.
    fn emulate_pass(
        dst: &mut [Elem],
        src: Option<&[Elem]>,
        tw: &[Elem],
        log_n: u32,
        p: &NttPass,
        scale: Elem,
    ) {
        let (k, c, s0, cpos) = (p.k, p.c, p.s0, p.cpos);
        let tile = 1usize << (k + c);
        let (kmask, cmask) = ((1u64 << k) - 1, (1u64 << c) - 1);
        let nmask = (1u64 << log_n) - 1;
        let (r1s, r1w, r2s, r2w) = if cpos < s0 {
            (cpos, c, s0, k)
        } else {
            (s0, k, cpos, c)
        };
        let mid = r2s - (r1s + r1w);
        let num_tiles = dst.len() >> (k + c);
        let mut written = vec![false; dst.len()];
        for g in 0..num_tiles as u64 {
            let mut rest = g;
            let part0 = rest & ((1u64 << r1s) - 1);
            rest >>= r1s;
            let part1 = rest & ((1u64 << mid) - 1);
            rest >>= mid;
            let base = part0 | (part1 << (r1s + r1w)) | (rest << (r2s + r2w));
            let pos_of = |b: u64, l: u64| base | (b << s0) | (l << cpos);
            let sm_of = |b: u64, l: u64| ((b << c) + (l ^ (b & cmask))) as usize;
            let split = |e: u64, bfast: bool| {
                if bfast {
                    (e & kmask, e >> k)
                } else {
                    (e >> c, e & cmask)
                }
            };
            let mut sm = vec![Elem::ZERO; tile];
            let mut filled = vec![false; tile];
            let mut reads = Vec::new();
            for e in 0..tile as u64 {
                let (b, l) = split(e, p.load_bfast);
                let pos = pos_of(b, l);
                let from = if p.bitrev {
                    (pos & !nmask) | bit_rev(pos & nmask, log_n)
                } else {
                    pos
                };
                reads.push(from);
                let i = sm_of(b, l);
                assert!(!filled[i], "shared slot {i} loaded twice");
                filled[i] = true;
                sm[i] = src.unwrap_or(dst)[from as usize];
            }
            for j in 0..k {
                let s = s0 + j;
                let hmask = (1u64 << s) - 1;
                for q in 0..(tile / 2) as u64 {
                    let l = q & cmask;
                    let pp = q >> c;
                    let blo = ((pp >> j) << (j + 1)) | (pp & ((1 << j) - 1));
                    let bhi = blo | (1 << j);
                    let w = tw[((pos_of(blo, l) & hmask) << (log_n - 1 - s)) as usize];
                    let (ilo, ihi) = (sm_of(blo, l), sm_of(bhi, l));
                    let u = sm[ilo];
                    let v = sm[ihi] * w;
                    sm[ilo] = u + v;
                    sm[ihi] = u - v;
                }
            }
            let mut writes = Vec::new();
            for e in 0..tile as u64 {
                let (b, l) = split(e, p.store_bfast);
                let pos = pos_of(b, l);
                writes.push(pos);
                let mut x = sm[sm_of(b, l)];
                if p.scale {
                    x *= scale;
                }
                assert!(!written[pos as usize], "position {pos} written twice");
                written[pos as usize] = true;
                dst[pos as usize] = x;
            }
            if src.is_none() {
                reads.sort_unstable();
                writes.sort_unstable();
                assert_eq!(reads, writes, "an in-place tile reads other positions");
            }
        }
        assert!(written.iter().all(|&w| w), "a position was not written");
    }

    /// The fused NTT's plan and index arithmetic, run on the host, against `cpu_ops::ntt`.
    #[test]
    fn fused_ntt_plan_matches_the_reference() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Elem::from_u64(x)
        };
        let cases: Vec<(u32, usize)> = (1..=13)
            .flat_map(|l| [(l, 1), (l, 3), (l, 4), (l, 64)])
            .chain([
                (14, 1),
                (14, 2),
                (15, 1),
                (16, 2),
                (17, 1),
                (18, 1),
                (20, 1),
            ])
            .collect();
        for (log_n, cols) in cases {
            if (cols << log_n) > 1 << 21 {
                continue;
            }
            for inverse in [false, true] {
                let v: Vec<Elem> = (0..cols << log_n).map(|_| rand()).collect();
                let mut want = v.clone();
                cpu_ops::ntt(&mut want, log_n, inverse);
                let w = Elem::root_of_unity(log_n).unwrap();
                let w = if inverse { w.inv() } else { w };
                let tw: Vec<Elem> = (0..1u64 << (log_n - 1)).map(|k| w.pow(k)).collect();
                let scale = Elem::inv_pow2(log_n);
                let mut io = v.clone();
                let mut scratch = vec![Elem::ZERO; io.len()];
                let plan = plan_ntt(log_n, cols, inverse);
                assert!(plan.iter().all(|p| p.k + p.c <= TILE_LOG && p.k >= 1));
                assert_eq!(plan.iter().map(|p| p.k).sum::<u32>(), log_n);
                for p in &plan {
                    match (p.src, p.dst) {
                        (Loc::Io, Loc::Io) => emulate_pass(&mut io, None, &tw, log_n, p, scale),
                        (Loc::Scratch, Loc::Scratch) => {
                            emulate_pass(&mut scratch, None, &tw, log_n, p, scale)
                        }
                        (Loc::Io, Loc::Scratch) => {
                            emulate_pass(&mut scratch, Some(&io), &tw, log_n, p, scale)
                        }
                        (Loc::Scratch, Loc::Io) => {
                            emulate_pass(&mut io, Some(&scratch), &tw, log_n, p, scale)
                        }
                    }
                }
                assert_eq!(io, want, "log_n {log_n} cols {cols} inverse {inverse}");
            }
        }
    }

    #[test]
    fn montgomery_form() {
        assert_eq!(to_mont(1), 0x0fff_fffe);
        assert_eq!(to_mont(0), 0);
        let t = poseidon2_table(Poseidon2::babybear16());
        assert_eq!(t.len(), 9 * 16 + 13);
        let t = poseidon2_table(Poseidon2::babybear24());
        assert_eq!(t.len(), 9 * 24 + 21);
    }
}
