//! The picture of a PPO run: `RUN_DIR/run.png` and `RUN_DIR/run.svg`,
//! drawn from `RUN_DIR/rounds.jsonl` at the end of `esper train
//! --controller ppo` and by `esper plot RUN_DIR`.
//!
//! Six charts, one point per round: the mean episode reward, the
//! throughput (environment-epochs per second, the run's running figure), the
//! environments' mean final validation accuracy, the mean number of live
//! seeds per environment, each point labelled with the round's germinations
//! and fossilizations (`g2 f1`), the share of the policy's decisions per op
//! (one line per op it ever chose), and the critic's loss in the update.
//!
//! The picture is bounded whatever `rounds.jsonl` holds: a round number
//! that is not a whole number in `0..`[`MAX_ROUNDS`], more rounds than that,
//! or more distinct ops than [`MAX_OPS`] is refused with a message naming
//! the line before any file is written; a figure beyond
//! ±[`VALUE_LIMIT`] is drawn at the limit (the chart's caption says so), a
//! share outside 0-100 % at its end.

use std::error::Error;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::plot::{FONT, PNG_NAME, SVG_NAME, register_font, shortened};
use crate::train::config::MAX_ROUNDS;
use crate::train::ppo::ROUNDS_FILE;

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1200;
const TITLE_HEIGHT: u32 = 40;

/// The largest magnitude a chart's figures are drawn at; beyond it they are
/// clipped to it.
pub(crate) const VALUE_LIMIT: f64 = 1e12;
/// Most distinct ops the op-share chart draws (leyline has six).
pub(crate) const MAX_OPS: usize = 16;

type DrawResult = std::result::Result<(), Box<dyn Error>>;

/// One chart: caption, colour, and the figure it plots.
type Chart = (&'static str, RGBColor, fn(&RoundPoint) -> Option<f64>);

/// One round's figures, as `rounds.jsonl` holds them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundPoint {
    /// 1-based round number.
    pub(crate) round: f64,
    pub(crate) reward: Option<f64>,
    pub(crate) eps: Option<f64>,
    pub(crate) accuracy: Option<f64>,
    pub(crate) live_seeds: Option<f64>,
    pub(crate) germinations: f64,
    pub(crate) fossilizations: f64,
    /// Per op, the share of the round's decisions that chose it, percent
    /// (`actions.chosen` over `actions.steps`; empty in runs written
    /// before the decision analytics).
    pub(crate) op_shares: Vec<(String, f64)>,
    /// The critic's loss in the update (`ppo.value_loss`).
    pub(crate) value_loss: Option<f64>,
}

/// Reads `run_dir/rounds.jsonl`; a line that is not a round is an error
/// naming its line number.
pub(crate) fn read(run_dir: &Path) -> Result<Vec<RoundPoint>> {
    let path = run_dir.join(ROUNDS_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut points = Vec::new();
    for (index, line) in text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
    {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), index + 1))?;
        let number = |key: &str| value.get(key).and_then(serde_json::Value::as_f64);
        let round = number("round")
            .with_context(|| format!("{} line {}: no round number", path.display(), index + 1))?;
        check_round(round).with_context(|| format!("{} line {}", path.display(), index + 1))?;
        if points.len() >= MAX_ROUNDS {
            bail!(
                "{} holds more than the {MAX_ROUNDS} rounds a run may have",
                path.display()
            );
        }
        let accuracies: Vec<f64> = value
            .get("final_accuracies")
            .and_then(serde_json::Value::as_array)
            .map(|list| list.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        let accuracy = (!accuracies.is_empty())
            .then(|| accuracies.iter().sum::<f64>() / accuracies.len() as f64);
        let steps = value
            .pointer("/actions/steps")
            .and_then(serde_json::Value::as_f64)
            .filter(|steps| *steps > 0.0);
        let op_shares = match (
            steps,
            value
                .pointer("/actions/chosen")
                .and_then(serde_json::Value::as_object),
        ) {
            (Some(steps), Some(chosen)) => chosen
                .iter()
                .filter_map(|(op, count)| {
                    count
                        .as_f64()
                        .map(|count| (op.clone(), 100.0 * count / steps))
                })
                .collect(),
            _ => Vec::new(),
        };
        points.push(RoundPoint {
            round: round + 1.0,
            op_shares,
            value_loss: value
                .pointer("/ppo/value_loss")
                .and_then(serde_json::Value::as_f64),
            reward: number("mean_episode_reward"),
            eps: number("eps"),
            accuracy,
            live_seeds: number("mean_active_seeds"),
            germinations: number("germinations").unwrap_or(0.0),
            fossilizations: number("fossilizations").unwrap_or(0.0),
        });
    }
    Ok(points)
}

