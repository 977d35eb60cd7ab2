//! A double-buffered upload -> kernel -> download pipeline over two streams (three when
//! the host stages the chunks through pinned memory).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::Pod;

use crate::driver::{api, is_page_locked, Event};
use crate::host_pages::par_copy;
use crate::ledger::Dir;
use crate::pinned::PinnedBlock;
use crate::{Buffer, CudaHal, Error, HalStream, Result};

/// The name of a pipeline's device input buffers.
pub(crate) const PIPELINE_IN: &str = "pipeline-in";
/// The name of a pipeline's device output buffers.
pub(crate) const PIPELINE_OUT: &str = "pipeline-out";

/// Whether chunks overlap (two or three streams and buffer sets) or run one after another.
///
/// ```
/// use cuda_hal::{CudaHal, LaunchDims, PipelineMode};
/// let Ok(hal) = CudaHal::new(0) else {
///     println!("no CUDA device here");
///     return;
/// };
/// let input = vec![1u32; 1 << 20];
/// let mut output = vec![0u32; input.len()];
/// let mut run = |mode| {
///     hal.pipeline(&input, &mut output, 1 << 18, mode, |s, i, o| {
///         // SAFETY: eltwise_add_u32(out, a, b, n) over the chunk's n elements.
///         unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(i.len(), 132))
///             .on(s).output(o).input(i).input(i).scalar(i.len() as u64).run() }
///     })
///     .unwrap()
/// };
/// let (sync, overlapped) = (run(PipelineMode::Synchronous), run(PipelineMode::Overlapped));
/// println!("overlap came to {:.0}% of perfect", 100.0 * overlapped.efficiency_against(&sync));
/// assert_eq!((sync.chunks, overlapped.chunks), (4, 4));
/// assert_eq!(output[0], 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineMode {
    /// Chunk k's upload overlaps chunk k-1's kernel and download. When the host stages
    /// chunks through pinned memory (pageable input or output), a third buffer set keeps two
    /// chunks on the device while the host copies the next one in and an earlier one out.
    Overlapped,
    /// Each chunk is uploaded, computed and downloaded before the next starts (the
    /// reference the overlapped mode is measured against).
    Synchronous,
}

/// What a pipeline run measured. Device times come from events around each stage.
///
/// ```
/// use cuda_hal::PipelineReport;
/// use std::time::Duration;
/// // The figures of a run: 10 ms of copies and 8 of kernels took 11 ms in all.
/// let r = PipelineReport {
///     chunks: 4,
///     wall: Duration::from_millis(11),
///     h2d_ms: 6.0,
///     compute_ms: 8.0,
///     d2h_ms: 4.0,
///     staging_ms: 0.0,
/// };
/// assert_eq!(r.ideal_ms(), 10.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PipelineReport {
    /// Chunks processed.
    pub chunks: usize,
    /// Host wall-clock time of the whole run.
    pub wall: Duration,
    /// Device time of all uploads, in milliseconds.
    pub h2d_ms: f64,
    /// Device time of all kernels.
    pub compute_ms: f64,
    /// Device time of all downloads.
    pub d2h_ms: f64,
    /// Host time of the copies between pageable memory and pinned staging (0 when input
    /// and output are page-locked).
    pub staging_ms: f64,
}

impl PipelineReport {
    /// The best a perfect overlap could do: the larger of transfer and compute time.
    ///
    /// ```
    /// use cuda_hal::PipelineReport;
    /// use std::time::Duration;
    /// let report = |wall_ms: u64| PipelineReport {
    ///     chunks: 4,
    ///     wall: Duration::from_millis(wall_ms),
    ///     h2d_ms: 6.0,
    ///     compute_ms: 8.0,
    ///     d2h_ms: 4.0,
    ///     staging_ms: 0.0,
    /// };
    /// assert_eq!(report(12).ideal_ms(), 10.0); // the copies (6 + 4 ms) bound it, not the 8 ms of kernels
    /// ```
    pub fn ideal_ms(&self) -> f64 {
        (self.h2d_ms + self.d2h_ms).max(self.compute_ms)
    }

