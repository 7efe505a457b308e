//! Hostile configuration and hostile calls on the hub: sizes near the integer
//! limits, durations near `Duration::MAX`, sink names that collide. Every one
//! is a typed error at build time or is handled; nothing panics.

use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::{TelemetryEvent, TelemetryMetric, TelemetryPacket};
use leyline::testing::{extreme_f64, extreme_u64, extreme_usize, hostile_string};
use nissa::hub::{MAX_BATCH, MAX_QUEUE_CAPACITY, MAX_SINK_NAME_BYTES, MAX_SINKS, MAX_TICK};
use nissa::{Error, Hub, HubConfig, JsonlConfig, JsonlSink, MemorySink, PrometheusSink};
use proptest::prelude::*;

fn config_field(result: &nissa::Result<Hub>) -> Option<&'static str> {
    match result {
        Err(Error::Config { field, .. }) => Some(field),
        _ => None,
    }
}

fn packet(value: f64) -> TelemetryPacket {
    TelemetryPacket::new("test", TelemetryLevel::Info).with_metric(TelemetryMetric::new(
        leyline::telemetry::KASMINA_SEED_ALPHA,
        value,
        "ratio",
    ))
}

#[test]
fn flush_with_a_maximal_timeout_returns_instead_of_panicking() {
    let memory = MemorySink::new();
    let hub = Hub::builder().sink(memory.clone()).build().unwrap();
    hub.emit(packet(0.5));
    let outcome = hub.flush(Duration::MAX);
    assert!(outcome.is_complete(), "{outcome:?}");
    assert_eq!(memory.len(), 1);
    let near_max = Duration::new(u64::MAX, 999_999_999);
    assert!(hub.flush(near_max).is_complete());
    hub.close();
}

#[test]
fn close_with_a_maximal_timeout_returns_instead_of_panicking() {
    for close_timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let memory = MemorySink::new();
        let hub = Hub::builder()
            .config(HubConfig {
                close_timeout,
                ..HubConfig::default()
            })
            .sink(memory.clone())
            .build()
            .unwrap();
        hub.emit(packet(0.25));
        hub.close();
        let stats = hub.stats();
        assert!(stats.closed);
        assert_eq!(stats.sink("memory").unwrap().delivered, 1);
    }
}

#[test]
fn queue_capacities_beyond_the_bound_are_config_errors() {
    for capacity in [MAX_QUEUE_CAPACITY + 1, usize::MAX, usize::MAX / 2 + 1] {
        let main = Hub::builder().queue_capacity(capacity).build();
        assert_eq!(config_field(&main), Some("queue_capacity"), "{main:?}");
        let sinks = Hub::builder()
            .sink_queue_capacity(capacity)
            .sink(MemorySink::new())
            .build();
        assert_eq!(
            config_field(&sinks),
            Some("sink_queue_capacity"),
            "{sinks:?}"
        );
        let own = Hub::builder()
            .sink_with_queue(MemorySink::new(), capacity)
            .build();
        assert_eq!(config_field(&own), Some("sink queue capacity"), "{own:?}");
    }
    // The bound itself is accepted.
    let at_bound = Hub::builder()
        .queue_capacity(MAX_QUEUE_CAPACITY)
        .sink_with_queue(MemorySink::new(), MAX_QUEUE_CAPACITY)
        .build()
        .unwrap();
    at_bound.close();
}

#[test]
fn batch_sizes_beyond_the_bound_are_config_errors() {
    for batch_max in [MAX_BATCH + 1, usize::MAX] {
        let result = Hub::builder()
            .config(HubConfig {
                batch_max,
                ..HubConfig::default()
            })
            .sink(MemorySink::new())
            .build();
        assert_eq!(config_field(&result), Some("batch_max"), "{result:?}");
    }
}

#[test]
fn tick_and_wake_settings_out_of_range_are_config_errors() {
    let long_tick = Hub::new(HubConfig {
        tick_max: MAX_TICK + Duration::from_nanos(1),
        ..HubConfig::default()
    });
    assert_eq!(config_field(&long_tick), Some("tick_max"), "{long_tick:?}");
    let max_tick = Hub::new(HubConfig {
        tick_min: Duration::MAX,
        tick_max: Duration::MAX,
        ..HubConfig::default()
    });
    assert_eq!(config_field(&max_tick), Some("tick_max"), "{max_tick:?}");
    let wake = Hub::new(HubConfig {
        queue_capacity: 8,
        wake_threshold: Some(9),
        ..HubConfig::default()
    });
    assert_eq!(config_field(&wake), Some("wake_threshold"), "{wake:?}");
}

