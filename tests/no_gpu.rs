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
    let not_found = |e: &Error| {
        matches!(
            e,
            Error::Cuda(cuda_hal::cuda_sys::Error::DriverNotFound { .. })
        )
    };
    assert!(not_found(&cuda_hal::driver::device_count().unwrap_err()));
    assert!(not_found(&cuda_hal::DeviceInfo::query(0).unwrap_err()));
    assert!(not_found(
        &CudaHal::with_config(0, cuda_hal::HalConfig::default())
            .err()
            .unwrap()
    ));
    assert!(not_found(&cuda_hal::HalSet::all().err().unwrap()));
    let err = cuda_hal::cuda_sys::driver().err().unwrap();
    assert!(matches!(
        err,
        cuda_hal::cuda_sys::Error::DriverNotFound { .. }
    ));
    // The CPU HAL keeps working where there is no driver.
    use cuda_hal::{Hal, HalBuffer};
    let cpu = cuda_hal::CpuHal::new();
    let b = cpu.copy_from("b", &[1u32, 2, 3]).unwrap();
    assert_eq!(b.get_at(2).unwrap(), 3);
    assert!(err.to_string().contains("libcuda"));
}
