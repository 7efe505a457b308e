//! The reference benchmark on the CPU gives figures that make a well-formed
//! baseline record.

use std::collections::BTreeMap;

use leyline::baseline::{BaselineRecord, Environment};
use tch::Device;
use tolaria::reference::StepKind;
use tolaria::reference::bench::{BenchOptions, Variant};
use tolaria::{DeviceChoice, ExecutionMode};

#[test]
fn variant_names_round_trip() {
    for mode in ExecutionMode::ALL {
        for step in [StepKind::Fused, StepKind::Autograd] {
            let variant = Variant { mode, step };
            assert_eq!(Variant::from_name(&variant.name()), Some(variant));
        }
    }
    assert_eq!(Variant::from_name("graph"), None);
    assert_eq!(
        Variant::from_name("eager"),
        None,
        "the general trainer owns the plain names"
    );
}

/// A fixed environment: probing the machine is the `esper` binary's job.
fn environment() -> Environment {
    Environment {
        device: "cpu".to_owned(),
        torch: "test".to_owned(),
        cuda: "n/a".to_owned(),
        driver: "n/a".to_owned(),
        cpu: "test cpu".to_owned(),
        git_rev: "test".to_owned(),
        tf32: false,
        amp: "off".to_owned(),
        extra: BTreeMap::new(),
    }
}

#[test]
fn a_cpu_bench_records_eager_latencies_and_refuses_graph_modes() -> anyhow::Result<()> {
    let mut options = BenchOptions::new(DeviceChoice::Cpu, true);
    options.warmup_epochs = 2;
    options.measured_epochs = 12;
    options.variants = vec![
        Variant::from_name("fused-eager").expect("known"),
        Variant::from_name("fused-graph-step").expect("known"),
    ];
    let mut lines = Vec::new();
    let run = tolaria::reference::bench::run(&options, &mut |line| lines.push(line.to_owned()))?;
    assert_eq!(run.device, Device::Cpu);
    let record = BaselineRecord::from_measurements(
        tolaria::reference::bench::WORKLOAD,
        "cpu-test",
        environment(),
        run.measurements,
    )?;
    let record = BaselineRecord::from_json(&record.to_json_pretty()?)?;
    assert_eq!(record.workload, "tolaria-reference");
    let eager = record
        .result("rust", "fused-eager")
        .expect("fused eager entry");
    assert!(eager.error.is_none());
    assert_eq!(eager.metrics["measured_epochs"], 12.0);
    let (p50, p95, max) = (
        eager.metrics["epoch_ms_p50"],
        eager.metrics["epoch_ms_p95"],
        eager.metrics["epoch_ms_max"],
    );
    assert!(0.0 < p50 && p50 <= p95 && p95 <= max, "{p50} {p95} {max}");
    assert!(eager.metrics["final_train_loss"] < eager.metrics["validation_loss"] + 1.0);
    let graph = record
        .result("rust", "fused-graph-step")
        .expect("fused graph-step entry");
    assert!(
        graph
            .error
            .as_deref()
            .is_some_and(|error| error.contains("CUDA"))
    );
    assert!(
        record
            .telemetry_names
            .iter()
            .any(|name| name == leyline::telemetry::TOLARIA_TRAINING_LATENCY_MS)
    );
    assert!(lines.iter().any(|line| line.contains("[rust eager]")));
    Ok(())
}
