//! c10d process groups on the CPU (Gloo): two ranks as two threads of this
//! process, each with its own TCPStore client and Gloo context.
//!
//! Two ranks in one process share libtorch's flight recorder (a process-wide
//! record of collectives), which is not safe for that: about one run in ten
//! ended in a SIGSEGV inside `FlightRecorder::recordWithResetEnabled` from
//! `ProcessGroupGloo::enqueue`. A rank per process, as `esper` runs them,
//! does not share it. So every test with two ranks runs in a process of its
//! own (`common::in_own_process`) with the recorder off (`TORCH_FR_BUFFER_SIZE=0`):
//! 40 runs of the whole file without a crash, against 2 in 15 before.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use torch_ext::dist::{DistBackend, ProcessGroup, ReduceOp, Rendezvous};

mod common;
use common::in_own_process;

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

fn rendezvous(port: u16, rank: usize, timeout: Duration) -> Rendezvous {
    Rendezvous {
        host: "127.0.0.1".to_owned(),
        port,
        rank,
        world_size: 2,
        timeout,
    }
}

#[test]
fn two_gloo_ranks_all_reduce_broadcast_and_meet() {
    in_own_process("two_gloo_ranks_all_reduce_broadcast_and_meet", || {
        let port = free_port();
        let timeout = Duration::from_secs(30);
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                thread::spawn(move || -> Vec<Vec<f32>> {
                    let group = ProcessGroup::new(
                        &rendezvous(port, rank, timeout),
                        DistBackend::Gloo,
                        Device::Cpu,
                    )
                    .expect("join the group");
                    assert_eq!((group.rank(), group.world_size()), (rank, 2));
                    let base = if rank == 0 {
                        [1.0f32, -2.0, 3.0]
                    } else {
                        [10.0f32, 20.0, -30.0]
                    };
                    let sum = Tensor::from_slice(&base);
                    group.all_reduce_(&sum, ReduceOp::Sum).expect("sum");
                    let max = Tensor::from_slice(&base);
                    group.all_reduce_(&max, ReduceOp::Max).expect("max");
                    let min = Tensor::from_slice(&base);
                    group.all_reduce_(&min, ReduceOp::Min).expect("min");
                    let from_one = Tensor::from_slice(&base);
                    group.broadcast_(&from_one, 1).expect("broadcast");
                    group.barrier().expect("barrier");
                    [sum, max, min, from_one]
                        .iter()
                        .map(|t| Vec::<f32>::try_from(t).expect("to vec"))
                        .collect()
                })
            })
            .collect();
        let results: Vec<_> = ranks
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect();
        for result in &results {
            assert_eq!(result[0], vec![11.0, 18.0, -27.0]);
            assert_eq!(result[1], vec![10.0, 20.0, 3.0]);
            assert_eq!(result[2], vec![1.0, -2.0, -30.0]);
            assert_eq!(result[3], vec![10.0, 20.0, -30.0]);
        }
    });
}

#[test]
fn a_peer_that_leaves_turns_the_next_collective_into_an_error() {
    in_own_process(
        "a_peer_that_leaves_turns_the_next_collective_into_an_error",
        || {
            let port = free_port();
            let timeout = Duration::from_secs(5);
            let leaver = thread::spawn(move || {
                let group = ProcessGroup::new(
                    &rendezvous(port, 1, timeout),
                    DistBackend::Gloo,
                    Device::Cpu,
                )
                .expect("join");
                group.barrier().expect("first barrier");
                drop(group); // leaves: its Gloo connections close
            });
            let group = ProcessGroup::new(
                &rendezvous(port, 0, timeout),
                DistBackend::Gloo,
                Device::Cpu,
            )
            .expect("join");
            group.barrier().expect("first barrier");
            leaver.join().expect("leaver thread");
            let start = Instant::now();
            let tensor = Tensor::ones([8], (Kind::Float, Device::Cpu));
            let error = group
                .all_reduce_(&tensor, ReduceOp::Sum)
                .expect_err("the peer is gone");
            assert!(
                start.elapsed() < timeout + Duration::from_secs(5),
                "took {:?}",
                start.elapsed()
            );
            println!("error seen by the remaining rank: {error}");
        },
    );
}

#[test]
fn a_missing_peer_fails_the_rendezvous_at_the_timeout() {
    // The port is free when `free_port` returns it, and may be taken again
    // before the store binds it: the tests with two ranks pick theirs in
    // processes of their own at the same time. Such an attempt fails at
    // once, not at the timeout, and is tried again on another port (seen
    // once in a CI run: an error after 0.8 ms). A rendezvous that never
    // waits for its timeout fails every attempt.
    let timeout = Duration::from_millis(1500);
    let mut fast = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let start = Instant::now();
        let error = ProcessGroup::new(
            &rendezvous(port, 0, timeout),
            DistBackend::Gloo,
            Device::Cpu,
        )
        .expect_err("nobody else comes");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(20), "took {took:?}: {error}");
        if took >= Duration::from_millis(1000) {
            println!("rendezvous error: {error}");
            return;
        }
        fast.push(format!("port {port}: {error} after {took:?}"));
    }
    panic!("no attempt waited for the timeout: {fast:#?}");
}

#[test]
fn bad_arguments_are_refused_before_libtorch() {
    let bad_rank = Rendezvous {
        rank: 2,
        ..rendezvous(29_999, 0, Duration::from_secs(1))
    };
    assert!(bad_rank.validate().is_err());
    let bad_port = rendezvous(0, 0, Duration::from_secs(1));
    assert!(bad_port.validate().is_err());
    let zero_timeout = rendezvous(29_999, 0, Duration::ZERO);
    assert!(zero_timeout.validate().is_err());
    // Gloo carries CPU tensors only; NCCL needs CUDA.
    let ok = rendezvous(29_999, 0, Duration::from_secs(1));
    assert!(ProcessGroup::new(&ok, DistBackend::Gloo, Device::Cuda(0)).is_err());
    assert!(ProcessGroup::new(&ok, DistBackend::Nccl, Device::Cpu).is_err());
}

#[test]
fn a_tensor_of_the_wrong_kind_is_refused() {
    in_own_process("a_tensor_of_the_wrong_kind_is_refused", || {
        let port = free_port();
        let timeout = Duration::from_secs(30);
        let peer = thread::spawn(move || {
            let group = ProcessGroup::new(
                &rendezvous(port, 1, timeout),
                DistBackend::Gloo,
                Device::Cpu,
            )
            .expect("join");
            group.barrier().expect("barrier");
        });
        let group = ProcessGroup::new(
            &rendezvous(port, 0, timeout),
            DistBackend::Gloo,
            Device::Cpu,
        )
        .expect("join");
        let strided = Tensor::ones([4, 4], (Kind::Float, Device::Cpu)).transpose(0, 1);
        assert!(group.all_reduce_(&strided, ReduceOp::Sum).is_err());
        assert!(
            group
                .broadcast_(&Tensor::ones([2], (Kind::Float, Device::Cpu)), 5)
                .is_err()
        );
        group.barrier().expect("barrier");
        peer.join().expect("peer");
    });
}
