//! The alloc+free mix of the benches (`phases`, `memory`) and of
//! `examples/alloc_free_loop.rs`: request `k` is for `SIZES[k % 6]` bytes under
//! `NAMES[k % 4]`, so that instruction counts of the example match the benches' path.

/// Four buffer names, as a prover would use them.
pub const NAMES: [&str; 4] = ["column", "twiddles", "merkle-layer", "scratch"];
/// Six sizes from 4 KiB to 256 MiB.
pub const SIZES: [usize; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20];
