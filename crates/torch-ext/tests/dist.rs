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
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use torch_ext::dist::{DistBackend, ProcessGroup, ReduceOp, Rendezvous};

mod common;
use common::in_own_process;

/// A loopback socket bound to a free port and listening, as a launcher
/// keeps one for rank 0: its port and its descriptor (which rank 0's group
/// takes over). Nothing else can take the port meanwhile.
fn meeting_place() -> (u16, RawFd) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    (port, listener.into_raw_fd())
}

fn rendezvous(port: u16, rank: usize, timeout: Duration) -> Rendezvous {
    Rendezvous {
        host: "127.0.0.1".to_owned(),
        port,
        rank,
        world_size: 2,
        timeout,
        listen_fd: None,
    }
}

/// Rank 0's rendezvous, serving the socket of [`meeting_place`].
fn served((port, fd): (u16, RawFd), timeout: Duration) -> Rendezvous {
    Rendezvous {
        listen_fd: Some(fd),
        ..rendezvous(port, 0, timeout)
    }
}

/// Rank `rank` of the group meeting at `place`.
fn member(place: (u16, RawFd), rank: usize, timeout: Duration) -> Rendezvous {
    if rank == 0 {
        served(place, timeout)
    } else {
        rendezvous(place.0, rank, timeout)
    }
}

#[test]
fn two_gloo_ranks_all_reduce_broadcast_and_meet() {
    in_own_process("two_gloo_ranks_all_reduce_broadcast_and_meet", || {
        let place = meeting_place();
        let timeout = Duration::from_secs(30);
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                thread::spawn(move || -> Vec<Vec<f32>> {
                    let group = ProcessGroup::new(
                        &member(place, rank, timeout),
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
            let place = meeting_place();
            let timeout = Duration::from_secs(5);
            let leaver = thread::spawn(move || {
                let group = ProcessGroup::new(
                    &rendezvous(place.0, 1, timeout),
                    DistBackend::Gloo,
                    Device::Cpu,
                )
                .expect("join");
                group.barrier().expect("first barrier");
                drop(group); // leaves: its Gloo connections close
            });
            let group = ProcessGroup::new(&served(place, timeout), DistBackend::Gloo, Device::Cpu)
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
    // Rank 0 serves a socket bound before: no other process can take the
    // port first (a port merely found free could be, and the rendezvous then
    // failed at once with EADDRINUSE instead of waiting).
    let timeout = Duration::from_millis(1500);
    let start = Instant::now();
    let error = ProcessGroup::new(
        &served(meeting_place(), timeout),
        DistBackend::Gloo,
        Device::Cpu,
    )
    .expect_err("nobody else comes");
    let took = start.elapsed();
    println!("rendezvous error after {took:?}: {error}");
    assert!(
        took >= Duration::from_millis(1000),
        "took {took:?}: {error}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}: {error}");
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
fn a_listening_socket_that_does_not_fit_is_refused_naming_it() {
    let timeout = Duration::from_secs(1);
    let refused = |rendezvous: &Rendezvous, needle: &str| {
        let error = ProcessGroup::new(rendezvous, DistBackend::Gloo, Device::Cpu)
            .expect_err("refused")
            .to_string();
        assert!(error.contains(needle), "{error}");
    };
    // Only rank 0 serves the store.
    let (port, fd) = meeting_place();
    refused(
        &Rendezvous {
            listen_fd: Some(fd),
            ..rendezvous(port, 1, timeout)
        },
        "only rank 0 serves the store",
    );
    // A socket bound to another port than the one the others are told.
    let other = if port == u16::MAX { port - 1 } else { port + 1 };
    refused(&served((other, fd), timeout), "not the store's port");
    // A descriptor that is not a socket, and one that is not open.
    let file =
        std::fs::File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("a file");
    refused(
        &served((port, file.as_raw_fd()), timeout),
        "is not a bound TCP socket",
    );
    refused(
        &served((port, i32::MAX), timeout),
        "is not a bound TCP socket",
    );
    refused(&served((port, -1), timeout), "is not a descriptor");
}

#[test]
fn a_tensor_of_the_wrong_kind_is_refused() {
    in_own_process("a_tensor_of_the_wrong_kind_is_refused", || {
        let place = meeting_place();
        let timeout = Duration::from_secs(30);
        let peer = thread::spawn(move || {
            let group = ProcessGroup::new(
                &rendezvous(place.0, 1, timeout),
                DistBackend::Gloo,
                Device::Cpu,
            )
            .expect("join");
            group.barrier().expect("barrier");
        });
        let group = ProcessGroup::new(&served(place, timeout), DistBackend::Gloo, Device::Cpu)
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