    /// `ideal_ms` over the measured wall time (1.0 is perfect overlap). In an overlapped
    /// run the stage events also count time spent queued behind the other stream, so this
    /// over-states the ideal; prefer [`PipelineReport::efficiency_against`].
    ///
    /// ```
    /// use cuda_hal::PipelineReport;
    /// use std::time::Duration;
    /// let report = |wall_ms: u64| PipelineReport {
    ///     chunks: 4,
    ///     wall: Duration::from_millis(wall_ms),
    ///     h2d_ms: 6.0,
    ///     compute_ms: 8.0,
    ///     d2h_ms: 4.0,
    ///     staging_ms: 0.0,
    /// };
    /// assert_eq!(report(20).overlap_efficiency(), 0.5);
    /// ```
    pub fn overlap_efficiency(&self) -> f64 {
        self.ideal_ms() / (self.wall.as_secs_f64() * 1e3)
    }

    /// The ideal of an uncontended (synchronous) run of the same work over this run's wall
    /// time: how close the overlap came to perfect.
    ///
    /// ```
    /// use cuda_hal::PipelineReport;
    /// use std::time::Duration;
    /// let report = |wall_ms: u64| PipelineReport {
    ///     chunks: 4,
    ///     wall: Duration::from_millis(wall_ms),
    ///     h2d_ms: 6.0,
    ///     compute_ms: 8.0,
    ///     d2h_ms: 4.0,
    ///     staging_ms: 0.0,
    /// };
    /// let synchronous = report(18); // every stage one after another
    /// let overlapped = PipelineReport { h2d_ms: 7.0, ..report(12) }; // queued stages look longer
    /// assert!((overlapped.efficiency_against(&synchronous) - 10.0 / 12.0).abs() < 1e-12);
    /// ```
    pub fn efficiency_against(&self, synchronous: &PipelineReport) -> f64 {
        synchronous.ideal_ms() / (self.wall.as_secs_f64() * 1e3)
    }
}

struct Set<I, O> {
    stream: HalStream,
    dev_in: Buffer<I>,
    dev_out: Buffer<O>,
    /// Staging for pageable input or output (`None` where it is page-locked already).
    pin_in: Option<PinnedBlock>,
    pin_out: Option<PinnedBlock>,
    /// Timing events of the chunk in flight: before and after the upload, after `compute`,
    /// after the download. The two after the copies are also their uses of the set's
    /// buffers on its stream (so the main stream and other streams wait for them).
    ev: [Arc<Event>; 4],
    /// The chunk in flight: (first element, length).
    busy: Option<(usize, usize)>,
}

