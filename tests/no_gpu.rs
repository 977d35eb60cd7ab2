//! Behaviour that needs no GPU: typing guarantees and the no-driver path.

use cuda_hal::{Buffer, CudaHal, Error};

#[test]
fn hal_and_buffers_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaHal>();
    assert_send_sync::<Buffer<u32>>();
    assert_send_sync::<Buffer<[u64; 4]>>();
}

#[test]
fn without_a_driver_every_entry_point_is_an_error_not_a_panic() {
    if cuda_hal::cuda_sys::driver().is_ok() {
        println!("a driver is present: this test covers machines without one");
        return;
    }
    let err = CudaHal::new(0).err().expect("no driver, no HAL");
    assert!(
        matches!(
            err,
            Error::Cuda(cuda_hal::cuda_sys::Error::DriverNotFound { .. })
        ),
        "{err}"
    );
    assert!(cuda_hal::driver::device_count().is_err());
    assert!(cuda_hal::DeviceInfo::query(0).is_err());
    assert!(err.to_string().contains("libcuda"));
}
