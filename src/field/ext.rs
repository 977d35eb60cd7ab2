//! The degree-4 extension `F_p[x] / (x^4 - 11)`.

use std::fmt;
use std::iter::{Product, Sum};
use std::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use bytemuck::{Pod, Zeroable};

use super::Elem;

/// An element `c0 + c1·x + c2·x^2 + c3·x^3` of `F_p[x] / (x^4 - 11)`, the quartic extension
/// of BabyBear (`x^4 = 11`; 11 is a quadratic non-residue mod `p`, so `x^4 - 11` is
/// irreducible). The same extension as Plonky3's `BinomialExtensionField<BabyBear, 4>`.
///
/// Stored as four canonical [`Elem`]s, lowest degree first (`#[repr(C)]`, 16 bytes), so a
/// buffer of `n` `ExtElem`s is `4n` `u32`s, element-major.
///
/// ```
/// use cuda_hal::field::{Elem, ExtElem};
/// let x = ExtElem::new([Elem::ZERO, Elem::ONE, Elem::ZERO, Elem::ZERO]);
/// assert_eq!(x.pow(4), ExtElem::from_base(Elem::new(11)));
/// let a = ExtElem::new([1, 2, 3, 4].map(Elem::new));
/// assert_eq!(a * a.inv(), ExtElem::ONE);
/// assert_eq!(a.mul_base(Elem::new(2)), a + a);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(C)]
pub struct ExtElem([Elem; 4]);

/// `W` in `x^4 = W`.
const W: Elem = Elem::new(11);

impl ExtElem {
    /// `W = 11`: the extension is `F_p[x] / (x^4 - W)`.
    pub const W: Elem = W;
    /// 0.
    pub const ZERO: ExtElem = ExtElem([Elem::ZERO; 4]);
    /// 1.
    pub const ONE: ExtElem = ExtElem([Elem::ONE, Elem::ZERO, Elem::ZERO, Elem::ZERO]);

    /// The element with these coefficients, lowest degree first.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// // x, so that x^4 = W = 11
    /// let x = ExtElem::new([Elem::ZERO, Elem::ONE, Elem::ZERO, Elem::ZERO]);
    /// assert_eq!(x.pow(4), ExtElem::from_base(ExtElem::W));
    /// ```
    #[inline]
    pub const fn new(coeffs: [Elem; 4]) -> ExtElem {
        ExtElem(coeffs)
    }

    /// The base-field element `e` (`e + 0·x + 0·x^2 + 0·x^3`).
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let (a, b) = (Elem::new(6), Elem::new(7));
    /// assert_eq!(ExtElem::from_base(a) * ExtElem::from_base(b), ExtElem::from_base(a * b));
    /// ```
    #[inline]
    pub const fn from_base(e: Elem) -> ExtElem {
        ExtElem([e, Elem::ZERO, Elem::ZERO, Elem::ZERO])
    }

    /// The coefficients, lowest degree first.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let e = ExtElem::new([1, 2, 3, 4].map(Elem::new));
    /// assert_eq!(e.coeffs()[3], Elem::new(4));
    /// ```
    #[inline]
    pub const fn coeffs(self) -> [Elem; 4] {
        self.0
    }

    /// `self * s` for a base-field `s` (four base multiplications).
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let e = ExtElem::new([1, 2, 3, 4].map(Elem::new));
    /// assert_eq!(e.mul_base(Elem::new(3)), e * ExtElem::from_base(Elem::new(3)));
    /// ```
    #[inline]
    pub fn mul_base(self, s: Elem) -> ExtElem {
        ExtElem(self.0.map(|c| c * s))
    }

    /// `self^e`.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let e = ExtElem::new([3, 1, 4, 1].map(Elem::new));
    /// assert_eq!(e.pow(3), e * e * e);
    /// assert_eq!(e.pow(0), ExtElem::ONE);
    /// ```
    pub fn pow(self, mut e: u64) -> ExtElem {
        let mut base = self;
        let mut acc = ExtElem::ONE;
        while e != 0 {
            if e & 1 == 1 {
                acc *= base;
            }
            base = base * base;
            e >>= 1;
        }
        acc
    }

    /// The inverse, or `None` for zero.
    ///
    /// With `a(x)` the element, `a(x)·a(-x) = b0 + b1·x^2` lies in the quadratic subfield,
    /// and `(b0 + b1·x^2)(b0 - b1·x^2) = b0^2 - W·b1^2` in the base field, so
    /// `a^-1 = a(-x)·(b0 - b1·x^2) / (b0^2 - W·b1^2)`: one base inversion.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let e = ExtElem::new([2, 7, 1, 8].map(Elem::new));
    /// assert_eq!(e * e.try_inv().unwrap(), ExtElem::ONE);
    /// assert_eq!(ExtElem::ZERO.try_inv(), None);
    /// ```
    pub fn try_inv(self) -> Option<ExtElem> {
        let [a0, a1, a2, a3] = self.0;
        let b0 = a0 * a0 + W * (a2 * a2) - W * (a1 * a3).double();
        let b1 = (a0 * a2).double() - a1 * a1 - W * (a3 * a3);
        let norm_inv = (b0 * b0 - W * (b1 * b1)).try_inv()?;
        let neg_x = ExtElem([a0, -a1, a2, -a3]);
        let conj = ExtElem([b0, Elem::ZERO, -b1, Elem::ZERO]);
        Some((neg_x * conj).mul_base(norm_inv))
    }