#[test]
fn sink_names_must_be_unique_non_empty_and_bounded() {
    let twice = Hub::builder()
        .sink(MemorySink::new())
        .sink(MemorySink::new())
        .build();
    assert_eq!(config_field(&twice), Some("sink name"), "{twice:?}");
    // The endpoint's sink is called `prometheus` too.
    let clash = Hub::builder()
        .sink(PrometheusSink::new())
        .prometheus_on_port(0)
        .build();
    assert_eq!(config_field(&clash), Some("sink name"), "{clash:?}");
    for name in [
        String::new(),
        "new\nline".to_owned(),
        "x".repeat(MAX_SINK_NAME_BYTES + 1),
    ] {
        let result = Hub::builder().sink(MemorySink::named(&name)).build();
        assert_eq!(config_field(&result), Some("sink name"), "{name:?}");
        let writer = Hub::builder()
            .sink(JsonlSink::to_writer(&name, std::io::sink()))
            .build();
        assert_eq!(config_field(&writer), Some("sink name"), "{name:?}");
    }
    let fine = Hub::builder()
        .sink(MemorySink::named("a"))
        .sink(MemorySink::named("b"))
        .build()
        .unwrap();
    fine.close();
}

#[test]
fn too_many_sinks_are_a_config_error() {
    let mut builder = Hub::builder();
    for index in 0..=MAX_SINKS {
        builder = builder.sink(MemorySink::named(&format!("memory{index}")));
    }
    let result = builder.build();
    assert_eq!(config_field(&result), Some("sinks"), "{result:?}");
}

/// A duration from two hostile integers, covering zero, tiny and
/// `Duration::MAX`.
fn extreme_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (extreme_u64(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        (0u64..20_000).prop_map(Duration::from_micros),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every public constructor and entry point of the hub, fed hostile
    /// sizes, durations, numbers and strings: either a typed configuration
    /// error, or a hub that accounts for every packet exactly.
    #[test]
    fn hub_entry_points_never_panic_and_always_account(
        queue_capacity in extreme_usize(),
        sink_queue_capacity in extreme_usize(),
        own_queue in extreme_usize(),
        batch_max in extreme_usize(),
        wake_threshold in proptest::option::of(extreme_usize()),
        tick_min in extreme_duration(),
        tick_max in extreme_duration(),
        flush_timeout in extreme_duration(),
        values in prop::collection::vec(extreme_f64(), 1..6),
        text in hostile_string(),
        name in hostile_string(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let memory = MemorySink::named("memory");
        let config = HubConfig {
            queue_capacity,
            sink_queue_capacity,
            batch_max,
            wake_threshold,
            tick_min,
            tick_max,
            close_timeout: Duration::from_secs(5),
        };
        let built = Hub::builder()
            .config(config)
            .sink(memory.clone())
            .sink_with_queue(MemorySink::named(&name), own_queue)
            .sink(PrometheusSink::new())
            .jsonl(JsonlConfig::new(dir.path()))
            .tracing()
            .build();
        let hub = match built {
            Ok(hub) => hub,
            Err(Error::Config { field, reason }) => {
                prop_assert!(!reason.is_empty(), "{field}: empty reason");
                return Ok(());
            }
            Err(other) => {
                prop_assert!(false, "untyped refusal: {other:?}");
                return Ok(());
            }
        };
        let mut sent = 0u64;
        for value in &values {
            let mut metric = TelemetryMetric::new(leyline::telemetry::KASMINA_SEED_ALPHA, *value, &text);
            metric.attributes.insert(text.clone(), text.clone());
            let mut event = TelemetryEvent::new(leyline::telemetry::KASMINA_SEED_STAGE_CHANGED, TelemetryLevel::Info, &text);
            event.attributes.insert(text.clone(), text.clone());
            hub.emit(TelemetryPacket::new(&text, TelemetryLevel::Info).with_metric(metric).with_event(event));
            sent += 1;
        }
        let _ = hub.flush(flush_timeout.min(Duration::from_secs(5)));
        hub.close();
        let stats = hub.stats();
        prop_assert_eq!(stats.emitted, sent);
        for sink in &stats.sinks {
            prop_assert_eq!(sink.pending, 0, "{:?}", sink);
            prop_assert_eq!(sink.delivered + sink.dropped + sink.failed, sent, "{:?}", sink);
        }
        // Non-finite values never count as delivered, in any built-in sink.
        let finite = values.iter().filter(|value| value.is_finite()).count() as u64;
        for name in ["prometheus", "jsonl", "tracing"] {
            let sink = stats.sink(name).unwrap();
            prop_assert!(sink.delivered <= finite, "{:?}", sink);
        }
    }
}

#[test]
fn a_slow_sink_with_a_maximal_delay_sleeps_instead_of_panicking() {
    let mut slow = nissa::SlowSink::new(Duration::MAX);
    let writer = std::thread::spawn(move || {
        use nissa::Sink;
        let _ = slow.write(&packet(0.5));
    });
    std::thread::sleep(Duration::from_millis(300));
    // Still asleep (the thread is left to the end of the test process); a
    // panic on `Instant` overflow would have finished it.
    assert!(!writer.is_finished());
}