/// Refuses a round number (0-based, as `rounds.jsonl` holds it) that is not
/// a whole number in `0..MAX_ROUNDS`.
fn check_round(round: f64) -> Result<()> {
    if !(round.is_finite() && round >= 0.0 && round.fract() == 0.0 && round < MAX_ROUNDS as f64) {
        bail!("round {round} is not a round number (a whole number from 0 to {MAX_ROUNDS})");
    }
    Ok(())
}

/// Refuses points the picture cannot hold (see the module docs).
fn check_points(points: &[RoundPoint]) -> Result<()> {
    if points.len() > MAX_ROUNDS {
        bail!(
            "{} rounds, more than the {MAX_ROUNDS} a run may have",
            points.len()
        );
    }
    let mut ops: Vec<&str> = Vec::new();
    for point in points {
        // `round` is 1-based here.
        check_round(point.round - 1.0)?;
        for (op, _) in &point.op_shares {
            if !ops.contains(&op.as_str()) {
                ops.push(op);
                if ops.len() > MAX_OPS {
                    bail!("more than {MAX_OPS} distinct ops in the decision shares");
                }
            }
        }
    }
    Ok(())
}

/// `value` clipped to ±[`VALUE_LIMIT`]; `None` when it is not finite.
pub(crate) fn clip(value: f64) -> Option<f64> {
    value
        .is_finite()
        .then(|| value.clamp(-VALUE_LIMIT, VALUE_LIMIT))
}

/// Draws `points` into `run_dir/run.png` and `run_dir/run.svg`.
pub(crate) fn draw_rounds(run_dir: &Path, points: &[RoundPoint]) -> Result<(PathBuf, PathBuf)> {
    if points.is_empty() {
        bail!(
            "{} holds no round yet; nothing to draw",
            run_dir.join(ROUNDS_FILE).display()
        );
    }
    check_points(points).map_err(|error| {
        anyhow!(
            "{}: {error}; no picture drawn",
            run_dir.join(ROUNDS_FILE).display()
        )
    })?;
    register_font()?;
    let title = format!(
        "esper train --controller ppo: {} - {} rounds",
        shortened(&run_dir.display().to_string(), 100),
        points.len()
    );
    let png = run_dir.join(PNG_NAME);
    let svg = run_dir.join(SVG_NAME);
    {
        let root = BitMapBackend::new(&png, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, &title, points)
            .map_err(|error| anyhow!("drawing {}: {error}", png.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, &title, points)
            .map_err(|error| anyhow!("drawing {}: {error}", svg.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", svg.display()))?;
    }
    Ok((png, svg))
}

fn draw<DB>(root: &DrawingArea<DB, Shift>, title: &str, points: &[RoundPoint]) -> DrawResult
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
    let areas = rest.split_evenly((3, 2));
    let series: [Chart; 5] = [
        ("mean episode reward", RGBColor(30, 136, 229), |p| p.reward),
        ("env-epochs per second (eps)", RGBColor(67, 160, 71), |p| {
            p.eps
        }),
        (
            "mean final validation accuracy (%)",
            RGBColor(216, 67, 21),
            |p| p.accuracy,
        ),
        ("live seeds per environment", RGBColor(142, 36, 170), |p| {
            p.live_seeds
        }),
        ("value loss of the update", RGBColor(0, 137, 123), |p| {
            p.value_loss
        }),
    ];
    let last = points.iter().map(|p| p.round).fold(1.0, f64::max);
    // The op shares take the fifth cell, the value loss the sixth.
    let cells = [0, 1, 2, 3, 5];
    if let Some(area) = areas.get(4) {
        draw_op_shares(area, points, last)?;
    }
    for (cell, (caption, colour, pick)) in cells.into_iter().zip(series) {
        let Some(area) = areas.get(cell) else {
            continue;
        };
        let values: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| pick(p).and_then(clip).map(|v| (p.round, v)))
            .collect();
        let clipped = points
            .iter()
            .filter_map(pick)
            .any(|v| v.is_finite() && v.abs() > VALUE_LIMIT);
        let caption = if clipped {
            format!("{caption} (clipped at \u{b1}{VALUE_LIMIT:e})")
        } else {
            caption.to_owned()
        };
        let low = values.iter().map(|(_, v)| *v).fold(f64::INFINITY, f64::min);
        let high = values
            .iter()
            .map(|(_, v)| *v)
            .fold(f64::NEG_INFINITY, f64::max);
        let (low, high) = if values.is_empty() {
            (0.0, 1.0)
        } else {
            let margin = ((high - low) * 0.1).max(1e-3);
            (low - margin, high + margin)
        };
        let mut chart = round_chart(area, &caption, points.len(), last, low..high)?;
        chart.draw_series(LineSeries::new(
            values.iter().copied(),
            colour.stroke_width(2),
        ))?;
        chart.draw_series(
            values
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, colour.filled())),
        )?;
        if caption.starts_with("live seeds") {
            // Germinations (up) and fossilizations (down) of the round, as ticks.
            for p in points {
                let label = format!(
                    "   g{:.0} f{:.0}",
                    p.germinations.clamp(-VALUE_LIMIT, VALUE_LIMIT),
                    p.fossilizations.clamp(-VALUE_LIMIT, VALUE_LIMIT)
                );
                if let Some(y) = p.live_seeds.and_then(clip) {
                    chart.draw_series(std::iter::once(Text::new(
                        label,
                        (p.round, y),
                        (FONT, 11).into_font().color(&BLACK),
                    )))?;
                }
            }
        }
    }
    Ok(())
}

