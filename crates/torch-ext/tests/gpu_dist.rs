//! NCCL process groups on two GPUs of one host: two ranks as two threads,
//! one GPU each, in a process of their own with libtorch's flight recorder
//! off (`common::in_own_process`, see `tests/dist.rs`). Skips with a printed
//! reason without two CUDA devices or without NVLink multicast turned off in
//! the environment.

use std::net::TcpListener;
use std::os::fd::IntoRawFd;
use std::thread;
use std::time::Duration;

use tch::{Device, Kind, Tensor};
use torch_ext::dist::{DistBackend, ProcessGroup, ReduceOp, Rendezvous, check_multicast_off};

mod common;
use common::in_own_process;

#[test]
fn two_nccl_ranks_reduce_and_broadcast_on_two_gpus() {
    in_own_process("two_nccl_ranks_reduce_and_broadcast_on_two_gpus", || {
        let count = torch_ext::cuda::device_count();
        if count < 2 {
            println!("skipped: needs 2 CUDA devices, found {count}");
            return;
        }
        if let Err(error) = check_multicast_off() {
            println!("skipped: {error}");
            return;
        }
        // Bound now and served by rank 0: no other process can take the port.
        let listener = TcpListener::bind("127.0.0.1:0").expect("port");
        let port = listener.local_addr().expect("addr").port();
        let served = listener.into_raw_fd();
        let ranks: Vec<_> = (0..2usize)
            .map(|rank| {
                thread::spawn(move || -> (Vec<f32>, Vec<f32>) {
                    let rendezvous = Rendezvous {
                        host: "127.0.0.1".to_owned(),
                        port,
                        rank,
                        world_size: 2,
                        timeout: Duration::from_secs(120),
                        listen_fd: (rank == 0).then_some(served),
                    };
                    let device = Device::Cuda(rank);
                    let group = ProcessGroup::new(&rendezvous, DistBackend::Nccl, device)
                        .expect("nccl group");
                    let values = Tensor::full([1024], (rank + 1) as f64, (Kind::Float, device));
                    group
                        .all_reduce_(&values, ReduceOp::Sum)
                        .expect("all-reduce");
                    let root = Tensor::full([4], (10 * rank + 7) as f64, (Kind::Float, device));
                    group.broadcast_(&root, 1).expect("broadcast");
                    group.barrier().expect("barrier");
                    let sum = Vec::<f32>::try_from(&values.to_device(Device::Cpu)).expect("sum");
                    let got = Vec::<f32>::try_from(&root.to_device(Device::Cpu)).expect("root");
                    (sum, got)
                })
            })
            .collect();
        for handle in ranks {
            let (sum, root) = handle.join().expect("rank");
            assert!(sum.iter().all(|v| *v == 3.0), "sum {:?}", &sum[..4]);
            assert_eq!(root, vec![17.0; 4]);
        }
        println!("two NCCL ranks agreed on two GPUs");
    });
}

#[test]
fn a_graph_captures_on_the_second_gpu_while_the_first_is_current() {
    let count = torch_ext::cuda::device_count();
    if count < 2 {
        println!("skipped: needs 2 CUDA devices, found {count}");
        return;
    }
    torch_ext::cuda::set_device(0).expect("device 0 current");
    let device = Device::Cuda(1);
    let stream = torch_ext::CudaStream::from_pool(1, false).expect("a stream of GPU 1");
    let x = Tensor::randn([8, 8], (Kind::Float, device));
    let mut out = Tensor::zeros([8, 8], (Kind::Float, device));
    let graph = torch_ext::CudaGraph::capture(&stream, None, 1, || {
        let y = x.f_matmul(&x).map_err(|e| e.to_string())?;
        out.f_copy_(&y).map_err(|e| e.to_string())?;
        Ok(())
    })
    .expect("capture on GPU 1's stream");
    assert_eq!(
        torch_ext::cuda::current_device().expect("current"),
        0,
        "the guard restored it"
    );
    let _ = out.zero_();
    graph.replay().expect("replay");
    let expected = x.matmul(&x);
    let diff = (&out - &expected).abs().max().double_value(&[]);
    assert!(diff < 1e-3, "replay differs by {diff}");
}
