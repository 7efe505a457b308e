//! Exact delivery accounting under concurrency: several producers with random
//! bursts and pauses, a slow sink, a fast one and a partly failing one; every
//! packet must end up delivered, dropped or failed exactly once per sink.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leyline::TelemetryLevel;
use leyline::proto::TelemetryPacket;
use nissa::{Error, Hub, HubConfig, MemorySink, Sink};
use proptest::prelude::*;

/// Records `(producer, seq)` of every packet it accepts, after an optional
/// delay; fails the packets whose `seq` is a multiple of `fail_every`.
struct RecordingSink {
    name: &'static str,
    delay: Duration,
    fail_every: Option<u64>,
    accepted: Ids,
    failed: Ids,
}

/// `(producer, seq)` of packets, shared with the test.
type Ids = Arc<Mutex<Vec<(u64, u64)>>>;

impl RecordingSink {
    fn new(name: &'static str, delay: Duration, fail_every: Option<u64>) -> RecordingSink {
        RecordingSink {
            name,
            delay,
            fail_every,
            accepted: Arc::default(),
            failed: Arc::default(),
        }
    }

    fn handles(&self) -> (Ids, Ids) {
        (Arc::clone(&self.accepted), Arc::clone(&self.failed))
    }
}

impl Sink for RecordingSink {
    fn name(&self) -> &str {
        self.name
    }

    fn write(&mut self, packet: &TelemetryPacket) -> nissa::Result<()> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let id = packet_id(packet);
        if self
            .fail_every
            .is_some_and(|every| id.1.is_multiple_of(every))
        {
            self.failed.lock().unwrap().push(id);
            return Err(Error::sink(self.name, "refused (test)"));
        }
        self.accepted.lock().unwrap().push(id);
        Ok(())
    }
}

fn packet(producer: u64, seq: u64) -> TelemetryPacket {
    let mut packet = TelemetryPacket::new(&format!("producer.{producer}"), TelemetryLevel::Info);
    packet.timestamp_unix_ns = seq as i64;
    packet
}

fn packet_id(packet: &TelemetryPacket) -> (u64, u64) {
    let producer = packet
        .source
        .strip_prefix("producer.")
        .and_then(|id| id.parse().ok())
        .unwrap_or(u64::MAX);
    (producer, packet.timestamp_unix_ns as u64)
}

/// Checks that `ids` holds no duplicates, only ids that were emitted, and
/// keeps each producer's order (queues are FIFO).
fn check_ids(ids: &[(u64, u64)], emitted_per_producer: &[u64]) {
    let unique: HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a packet was delivered twice");
    let mut last_seq = vec![None; emitted_per_producer.len()];
    for &(producer, seq) in ids {
        let index = producer as usize;
        assert!(
            index < emitted_per_producer.len(),
            "unknown producer {producer}"
        );
        assert!(
            seq < emitted_per_producer[index],
            "seq {seq} was never emitted"
        );
        if let Some(previous) = last_seq[index] {
            assert!(
                seq > previous,
                "producer {producer}: {seq} after {previous}"
            );
        }
        last_seq[index] = Some(seq);
    }
}

/// Bursts of `len` emits followed by a pause of `pause_us`.
type Plan = Vec<(u64, u64)>;

