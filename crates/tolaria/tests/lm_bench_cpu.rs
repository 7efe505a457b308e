//! `tolaria-lm` on the CPU, on the seeded synthetic text: the seeds are
//! brought to BLENDING by the lifecycle, one eager epoch is measured, and
//! the record's figures hang together (tokens are windows times the
//! context, the perplexity is the exponential of the validation loss).

use tolaria::engine::bench::{LM_WORKLOAD, LmOptions, run_lm};
use tolaria::task::{LM_BATCH, LM_CONTEXT};
use torch_ext::DeviceChoice;

#[test]
fn a_short_synthetic_run_measures_one_eager_epoch_with_consistent_figures() {
    let mut options = LmOptions::new(DeviceChoice::Cpu, true);
    options.synthetic = true;
    options.train_windows = Some(2 * LM_BATCH);
    options.warmup_epochs = 0;
    options.measured_epochs = 1;
    let mut lines = Vec::new();
    let run = run_lm(&options, &mut |line: &str| lines.push(line.to_owned())).expect("runs");
    assert!(
        lines.iter().any(|line| line.contains(LM_WORKLOAD)),
        "{lines:?}"
    );
    let results = &run.measurements.results;
    assert_eq!(results.len(), 1, "fp32 eager alone on the CPU");
    let entry = &results[0];
    assert_eq!(entry.mode, "eager");
    assert_eq!(entry.error, None);
    let metric = |key: &str| {
        *entry
            .metrics
            .get(key)
            .unwrap_or_else(|| panic!("{key} in {:?}", entry.metrics))
    };
    assert_eq!(metric("steps_per_epoch"), 2.0);
    let tokens = metric("tokens_per_s");
    let windows = metric("samples_per_s");
    assert!(windows > 0.0);
    assert!((tokens - windows * LM_CONTEXT as f64).abs() < 1e-6 * tokens);
    let loss = metric("val_loss");
    assert!(loss.is_finite() && loss > 0.0);
    assert!((metric("val_perplexity") - loss.exp()).abs() < 1e-9 * loss.exp());
    let params = &run.measurements.params;
    assert_eq!(params["steps_per_epoch"], 2);
    assert_eq!(params["batch_size"], LM_BATCH);
    assert_eq!(params["host_parameters"], 636_032);
}
