//! The plan of the fused NTT passes: how many passes a `2^log_n`-point NTT takes, which
//! stages each runs and where it reads and writes (see [`plan_ntt`] and
//! `kernels/ntt.cuh`).
//!
//! Plain Rust with no dependency: `build.rs` includes this file too, to compile a pass
//! kernel for each pass of every plan ([`fixed_passes`]) with its parameters
//! as constants, so the kernels and the plan the crate launches them by cannot disagree.

/// Largest tile (log2 elements) of the fused NTT passes: a pass of `k` stages moves tiles
/// of `2^(k + c)` elements (`c` coalescing bits) through 16 KiB of shared memory at most,
/// with `2^(k + c - REG_LOG)` threads (the kernels are built for 256).
pub(crate) const TILE_LOG: u32 = 12;
/// Coalescing bits of a single-pass NTT (whole columns per tile, up to 32 of them).
const SINGLE_COALESCE_LOG: u32 = 5;
/// The column count the passes compiled per size are planned for: a multiple of 32 gives a
/// single-pass plan its most coalescing bits (multi-pass plans do not depend on it).
const FIXED_PLAN_COLS: usize = 1 << SINGLE_COALESCE_LOG;
/// Stages and coalescing bits of each pass of a multi-pass NTT: 4096-element tiles of 256
/// threads, 16 consecutive points (64 bytes) per lane group for a pass of up to 8 stages.
/// On an H100 this measured 5% faster for 2^24 than 8192-element tiles with 32 consecutive
/// points. A pass of 9 stages keeps the tile and takes 8 consecutive points (32 bytes, a
/// whole sector): sizes that 9-stage passes cover in fewer passes than 8-stage ones
/// (2^17, 2^18, 2^25 to 2^27) take them, and move a pass's worth less memory.
const MAX_PASS_STAGES: u32 = 9;
const MULTI_COALESCE_LOG: u32 = 4;
const WIDE_PASS_COALESCE_LOG: u32 = TILE_LOG - MAX_PASS_STAGES;
/// Each thread of a pass holds `2^REG_LOG` values; passes need `k >= REG_LOG`.
pub(crate) const REG_LOG: u32 = 4;

/// Where a pass reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// The caller's buffer.
    Io,
    /// The scratch buffer.
    Scratch,
}

/// One pass: a launch of `ntt_pass_k{k}_bb`, or of the kernel compiled for it (see
/// [`pass_kernel`]; parameters as in `kernels/ntt.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NttPass {
    pub(crate) s0: u32,
    pub(crate) k: u32,
    pub(crate) c: u32,
    pub(crate) cpos: u32,
    pub(crate) bitrev: bool,
    /// First lane bit of the load and store layouts (tile bits `0..k` are the stages',
    /// `k..k + c` the coalescing bits).
    pub(crate) p_load: u32,
    pub(crate) p_store: u32,
    pub(crate) src: Loc,
    pub(crate) dst: Loc,
    pub(crate) scale: bool,
}

impl NttPass {
    /// The pass's parameters in the order `NTT_FIXED_PASS` and the host check take them:
    /// `k, s0, c, cpos, bitrev, p_load, p_store`.
    #[cfg_attr(not(test), allow(dead_code))] // used by build.rs and the tests' host check
    pub(crate) fn shape(&self) -> [u32; 7] {
        let p = self;
        [
            p.k,
            p.s0,
            p.c,
            p.cpos,
            u32::from(p.bitrev),
            p.p_load,
            p.p_store,
        ]
    }

    pub(crate) fn uses_scratch(&self) -> bool {
        self.src == Loc::Scratch || self.dst == Loc::Scratch
    }
}

/// The pass kernels by stage count, `REG_LOG..=TILE_LOG`.
const NTT_PASS_KERNELS: [&str; 9] = [
    "ntt_pass_k4_bb",
    "ntt_pass_k5_bb",
    "ntt_pass_k6_bb",
    "ntt_pass_k7_bb",
    "ntt_pass_k8_bb",
    "ntt_pass_k9_bb",
    "ntt_pass_k10_bb",
    "ntt_pass_k11_bb",
    "ntt_pass_k12_bb",
];