impl CudaHal {
    /// Streams `input` through upload -> `compute` -> download in chunks of `chunk_len`
    /// elements, writing `output` (same length). `compute` queues its work on the given
    /// stream, reading the first buffer and writing the second (use
    /// `hal.launch(..).on(stream)`); for the last chunk the buffers are shorter slices.
    ///
    /// Pageable `input`/`output` go through pinned staging (a parallel host memcpy per
    /// chunk, with streaming stores unless `StagingConfig::streaming_pipeline` is off);
    /// page-locked ones (a [`PinnedBuffer`](crate::PinnedBuffer)'s host slice or
    /// [`RegisteredHost`](crate::RegisteredHost) memory) are copied directly.
    ///
    /// ```
    /// use cuda_hal::{CudaHal, LaunchDims, PipelineMode};
    /// let Ok(hal) = CudaHal::new(0) else {
    ///     println!("no CUDA device here");
    ///     return;
    /// };
    /// let input: Vec<u32> = (0..10_000).collect();
    /// let mut output = vec![0u32; input.len()];
    /// let report = hal
    ///     .pipeline(&input, &mut output, 4096, PipelineMode::Overlapped, |s, i, o| {
    ///         // SAFETY: eltwise_add_u32(out, a, b, n) over the chunk's n elements.
    ///         unsafe { hal.launch("eltwise_add_u32", LaunchDims::for_elements(i.len(), 132))
    ///             .on(s).output(o).input(i).input(i).scalar(i.len() as u64).run() }
    ///     })
    ///     .unwrap();
    /// assert_eq!(output[9_999], 19_998);
    /// assert_eq!(report.chunks, 3);
    /// ```
    pub fn pipeline<I, O, F>(
        &self,
        input: &[I],
        output: &mut [O],
        chunk_len: usize,
        mode: PipelineMode,
        mut compute: F,
    ) -> Result<PipelineReport>
    where
        I: Pod + Send + Sync,
        O: Pod + Send + Sync,
        F: FnMut(&HalStream, &Buffer<I>, &Buffer<O>) -> Result<()>,
    {
        if input.len() != output.len() {
            return Err(Error::LengthMismatch {
                name: "pipeline output".into(),
                expected: input.len(),
                actual: output.len(),
            });
        }
        if input.is_empty() || chunk_len == 0 {
            return Err(Error::ZeroLength {
                name: "pipeline".into(),
            });
        }
        let h = &self.inner;
        h.enter()?;
        let chunk_len = chunk_len.min(input.len());
        let (si, so) = (std::mem::size_of::<I>(), std::mem::size_of::<O>());
        let direct_in = is_page_locked(bytemuck::cast_slice(input));
        let direct_out = is_page_locked(bytemuck::cast_slice(output));
        let streaming = self.config().staging.streaming_pipeline;
        // With staging, the host copies are a third stage: a third set lets them overlap two
        // chunks' transfers and kernels rather than one.
        let nsets = match mode {
            PipelineMode::Synchronous => 1,
            PipelineMode::Overlapped if direct_in && direct_out => 2,
            PipelineMode::Overlapped => 3,
        };
        let mut sets = Vec::with_capacity(nsets);
        for _ in 0..nsets {
            sets.push(Set {
                stream: self.create_stream()?,
                dev_in: self.alloc::<I>(PIPELINE_IN, chunk_len)?,
                dev_out: self.alloc::<O>(PIPELINE_OUT, chunk_len)?,
                pin_in: match direct_in {
                    true => None,
                    false => Some(h.guard(h.pinned.take(chunk_len * si))?),
                },
                pin_out: match direct_out {
                    true => None,
                    false => Some(h.guard(h.pinned.take(chunk_len * so))?),
                },
                ev: [
                    Arc::new(Event::new_timing()?),
                    Arc::new(Event::new_timing()?),
                    Arc::new(Event::new_timing()?),
                    Arc::new(Event::new_timing()?),
                ],
                busy: None,
            });
        }
        let d = api()?;
        let out_base = output.as_mut_ptr();
        let (mut h2d, mut comp, mut d2h) = (0f64, 0f64, 0f64);
        // Host time of the staging copies (shared by `finish` and the loop).
        let staging = std::cell::Cell::new(Duration::ZERO);
        let mut finish = |set: &mut Set<I, O>, output: &mut [O]| -> Result<()> {
            let Some((start, len)) = set.busy.take() else {
                return Ok(());
            };
            h.guard(set.ev[3].synchronize())?;
            h2d += set.ev[1].elapsed_ms(&set.ev[0])? as f64;
            comp += set.ev[2].elapsed_ms(&set.ev[1])? as f64;
            d2h += set.ev[3].elapsed_ms(&set.ev[2])? as f64;
            if let Some(pin) = &set.pin_out {
                let t = Instant::now();
                let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut output[start..start + len]);
                par_copy(dst, &pin.mem.as_slice()[..len * so], streaming);
                staging.set(staging.get() + t.elapsed());
            }
            Ok(())
        };
        let t0 = Instant::now();
        let chunks = input.len().div_ceil(chunk_len);
        // Caught so that a panic in `compute` (or anywhere in the loop) still waits for the
        // copies in flight below: they read and write `input`, `output` and the sets'
        // buffers, which unwinding would free or hand back to the caller.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            // The sets' device buffers were allocated in the main stream's order (a cached
            // block may still be in use there): the side streams' first copies wait for it.
            sets.iter().try_for_each(|set| set.stream.after_main())?;
            for k in 0..chunks {
                let _range = crate::nvtx::range(|| format!("pipeline chunk {k}/{chunks}"));
                let set = &mut sets[k % nsets];
                finish(set, output)?;
                let start = k * chunk_len;
                let len = chunk_len.min(input.len() - start);
                let src: &[u8] = bytemuck::cast_slice(&input[start..start + len]);
                let host_in = match set.pin_in.as_mut() {
                    None => src.as_ptr(),
                    Some(pin) => {
                        let t = Instant::now();
                        par_copy(&mut pin.mem.as_mut_slice()[..len * si], src, streaming);
                        staging.set(staging.get() + t.elapsed());
                        pin.mem.as_ptr()
                    }
                };
                // SAFETY: start + len <= output.len(); the pointer is only used for the
                // device copy below, while `output` stays mutably borrowed by this call.
                let host_out = match &set.pin_out {
                    None => unsafe { out_base.add(start) }.cast::<u8>(),
                    Some(pin) => pin.mem.as_ptr(),
                };
                let (dev_in, dev_out) = (set.dev_in.slice(0, len)?, set.dev_out.slice(0, len)?);
                let s = &set.stream;
                // The copies are accesses of the set's buffers like any other: ordered after
                // the buffers' other uses, host edits `compute` made with views uploaded or
                // dropped, and the host copy of what the upload overwrites marked stale.
                let (in_range, out_range) = (dev_in.byte_range(), dev_out.byte_range());
                dev_in.access_on(s, in_range.clone(), true)?;
                set.ev[0].record(&s.stream)?;
                // SAFETY: host_in holds len*si bytes (staged, or the caller's pinned input,
                // borrowed for the whole call) and is rewritten only after ev[3] completes.
                let to = dev_in.raw_ptr();
                s.stream
                    .queue(|st| unsafe { d.cuMemcpyHtoDAsync(to, host_in.cast(), len * si, st) })?;
                h.ledger.copy(Dir::H2D, len * si);
                set.ev[1].record(&s.stream)?;
                dev_in.after_on(s, set.ev[1].clone(), in_range, true);
                compute(s, &dev_in, &dev_out)?;
                // `compute` may have left another context current.
                h.enter()?;
                set.ev[2].record(&s.stream)?;
                dev_out.access_on(s, out_range.clone(), false)?;
                // SAFETY: host_out has room for len*so bytes (staging, or the caller's pinned
                // output range of this chunk) and is read only after ev[3].
                let from = dev_out.raw_ptr();
                s.stream.queue(|st| unsafe {
                    d.cuMemcpyDtoHAsync(host_out.cast(), from, len * so, st)
                })?;
                h.ledger.copy(Dir::D2H, len * so);
                set.ev[3].record(&s.stream)?;
                dev_out.after_on(s, set.ev[3].clone(), out_range, false);
                set.busy = Some((start, len));
                if mode == PipelineMode::Synchronous {
                    finish(set, output)?;
                }
            }
            // Drain in chunk order.
            let mut left: Vec<&mut Set<I, O>> =
                sets.iter_mut().filter(|s| s.busy.is_some()).collect();
            left.sort_by_key(|s| s.busy.map(|b| b.0));
            for set in left {
                finish(set, output)?;
            }
            Ok(())
        }));
        let wall = t0.elapsed();
        // Every copy is complete (or failed): the blocks can go back to the pool. Every
        // stream is waited for, even after one fails.
        let synced = sets
            .iter()
            .map(|s| {
                // The driver's stream, waited for with no context bound first: a failed
                // bind would leave the copies in doubt.
                let waited = h.guard(s.stream.stream.synchronize());
                // Where the wait failed, the set's copies may still run: its blocks are
                // never reused nor freed.
                for b in s.pin_in.iter().chain(&s.pin_out) {
                    crate::pinned::keep_if_still_used(&b.mem, &waited);
                }
                waited
            })
            .fold(Ok(()), Result::and);
        for set in sets {
            set.pin_in
                .into_iter()
                .chain(set.pin_out)
                .for_each(|b| h.pinned.give(b));
        }
        let result = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        h.guard(result)?;
        synced?;
        Ok(PipelineReport {
            chunks,
            wall,
            h2d_ms: h2d,
            compute_ms: comp,
            d2h_ms: d2h,
            staging_ms: staging.get().as_secs_f64() * 1e3,
        })
    }
}
