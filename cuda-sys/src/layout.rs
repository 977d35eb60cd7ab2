//! Compile-time checks that the structs the HAL hands to the driver have the C layout of
//! `cuda.h` on 64-bit targets (sizes and field offsets worked out from the header by hand).

#![cfg(target_pointer_width = "64")]

use core::mem::{align_of, offset_of, size_of};

use static_assertions::{assert_eq_size, const_assert_eq};

use crate::bindings::*;

// Handles and device pointers are one machine word.
assert_eq_size!(CUdeviceptr, u64);
assert_eq_size!(CUstream, *mut core::ffi::c_void);
assert_eq_size!(CUmemoryPool, *mut core::ffi::c_void);
assert_eq_size!(CUresult, u32);

// struct CUmemLocation { CUmemLocationType type; int id; }
const_assert_eq!(size_of::<CUmemLocation>(), 8);
const_assert_eq!(offset_of!(CUmemLocation, id), 4);

// struct CUmemAccessDesc { CUmemLocation location; CUmemAccess_flags flags; }
const_assert_eq!(size_of::<CUmemAccessDesc>(), 12);
const_assert_eq!(offset_of!(CUmemAccessDesc, flags), 8);

// struct CUmemPoolProps: 4 + 4 + 8 + ptr + size_t + ushort + 54 reserved bytes.
const_assert_eq!(size_of::<CUmemPoolProps>(), 88);
const_assert_eq!(align_of::<CUmemPoolProps>(), 8);
const_assert_eq!(offset_of!(CUmemPoolProps, location), 8);
const_assert_eq!(offset_of!(CUmemPoolProps, win32SecurityAttributes), 16);
const_assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
const_assert_eq!(offset_of!(CUmemPoolProps, usage), 32);
const_assert_eq!(offset_of!(CUmemPoolProps, reserved), 34);

// struct CUDA_MEMCPY2D: seven 8-byte slots for each side, then width and height.
const_assert_eq!(size_of::<CUDA_MEMCPY2D>(), 128);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, srcMemoryType), 16);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, srcHost), 24);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, srcDevice), 32);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, srcPitch), 48);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, dstXInBytes), 56);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, dstMemoryType), 72);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, dstDevice), 88);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, dstPitch), 104);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, WidthInBytes), 112);
const_assert_eq!(offset_of!(CUDA_MEMCPY2D, Height), 120);

// struct CUlaunchConfig: seven unsigned ints, padding, stream, attrs pointer, count.
const_assert_eq!(size_of::<CUlaunchConfig>(), 56);
const_assert_eq!(offset_of!(CUlaunchConfig, sharedMemBytes), 24);
const_assert_eq!(offset_of!(CUlaunchConfig, hStream), 32);
const_assert_eq!(offset_of!(CUlaunchConfig, attrs), 40);
const_assert_eq!(offset_of!(CUlaunchConfig, numAttrs), 48);