fn plans() -> impl Strategy<Value = Vec<Plan>> {
    prop::collection::vec(prop::collection::vec((1u64..150, 0u64..150), 1..6), 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_packet_is_accounted_exactly_once_per_sink(
        plans in plans(),
        queue_capacity in 1usize..256,
        slow_queue in 1usize..48,
        fast_queue in 1usize..512,
        slow_delay_us in 0u64..80,
    ) {
        let slow = RecordingSink::new("slow", Duration::from_micros(slow_delay_us), None);
        let flaky = RecordingSink::new("flaky", Duration::ZERO, Some(7));
        let (slow_accepted, _) = slow.handles();
        let (flaky_accepted, flaky_failed) = flaky.handles();
        let memory = MemorySink::new();
        let hub = Hub::builder()
            .config(HubConfig {
                queue_capacity,
                tick_max: Duration::from_millis(5),
                ..HubConfig::default()
            })
            .sink_with_queue(slow, slow_queue)
            .sink_with_queue(memory.clone(), fast_queue)
            .sink_with_queue(flaky, fast_queue)
            .build()
            .unwrap();

        let emitted_per_producer: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = plans
                .iter()
                .enumerate()
                .map(|(producer, plan)| {
                    let hub = hub.clone();
                    scope.spawn(move || {
                        let mut seq = 0;
                        for &(burst, pause_us) in plan {
                            for _ in 0..burst {
                                hub.emit(packet(producer as u64, seq));
                                seq += 1;
                            }
                            if pause_us > 0 {
                                std::thread::sleep(Duration::from_micros(pause_us));
                            } else {
                                std::thread::yield_now();
                            }
                        }
                        seq
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        let total: u64 = emitted_per_producer.iter().sum();

        let outcome = hub.flush(Duration::from_secs(20));
        prop_assert!(outcome.is_complete(), "flush did not finish: {outcome:?}");
        prop_assert_eq!(outcome.pending, 0);
        let stats = hub.stats();
        prop_assert_eq!(stats.emitted, total);
        prop_assert_eq!(stats.after_close, 0);
        prop_assert_eq!(stats.queued, 0);
        for sink in &stats.sinks {
            prop_assert_eq!(sink.emitted, total, "{}", sink.name);
            prop_assert_eq!(sink.pending, 0, "{}", sink.name);
            prop_assert_eq!(
                sink.delivered + sink.dropped + sink.failed,
                total,
                "sink {} does not add up: {:?}",
                sink.name,
                sink
            );
            prop_assert_eq!(sink.dropped, stats.queue_dropped + sink.sink_queue_dropped);
        }

        // The counters agree with what the sinks actually saw.
        let slow_ids = slow_accepted.lock().unwrap().clone();
        let memory_ids: Vec<_> = memory.packets().iter().map(packet_id).collect();
        let flaky_ids = flaky_accepted.lock().unwrap().clone();
        let flaky_failed_ids = flaky_failed.lock().unwrap().clone();
        prop_assert_eq!(stats.sink("slow").unwrap().delivered, slow_ids.len() as u64);
        prop_assert_eq!(stats.sink("memory").unwrap().delivered, memory_ids.len() as u64);
        prop_assert_eq!(stats.sink("flaky").unwrap().delivered, flaky_ids.len() as u64);
        prop_assert_eq!(stats.sink("flaky").unwrap().failed, flaky_failed_ids.len() as u64);
        prop_assert!(flaky_failed_ids.iter().all(|&(_, seq)| seq.is_multiple_of(7)));
        prop_assert!(flaky_ids.iter().all(|&(_, seq)| !seq.is_multiple_of(7)));
        for ids in [&slow_ids, &memory_ids, &flaky_ids] {
            check_ids(ids, &emitted_per_producer);
        }

        hub.close();
        let closed = hub.stats();
        prop_assert!(closed.closed);
        prop_assert_eq!(closed.emitted, total);
        prop_assert_eq!(closed.sinks, stats.sinks);
    }
}

/// Producers racing with `close`: every call is either part of `emitted` (and
/// then delivered, dropped or failed) or counted in `after_close`.
#[test]
fn emits_racing_with_close_are_all_counted() {
    for round in 0..6 {
        let memory = MemorySink::new();
        let hub = Hub::builder()
            .queue_capacity(64)
            .sink_queue_capacity(32)
            .sink(memory.clone())
            .build()
            .unwrap();
        let closed = AtomicBool::new(false);
        let calls: u64 = std::thread::scope(|scope| {
            let producers: Vec<_> = (0..3)
                .map(|producer| {
                    let hub = hub.clone();
                    let closed = &closed;
                    scope.spawn(move || {
                        let mut seq = 0;
                        while !closed.load(Ordering::Acquire) {
                            hub.emit(packet(producer, seq));
                            seq += 1;
                        }
                        // These certainly come after close returned.
                        for _ in 0..10 {
                            hub.emit(packet(producer, seq));
                            seq += 1;
                        }
                        seq
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2 + round));
            hub.close();
            closed.store(true, Ordering::Release);
            producers
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .sum()
        });
        let stats = hub.stats();
        assert!(stats.closed);
        assert!(stats.after_close >= 30, "round {round}: {stats:?}");
        assert_eq!(stats.emitted + stats.after_close, calls, "round {round}");
        let sink = stats.sink("memory").unwrap();
        assert_eq!(sink.pending, 0, "round {round}: {sink:?}");
        assert_eq!(sink.delivered + sink.dropped + sink.failed, stats.emitted);
        assert_eq!(sink.delivered, memory.len() as u64);
        // Emitting after close is still safe and still counted.
        hub.emit(packet(9, 0));
        assert_eq!(hub.stats().after_close, stats.after_close + 1);
    }
}
