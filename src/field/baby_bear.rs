//! The BabyBear prime field, stored in canonical form.

use std::fmt;
use std::iter::{Product, Sum};
use std::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use bytemuck::{Pod, Zeroable};

/// The BabyBear prime `p = 15 * 2^27 + 1 = 2013265921`.
pub const P: u32 = 15 * (1 << 27) + 1;

const P64: u64 = P as u64;

/// An element of the BabyBear field `F_p`, `p = 15 * 2^27 + 1`.
///
/// **Representation.** The stored `u32` is the *canonical* value in `[0, p)` (not Montgomery
/// form), so a buffer of `Elem` is a buffer of plain `u32` residues: what a GPU kernel, a file
/// or another library reads is the number itself. Every constructor reduces or checks; the
/// arithmetic keeps results canonical.
///
/// `Elem` is `Pod`, so a buffer can hold any bit pattern; a value `>= p` (`!is_canonical()`)
/// is not a field element. Operations on such a value never panic but give unspecified
/// results.
///
/// ```
/// use cuda_hal::field::Elem;
/// let a = Elem::new(2_000_000_000);
/// let b = Elem::new(100_000_000);
/// assert_eq!((a + b).as_u32(), 2_100_000_000 - 2013265921);
/// assert_eq!(a * a.inv(), Elem::ONE);
/// assert_eq!(Elem::new(3).pow(4), Elem::new(81));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
#[repr(transparent)]
pub struct Elem(u32);

impl Elem {
    /// The field's order `p`.
    pub const MODULUS: u32 = P;
    /// 0.
    pub const ZERO: Elem = Elem(0);
    /// 1.
    pub const ONE: Elem = Elem(1);
    /// `p - 1`, that is `-1`.
    pub const NEG_ONE: Elem = Elem(P - 1);
    /// 31, the standard generator of the multiplicative group (order `p - 1`).
    pub const GENERATOR: Elem = Elem(31);
    /// `2^27` divides `p - 1`: the largest power-of-two NTT has `2^27` points.
    pub const TWO_ADICITY: u32 = 27;
    /// `31^15 = 0x1a427a41`, a primitive `2^27`-th root of unity: the standard BabyBear choice
    /// (`GENERATOR^((p-1) / 2^27)`, the same value as Plonky3's and RISC Zero's).
    pub const TWO_ADIC_GENERATOR: Elem = Elem(0x1a42_7a41);

    /// `x mod p`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::new(Elem::MODULUS + 5), Elem::new(5));
    /// assert_eq!(Elem::new(7).as_u32(), 7);
    /// ```
    #[inline]
    pub const fn new(x: u32) -> Elem {
        Elem(x % P)
    }

