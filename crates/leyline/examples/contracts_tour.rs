//! A tour of leyline's contracts, as a crate that depends on leyline uses
//! them: the lifecycle's transition table, a `SeedState` through protobuf and
//! JSON, bad input refused at the boundary, and telemetry names and packets
//! read back from a `Collector`.
//!
//! ```sh
//! cargo run -p leyline --example contracts_tour
//! ```

use leyline::codec::Contract;
use leyline::proto::SeedState;
use leyline::{Collector, SCHEMA_VERSION, SeedStage, Telemetry};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The transition table: the one source of truth for lifecycle moves.
    let mut stage = SeedStage::Germinated;
    print!("the happy path: {stage:?}");
    while let Some(next) = stage.advance_target() {
        leyline::stage::validate_transition(stage, next)?;
        stage = next;
        print!(" -> {stage:?}");
    }
    println!();
    match leyline::stage::validate_transition(SeedStage::Training, SeedStage::Fossilized) {
        Ok(()) => println!("TRAINING -> FOSSILIZED was accepted (it should not be)"),
        Err(error) => println!("TRAINING -> FOSSILIZED is refused: {error}"),
    }
    println!(
        "from BLENDING a seed may go to {:?}",
        SeedStage::Blending.successors()
    );

    // A seed's exported state through protobuf bytes and JSON, validated both ways.
    let state = SeedState {
        schema_version: SCHEMA_VERSION,
        seed_id: "seed-1".into(),
        slot_id: "r0c1".into(),
        stage: SeedStage::Blending.value(),
        alpha: 0.4,
        alpha_curve: 1,
        alpha_algorithm: 1,
        ..Default::default()
    };
    let bytes = state.encode_protobuf()?;
    let json = state.to_json()?;
    assert_eq!(SeedState::decode_protobuf(&bytes)?, state);
    assert_eq!(SeedState::from_json(&json)?, state);
    println!("SeedState: {} protobuf bytes, JSON {json}", bytes.len());

    // Bad input is an error naming what is wrong, never a panic.
    let reserved = SeedState {
        stage: 5,
        ..state.clone()
    };
    match reserved.encode_protobuf() {
        Ok(_) => println!("stage 5 was encoded (it should not be)"),
        Err(error) => println!("stage 5 (reserved) is refused: {error}"),
    }
    let out_of_range = SeedState {
        alpha: 1.5,
        ..state.clone()
    };
    match out_of_range.encode_protobuf() {
        Ok(_) => println!("alpha 1.5 was encoded (it should not be)"),
        Err(error) => println!("alpha 1.5 is refused: {error}"),
    }
    match SeedState::decode_protobuf(&[0xff, 0xff, 0xff]) {
        Ok(_) => println!("garbage decoded (it should not)"),
        Err(error) => println!("three garbage bytes are refused: {error}"),
    }

    // Telemetry: names come from leyline's catalogue, with their units.
    let latency = leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS;
    let spec = leyline::telemetry::metric_spec(latency).ok_or("a catalogued metric")?;
    println!("metric {latency}: unit {:?}", spec.unit);
    let collector = Collector::new();
    let telemetry = Telemetry::new(collector.clone());
    telemetry.emit_metrics(
        "example",
        leyline::TelemetryLevel::Info,
        [leyline::metric(latency, 12.5)],
    );
    telemetry.emit_event(
        "example",
        leyline::telemetry::KASMINA_SEED_GERMINATED,
        "seed-1 germinated in r0c1",
        vec![("slot", "r0c1".to_owned())],
    );
    println!(
        "read back: metric values {:?}, events {:?}",
        collector.metric_values(latency),
        collector.event_names()
    );
    Ok(())
}
