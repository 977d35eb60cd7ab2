//! `cuda-hal`: a CUDA driver-API HAL for prover and compute backends.
//!
//! Layers, bottom up:
//! - [`cuda_sys`]: bindgen'd driver API loaded at run time; every failure is a `Result`.
//! - [`driver`]: safe wrappers, one per driver object (context, stream, event, pool,
//!   module, pinned memory).
//! - [`CudaHal`] and [`Buffer`]: one device's context, stream, own memory pool and kernels;
//!   typed buffers with a host cache, `get_at` by offset and stream-ordered allocation.
//! - [`ops`]: operations on buffers built from the embedded kernels.
//! - [`Hal`] and [`HalBuffer`]: the backend-neutral interface prover code is written against
//!   (element-wise field arithmetic, batched NTT and bit reversal, coset LDE, Poseidon2 row
//!   hashing and Merkle layers), with [`CpuHal`], a host implementation that runs anywhere.
//! - [`field`] (BabyBear and its quartic extension), [`poseidon2`] and [`cpu_ops`] (the
//!   reference operations every backend must match).
//!
//! The four phases of the GB10 plan are cargo features (see [`PHASES`]); with none enabled
//! the crate behaves like the original HAL, so each phase's gain can be measured.
//!
//! ```
//! use cuda_hal::{ops, CudaHal};
//! let hal = match CudaHal::new(0) {
//!     Ok(hal) => hal,
//!     Err(e) => return println!("no CUDA device here: {e}"),
//! };
//! let a = hal.copy_from("a", &[1.0f32, 2.0, 3.0]).unwrap();
//! let b = hal.copy_from("b", &[0.5f32, 0.5, 0.5]).unwrap();
//! let out = hal.alloc::<f32>("out", 3).unwrap();
//! ops::mul(&out, &a, &b).unwrap();
//! assert_eq!(out.to_vec().unwrap(), vec![0.5, 1.0, 1.5]);
//! ```

mod alloc_keys;
mod allocs;
mod arena;
mod arena_placement;
mod block_cache;
mod buffer;
mod copy_threads;
mod cpu_hal;
pub mod cpu_ops;
pub mod driver;
mod error;
mod fastcopy;
pub mod field;
mod hal;
mod hal_trait;
pub mod host_cache;
mod host_copies;
mod host_pages;
mod kept_threads;
mod kernels;
mod ledger;
mod managed;
mod multi;
mod ntt_plan;
pub mod nvtx;
pub mod ops;
mod phases;
mod pinned;
mod pipeline;
pub mod poseidon2;
mod probe_table;
mod prover_ops;
mod recycler;
mod resize;
mod staging;
mod streams;
mod tracking;
mod transfer;

pub use arena::{ArenaLayout, ArenaStats, ArenaView, Batch, BatchArena};
pub use buffer::{Buffer, RawBuffer};
pub use cpu_hal::{CpuBuffer, CpuHal};
pub use cuda_sys;
pub use driver::{DeviceInfo, PinnedFlags, PoolStats};
pub use error::{Error, Result};
pub use hal::{CudaHal, HalConfig, HalStats};
pub use hal_trait::{Hal, HalBuffer};
pub use host_copies::HostCopyStats;
pub use kernels::{kernels_available, DevicePtr, Launch, LaunchDims, FATBIN};
pub use ledger::{LedgerSnapshot, Traffic};
pub use managed::{ManagedAdvice, ManagedBuffer, ManagedLocation, ManagedRangeInfo};
pub use multi::HalSet;
pub use phases::{Phases, PHASES};
pub use pinned::{PinnedBuffer, PinnedPoolStats, RegisteredHost};
pub use pipeline::{PipelineMode, PipelineReport};
pub use poseidon2::Digest;
pub use resize::GrowableBuffer;
pub use staging::{StagingConfig, StagingStats};
pub use streams::{HalEvent, HalStream};
pub use tracking::{LiveAllocation, MemoryReport, NameTotals};
pub use transfer::{PendingRead, READ_SNAPSHOT_NAME};