    /// `x mod p` (same as [`Elem::new`]).
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::from_u32(u32::MAX), Elem::new(u32::MAX));
    /// ```
    #[inline]
    pub const fn from_u32(x: u32) -> Elem {
        Elem::new(x)
    }

    /// `x mod p`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// let big = u64::from(Elem::MODULUS) * 3 + 2;
    /// assert_eq!(Elem::from_u64(big), Elem::new(2));
    /// ```
    #[inline]
    pub const fn from_u64(x: u64) -> Elem {
        Elem((x % P64) as u32)
    }

    /// `x` if it is below `p`, else `None`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::from_canonical(12), Some(Elem::new(12)));
    /// assert_eq!(Elem::from_canonical(Elem::MODULUS), None, "p itself is not canonical");
    /// ```
    #[inline]
    pub const fn from_canonical(x: u32) -> Option<Elem> {
        if x < P {
            Some(Elem(x))
        } else {
            None
        }
    }

    /// The canonical value in `[0, p)`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!((-Elem::ONE).as_u32(), Elem::MODULUS - 1);
    /// ```
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self.0
    }

    /// The Montgomery form `x·2^32 mod p` that the kernels use for constant tables
    /// (`kernels/babybear.cuh` multiplies in Montgomery form).
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::ONE.to_montgomery(), 0x0fff_fffe); // 2^32 mod p
    /// assert_eq!(Elem::ZERO.to_montgomery(), 0);
    /// ```
    #[inline]
    pub const fn to_montgomery(self) -> u32 {
        (((self.0 as u64) << 32) % (P as u64)) as u32
    }

    /// Whether the stored value is below `p` (always true for values made by this crate).
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// // Elements read back from raw device memory can be checked before use.
    /// let raw: [u32; 2] = [5, u32::MAX];
    /// let elems: &[Elem] = bytemuck::cast_slice(&raw);
    /// assert!(elems[0].is_canonical() && !elems[1].is_canonical());
    /// ```
    #[inline]
    pub const fn is_canonical(self) -> bool {
        self.0 < P
    }

    /// `self * self`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::new(9).square(), Elem::new(81));
    /// ```
    #[inline]
    pub fn square(self) -> Elem {
        self * self
    }

    /// `self + self`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::NEG_ONE.double(), -Elem::new(2));
    /// ```
    #[inline]
    pub fn double(self) -> Elem {
        self + self
    }

    /// `self^e`, by square-and-multiply. `x^0 = 1`, also for `x = 0`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::new(2).pow(10), Elem::new(1024));
    /// assert_eq!(Elem::ZERO.pow(0), Elem::ONE);
    /// // Fermat: x^(p-1) = 1 for x != 0.
    /// assert_eq!(Elem::new(12345).pow(u64::from(Elem::MODULUS) - 1), Elem::ONE);
    /// ```
    pub fn pow(self, mut e: u64) -> Elem {
        let mut base = self;
        let mut acc = Elem::ONE;
        while e != 0 {
            if e & 1 == 1 {
                acc *= base;
            }
            base = base.square();
            e >>= 1;
        }
        acc
    }

    /// The multiplicative inverse, or `None` for zero.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// let x = Elem::new(1234);
    /// assert_eq!(x * x.try_inv().unwrap(), Elem::ONE);
    /// assert_eq!(Elem::ZERO.try_inv(), None);
    /// ```
    pub fn try_inv(self) -> Option<Elem> {
        if self.0 % P == 0 {
            None
        } else {
            Some(self.pow(u64::from(P) - 2))
        }
    }

    /// The multiplicative inverse (`self^(p-2)`); zero maps to zero.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::new(2).inv(), Elem::new(1006632961));
    /// assert_eq!(Elem::ZERO.inv(), Elem::ZERO);
    /// ```
    pub fn inv(self) -> Elem {
        self.try_inv().unwrap_or(Elem::ZERO)
    }

    /// A primitive `2^log_n`-th root of unity: `GENERATOR^((p-1) / 2^log_n)`, that is
    /// `TWO_ADIC_GENERATOR^(2^(27 - log_n))`. `None` when `log_n > 27`.
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// let w = Elem::root_of_unity(3).unwrap();
    /// assert_eq!(w.pow(8), Elem::ONE);
    /// assert_ne!(w.pow(4), Elem::ONE);
    /// assert_eq!(w, Elem::GENERATOR.pow((Elem::MODULUS as u64 - 1) / 8));
    /// ```
    pub fn root_of_unity(log_n: u32) -> Option<Elem> {
        if log_n > Self::TWO_ADICITY {
            return None;
        }
        let mut w = Self::TWO_ADIC_GENERATOR;
        for _ in log_n..Self::TWO_ADICITY {
            w = w.square();
        }
        Some(w)
    }

    /// `1 / 2^log_n` (the inverse-NTT scale).
    ///
    /// ```
    /// use cuda_hal::field::Elem;
    /// assert_eq!(Elem::inv_pow2(10) * Elem::new(1024), Elem::ONE);
    /// assert_eq!(Elem::inv_pow2(0), Elem::ONE);
    /// ```
    pub fn inv_pow2(log_n: u32) -> Elem {
        // 2^-1 = (p + 1) / 2.
        Elem(P.div_ceil(2)).pow(u64::from(log_n))
    }
}

impl From<u32> for Elem {
    /// Reduces mod `p`.
    fn from(x: u32) -> Elem {
        Elem::new(x)
    }
}

impl From<Elem> for u32 {
    fn from(x: Elem) -> u32 {
        x.0
    }
}

impl fmt::Debug for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Add for Elem {
    type Output = Elem;
    #[inline]
    fn add(self, rhs: Elem) -> Elem {
        // Canonical inputs: the sum is below 2p < 2^32. Wrapping keeps bad input panic-free.
        let s = self.0.wrapping_add(rhs.0);
        Elem(if s >= P { s.wrapping_sub(P) } else { s })
    }
}

impl Sub for Elem {
    type Output = Elem;
    #[inline]
    fn sub(self, rhs: Elem) -> Elem {
        let (d, borrow) = self.0.overflowing_sub(rhs.0);
        Elem(if borrow { d.wrapping_add(P) } else { d })
    }
}

impl Neg for Elem {
    type Output = Elem;
    #[inline]
    fn neg(self) -> Elem {
        Elem::ZERO - self
    }
}

impl Mul for Elem {
    type Output = Elem;
    #[inline]
    fn mul(self, rhs: Elem) -> Elem {
        Elem(((u64::from(self.0) * u64::from(rhs.0)) % P64) as u32)
    }
}

impl AddAssign for Elem {
    #[inline]
    fn add_assign(&mut self, rhs: Elem) {
        *self = *self + rhs;
    }
}

