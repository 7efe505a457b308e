//! The run picture: `RUN_DIR/run.png` and `RUN_DIR/run.svg`, drawn from
//! `RUN_DIR/epochs.jsonl` at the end of `esper train` and on demand by
//! `esper plot RUN_DIR`.
//!
//! Top: accuracy (train and validation, percent; a vertical line in the
//! stage's colour where a seed was germinated, fossilized or pruned) and
//! loss per epoch, side by side. Below: one swimlane per slot, coloured by the seed's stage after
//! each epoch, with the blend alpha (0 at the bottom of the lane, 1 at the
//! top) drawn across it and the blueprint's name where a seed starts. A
//! legend of the stage colours closes the picture.
//!
//! Text is drawn with the DejaVu Sans font embedded in the binary (the
//! `dejavu` crate, through plotters' `ab_glyph` backend), so the PNG needs
//! no system font and no fontconfig.
//!
//! The picture is bounded whatever `epochs.jsonl` holds: a record whose
//! epoch lies beyond the longest run `esper train` makes
//! ([`MAX_EPOCHS`]), more records than that, or more slots than a run may
//! name ([`MAX_SLOTS`] lanes) is refused with a message before any file is
//! written; values outside their axes are clipped to them (accuracy to
//! 0-100 %, alpha to 0-1, a loss to 0-[`LOSS_AXIS_LIMIT`], the caption
//! saying so), and long names are shortened.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Result, anyhow, bail};
use clap::Parser;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::train::config::{MAX_EPOCHS, MAX_SLOTS};
use crate::train::epoch_log::{self, EpochRecord};
use lane::{draw_lane, epoch_label, x_label_count};

mod lane;
#[cfg(test)]
mod tests;

/// The PNG's file name inside the run directory.
pub(crate) const PNG_NAME: &str = "run.png";
/// The SVG's file name inside the run directory.
pub(crate) const SVG_NAME: &str = "run.svg";

/// Font family name the embedded font is registered under.
pub(crate) const FONT: &str = "sans-serif";
const WIDTH: u32 = 1400;
const TITLE_HEIGHT: u32 = 40;
const CHARTS_HEIGHT: u32 = 380;
const LANE_HEIGHT: u32 = 64;
const AXIS_HEIGHT: u32 = 40;
const LEGEND_HEIGHT: u32 = 44;
const LABEL_AREA: u32 = 70;
/// The top of the loss axis at most; larger losses are drawn at it.
pub(crate) const LOSS_AXIS_LIMIT: f64 = 1e6;
/// Characters of a slot or blueprint name drawn at most.
const NAME_CHARS: usize = 24;

/// `esper plot RUN_DIR`: redraws the picture of a run from its
/// `epochs.jsonl`.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(
    name = "esper plot",
    about = "Draw the picture of a training run (run.png and run.svg in its directory) from its \
             epochs.jsonl, or a simic-learning record's learning curves beside it."
)]
pub(crate) struct PlotArgs {
    /// The run directory `esper train` wrote, or a `simic-learning`
    /// record (its learning curves are drawn beside it).
    #[arg(value_name = "RUN_DIR")]
    pub(crate) run_dir: PathBuf,
}

