//! The BabyBear field `F_p`, `p = 15·2^27 + 1`, and its quartic extension `F_p[x]/(x^4 - 11)`.
//!
//! Both types are `Pod` so they live in device buffers as they are:
//!
//! - [`Elem`] is one `u32` holding the **canonical** residue in `[0, p)` (not Montgomery
//!   form). GPU kernels read and write the same numbers; a kernel may convert to Montgomery
//!   form internally but must store canonical values.
//! - [`ExtElem`] is four `Elem`s, lowest-degree coefficient first (`#[repr(C)]`).
//!
//! [`FieldElement`] abstracts over both for element-wise operations.
//!
//! ```
//! use cuda_hal::field::{Elem, ExtElem, FieldElement};
//! fn dot<F: FieldElement>(a: &[F], b: &[F]) -> F {
//!     a.iter().zip(b).fold(F::ZERO, |acc, (x, y)| acc + *x * *y)
//! }
//! assert_eq!(dot(&[Elem::new(2), Elem::new(3)], &[Elem::new(4), Elem::new(5)]), Elem::new(23));
//! let e = ExtElem::from_base(Elem::new(7));
//! assert_eq!(dot(&[e], &[e]), ExtElem::from_base(Elem::new(49)));
//! ```

mod baby_bear;
mod ext;

use std::fmt::{Debug, Display};
use std::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub, SubAssign};

pub use baby_bear::{Elem, P};
pub use ext::ExtElem;

/// What element-wise operations need of a field type: [`Elem`] or [`ExtElem`].
///
/// Code generic over it runs on either field:
/// ```
/// use cuda_hal::field::{Elem, ExtElem, FieldElement};
/// fn sum_of_squares<F: FieldElement>(xs: &[F]) -> F {
///     xs.iter().fold(F::ZERO, |acc, &x| acc + x * x)
/// }
/// let xs = [Elem::new(1), Elem::new(2), Elem::new(3)];
/// assert_eq!(sum_of_squares(&xs), Elem::new(14));
/// let ext: Vec<ExtElem> = xs.iter().map(|&x| ExtElem::from_base(x)).collect();
/// assert_eq!(sum_of_squares(&ext), ExtElem::from_base(Elem::new(14)));
/// ```
pub trait FieldElement:
    bytemuck::Pod
    + Send
    + Sync
    + Default
    + Eq
    + Debug
    + Display
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Degree over the base field (1 or 4): the number of `u32`s per element.
    const DEGREE: usize;
    /// A short tag for kernel names and messages: `"bb"` or `"bb4"`.
    const TAG: &'static str;

    /// The base-field element `e` embedded in this field.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem, FieldElement};
    /// let e = <ExtElem as FieldElement>::from_base(Elem::new(7));
    /// assert_eq!(e.coeffs(), [Elem::new(7), Elem::ZERO, Elem::ZERO, Elem::ZERO]);
    /// ```
    fn from_base(e: Elem) -> Self;
    /// `self * s` for a base-field `s`.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem, FieldElement};
    /// let x = ExtElem::new([1, 2, 3, 4].map(Elem::new));
    /// let y = FieldElement::mul_base(x, Elem::new(2));
    /// assert_eq!(y.coeffs(), [2, 4, 6, 8].map(Elem::new));
    /// ```
    fn mul_base(self, s: Elem) -> Self;
    /// `self^e`.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, FieldElement};
    /// assert_eq!(FieldElement::pow(Elem::new(3), 4), Elem::new(81));
    /// assert_eq!(FieldElement::pow(Elem::new(3), 0), Elem::ONE);
    /// ```
    fn pow(self, e: u64) -> Self;
    /// The inverse; zero maps to zero.
    ///
    /// ```
    /// use cuda_hal::field::{Elem, ExtElem, FieldElement};
    /// let x = ExtElem::new([5, 0, 1, 9].map(Elem::new));
    /// assert_eq!(x * FieldElement::inv(x), ExtElem::ONE);
    /// assert_eq!(FieldElement::inv(Elem::ZERO), Elem::ZERO);
    /// ```
    fn inv(self) -> Self;
}

impl FieldElement for Elem {
    const ZERO: Self = Elem::ZERO;
    const ONE: Self = Elem::ONE;
    const DEGREE: usize = 1;
    const TAG: &'static str = "bb";

    fn from_base(e: Elem) -> Self {
        e
    }
    fn mul_base(self, s: Elem) -> Self {
        self * s
    }
    fn pow(self, e: u64) -> Self {
        Elem::pow(self, e)
    }
    fn inv(self) -> Self {
        Elem::inv(self)
    }
}

impl FieldElement for ExtElem {
    const ZERO: Self = ExtElem::ZERO;
    const ONE: Self = ExtElem::ONE;
    const DEGREE: usize = 4;
    const TAG: &'static str = "bb4";

    fn from_base(e: Elem) -> Self {
        ExtElem::from_base(e)
    }
    fn mul_base(self, s: Elem) -> Self {
        ExtElem::mul_base(self, s)
    }
    fn pow(self, e: u64) -> Self {
        ExtElem::pow(self, e)
    }
    fn inv(self) -> Self {
        ExtElem::inv(self)
    }
}
