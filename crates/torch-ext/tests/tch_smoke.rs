//! Smoke test for the provisioned libtorch: tch links, loads without
//! LD_LIBRARY_PATH (the rpath from `.cargo/config.toml`) and computes a matmul
//! with known values on the CPU.

use tch::{Device, Kind, Tensor};

#[test]
fn cpu_matmul_gives_the_known_product() -> anyhow::Result<()> {
    let a = Tensor::from_slice(&[1.0_f32, 2.0, 3.0, 4.0]).f_reshape([2, 2])?;
    let b = Tensor::from_slice(&[5.0_f32, 6.0, 7.0, 8.0]).f_reshape([2, 2])?;
    let product = a.f_matmul(&b)?;
    assert_eq!(product.size(), vec![2, 2]);
    assert_eq!(product.kind(), Kind::Float);
    assert_eq!(product.device(), Device::Cpu);
    let values = Vec::<f32>::try_from(product.f_flatten(0, -1)?)?;
    // [[1,2],[3,4]] x [[5,6],[7,8]] = [[19,22],[43,50]]
    assert_eq!(values, vec![19.0, 22.0, 43.0, 50.0]);
    Ok(())
}

#[test]
fn autograd_through_the_matmul_gives_the_known_gradient() -> anyhow::Result<()> {
    let x = Tensor::from_slice(&[1.0_f32, 2.0, 3.0]).f_set_requires_grad(true)?;
    let w = Tensor::from_slice(&[4.0_f32, 5.0, 6.0]);
    let y = x.f_dot(&w)?; // 4 + 10 + 18 = 32
    assert_eq!(f64::try_from(&y)?, 32.0);
    y.backward();
    let grad = Vec::<f32>::try_from(x.grad())?;
    assert_eq!(grad, vec![4.0, 5.0, 6.0]);
    Ok(())
}