impl SubAssign for Elem {
    #[inline]
    fn sub_assign(&mut self, rhs: Elem) {
        *self = *self - rhs;
    }
}

impl MulAssign for Elem {
    #[inline]
    fn mul_assign(&mut self, rhs: Elem) {
        *self = *self * rhs;
    }
}

impl Sum for Elem {
    fn sum<I: Iterator<Item = Elem>>(iter: I) -> Elem {
        iter.fold(Elem::ZERO, Add::add)
    }
}

impl Product for Elem {
    fn product<I: Iterator<Item = Elem>>(iter: I) -> Elem {
        iter.fold(Elem::ONE, Mul::mul)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn elem() -> impl Strategy<Value = Elem> {
        prop_oneof![
            (0..P).prop_map(Elem),
            Just(Elem::ZERO),
            Just(Elem::ONE),
            Just(Elem::NEG_ONE),
            (P - 16..P).prop_map(Elem),
        ]
    }

    #[test]
    fn constants() {
        assert_eq!(P, 2013265921);
        assert_eq!(Elem::GENERATOR.pow(15), Elem::TWO_ADIC_GENERATOR);
        // The generator has order exactly p - 1 = 2^27 * 3 * 5.
        let n = u64::from(P) - 1;
        assert_eq!(Elem::GENERATOR.pow(n), Elem::ONE);
        for q in [2u64, 3, 5] {
            assert_ne!(Elem::GENERATOR.pow(n / q), Elem::ONE, "31^((p-1)/{q})");
        }
        assert_eq!(Elem::new(P), Elem::ZERO);
        assert_eq!(Elem::new(u32::MAX), Elem(u32::MAX % P));
        assert_eq!(Elem::from_u64(u64::MAX), Elem((u64::MAX % P64) as u32));
        assert_eq!(Elem::from_canonical(P), None);
        assert_eq!(Elem::inv_pow2(5) * Elem::new(32), Elem::ONE);
    }

    #[test]
    fn roots_of_unity_have_exact_order() {
        for log_n in 0..=Elem::TWO_ADICITY {
            let w = Elem::root_of_unity(log_n).unwrap();
            assert_eq!(w.pow(1 << log_n), Elem::ONE, "log_n {log_n}");
            if log_n > 0 {
                assert_eq!(w.pow(1 << (log_n - 1)), Elem::NEG_ONE, "log_n {log_n}");
            }
            assert_eq!(w, Elem::GENERATOR.pow((u64::from(P) - 1) >> log_n));
        }
        assert_eq!(Elem::root_of_unity(28), None);
    }

    #[test]
    fn non_canonical_values_do_not_panic() {
        let bad: Elem = bytemuck::cast(u32::MAX);
        assert!(!bad.is_canonical());
        let _ = (bad + bad, bad - bad, bad * bad, -bad, bad.inv());
    }

    proptest! {
        #[test]
        fn field_axioms(a in elem(), b in elem(), c in elem()) {
            prop_assert!((a + b).is_canonical() && (a - b).is_canonical() && (a * b).is_canonical());
            prop_assert_eq!(a + b, b + a);
            prop_assert_eq!(a * b, b * a);
            prop_assert_eq!((a + b) + c, a + (b + c));
            prop_assert_eq!((a * b) * c, a * (b * c));
            prop_assert_eq!(a * (b + c), a * b + a * c);
            prop_assert_eq!(a + Elem::ZERO, a);
            prop_assert_eq!(a * Elem::ONE, a);
            prop_assert_eq!(a + (-a), Elem::ZERO);
            prop_assert_eq!(a - b, a + (-b));
            prop_assert_eq!((a - b) + b, a);
            // Against u64 arithmetic.
            prop_assert_eq!((a + b).as_u32() as u64, (a.0 as u64 + b.0 as u64) % P64);
            prop_assert_eq!((a * b).as_u32() as u64, (a.0 as u64 * b.0 as u64) % P64);
        }

        #[test]
        fn inverse(a in elem()) {
            if a == Elem::ZERO {
                prop_assert_eq!(a.try_inv(), None);
            } else {
                prop_assert_eq!(a * a.inv(), Elem::ONE);
                prop_assert_eq!(a.inv().inv(), a);
            }
        }

        #[test]
        fn pow_adds_exponents(a in elem(), e in 0u64..1 << 40, f in 0u64..1 << 20) {
            prop_assert_eq!(a.pow(e) * a.pow(f), a.pow(e + f));
            prop_assert_eq!(a.pow(u64::from(P) - 1), if a == Elem::ZERO { Elem::ZERO } else { Elem::ONE });
        }
    }
}
