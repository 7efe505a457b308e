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
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::train::config::{MAX_EPOCHS, MAX_SLOTS};
use crate::train::epoch_log::{self, EpochRecord};

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

/// How many epoch labels an axis asks for (plotters picks round values).
fn x_label_count(epochs: usize) -> usize {
    epochs.clamp(2, 20)
}

/// Whole epochs only: plotters may place a tick between two epochs.
fn epoch_label(value: &f64) -> String {
    if (value - value.round()).abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        String::new()
    }
}

/// One slot's lane: stage colours per epoch, the alpha line, and the
/// blueprint's name where each seed starts.
fn draw_lane<DB>(
    area: &DrawingArea<DB, Shift>,
    records: &[EpochRecord],
    lane: usize,
    with_axis: bool,
    x_range: std::ops::Range<f64>,
) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let name = records
        .iter()
        .find_map(|record| record.slots.get(lane).map(|slot| slot.slot.clone()))
        .unwrap_or_default();
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(10)
        .margin_top(2)
        .x_label_area_size(if with_axis { AXIS_HEIGHT } else { 0 })
        .y_label_area_size(LABEL_AREA)
        .build_cartesian_2d(x_range, -0.05..1.05)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_mesh()
        .disable_y_axis()
        .y_labels(0)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 14));
    if with_axis {
        mesh.x_desc("epoch")
            .x_labels(x_label_count(last_epoch(records)))
            .x_label_formatter(&epoch_label);
    } else {
        mesh.disable_x_axis();
    }
    mesh.draw()?;
    // The slot's name, left of the lane, centred on it.
    let lane_pixels = chart.plotting_area().get_pixel_range().1;
    let middle = (lane_pixels.start + lane_pixels.end) / 2 - area.get_base_pixel().1;
    area.draw(&Text::new(
        name,
        (14, middle),
        (FONT, 15)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center)),
    ))?;
    let lane_slots = || {
        records.iter().filter_map(move |record| {
            record
                .slots
                .get(lane)
                .map(|slot| (record.epoch as f64 + 1.0, slot))
        })
    };
    chart.draw_series(lane_slots().map(|(centre, slot)| {
        Rectangle::new(
            [(centre - 0.5, -0.05), (centre + 0.5, 1.05)],
            stage_colour(&slot.stage).filled(),
        )
    }))?;
    // The blueprint's name where each seed starts, over the colours.
    let mut previous_seed: Option<&str> = None;
    for (centre, slot) in lane_slots() {
        let seed = slot.seed_id.as_deref();
        if seed.is_some()
            && seed != previous_seed
            && let Some(blueprint) = &slot.blueprint
        {
            chart.draw_series(std::iter::once(Text::new(
                blueprint.clone(),
                (centre - 0.4, 0.55),
                (FONT, 13)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            )))?;
        }
        previous_seed = seed;
    }
    chart.draw_series(LineSeries::new(
        records.iter().filter_map(|record| {
            record
                .slots
                .get(lane)
                .map(|slot| (record.epoch as f64 + 1.0, slot.alpha))
        }),
        BLACK.stroke_width(2),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::epoch_log::SlotRecord;

    fn record(epoch: usize, stage: &str, alpha: f64) -> EpochRecord {
        EpochRecord {
            epoch,
            train_loss: Some(1.0 / (epoch as f64 + 1.0)),
            train_accuracy: 50.0 + epoch as f64,
            val_loss: if epoch == 1 { None } else { Some(0.9) },
            val_accuracy: 48.0 + epoch as f64,
            epoch_ms: 10.0,
            samples_per_s: 1000.0,
            active_seeds: 1,
            slots: vec![
                SlotRecord {
                    slot: "r0c1".to_owned(),
                    stage: stage.to_owned(),
                    alpha,
                    blueprint: Some("conv_light".to_owned()),
                    seed_id: Some("seed-0".to_owned()),
                },
                SlotRecord {
                    slot: "r0c2".to_owned(),
                    stage: "DORMANT".to_owned(),
                    alpha: 0.0,
                    blueprint: None,
                    seed_id: None,
                },
            ],
            decision: None,
            rollback: None,
            val_perplexity: None,
        }
    }

    #[test]
    fn a_picture_is_drawn_for_every_stage_and_a_missing_loss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records: Vec<EpochRecord> = LEGEND
            .iter()
            .enumerate()
            .map(|(epoch, stage)| record(epoch, stage, epoch as f64 / 8.0))
            .collect();
        let (png, svg) = draw_run(dir.path(), &records).expect("drawn");
        let png_bytes = std::fs::read(png).expect("png");
        assert!(png_bytes.starts_with(b"\x89PNG"));
        let svg_text = std::fs::read_to_string(svg).expect("svg");
        assert!(svg_text.contains("<svg") && svg_text.contains("conv_light"));
        assert!(svg_text.contains("r0c2"), "a lane per slot");
        assert!(draw_run(dir.path(), &[]).is_err(), "nothing to draw");
    }

    /// The names of the files in `dir`.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_language_models_perplexity_is_in_the_loss_caption() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut records: Vec<EpochRecord> =
            (0..3).map(|epoch| record(epoch, "TRAINING", 0.0)).collect();
        for (record, perplexity) in records.iter_mut().zip([21.0, f64::NAN, 6.0]) {
            record.val_perplexity = Some(perplexity);
        }
        let (_, svg) = draw_run(dir.path(), &records).expect("drawn");
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert!(
            svg.contains("validation perplexity 21.00 -&gt; 6.00")
                || svg.contains("validation perplexity 21.00 -> 6.00"),
            "caption"
        );
        let (_, svg) = draw_run(
            dir.path(),
            &records[..1]
                .iter()
                .map(|r| EpochRecord {
                    val_perplexity: None,
                    ..r.clone()
                })
                .collect::<Vec<_>>(),
        )
        .expect("drawn");
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert!(!svg.contains("perplexity"), "an image task has none");
    }

    #[test]
    fn absurd_epochs_and_slot_counts_are_refused_before_anything_is_drawn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut far = record(0, "TRAINING", 0.5);
        far.epoch = usize::MAX;
        let error = draw_run(dir.path(), &[record(0, "TRAINING", 0.5), far])
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains(&format!("epoch {}", usize::MAX)) && error.contains("no picture"),
            "{error}"
        );
        let mut crowded = record(0, "TRAINING", 0.5);
        crowded.slots = (0..50_000)
            .map(|index| epoch_log::SlotRecord {
                slot: format!("r{index}c0"),
                stage: "DORMANT".to_owned(),
                alpha: 0.0,
                blueprint: None,
                seed_id: None,
            })
            .collect();
        let error = draw_run(dir.path(), &[crowded])
            .expect_err("refused")
            .to_string();
        assert!(error.contains("50000 slots"), "{error}");
        assert!(files(dir.path()).is_empty(), "nothing written");
    }

    #[test]
    fn values_beyond_the_axes_are_clipped_and_long_names_shortened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wild = record(1, "BLENDING", 7.0);
        wild.train_loss = Some(f64::MAX);
        wild.val_loss = Some(-1e300);
        wild.train_accuracy = 1e300;
        wild.val_accuracy = f64::NAN;
        wild.slots[0].blueprint = Some("b".repeat(10_000));
        wild.slots[1].alpha = f64::NEG_INFINITY;
        let clipped_record = clipped(&wild);
        assert_eq!(clipped_record.train_loss, Some(LOSS_AXIS_LIMIT));
        assert_eq!(clipped_record.val_loss, Some(0.0));
        assert_eq!(clipped_record.train_accuracy, 100.0);
        assert!(clipped_record.val_accuracy.is_nan(), "left out");
        assert_eq!(clipped_record.slots[0].alpha, 1.0);
        assert_eq!(clipped_record.slots[1].alpha, 0.0);
        assert_eq!(
            clipped_record.slots[0]
                .blueprint
                .as_deref()
                .map(|name| name.chars().count()),
            Some(NAME_CHARS)
        );
        let (_, svg) = draw_run(dir.path(), &[record(0, "TRAINING", 0.2), wild]).expect("drawn");
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert!(svg.contains("clipped at 1e6"), "the loss axis says so");
    }

    fn hostile_record() -> impl proptest::strategy::Strategy<Value = EpochRecord> {
        use leyline::testing::{extreme_f64, extreme_usize};
        use proptest::prelude::*;
        let slot = (
            "\\PC{0,8}",
            proptest::sample::select(LEGEND.to_vec()),
            extreme_f64(),
            proptest::option::of("\\PC{0,40}"),
        )
            .prop_map(|(slot, stage, alpha, blueprint)| epoch_log::SlotRecord {
                slot,
                stage: stage.to_owned(),
                alpha,
                seed_id: blueprint.as_ref().map(|_| "seed-0".to_owned()),
                blueprint,
            });
        (
            prop_oneof![4 => 0usize..64, 1 => extreme_usize()],
            proptest::option::of(extreme_f64()),
            extreme_f64(),
            proptest::option::of(extreme_f64()),
            extreme_f64(),
            proptest::collection::vec(slot, 0..4),
        )
            .prop_map(
                |(epoch, train_loss, train_accuracy, val_loss, val_accuracy, slots)| EpochRecord {
                    epoch,
                    train_loss,
                    train_accuracy,
                    val_loss,
                    val_accuracy,
                    epoch_ms: 1.0,
                    samples_per_s: 1.0,
                    active_seeds: 0,
                    slots,
                    decision: None,
                    rollback: None,
                    val_perplexity: None,
                },
            )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever a record holds, the bounds check and the clipping give
        /// values inside the picture's axes or a refusal, never a panic.
        #[test]
        fn hostile_records_are_refused_or_clipped_into_the_axes(
            records in proptest::collection::vec(hostile_record(), 1..6),
        ) {
            if check_bounds(&records).is_ok() {
                for record in records.iter().map(clipped) {
                    proptest::prop_assert!(record.epoch < MAX_EPOCHS);
                    for accuracy in [record.train_accuracy, record.val_accuracy] {
                        proptest::prop_assert!(
                            accuracy.is_nan() || (0.0..=100.0).contains(&accuracy)
                        );
                    }
                    for loss in [record.train_loss, record.val_loss].into_iter().flatten() {
                        proptest::prop_assert!((0.0..=LOSS_AXIS_LIMIT).contains(&loss));
                    }
                    for slot in &record.slots {
                        proptest::prop_assert!((0.0..=1.0).contains(&slot.alpha));
                        proptest::prop_assert!(slot.slot.chars().count() <= NAME_CHARS);
                    }
                }
            }
        }
    }

    proptest::proptest! {
        // Each case draws a PNG and an SVG (a fraction of a second each).
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

        /// Drawing hostile records gives the picture or an error that leaves
        /// no file behind, never a panic.
        #[test]
        fn hostile_records_draw_or_are_refused_leaving_nothing(
            records in proptest::collection::vec(hostile_record(), 0..4),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            match draw_run(dir.path(), &records) {
                Ok(_) => proptest::prop_assert_eq!(files(dir.path()), [PNG_NAME, SVG_NAME]),
                Err(error) => {
                    let message = error.to_string();
                    proptest::prop_assert!(!message.is_empty());
                    proptest::prop_assert!(files(dir.path()).is_empty());
                }
            }
        }
    }
}
