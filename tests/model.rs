//! Model-based tests: random sequences of buffer operations on the GPU checked against a
//! plain `Vec` model, in whichever phase build runs them. On failure the seed and the
//! operation are printed; rerun one seed with `CUDA_HAL_MODEL_SEED=<seed>`.
//! `CUDA_HAL_MODEL_CASES` sets how many sequences run (default 300).

mod common;

use common::{gpu, Rng};
use cuda_hal::{ops, Buffer, CudaHal, Error};

/// A buffer (or slice) and the model of the allocation it views.
struct Entry {
    buf: Buffer<u32>,
    /// Index of the model allocation, and this view's range in it.
    alloc: usize,
    start: usize,
}

struct Model {
    allocs: Vec<Vec<u32>>,
    entries: Vec<Entry>,
}

impl Model {
    fn view(&self, e: usize) -> &[u32] {
        let en = &self.entries[e];
        &self.allocs[en.alloc][en.start..en.start + en.buf.len()]
    }

    fn view_mut(&mut self, e: usize) -> &mut [u32] {
        let (alloc, start, len) = {
            let en = &self.entries[e];
            (en.alloc, en.start, en.buf.len())
        };
        &mut self.allocs[alloc][start..start + len]
    }

    fn overlaps(&self, a: usize, b: usize) -> bool {
        let (x, y) = (&self.entries[a], &self.entries[b]);
        x.alloc == y.alloc && x.start < y.start + y.buf.len() && y.start < x.start + x.buf.len()
    }
}