    /// The inverse; zero maps to zero.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem};
    /// let e = ExtElem::new([0, 0, 5, 0].map(Elem::new));
    /// assert_eq!(e.inv() * e, ExtElem::ONE);
    /// assert_eq!(ExtElem::ZERO.inv(), ExtElem::ZERO);
    /// ```
    pub fn inv(self) -> ExtElem {
        self.try_inv().unwrap_or(ExtElem::ZERO)
    }
}

impl From<Elem> for ExtElem {
    fn from(e: Elem) -> ExtElem {
        ExtElem::from_base(e)
    }
}

impl fmt::Debug for ExtElem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl fmt::Display for ExtElem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [c0, c1, c2, c3] = self.0;
        write!(f, "{c0} + {c1}x + {c2}x^2 + {c3}x^3")
    }
}

impl Add for ExtElem {
    type Output = ExtElem;
    #[inline]
    fn add(self, rhs: ExtElem) -> ExtElem {
        let (a, b) = (self.0, rhs.0);
        ExtElem([a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]])
    }
}

impl Sub for ExtElem {
    type Output = ExtElem;
    #[inline]
    fn sub(self, rhs: ExtElem) -> ExtElem {
        let (a, b) = (self.0, rhs.0);
        ExtElem([a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]])
    }
}

impl Neg for ExtElem {
    type Output = ExtElem;
    #[inline]
    fn neg(self) -> ExtElem {
        ExtElem(self.0.map(|c| -c))
    }
}

impl Mul for ExtElem {
    type Output = ExtElem;
    #[inline]
    fn mul(self, rhs: ExtElem) -> ExtElem {
        let [a0, a1, a2, a3] = self.0;
        let [b0, b1, b2, b3] = rhs.0;
        ExtElem([
            a0 * b0 + W * (a1 * b3 + a2 * b2 + a3 * b1),
            a0 * b1 + a1 * b0 + W * (a2 * b3 + a3 * b2),
            a0 * b2 + a1 * b1 + a2 * b0 + W * (a3 * b3),
            a0 * b3 + a1 * b2 + a2 * b1 + a3 * b0,
        ])
    }
}

impl AddAssign for ExtElem {
    #[inline]
    fn add_assign(&mut self, rhs: ExtElem) {
        *self = *self + rhs;
    }
}

impl SubAssign for ExtElem {
    #[inline]
    fn sub_assign(&mut self, rhs: ExtElem) {
        *self = *self - rhs;
    }
}

impl MulAssign for ExtElem {
    #[inline]
    fn mul_assign(&mut self, rhs: ExtElem) {
        *self = *self * rhs;
    }
}

impl Sum for ExtElem {
    fn sum<I: Iterator<Item = ExtElem>>(iter: I) -> ExtElem {
        iter.fold(ExtElem::ZERO, Add::add)
    }
}

impl Product for ExtElem {
    fn product<I: Iterator<Item = ExtElem>>(iter: I) -> ExtElem {
        iter.fold(ExtElem::ONE, Mul::mul)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::P;
    use proptest::prelude::*;

    fn base() -> impl Strategy<Value = Elem> {
        prop_oneof![
            4 => (0..P).prop_map(Elem::new),
            1 => Just(Elem::ZERO),
            1 => Just(Elem::NEG_ONE),
        ]
    }

    fn ext() -> impl Strategy<Value = ExtElem> {
        [base(), base(), base(), base()].prop_map(ExtElem::new)
    }

    #[test]
    fn modulus_is_irreducible_and_x4_is_w() {
        // 11 is a non-residue (Euler's criterion); with p = 1 mod 4 that makes x^4 - 11
        // irreducible.
        assert_eq!(Elem::new(11).pow((u64::from(P) - 1) / 2), Elem::NEG_ONE);
        let x = ExtElem::new([Elem::ZERO, Elem::ONE, Elem::ZERO, Elem::ZERO]);
        assert_eq!(x * x * x * x, ExtElem::from_base(W));
        // The field has p^4 elements: a^(p^4) = a (Frobenius applied four times).
        let a = ExtElem::new([3, 1, 4, 1].map(Elem::new));
        let p = u64::from(P);
        assert_eq!(a.pow(p).pow(p).pow(p).pow(p), a);
        assert_ne!(a.pow(p).pow(p), a, "a lies in no proper subfield");
    }

    proptest! {
        #[test]
        fn field_axioms(a in ext(), b in ext(), c in ext()) {
            prop_assert_eq!(a + b, b + a);
            prop_assert_eq!(a * b, b * a);
            prop_assert_eq!((a + b) + c, a + (b + c));
            prop_assert_eq!((a * b) * c, a * (b * c));
            prop_assert_eq!(a * (b + c), a * b + a * c);
            prop_assert_eq!(a * ExtElem::ONE, a);
            prop_assert_eq!(a + (-a), ExtElem::ZERO);
            prop_assert_eq!((a - b) + b, a);
        }

        #[test]
        fn inverse(a in ext()) {
            if a == ExtElem::ZERO {
                prop_assert_eq!(a.try_inv(), None);
            } else {
                prop_assert_eq!(a * a.inv(), ExtElem::ONE);
            }
        }

        #[test]
        fn base_embedding(a in ext(), s in base(), t in base()) {
            prop_assert_eq!(a.mul_base(s), a * ExtElem::from_base(s));
            prop_assert_eq!(ExtElem::from_base(s) * ExtElem::from_base(t), ExtElem::from_base(s * t));
            prop_assert_eq!(ExtElem::from_base(s) + ExtElem::from_base(t), ExtElem::from_base(s + t));
        }
    }
}