/// A chart over rounds 1..=`last` with `y` on its vertical axis, its
/// caption and mesh drawn.
pub(crate) fn round_chart<'a, DB>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    rounds: usize,
    last: f64,
    y: std::ops::Range<f64>,
) -> std::result::Result<
    ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    Box<dyn Error>,
>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5..last + 0.5, y)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .x_labels(rounds.clamp(2, 12))
        .x_label_formatter(&|x: &f64| format!("{x:.0}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    Ok(chart)
}

/// Colours of the op lines, in the order the ops are met.
const OP_COLOURS: [RGBColor; 6] = [
    RGBColor(96, 125, 139),
    RGBColor(67, 160, 71),
    RGBColor(251, 140, 0),
    RGBColor(229, 57, 53),
    RGBColor(142, 36, 170),
    RGBColor(30, 136, 229),
];

/// The share of each round's decisions per op, one line per op the policy
/// ever chose, with a legend.
fn draw_op_shares<DB>(area: &DrawingArea<DB, Shift>, points: &[RoundPoint], last: f64) -> DrawResult
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let mut ops: Vec<&str> = Vec::new();
    for point in points {
        for (op, share) in &point.op_shares {
            if *share > 0.0 && !ops.contains(&op.as_str()) {
                ops.push(op);
            }
        }
    }
    let mut chart = round_chart(
        area,
        "share of decisions per op (%)",
        points.len(),
        last,
        0.0..100.0,
    )?;
    for (index, op) in ops.iter().enumerate() {
        let colour = OP_COLOURS[index % OP_COLOURS.len()];
        let values: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| {
                p.op_shares
                    .iter()
                    .find(|(name, _)| name == op)
                    .and_then(|(_, share)| share.is_finite().then(|| share.clamp(0.0, 100.0)))
                    .map(|share| (p.round, share))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(values, colour.stroke_width(2)))?
            .label(shortened(op, 24))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    if !ops.is_empty() {
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Strategy as _;

    use super::*;

    #[test]
    fn rounds_are_read_with_their_figures_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(ROUNDS_FILE),
            "{\"round\":0,\"mean_episode_reward\":1.5,\"eps\":2.0,\"final_accuracies\":[80.0,90.0],\
             \"mean_active_seeds\":0.5,\"germinations\":2,\"fossilizations\":1,\
             \"actions\":{\"steps\":4,\"chosen\":{\"WAIT\":3,\"GERMINATE\":1,\"PRUNE\":0}},\
             \"ppo\":{\"value_loss\":0.25}}\n\
             {\"round\":1,\"mean_episode_reward\":null,\"eps\":3.0,\"final_accuracies\":[]}\n",
        )
        .expect("write");
        let points = read(dir.path()).expect("read");
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].round, 1.0);
        assert_eq!(points[0].accuracy, Some(85.0));
        assert_eq!(points[0].germinations, 2.0);
        assert_eq!(points[1].reward, None);
        assert_eq!(points[1].accuracy, None);
        assert_eq!(
            points[0].op_shares,
            [
                ("GERMINATE".to_owned(), 25.0),
                ("PRUNE".to_owned(), 0.0),
                ("WAIT".to_owned(), 75.0)
            ]
        );
        assert_eq!(points[0].value_loss, Some(0.25));
        assert!(points[1].op_shares.is_empty(), "a line without actions");
        let (png, svg) = draw_rounds(dir.path(), &points).expect("draw");
        assert!(std::fs::metadata(png).expect("png").len() > 1000);
        assert!(
            std::fs::read_to_string(svg)
                .expect("svg")
                .contains("mean episode reward")
        );
        let svg = std::fs::read_to_string(dir.path().join(SVG_NAME)).expect("svg");
        assert!(svg.contains("share of decisions per op"), "the op chart");
        assert!(svg.contains("GERMINATE"), "the op chart's legend");
        std::fs::write(dir.path().join(ROUNDS_FILE), "{\"round\":0}\nnot json\n").expect("write");
        let error = read(dir.path())
            .expect_err("line 2 is not JSON")
            .to_string();
        assert!(error.contains("line 2"), "{error}");
    }

    /// The names of the files in `dir` but `rounds.jsonl`.
    fn pictures(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name != ROUNDS_FILE)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn absurd_round_numbers_are_refused_naming_the_line_and_huge_figures_clipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        for round in ["1e300", "-1", "0.5", "100000", "18446744073709551615"] {
            std::fs::write(
                dir.path().join(ROUNDS_FILE),
                format!("{{\"round\":0}}\n{{\"round\":{round}}}\n"),
            )
            .expect("write");
            let error = format!("{:#}", read(dir.path()).expect_err("refused"));
            assert!(
                error.contains("line 2") && error.contains("not a round number"),
                "{round}: {error}"
            );
        }
        let point = |round: f64| RoundPoint {
            round,
            reward: Some(f64::MAX),
            eps: Some(-1e300),
            accuracy: Some(f64::NAN),
            live_seeds: Some(1e200),
            germinations: f64::INFINITY,
            fossilizations: -0.0,
            op_shares: vec![("WAIT".to_owned(), 1e300), ("x".repeat(1000), f64::NAN)],
            value_loss: Some(f64::MIN_POSITIVE),
        };
        let error = draw_rounds(dir.path(), &[point(1.0), point(f64::MAX)])
            .expect_err("refused")
            .to_string();
        assert!(error.contains("no picture"), "{error}");
        let too_many_ops = RoundPoint {
            op_shares: (0..=MAX_OPS).map(|op| (op.to_string(), 1.0)).collect(),
            ..point(1.0)
        };
        assert!(draw_rounds(dir.path(), &[too_many_ops]).is_err());
        assert!(pictures(dir.path()).is_empty(), "nothing written");
        let (_, svg) = draw_rounds(dir.path(), &[point(1.0), point(2.0)]).expect("drawn");
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert!(svg.contains("mean episode reward (clipped at"), "said");
    }

    proptest::proptest! {
        // Each case reads and draws a PNG and an SVG.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

        /// Whatever numbers `rounds.jsonl` holds, `esper plot` reads and
        /// draws them or refuses with a message and writes no picture;
        /// never a panic.
        #[test]
        fn hostile_rounds_draw_or_are_refused_leaving_nothing(
            lines in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        4 => (0u64..50).prop_map(|round| round as f64),
                        1 => leyline::testing::extreme_f64(),
                    ],
                    proptest::collection::vec(leyline::testing::extreme_f64(), 6),
                    leyline::testing::extreme_u64(),
                ),
                1..5,
            ),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            // JSON has no NaN or infinity: those are written as null, as the
            // run writes them.
            let number = |value: f64| {
                serde_json::Number::from_f64(value).map_or(serde_json::Value::Null, Into::into)
            };
            let text: String = lines
                .iter()
                .map(|(round, figures, count)| {
                    serde_json::json!({
                        "round": number(*round),
                        "mean_episode_reward": number(figures[0]),
                        "eps": number(figures[1]),
                        "final_accuracies": [number(figures[2])],
                        "mean_active_seeds": number(figures[3]),
                        "germinations": count,
                        "actions": {"steps": number(figures[4]), "chosen": {"WAIT": count}},
                        "ppo": {"value_loss": number(figures[5])},
                    })
                    .to_string()
                        + "\n"
                })
                .collect();
            std::fs::write(dir.path().join(ROUNDS_FILE), text).expect("write");
            match read(dir.path()).and_then(|points| draw_rounds(dir.path(), &points)) {
                Ok(_) => proptest::prop_assert_eq!(pictures(dir.path()), [PNG_NAME, SVG_NAME]),
                Err(error) => {
                    proptest::prop_assert!(error.chain().count() > 0 && !error.to_string().is_empty());
                    proptest::prop_assert!(pictures(dir.path()).is_empty());
                }
            }
        }
    }
}
