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
    fn from_base(e: Elem) -> Self;
    /// `self * s` for a base-field `s`.
    fn mul_base(self, s: Elem) -> Self;
    /// `self^e`.
    fn pow(self, e: u64) -> Self;
    /// The inverse; zero maps to zero.
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