fn run_sequence(hal: &CudaHal, seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let mut m = Model {
        allocs: Vec::new(),
        entries: Vec::new(),
    };
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        let op = if m.entries.is_empty() {
            0
        } else {
            rng.below(12)
        };
        let pick = |rng: &mut Rng, m: &Model| rng.below(m.entries.len());
        match op {
            0 | 1 => {
                let cap = if rng.below(10) == 0 { 300_000 } else { 2000 };
                let n = 1 + rng.below(cap);
                let data = rng.u32s(n);
                let buf = if op == 0 {
                    let b = hal.alloc_zeroed::<u32>("model-zeroed", n).unwrap();
                    m.allocs.push(vec![0; n]);
                    b
                } else {
                    let b = hal.copy_from("model", &data).unwrap();
                    m.allocs.push(data);
                    b
                };
                m.entries.push(Entry {
                    buf,
                    alloc: m.allocs.len() - 1,
                    start: 0,
                });
            }
            2 => {
                // A slice of a slice.
                let e = pick(&mut rng, &m);
                let len = m.entries[e].buf.len();
                let off = rng.below(len);
                let n = 1 + rng.below(len - off);
                let s = m.entries[e].buf.slice(off, n).unwrap();
                let (alloc, start) = (m.entries[e].alloc, m.entries[e].start + off);
                m.entries.push(Entry {
                    buf: s,
                    alloc,
                    start,
                });
                assert!(
                    matches!(
                        m.entries[e].buf.slice(off, len - off + 1),
                        Err(Error::OutOfRange { .. })
                    ),
                    "{ctx}"
                );
            }
            3 => {
                let e = pick(&mut rng, &m);
                let i = rng.below(m.entries[e].buf.len());
                assert_eq!(
                    m.entries[e].buf.get_at(i).unwrap(),
                    m.view(e)[i],
                    "{ctx}: get_at({i})"
                );
            }
            4 => {
                let e = pick(&mut rng, &m);
                let want = m.view(e).to_vec();
                assert!(
                    m.entries[e].buf.view(|s| s == &want[..]).unwrap(),
                    "{ctx}: view"
                );
            }
            5 => {
                let e = pick(&mut rng, &m);
                let len = m.entries[e].buf.len();
                let edits: Vec<(usize, u32)> = (0..1 + rng.below(5))
                    .map(|_| (rng.below(len), rng.next_u64() as u32))
                    .collect();
                m.entries[e]
                    .buf
                    .view_mut(|s| edits.iter().for_each(|(i, v)| s[*i] = *v))
                    .unwrap();
                let mv = m.view_mut(e);
                edits.iter().for_each(|(i, v)| mv[*i] = *v);
            }
            6 => {
                let e = pick(&mut rng, &m);
                let v = rng.next_u64() as u32;
                m.entries[e].buf.fill(v).unwrap();
                m.view_mut(e).fill(v);
            }
            7 => {
                // Kernel write: out = a + b (or a * b) over equal-length views.
                let (o, a, b) = (pick(&mut rng, &m), pick(&mut rng, &m), pick(&mut rng, &m));
                let n = m.entries[o]
                    .buf
                    .len()
                    .min(m.entries[a].buf.len())
                    .min(m.entries[b].buf.len());
                let (so, sa, sb) = (
                    rng.below(m.entries[o].buf.len() - n + 1),
                    rng.below(m.entries[a].buf.len() - n + 1),
                    rng.below(m.entries[b].buf.len() - n + 1),
                );
                let mul = rng.below(2) == 0;
                let views = [(o, so), (a, sa), (b, sb)].map(|(e, s)| {
                    let en = &m.entries[e];
                    Entry {
                        buf: en.buf.slice(s, n).unwrap(),
                        alloc: en.alloc,
                        start: en.start + s,
                    }
                });
                let base = m.entries.len();
                m.entries.extend(views);
                let (eo, ea, eb) = (base, base + 1, base + 2);
                let r = if mul {
                    ops::mul(&m.entries[eo].buf, &m.entries[ea].buf, &m.entries[eb].buf)
                } else {
                    ops::add(&m.entries[eo].buf, &m.entries[ea].buf, &m.entries[eb].buf)
                };
                if m.overlaps(eo, ea) || m.overlaps(eo, eb) {
                    assert!(
                        matches!(r, Err(Error::Aliasing { .. })),
                        "{ctx}: overlap must be refused"
                    );
                } else {
                    r.unwrap();
                    let (x, y) = (m.view(ea).to_vec(), m.view(eb).to_vec());
                    let out = m.view_mut(eo);
                    for i in 0..n {
                        out[i] = if mul {
                            x[i].wrapping_mul(y[i])
                        } else {
                            x[i].wrapping_add(y[i])
                        };
                    }
                }
                m.entries.truncate(base);
            }
            8 => {
                let e = pick(&mut rng, &m);
                let data = rng.u32s(m.entries[e].buf.len());
                m.entries[e].buf.copy_from_slice(&data).unwrap();
                m.view_mut(e).copy_from_slice(&data);
                let short = vec![0u32; m.entries[e].buf.len() + 1];
                assert!(
                    matches!(
                        m.entries[e].buf.copy_from_slice(&short),
                        Err(Error::LengthMismatch { .. })
                    ),
                    "{ctx}"
                );
            }
            9 => {
                let e = pick(&mut rng, &m);
                assert_eq!(
                    m.entries[e].buf.to_vec().unwrap(),
                    m.view(e),
                    "{ctx}: to_vec"
                );
            }
            10 => {
                let e = pick(&mut rng, &m);
                m.entries.swap_remove(e);
            }
            _ => {
                // Device copy between views of equal length.
                let (d, s) = (pick(&mut rng, &m), pick(&mut rng, &m));
                let n = m.entries[d].buf.len().min(m.entries[s].buf.len());
                let dst = m.entries[d].buf.slice(0, n).unwrap();
                let src = m.entries[s].buf.slice(0, n).unwrap();
                let r = dst.copy_from_buffer(&src);
                let (da, dst_start, sa, src_start) = (
                    m.entries[d].alloc,
                    m.entries[d].start,
                    m.entries[s].alloc,
                    m.entries[s].start,
                );
                if da == sa && dst_start < src_start + n && src_start < dst_start + n {
                    assert!(
                        matches!(r, Err(Error::Aliasing { .. })),
                        "{ctx}: overlapping copy must be refused"
                    );
                } else {
                    r.unwrap();
                    let data = m.allocs[sa][src_start..src_start + n].to_vec();
                    m.allocs[da][dst_start..dst_start + n].copy_from_slice(&data);
                }
            }
        }
    }
    // Everything still matches at the end.
    for e in 0..m.entries.len() {
        assert_eq!(
            m.entries[e].buf.to_vec().unwrap(),
            m.view(e),
            "seed {seed}: final check of view {e}"
        );
    }
}

#[test]
fn random_operation_sequences_match_a_vec_model() {
    let Some(hal) = gpu() else { return };
    let cases: u64 = std::env::var("CUDA_HAL_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    if let Some(seed) = std::env::var("CUDA_HAL_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return run_sequence(&hal, seed, 60);
    }
    let threads = 4u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let hal = hal.clone();
            s.spawn(move || {
                for k in 0..cases.div_ceil(threads) {
                    run_sequence(&hal, 1_000_000 * t + k, 40);
                }
            });
        }
    });
    hal.synchronize().unwrap();
    assert_eq!(
        hal.memory_report().current_bytes,
        0,
        "every buffer was freed"
    );
    println!("{cases} sequences of 40 operations matched the model");
}

#[test]
fn several_hals_on_one_device_hammered_by_threads() {
    let Some(_g) = gpu() else { return };
    let hals: Vec<CudaHal> = (0..3).map(|_| CudaHal::new(0).unwrap()).collect();
    std::thread::scope(|s| {
        for (k, hal) in hals.iter().enumerate() {
            for t in 0..3u64 {
                let hal = hal.clone();
                s.spawn(move || {
                    for i in 0..10 {
                        run_sequence(&hal, 50_000 + 100 * k as u64 + 10 * t + i, 30);
                    }
                });
            }
        }
    });
    for h in &hals {
        assert_eq!(h.memory_report().current_bytes, 0);
    }
}
