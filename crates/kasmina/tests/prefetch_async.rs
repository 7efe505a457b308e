//! The async blueprint prefetcher: builds off the calling thread, hands the
//! module over for germination, cancels, and refuses unknown blueprints.

mod common;

use std::time::{Duration, Instant};

use common::lone_slot;
use kasmina::Error;
use kasmina::blueprint::Blueprint;
use kasmina::host::{SlotId, Topology};
use kasmina::lifecycle::GerminationOptions;
use kasmina::prefetch::{PrefetchConfig, Prefetcher};
use leyline::SeedStage;
use tch::Device;

fn prefetcher() -> Prefetcher {
    Prefetcher::new(PrefetchConfig::default()).expect("prefetcher")
}

#[test]
fn a_prefetched_module_germinates() {
    let prefetcher = prefetcher();
    let ticket = prefetcher
        .request("conv_light", 4, SlotId::new(0, 0), Device::Cpu)
        .expect("request");
    assert_eq!(ticket.blueprint(), Blueprint::ConvLight);
    let prepared = ticket.wait().expect("built");
    assert_eq!(prepared.slot, SlotId::new(0, 0));
    assert_eq!(prepared.module.channels(), 4);
    assert_eq!(
        prepared.module.param_count(),
        Blueprint::ConvLight
            .param_count(Topology::Cnn, 4)
            .expect("cnn")
    );
    let mut slot = lone_slot(Topology::Cnn);
    slot.germinate_module(prepared.module, GerminationOptions::new("prefetched"))
        .expect("germinate");
    assert_eq!(slot.stage(), Some(SeedStage::Germinated));

    // A module of the wrong width is refused by the slot.
    let wide = prefetcher
        .request("norm", 8, SlotId::new(0, 0), Device::Cpu)
        .expect("request")
        .wait()
        .expect("built");
    let mut other = lone_slot(Topology::Cnn);
    let error = other
        .germinate_module(wide.module, GerminationOptions::new("wide"))
        .expect_err("8 channels into a 4-channel slot");
    assert!(matches!(error, Error::ShapeMismatch { .. }), "{error}");
    assert!(other.is_empty());
}

#[test]
fn unknown_blueprints_fail_at_request_time() {
    let prefetcher = prefetcher();
    let error = prefetcher
        .request("mlp_huge", 4, SlotId::new(0, 1), Device::Cpu)
        .expect_err("unknown");
    assert!(
        matches!(&error, Error::UnknownBlueprint { name, .. } if name == "mlp_huge"),
        "{error}"
    );
    assert!(
        error.to_string().contains("conv_light"),
        "the error lists the known names"
    );
    assert!(
        prefetcher
            .try_request("lora", 4, SlotId::new(0, 1), Device::Cpu)
            .is_err()
    );
}

#[test]
fn cancelled_tickets_yield_cancelled() {
    let prefetcher = prefetcher();
    let ticket = prefetcher
        .request("conv_heavy", 16, SlotId::new(0, 2), Device::Cpu)
        .expect("request");
    ticket.cancel();
    assert!(ticket.is_cancelled());
    assert!(matches!(ticket.wait(), Err(Error::Cancelled)));
    let mut polled = prefetcher
        .request("noop", 16, SlotId::new(0, 2), Device::Cpu)
        .expect("request");
    polled.cancel();
    assert!(matches!(polled.try_take(), Err(Error::Cancelled)));
}

#[test]
fn many_requests_in_flight_all_complete_and_polling_works() {
    let prefetcher = Prefetcher::new(PrefetchConfig {
        queue_capacity: 4,
        worker_threads: 2,
    })
    .expect("prefetcher");
    // More requests than queue slots: `request` waits for room.
    let tickets: Vec<_> = (0..24)
        .map(|index| {
            let blueprint = Blueprint::CNN[index % Blueprint::CNN.len()];
            prefetcher
                .request(
                    blueprint.name(),
                    8,
                    SlotId::new(0, (index % 3) as u32),
                    Device::Cpu,
                )
                .expect("request")
        })
        .collect();
    let mut ids = Vec::new();
    for mut ticket in tickets {
        let blueprint = ticket.blueprint();
        let deadline = Instant::now() + Duration::from_secs(30);
        let prepared = loop {
            if let Some(prepared) = ticket.try_take().expect("poll") {
                break prepared;
            }
            assert!(Instant::now() < deadline, "prefetch never finished");
            std::thread::sleep(Duration::from_micros(200));
        };
        assert_eq!(prepared.module.blueprint(), blueprint);
        assert_eq!(
            prepared.module.param_count(),
            blueprint.param_count(Topology::Cnn, 8).expect("cnn")
        );
        ids.push(prepared.id);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 24);
    prefetcher.shutdown(Duration::from_secs(5));
}

#[test]
fn invalid_configuration_and_channels_are_refused() {
    assert!(matches!(
        Prefetcher::new(PrefetchConfig {
            queue_capacity: 0,
            worker_threads: 1
        }),
        Err(Error::OutOfRange {
            field: "PrefetchConfig.queue_capacity",
            ..
        })
    ));
    let prefetcher = prefetcher();
    assert!(matches!(
        prefetcher.request("norm", 0, SlotId::new(0, 0), Device::Cpu),
        Err(Error::OutOfRange {
            field: "blueprint width",
            ..
        })
    ));
}