/// The passes of a `2^log_n`-point NTT over `cols` columns (`log_n >= REG_LOG`).
///
/// - `log_n <= 12`: one in-place pass whose tiles hold whole columns (and `2^c` of them at
///   once, `c` limited by the column count's power-of-two factor), bit reversal on load.
///   Lanes load along the column's top bits (consecutive after reversal) and store along
///   its low bits.
/// - else: `⌈log_n / 9⌉` passes of up to 9 stages, the larger shares first, with 16
///   consecutive points on the lanes (8 for a pass of 9 stages; the coalescing bits at
///   position 0). The first reads the bit-reversed input from `Io` into `Scratch` (its
///   tiles read other positions than they write; its coalescing bits are the column's top
///   ones, consecutive after reversal, and it stores along the low stage bits), the middle
///   ones work in place on `Scratch`, the last writes to `Io`.
///
/// The inverse's `1/n` is applied on the last pass's stores.
pub(crate) fn plan_ntt(log_n: u32, cols: usize, inverse: bool) -> Vec<NttPass> {
    debug_assert!(log_n >= REG_LOG);
    if log_n <= TILE_LOG {
        let k = log_n;
        let c = single_pass_coalesce_log(k, cols);
        return vec![NttPass {
            s0: 0,
            k,
            c,
            cpos: k,
            bitrev: true,
            p_load: k.saturating_sub(5).max(REG_LOG),
            p_store: if k > REG_LOG { 0 } else { REG_LOG },
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
        let c = if k == MAX_PASS_STAGES {
            WIDE_PASS_COALESCE_LOG
        } else {
            MULTI_COALESCE_LOG
        };
        out.push(NttPass {
            s0,
            k,
            c,
            cpos: if first { log_n - c } else { 0 },
            bitrev: first,
            p_load: k,
            p_store: if first { 0 } else { k },
            src: if first { Loc::Io } else { Loc::Scratch },
            dst: if last { Loc::Io } else { Loc::Scratch },
            scale: last && inverse,
        });
        s0 += k;
    }
    out
}

/// Coalescing bits of a single-pass plan of `2^log_n` points over `cols` columns: as many
/// whole columns a tile as fit, at most 32, and a power of two that divides `cols`.
fn single_pass_coalesce_log(log_n: u32, cols: usize) -> u32 {
    (TILE_LOG - log_n)
        .min(SINGLE_COALESCE_LOG)
        .min(cols.trailing_zeros())
}

/// Column sizes (log2) whose NTT passes are compiled for their size: every size, up to
/// BabyBear's two-adicity (27). A single-pass size is compiled for its plan over a multiple
/// of 32 columns; a column count with fewer coalescing bits takes the generic kernel.
pub(crate) const FIXED_LOG_N: std::ops::RangeInclusive<u32> = REG_LOG..=27;

/// The kernel of pass `index` of a `2^log_n`-point NTT compiled for it (`log_n` in
/// [`FIXED_LOG_N`]): `ntt_pass_n{log_n}_{index}_bb`.
fn fixed_pass_kernel(log_n: u32, index: usize) -> String {
    format!("ntt_pass_n{log_n}_{index}_bb")
}

/// The kernel that runs pass `index` of `plan`, a plan of `2^log_n`-point columns: the one
/// compiled for that pass where there is one and `fixed` allows it, else the generic pass
/// kernel of its stage count.
pub(crate) fn pass_kernel(
    plan: &[NttPass],
    index: usize,
    log_n: u32,
    fixed: bool,
) -> std::borrow::Cow<'static, str> {
    let compiled =
        plan.len() > 1 || plan[index].c == single_pass_coalesce_log(log_n, FIXED_PLAN_COLS);
    if fixed && compiled && FIXED_LOG_N.contains(&log_n) {
        fixed_pass_kernel(log_n, index).into()
    } else {
        NTT_PASS_KERNELS[(plan[index].k - REG_LOG) as usize].into()
    }
}

/// The kernel that runs the first pass of `plan` (a plan of `2^log_n`-point columns) for a
/// coset LDE, reading the coefficients rather than the expanded column: as
/// [`pass_kernel`], with `ntt_lde_pass_` for `ntt_pass_` (the same arguments and two
/// more, see `kernels/babybear.cu`).
pub(crate) fn lde_pass_kernel(plan: &[NttPass], log_n: u32, fixed: bool) -> String {
    pass_kernel(plan, 0, log_n, fixed).replacen("ntt_pass_", "ntt_lde_pass_", 1)
}

/// Every pass compiled for its size: `(log_n, index, pass)`, the forward plan's over
/// [`FIXED_PLAN_COLS`] columns (an inverse plan differs only in its last pass's `scale`,
/// which stays an argument).
#[cfg_attr(not(test), allow(dead_code))] // build.rs compiles the kernels from it
pub(crate) fn fixed_passes() -> impl Iterator<Item = (u32, usize, NttPass)> {
    FIXED_LOG_N.flat_map(|log_n| {
        plan_ntt(log_n, FIXED_PLAN_COLS, false)
            .into_iter()
            .enumerate()
            .map(move |(i, p)| (log_n, i, p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::Elem;

    /// The passes compiled for their sizes are the ones launched: for every size they
    /// cover, whatever the column count and direction, the plan is theirs (less the
    /// inverse's scale), and `pass_kernel` names their kernels; smaller sizes and
    /// `fixed: false` take the generic kernels.
    #[test]
    fn the_compiled_passes_are_the_plans_the_crate_launches() {
        assert_eq!(*FIXED_LOG_N.end(), Elem::TWO_ADICITY);
        let fixed: Vec<(u32, usize, NttPass)> = fixed_passes().collect();
        assert_eq!(
            fixed.len(),
            9 + 6 * 2 + 9 * 3,
            "1 pass a size to 2^12, 2 to 2^18, 3 above"
        );
        let mut generic_single = 0;
        for log_n in REG_LOG..=Elem::TWO_ADICITY {
            for cols in [1, 2, 3, 32, 64, 1 << 12] {
                for inverse in [false, true] {
                    let plan = plan_ntt(log_n, cols, inverse);
                    assert_eq!(plan.len() > 1, log_n > TILE_LOG, "log_n {log_n}");
                    for (i, p) in plan.iter().enumerate() {
                        let generic = format!("ntt_pass_k{}_bb", p.k);
                        let generic_lde = format!("ntt_lde_pass_k{}_bb", p.k);
                        assert_eq!(pass_kernel(&plan, i, log_n, false), generic);
                        if i == 0 {
                            assert_eq!(lde_pass_kernel(&plan, log_n, false), generic_lde);
                        }
                        let compiled = fixed
                            .iter()
                            .find(|&&(l, j, _)| (l, j) == (log_n, i))
                            .map(|&(_, _, p)| p)
                            .expect("every size is compiled");
                        let launched = NttPass { scale: false, ..*p };
                        if compiled != launched {
                            // Only a single-pass plan over too few columns for the
                            // compiled one's coalescing bits differs; it runs the generic
                            // kernel.
                            assert!(plan.len() == 1 && p.c < compiled.c, "log_n {log_n}");
                            assert_eq!(NttPass { c: p.c, ..compiled }, launched);
                            assert_eq!(pass_kernel(&plan, i, log_n, true), generic);
                            assert_eq!(lde_pass_kernel(&plan, log_n, true), generic_lde);
                            generic_single += 1;
                            continue;
                        }
                        let name = format!("ntt_pass_n{log_n}_{i}_bb");
                        assert_eq!(pass_kernel(&plan, i, log_n, true), name);
                        if i == 0 {
                            let lde = format!("ntt_lde_pass_n{log_n}_0_bb");
                            assert_eq!(lde_pass_kernel(&plan, log_n, true), lde);
                            assert!(
                                p.bitrev && p.s0 == 0,
                                "an LDE's source is read bit-reversed from stage 0"
                            );
                        }
                        let last = i + 1 == plan.len();
                        assert_eq!(p.scale, inverse && last, "{name}");
                    }
                }
            }
        }
        // 2^4 to 2^11 over 1, 2 and 3 columns (2^11 over 2 has its one coalescing bit),
        // forward and inverse.
        assert_eq!(generic_single, (8 * 3 - 1) * 2);
    }
}
