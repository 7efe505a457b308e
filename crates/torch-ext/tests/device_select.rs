//! The workspace's one device selection: what each [`DeviceChoice`] gives on
//! this machine, the typed errors for a CUDA device that is not there, and
//! the serialized form benchmark records carry.

use tch::Device;
use torch_ext::DeviceChoice;
use torch_ext::device::select;

#[test]
fn cpu_is_always_the_cpu_and_auto_follows_cuda_availability() {
    assert_eq!(select(DeviceChoice::Cpu).ok(), Some(Device::Cpu));
    let expected = if torch_ext::cuda::is_available() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    assert_eq!(select(DeviceChoice::Auto).ok(), Some(expected));
    assert_eq!(DeviceChoice::default(), DeviceChoice::Auto);
}

#[test]
fn a_cuda_device_that_is_not_there_is_a_typed_error() {
    let count = torch_ext::cuda::device_count();
    match select(DeviceChoice::Cuda(count)) {
        Err(torch_ext::Error::CudaUnavailable) => assert_eq!(count, 0),
        Err(torch_ext::Error::InvalidDevice {
            device,
            count: seen,
        }) => {
            assert_eq!((device, seen), (count, count));
        }
        other => panic!("CUDA device {count} of {count} gave {other:?}"),
    }
    assert!(select(DeviceChoice::Cuda(usize::MAX)).is_err());
    if count > 0 {
        assert_eq!(select(DeviceChoice::Cuda(0)).ok(), Some(Device::Cuda(0)));
    }
}

#[test]
fn choices_keep_their_record_form_and_name_devices_exactly() -> anyhow::Result<()> {
    // The trainer configuration inside baseline records spells devices so.
    assert_eq!(serde_json::to_string(&DeviceChoice::Cpu)?, "\"cpu\"");
    assert_eq!(serde_json::to_string(&DeviceChoice::Auto)?, "\"auto\"");
    assert_eq!(
        serde_json::to_string(&DeviceChoice::Cuda(1))?,
        "{\"cuda\":1}"
    );
    let back: DeviceChoice = serde_json::from_str("{\"cuda\":1}")?;
    assert_eq!(back, DeviceChoice::Cuda(1));
    assert_eq!(DeviceChoice::of(Device::Cuda(3)), DeviceChoice::Cuda(3));
    assert_eq!(DeviceChoice::of(Device::Cpu), DeviceChoice::Cpu);
    Ok(())
}
