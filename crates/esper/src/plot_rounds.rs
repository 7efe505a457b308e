//! The picture of a PPO run: `RUN_DIR/run.png` and `RUN_DIR/run.svg`,
//! drawn from `RUN_DIR/rounds.jsonl` at the end of `esper train
//! --controller ppo` and by `esper plot RUN_DIR`.
//!
//! Four charts, one point per round: the mean episode reward, the
//! throughput (environment-epochs per second, the run's running figure), the
//! environments' mean final validation accuracy, and the mean number of live
//! seeds per environment, each point labelled with the round's germinations
//! and fossilizations (`g2 f1`).

use std::error::Error;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::plot::{FONT, PNG_NAME, SVG_NAME, register_font};
use crate::train::ppo::ROUNDS_FILE;

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 820;
const TITLE_HEIGHT: u32 = 40;

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
        let accuracies: Vec<f64> = value
            .get("final_accuracies")
            .and_then(serde_json::Value::as_array)
            .map(|list| list.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        let accuracy = (!accuracies.is_empty())
            .then(|| accuracies.iter().sum::<f64>() / accuracies.len() as f64);
        points.push(RoundPoint {
            round: round + 1.0,
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

/// Draws `points` into `run_dir/run.png` and `run_dir/run.svg`.
pub(crate) fn draw_rounds(run_dir: &Path, points: &[RoundPoint]) -> Result<(PathBuf, PathBuf)> {
    if points.is_empty() {
        bail!(
            "{} holds no round yet; nothing to draw",
            run_dir.join(ROUNDS_FILE).display()
        );
    }
    register_font()?;
    let title = format!(
        "esper train --controller ppo: {} - {} rounds",
        run_dir.display(),
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
    let areas = rest.split_evenly((2, 2));
    let series: [Chart; 4] = [
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
    ];
    let last = points.iter().map(|p| p.round).fold(1.0, f64::max);
    for (area, (caption, colour, pick)) in areas.iter().zip(series) {
        let values: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| pick(p).map(|v| (p.round, v)))
            .collect();
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
        let mut chart = ChartBuilder::on(area)
            .caption(caption, (FONT, 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.5..last + 0.5, low..high)?;
        chart
            .configure_mesh()
            .x_desc("round")
            .x_labels(points.len().clamp(2, 12))
            .x_label_formatter(&|x: &f64| format!("{x:.0}"))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
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
                let label = format!("   g{:.0} f{:.0}", p.germinations, p.fossilizations);
                if let Some(y) = p.live_seeds {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_read_with_their_figures_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(ROUNDS_FILE),
            "{\"round\":0,\"mean_episode_reward\":1.5,\"eps\":2.0,\"final_accuracies\":[80.0,90.0],\
             \"mean_active_seeds\":0.5,\"germinations\":2,\"fossilizations\":1}\n\
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
        let (png, svg) = draw_rounds(dir.path(), &points).expect("draw");
        assert!(std::fs::metadata(png).expect("png").len() > 1000);
        assert!(
            std::fs::read_to_string(svg)
                .expect("svg")
                .contains("mean episode reward")
        );
        std::fs::write(dir.path().join(ROUNDS_FILE), "{\"round\":0}\nnot json\n").expect("write");
        let error = read(dir.path())
            .expect_err("line 2 is not JSON")
            .to_string();
        assert!(error.contains("line 2"), "{error}");
    }
}