/// `esper plot`: reads the run's epochs (or, for a PPO run, its rounds)
/// and writes both pictures.
pub(crate) fn run(args: &PlotArgs) -> Result<()> {
    if args.run_dir.is_file() {
        // A simic-learning record: its learning curves beside it.
        let text = std::fs::read_to_string(&args.run_dir)
            .map_err(|error| anyhow!("reading {}: {error}", args.run_dir.display()))?;
        let record = leyline::baseline::BaselineRecord::from_json(&text)
            .map_err(|error| anyhow!("{} is not a record: {error}", args.run_dir.display()))?;
        let (png, svg) = crate::plot_learning::draw(&record, &args.run_dir)?;
        println!("wrote {} and {}", png.display(), svg.display());
        return Ok(());
    }
    let rounds = args.run_dir.join(crate::train::ppo::ROUNDS_FILE);
    if rounds.is_file() && !args.run_dir.join(epoch_log::FILE_NAME).is_file() {
        let points = crate::plot_rounds::read(&args.run_dir)?;
        let (png, svg) = crate::plot_rounds::draw_rounds(&args.run_dir, &points)?;
        println!("wrote {} and {}", png.display(), svg.display());
        if args.run_dir.join(crate::train::ppo::EPISODE_FILE).is_file() {
            let records = epoch_log::read_file(&args.run_dir, crate::train::ppo::EPISODE_FILE)?;
            let (png, svg) = draw_episode(&args.run_dir, &records)?;
            println!("wrote {} and {}", png.display(), svg.display());
        }
        return Ok(());
    }
    let records = epoch_log::read(&args.run_dir)?;
    let (png, svg) = draw_run(&args.run_dir, &records)?;
    println!("wrote {} and {}", png.display(), svg.display());
    Ok(())
}

/// Draws `records` into `run_dir/run.png` and `run_dir/run.svg`; returns
/// their paths. The title names the run directory and, when
/// `run_dir/config.toml` is there, the task and controller.
pub(crate) fn draw_run(run_dir: &Path, records: &[EpochRecord]) -> Result<(PathBuf, PathBuf)> {
    draw_named(
        run_dir,
        records,
        epoch_log::FILE_NAME,
        (PNG_NAME, SVG_NAME),
        "",
    )
}

/// The episode picture of a PPO run: `episode.jsonl` (the first
/// environment's last episode, epoch by epoch) drawn as a run's picture,
/// into `episode.png` and `episode.svg`.
pub(crate) fn draw_episode(run_dir: &Path, records: &[EpochRecord]) -> Result<(PathBuf, PathBuf)> {
    draw_named(
        run_dir,
        records,
        crate::train::ppo::EPISODE_FILE,
        (EPISODE_PNG, EPISODE_SVG),
        " (environment 0 of the last round)",
    )
}

/// The episode picture's PNG inside a PPO run's directory.
pub(crate) const EPISODE_PNG: &str = "episode.png";
/// The episode picture's SVG inside a PPO run's directory.
pub(crate) const EPISODE_SVG: &str = "episode.svg";

