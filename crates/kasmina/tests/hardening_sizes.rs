//! Sizes near the integer limits are typed errors, decided before any tensor
//! is allocated, the same in debug and release (issue 9): host configs,
//! blueprint widths, prefetch sizing, seed masks and op masks.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use kasmina::blueprint::Blueprint;
use kasmina::host::{CnnHost, CnnHostConfig, LinearHost, SlotId, Topology};
use kasmina::host::{TransformerHost, TransformerHostConfig};
use kasmina::prefetch::{PrefetchConfig, Prefetcher};
use tch::Device;

/// Runs `f`, which must return an error without panicking, within a second.
fn refused<T: std::fmt::Debug>(what: &str, f: impl FnOnce() -> kasmina::Result<T>) {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(f));
    let elapsed = started.elapsed();
    match outcome {
        Ok(Err(error)) => {
            assert!(elapsed < Duration::from_secs(1), "{what}: took {elapsed:?}");
            eprintln!("{what}: {error}");
        }
        Ok(Ok(value)) => panic!("{what}: accepted ({value:?})"),
        Err(_) => panic!("{what}: panicked"),
    }
}

#[test]
fn cnn_host_sizes_near_the_limits_are_errors() {
    let base = CnnHostConfig::fashion_mnist();
    let cases: Vec<(&str, CnnHostConfig)> = vec![
        (
            "n_blocks usize::MAX",
            CnnHostConfig {
                n_blocks: usize::MAX,
                ..base.clone()
            },
        ),
        (
            "n_blocks 70",
            CnnHostConfig {
                n_blocks: 70,
                ..base.clone()
            },
        ),
        (
            "base_channels i64::MAX",
            CnnHostConfig {
                base_channels: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "base_channels 2^40",
            CnnHostConfig {
                base_channels: 1 << 40,
                ..base.clone()
            },
        ),
        (
            "in_channels i64::MAX",
            CnnHostConfig {
                in_channels: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "input_size i64::MAX",
            CnnHostConfig {
                input_size: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "n_classes i64::MAX",
            CnnHostConfig {
                n_classes: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "kernel_size i64::MAX",
            CnnHostConfig {
                kernel_size: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "pool_layers 200",
            CnnHostConfig {
                n_blocks: 300,
                pool_layers: 200,
                ..base.clone()
            },
        ),
    ];
    for (what, config) in cases {
        refused(what, || CnnHost::new(config, Device::Cpu));
    }
}

#[test]
fn transformer_host_sizes_near_the_limits_are_errors() {
    let base = TransformerHostConfig::tiny();
    let cases: Vec<(&str, TransformerHostConfig)> = vec![
        (
            "vocab i64::MAX",
            TransformerHostConfig {
                vocab_size: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "n_embd 2^40",
            TransformerHostConfig {
                n_embd: 1 << 40,
                n_head: 1,
                ..base.clone()
            },
        ),
        (
            "n_embd 0",
            TransformerHostConfig {
                n_embd: 0,
                ..base.clone()
            },
        ),
        (
            "block_size i64::MAX",
            TransformerHostConfig {
                block_size: i64::MAX,
                ..base.clone()
            },
        ),
        (
            "no layers, usize::MAX segments",
            TransformerHostConfig {
                n_layer: 0,
                num_segments: usize::MAX,
                ..base.clone()
            },
        ),
        (
            "usize::MAX layers",
            TransformerHostConfig {
                n_layer: usize::MAX,
                num_segments: 1,
                ..base.clone()
            },
        ),
    ];
    for (what, config) in cases {
        refused(what, || TransformerHost::new(config, Device::Cpu));
    }
    let huge = TransformerHostConfig {
        vocab_size: i64::MAX,
        ..base
    };
    refused("param_count of an i64::MAX vocabulary", || {
        huge.param_count()
    });
}

#[test]
fn linear_host_sizes_are_checked() {
    for (input, output) in [
        (i64::MAX, 4),
        (4, i64::MAX),
        (0, 4),
        (4, 0),
        (-1, 4),
        (1 << 31, 1 << 31),
    ] {
        refused(&format!("linear {input}x{output}"), || {
            LinearHost::new(input, output, Device::Cpu)
        });
    }
}

#[test]
fn blueprint_widths_near_the_limits_are_errors() {
    for blueprint in Blueprint::ALL {
        for topology in [Topology::Cnn, Topology::Transformer] {
            if !blueprint.exists_in(topology) {
                continue;
            }
            for dim in [i64::MAX, 1 << 40, 1 << 20] {
                refused(&format!("{blueprint} {topology:?} build {dim}"), || {
                    blueprint.build(topology, dim, Device::Cpu)
                });
                if *blueprint != Blueprint::Noop {
                    refused(&format!("{blueprint} {topology:?} count {dim}"), || {
                        blueprint.param_count(topology, dim)
                    });
                }
            }
        }
    }
}

#[test]
fn cnn_block_channels_do_not_overflow() {
    let config = CnnHostConfig::fashion_mnist();
    refused("block_channels(200)", || config.block_channels(200));
    refused("block_channels(62)", || config.block_channels(62));
    assert_eq!(config.block_channels(2).expect("in range"), 32);
}

#[test]
fn prefetch_sizes_are_bounded() {
    refused("queue usize::MAX", || {
        Prefetcher::new(PrefetchConfig {
            queue_capacity: usize::MAX,
            worker_threads: 1,
        })
    });
    let prefetcher = Prefetcher::new(PrefetchConfig::default()).expect("prefetcher");
    refused("request at i64::MAX channels", || {
        prefetcher.request("conv_heavy", i64::MAX, SlotId::new(0, 0), Device::Cpu)
    });
    refused("try_request at 2^40 channels", || {
        prefetcher.try_request("conv_light", 1 << 40, SlotId::new(0, 0), Device::Cpu)
    });
    let outcome = catch_unwind(AssertUnwindSafe(|| prefetcher.shutdown(Duration::MAX)));
    assert!(outcome.is_ok(), "shutdown(Duration::MAX) panicked");
}
