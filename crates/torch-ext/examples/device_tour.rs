//! What torch-ext adds to tch, in one run: the one device picker, gradient
//! clipping that reads nothing back, inference mode, a process group (two
//! Gloo ranks as two threads, all-reducing on the CPU), and on a CUDA machine
//! a side stream, GPU timing with events and a captured CUDA graph replayed.
//! On a machine without CUDA the CUDA part says it is skipped.
//!
//! ```sh
//! cargo run -p torch-ext --example device_tour
//! ```

use std::net::TcpListener;
use std::os::fd::IntoRawFd;
use std::time::Duration;

use tch::{Device, Kind, Tensor};
use torch_ext::dist::{DistBackend, ProcessGroup, ReduceOp, Rendezvous};
use torch_ext::{CudaEvent, CudaGraph, CudaStream, DeviceChoice, InferenceModeGuard};

fn main() -> anyhow::Result<()> {
    let device = torch_ext::device::select(DeviceChoice::Auto)?;
    println!("device picked by `auto`: {device:?}");

    // Clipping on the device: the total norm comes back as a tensor, so a
    // training step never waits for the host.
    let grads = vec![
        Tensor::full([3], 3.0, (Kind::Float, device)),
        Tensor::full([4], 4.0, (Kind::Float, device)),
    ];
    let norm = torch_ext::fused::clip_grad_norm_(&grads, 1.0, 2.0)?;
    let clipped: f64 = grads
        .iter()
        .map(|g| g.square().sum(Kind::Double).double_value(&[]))
        .sum();
    println!(
        "gradient norm before clipping {:.3}, after {:.3}",
        norm.double_value(&[]),
        clipped.sqrt()
    );

    {
        let _inference = InferenceModeGuard::new()?;
        let y = Tensor::ones([2, 2], (Kind::Float, device))
            .matmul(&Tensor::eye(2, (Kind::Float, device)));
        println!("under inference mode: requires_grad {}", y.requires_grad());
    }

    collectives()?;

    let Device::Cuda(index) = device else {
        println!("CUDA part skipped: no CUDA device on this machine");
        return Ok(());
    };
    let stream = CudaStream::from_pool(index, false)?;
    let start = CudaEvent::new(true)?;
    let end = CudaEvent::new(true)?;
    let x = Tensor::randn([512, 512], (Kind::Float, device));
    let mut out = Tensor::zeros([512, 512], (Kind::Float, device));
    let graph = CudaGraph::capture(&stream, None, 2, || {
        let y = x.f_matmul(&x).map_err(|e| e.to_string())?;
        out.f_copy_(&y).map_err(|e| e.to_string())?;
        Ok(())
    })?;
    start.record(&stream)?;
    for _ in 0..10 {
        graph.replay_on(&stream)?;
    }
    end.record(&stream)?;
    end.synchronize()?;
    println!(
        "10 graph replays of a 512x512 matmul on a side stream: {:.3} ms",
        start.elapsed_ms(&end)?
    );
    Ok(())
}

/// Two ranks of a c10d group (Gloo, CPU tensors) as two threads: each
/// contributes its rank + 1 and both read back the sum.
fn collectives() -> anyhow::Result<()> {
    // Rank 0 serves a socket bound here, so nothing can take the port first.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let served = listener.into_raw_fd();
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            std::thread::spawn(move || -> anyhow::Result<f64> {
                let rendezvous = Rendezvous {
                    host: "127.0.0.1".to_owned(),
                    port,
                    rank,
                    world_size: 2,
                    timeout: Duration::from_secs(30),
                    listen_fd: (rank == 0).then_some(served),
                };
                let group = ProcessGroup::new(&rendezvous, DistBackend::Gloo, Device::Cpu)?;
                let value = Tensor::full([1], (rank + 1) as f64, (Kind::Float, Device::Cpu));
                group.all_reduce_(&value, ReduceOp::Sum)?;
                Ok(value.double_value(&[0]))
            })
        })
        .collect();
    for (rank, handle) in ranks.into_iter().enumerate() {
        let sum = handle
            .join()
            .map_err(|_| anyhow::anyhow!("rank {rank} panicked"))??;
        println!("rank {rank} of 2 after all-reduce(sum): {sum}");
    }
    Ok(())
}
