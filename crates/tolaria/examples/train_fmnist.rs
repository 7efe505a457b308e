//! Trains the `tolaria-fmnist` model (the Fashion-MNIST CNN host with
//! `conv_light` at r0c1 and `attention` at r0c2 blending at alpha 0.5)
//! with the general trainer, printing one line per epoch.
//!
//! ```text
//! cargo run --release -p tolaria --example train_fmnist -- \
//!     [--mode eager|graph-step|graph-epoch] [--precision auto|fp32|bf16|fp16] \
//!     [--epochs N] [--train-samples N] [--synthetic] [--device auto|cpu|cuda] [--kernels]
//! ```
//!
//! `--kernels` prints, after training, what each captured graph holds (one
//! line per kernel function and node kind).
//!
//! Without `--synthetic` it reads Fashion-MNIST from Debian's
//! `dataset-fashion-mnist` package (or `$ESPER_FASHION_MNIST_DIR`).

use std::process::ExitCode;

use leyline::Telemetry;
use tolaria::amp::Precision;
use tolaria::data::Dataset;
use tolaria::data::synthetic::{ImageTaskOptions, image_task};
use tolaria::engine::bench::{bring_to_blending, fmnist_model};
use tolaria::engine::trainer::{ModelTrainer, ModelTrainerConfig};
use tolaria::{DeviceChoice, ExecutionMode};

struct Args {
    mode: ExecutionMode,
    precision: Option<Precision>,
    epochs: usize,
    train_samples: Option<usize>,
    synthetic: bool,
    device: DeviceChoice,
    kernels: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        mode: ExecutionMode::Eager,
        precision: None,
        epochs: 3,
        train_samples: None,
        synthetic: false,
        device: DeviceChoice::Auto,
        kernels: false,
    };
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        let mut value = || raw.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--mode" => {
                let text = value()?;
                args.mode = ExecutionMode::from_name(&text)
                    .ok_or_else(|| format!("unknown mode {text:?}"))?;
            }
            "--precision" => {
                let text = value()?;
                args.precision = match text.as_str() {
                    "auto" => None,
                    other => Some(other.parse::<Precision>().map_err(|e| e.to_string())?),
                };
            }
            "--epochs" => args.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--train-samples" => {
                args.train_samples = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--train-samples: {e}"))?,
                );
            }
            "--synthetic" => args.synthetic = true,
            "--kernels" => args.kernels = true,
            "--device" => {
                args.device = value()?
                    .parse()
                    .map_err(|e: torch_ext::Error| e.to_string())?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn data(synthetic: bool) -> Result<(Dataset, Dataset), String> {
    if synthetic {
        let train =
            image_task(&ImageTaskOptions::fashion_like(60_000, 1)).map_err(|e| e.to_string())?;
        let test =
            image_task(&ImageTaskOptions::fashion_like(10_000, 2)).map_err(|e| e.to_string())?;
        return Ok((train, test));
    }
    tolaria::data::fashion_mnist::load(Default::default()).map_err(|e| e.to_string())
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let device = torch_ext::device::select(args.device).map_err(|e| e.to_string())?;
    let (train, test) = data(args.synthetic)?;
    let train = match args.train_samples {
        Some(len) => train
            .slice(0, len.min(train.len()))
            .map_err(|e| e.to_string())?,
        None => train,
    };
    tch::manual_seed(7);
    let model = fmnist_model(device, Telemetry::disabled()).map_err(|e| e.to_string())?;
    let subset = train
        .slice(0, 4096.min(train.len()))
        .map_err(|e| e.to_string())?;
    let model = bring_to_blending(model, &subset, 40).map_err(|e| e.to_string())?;
    let config = ModelTrainerConfig {
        mode: args.mode,
        precision: args.precision,
        counterfactual_samples: 0,
        ..ModelTrainerConfig::default()
    };
    let mut trainer = ModelTrainer::new(model, &train, Some(&test), config, Telemetry::disabled())
        .map_err(|e| e.to_string())?;
    println!(
        "training {} samples on {device:?}, {} {}",
        train.len(),
        trainer.precision(),
        args.mode.name()
    );
    for _ in 0..args.epochs {
        let report = trainer.train_epoch().map_err(|e| e.to_string())?;
        println!(
            "epoch {}: {:.1} ms ({} of {} steps replayed), loss {:.4}, val accuracy {:.2}%",
            report.epoch,
            report.train.epoch_ms,
            report.train.replayed_steps,
            report.train.steps,
            report.train.loss,
            report.validation.map_or(f64::NAN, |v| v.accuracy)
        );
    }
    if args.kernels {
        for ((batch, variant), nodes) in trainer
            .engine()
            .graph_summaries()
            .map_err(|e| e.to_string())?
        {
            println!("graph for batch {batch}, variant {variant}:");
            for (count, node) in nodes {
                println!("{count:6}  {node}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("train_fmnist: {error}");
            ExitCode::FAILURE
        }
    }
}