/// Draws `records` (read from `run_dir/source`) into the two pictures of
/// `names`, the title followed by `suffix`.
fn draw_named(
    run_dir: &Path,
    records: &[EpochRecord],
    source: &str,
    names: (&str, &str),
    suffix: &str,
) -> Result<(PathBuf, PathBuf)> {
    if records.is_empty() {
        bail!(
            "{} holds no epoch yet; nothing to draw",
            run_dir.join(source).display()
        );
    }
    check_bounds(records).map_err(|error| {
        anyhow!(
            "{}: {error}; no picture drawn",
            run_dir.join(source).display()
        )
    })?;
    let records: Vec<EpochRecord> = records.iter().map(clipped).collect();
    let records = records.as_slice();
    register_font()?;
    let title = format!("{}{suffix}", title(run_dir, records));
    let height = picture_height(records);
    let png = run_dir.join(names.0);
    let svg = run_dir.join(names.1);
    {
        let root = BitMapBackend::new(&png, (WIDTH, height)).into_drawing_area();
        draw(&root, &title, records)
            .map_err(|error| anyhow!("drawing {}: {error}", png.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, (WIDTH, height)).into_drawing_area();
        draw(&root, &title, records)
            .map_err(|error| anyhow!("drawing {}: {error}", svg.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", svg.display()))?;
    }
    Ok((png, svg))
}

/// Registers the embedded DejaVu Sans as [`FONT`] (once).
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        bail!("the embedded DejaVu Sans font could not be loaded")
    }
}

/// Refuses records the picture cannot hold: more than [`MAX_EPOCHS`]
/// records, an epoch at or beyond [`MAX_EPOCHS`], more than [`MAX_SLOTS`]
/// slots in a record.
fn check_bounds(records: &[EpochRecord]) -> Result<()> {
    if records.len() > MAX_EPOCHS {
        bail!(
            "{} records, more than the {MAX_EPOCHS} epochs a run may have",
            records.len()
        );
    }
    if let Some(record) = records.iter().find(|record| record.epoch >= MAX_EPOCHS) {
        bail!(
            "a record of epoch {}, beyond the {MAX_EPOCHS} epochs a run may have",
            record.epoch
        );
    }
    let slots = slot_count(records);
    if slots > MAX_SLOTS {
        bail!("a record with {slots} slots, more than the {MAX_SLOTS} a run may have");
    }
    Ok(())
}

/// `value` clamped into `low..=high`; `None` when it is not finite.
fn within(value: f64, low: f64, high: f64) -> Option<f64> {
    value.is_finite().then(|| value.clamp(low, high))
}

/// At most [`NAME_CHARS`] characters of `name` (an ellipsis marks a cut).
fn short(name: &str) -> String {
    shortened(name, NAME_CHARS)
}

/// At most `chars` characters of `name` (at least 1; an ellipsis marks a
/// cut).
pub(crate) fn shortened(name: &str, chars: usize) -> String {
    let chars = chars.max(1);
    if name.chars().count() <= chars {
        return name.to_owned();
    }
    let mut cut: String = name.chars().take(chars - 1).collect();
    cut.push('\u{2026}');
    cut
}

/// `record` with its values clipped to the axes and its names shortened
/// (see the module docs): a value that is not finite is left out (NaN for
/// an accuracy, `None` for a loss, 0 for an alpha).
fn clipped(record: &EpochRecord) -> EpochRecord {
    let mut record = record.clone();
    record.train_accuracy = within(record.train_accuracy, 0.0, 100.0).unwrap_or(f64::NAN);
    record.val_accuracy = within(record.val_accuracy, 0.0, 100.0).unwrap_or(f64::NAN);
    record.train_loss = record
        .train_loss
        .and_then(|loss| within(loss, 0.0, LOSS_AXIS_LIMIT));
    record.val_loss = record
        .val_loss
        .and_then(|loss| within(loss, 0.0, LOSS_AXIS_LIMIT));
    record.val_perplexity = record
        .val_perplexity
        .and_then(|perplexity| within(perplexity, 1.0, f64::MAX));
    for slot in &mut record.slots {
        slot.alpha = within(slot.alpha, 0.0, 1.0).unwrap_or(0.0);
        slot.slot = short(&slot.slot);
        slot.blueprint = slot.blueprint.as_deref().map(short);
    }
    record
}

/// The last epoch the picture's axis shows (1-based).
fn last_epoch(records: &[EpochRecord]) -> usize {
    records
        .iter()
        .map(|record| record.epoch.saturating_add(1))
        .max()
        .unwrap_or(1)
}

fn slot_count(records: &[EpochRecord]) -> usize {
    records
        .iter()
        .map(|record| record.slots.len())
        .max()
        .unwrap_or(0)
}

fn picture_height(records: &[EpochRecord]) -> u32 {
    let lanes = u32::try_from(slot_count(records)).unwrap_or(u32::MAX);
    TITLE_HEIGHT + CHARTS_HEIGHT + lanes.saturating_mul(LANE_HEIGHT) + AXIS_HEIGHT + LEGEND_HEIGHT
}

/// `esper train: <dir> (task fmnist, controller heuristic) - 40 epochs, val 86.1% -> 88.0%`.
fn title(run_dir: &Path, records: &[EpochRecord]) -> String {
    let name = run_dir.file_name().map_or_else(
        || run_dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let name = shortened(&name, 80);
    let described = std::fs::read_to_string(run_dir.join("config.toml"))
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
        .map(|table| {
            let field =
                |key: &str| short(table.get(key).and_then(toml::Value::as_str).unwrap_or("?"));
            format!(
                " (task {}, controller {})",
                field("task"),
                field("controller")
            )
        })
        .unwrap_or_default();
    let first = records
        .first()
        .map_or(0.0, |record| record.val_accuracy)
        .clamp(0.0, 100.0);
    let last = records
        .last()
        .map_or(0.0, |record| record.val_accuracy)
        .clamp(0.0, 100.0);
    format!(
        "esper train: {name}{described}  -  {} epochs, validation accuracy {first:.1}% -> {last:.1}%",
        records.len()
    )
}

/// The colour of a stage name (leyline's names).
pub(crate) fn stage_colour(stage: &str) -> RGBColor {
    match stage {
        "GERMINATED" => RGBColor(253, 216, 53),
        "TRAINING" => RGBColor(255, 152, 0),
        "BLENDING" => RGBColor(66, 165, 245),
        "HOLDING" => RGBColor(126, 87, 194),
        "FOSSILIZED" => RGBColor(67, 160, 71),
        "PRUNED" => RGBColor(229, 57, 53),
        "EMBARGOED" => RGBColor(240, 98, 146),
        "RESETTING" => RGBColor(161, 136, 127),
        "DORMANT" => RGBColor(238, 238, 238),
        _ => RGBColor(255, 255, 255),
    }
}

/// The stages of the legend, in lifecycle order.
const LEGEND: [&str; 9] = [
    "DORMANT",
    "GERMINATED",
    "TRAINING",
    "BLENDING",
    "HOLDING",
    "FOSSILIZED",
    "PRUNED",
    "EMBARGOED",
    "RESETTING",
];

type DrawResult = std::result::Result<(), Box<dyn Error>>;

fn draw<DB>(root: &DrawingArea<DB, Shift>, title: &str, records: &[EpochRecord]) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (title_area, rest) = root.split_vertically(TITLE_HEIGHT);
    title_area.draw(&Text::new(
        title.to_owned(),
        (12, 12),
        (FONT, 18).into_font().color(&BLACK),
    ))?;
    let (charts, rest) = rest.split_vertically(CHARTS_HEIGHT);
    let (accuracy_area, loss_area) = charts.split_horizontally(WIDTH / 2);
    let last = last_epoch(records);
    let x_range = 0.5..last as f64 + 0.5;
    let x = |record: &EpochRecord| record.epoch as f64 + 1.0;

    // Accuracy.
    let accuracies = || {
        records
            .iter()
            .flat_map(|record| [record.train_accuracy, record.val_accuracy])
    };
    let lowest = accuracies().fold(100.0_f64, f64::min);
    let highest = accuracies().fold(0.0_f64, f64::max);
    // The range of the accuracies, widened to multiples of 5 with a margin.
    let floor = (((lowest - 2.0) / 5.0).floor() * 5.0).clamp(0.0, 95.0);
    let ceiling = (((highest + 2.0) / 5.0).ceil() * 5.0).clamp(floor + 5.0, 100.0);
    let mut chart = ChartBuilder::on(&accuracy_area)
        .caption("accuracy (%)", (FONT, 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(LABEL_AREA)
        .build_cartesian_2d(x_range.clone(), floor..ceiling)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .x_labels(x_label_count(last))
        .x_label_formatter(&epoch_label)
        .y_label_formatter(&|value: &f64| format!("{value:.0}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    // A thin vertical line where a seed was germinated, fossilized or pruned.
    for record in records {
        let colour = match record.acted().map(|decision| decision.op.as_str()) {
            Some("GERMINATE") => stage_colour("TRAINING"),
            Some("FOSSILIZE") => stage_colour("FOSSILIZED"),
            Some("PRUNE") => stage_colour("PRUNED"),
            _ => continue,
        };
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x(record), floor), (x(record), ceiling)],
            colour.stroke_width(2),
        )))?;
    }
    let train_colour = RGBColor(30, 136, 229);
    let val_colour = RGBColor(216, 67, 21);
    chart
        .draw_series(LineSeries::new(
            records
                .iter()
                .map(|r| (x(r), r.train_accuracy))
                .filter(|(_, y)| y.is_finite()),
            train_colour.stroke_width(2),
        ))?
        .label("train")
        .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], train_colour));
    chart
        .draw_series(LineSeries::new(
            records
                .iter()
                .map(|r| (x(r), r.val_accuracy))
                .filter(|(_, y)| y.is_finite()),
            val_colour.stroke_width(2),
        ))?
        .label("validation")
        .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], val_colour));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 13))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;

    // Loss.
    let highest = records
        .iter()
        .flat_map(|record| [record.train_loss, record.val_loss])
        .flatten()
        .fold(0.0_f64, f64::max);
    // The losses were clipped to LOSS_AXIS_LIMIT; a clipped one says so.
    let top = if highest > 0.0 { highest * 1.05 } else { 1.0 };
    let mut caption = if highest >= LOSS_AXIS_LIMIT {
        format!("loss (clipped at {LOSS_AXIS_LIMIT:e})")
    } else {
        "loss".to_owned()
    };
    // A language model's perplexity: the first and the last epoch's.
    let mut perplexity = records.iter().filter_map(|record| record.val_perplexity);
    if let Some(first) = perplexity.next() {
        let last = perplexity.next_back().unwrap_or(first);
        caption.push_str(&format!(
            ", per token; validation perplexity {first:.2} -> {last:.2}"
        ));
    }
    let mut chart = ChartBuilder::on(&loss_area)
        .caption(caption, (FONT, 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(LABEL_AREA)
        .build_cartesian_2d(x_range.clone(), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .x_labels(x_label_count(last))
        .x_label_formatter(&epoch_label)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            records
                .iter()
                .filter_map(|r| r.train_loss.map(|loss| (x(r), loss))),
            train_colour.stroke_width(2),
        ))?
        .label("train")
        .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], train_colour));
    chart
        .draw_series(LineSeries::new(
            records
                .iter()
                .filter_map(|r| r.val_loss.map(|loss| (x(r), loss))),
            val_colour.stroke_width(2),
        ))?
        .label("validation")
        .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], val_colour));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;

    // Swimlanes, one per slot; the last one carries the epoch axis.
    let lanes = slot_count(records);
    let (lanes_area, legend_area) =
        rest.split_vertically(u32::try_from(lanes).unwrap_or(0) * LANE_HEIGHT + AXIS_HEIGHT);
    let mut lane_rest = lanes_area;
    for lane in 0..lanes {
        let last = lane + 1 == lanes;
        let height = if last {
            LANE_HEIGHT + AXIS_HEIGHT
        } else {
            LANE_HEIGHT
        };
        let (area, below) = lane_rest.split_vertically(height);
        lane_rest = below;
        draw_lane(&area, records, lane, last, x_range.clone())?;
    }

    // Legend of the stage colours.
    let legend_area = legend_area.margin(8, 4, LABEL_AREA + 10, 10);
    let mut left = 0_i32;
    legend_area.draw(&Text::new(
        "stage:",
        (left, 6),
        (FONT, 14).into_font().color(&BLACK),
    ))?;
    left += 60;
    for stage in LEGEND {
        legend_area.draw(&Rectangle::new(
            [(left, 4), (left + 18, 22)],
            stage_colour(stage).filled(),
        ))?;
        legend_area.draw(&Rectangle::new(
            [(left, 4), (left + 18, 22)],
            BLACK.stroke_width(1),
        ))?;
        legend_area.draw(&Text::new(
            stage.to_lowercase(),
            (left + 24, 6),
            (FONT, 14).into_font().color(&BLACK),
        ))?;
        left += 34 + 9 * i32::try_from(stage.len()).unwrap_or(10);
    }
    legend_area.draw(&Text::new(
        "black line: alpha (0 bottom, 1 top)",
        (left + 10, 6),
        (FONT, 14).into_font().color(&BLACK),
    ))?;
    Ok(())
}
