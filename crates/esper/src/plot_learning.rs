//! The picture of a `simic-learning` record: the learning curves of every
//! training seed, drawn beside the record (`<record>.png` and `.svg`) by
//! `esper bench simic-learning`.
//!
//! Four charts over the training rounds, one line per training seed: the
//! mean episode reward, the live seeds per environment, the seeds
//! fossilized in the round, and the mean final validation accuracy, with
//! the baselines' accuracy on the evaluation environments as horizontal
//! lines (no growth, germinate-once, heuristic, max growth) for scale.
//! Where the run measured a greedy learning curve (`--greedy-every`), its
//! points (the greedy policy's mean final accuracy on the curve's own
//! environments) are circles in the seed's colour on the accuracy chart.
//! Figures come from the record's `ppo-seed<S>-round-<R>` and `*-eval`
//! entries; a record without them draws nothing and says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use leyline::baseline::BaselineRecord;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::plot::{FONT, register_font};
use crate::plot_rounds::{clip, round_chart};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 900;
const TITLE_HEIGHT: u32 = 40;
/// Most training seeds drawn (one colour each).
const MAX_SEEDS: usize = 8;

/// A seed's colour.
const SEED_COLOURS: [RGBColor; MAX_SEEDS] = [
    RGBColor(30, 136, 229),
    RGBColor(216, 67, 21),
    RGBColor(67, 160, 71),
    RGBColor(142, 36, 170),
    RGBColor(251, 140, 0),
    RGBColor(0, 137, 123),
    RGBColor(121, 85, 72),
    RGBColor(96, 125, 139),
];

/// Per training seed, per round: (round, metric name) -> value.
type Curves = BTreeMap<usize, Vec<(usize, BTreeMap<String, f64>)>>;

/// The learning curves of `record`.
fn curves(record: &BaselineRecord) -> Curves {
    let mut curves = Curves::new();
    for entry in &record.results {
        let Some(rest) = entry.mode.strip_prefix("ppo-seed") else {
            continue;
        };
        let Some((seed, round)) = rest.split_once("-round-") else {
            continue;
        };
        let (Ok(seed), Ok(round)) = (seed.parse::<usize>(), round.parse::<usize>()) else {
            continue;
        };
        curves
            .entry(seed)
            .or_default()
            .push((round, entry.metrics.clone()));
    }
    for rounds in curves.values_mut() {
        rounds.sort_by_key(|(round, _)| *round);
    }
    curves
}

/// Draws the learning curves of `record` beside `out` (`out` with `.png`
/// and `.svg`); returns the two paths.
pub(crate) fn draw(record: &BaselineRecord, out: &Path) -> Result<(PathBuf, PathBuf)> {
    let curves = curves(record);
    if curves.is_empty() {
        bail!("the record has no ppo-seed<S>-round-<R> entries; no learning curves drawn");
    }
    if curves.len() > MAX_SEEDS {
        bail!(
            "the record has {} training seeds; the picture draws at most {MAX_SEEDS}",
            curves.len()
        );
    }
    register_font()?;
    let baselines: Vec<(String, f64)> = record
        .results
        .iter()
        .filter(|entry| entry.mode.ends_with("-eval") && !entry.mode.starts_with("ppo"))
        .filter_map(|entry| {
            let value = entry.metrics.get("final_accuracy_pct").copied()?;
            Some((entry.mode.trim_end_matches("-eval").to_owned(), value))
        })
        .collect();
    let title = format!(
        "{} {} on {}: learning curves of {} training seed(s)",
        record.workload,
        record.label,
        record.environment.device,
        curves.len()
    );
    let png = out.with_extension("png");
    let svg = out.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, (WIDTH, HEIGHT)).into_drawing_area();
        draw_on(&root, &title, &curves, &baselines)
            .map_err(|error| anyhow!("drawing {}: {error}", png.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, (WIDTH, HEIGHT)).into_drawing_area();
        draw_on(&root, &title, &curves, &baselines)
            .map_err(|error| anyhow!("drawing {}: {error}", svg.display()))?;
        root.present()
            .map_err(|error| anyhow!("writing {}: {error}", svg.display()))?;
    }
    Ok((png, svg))
}

fn draw_on<DB>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    curves: &Curves,
    baselines: &[(String, f64)],
) -> std::result::Result<(), Box<dyn std::error::Error>>
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
    let charts = [
        ("mean episode reward", "mean_episode_reward"),
        ("live seeds per environment", "active_seeds_per_env"),
        ("seeds fossilized in the round", "fossilizations"),
        ("mean final validation accuracy (%)", "final_accuracy_pct"),
    ];
    let rounds = curves.values().map(Vec::len).max().unwrap_or(1).max(1);
    let last = rounds as f64;
    for (area, (caption, key)) in areas.iter().zip(charts) {
        let points: Vec<(usize, Vec<(f64, f64)>)> = curves
            .iter()
            .map(|(seed, rounds)| {
                let values = rounds
                    .iter()
                    .filter_map(|(round, metrics)| {
                        let value = clip(*metrics.get(key)?)?;
                        Some((*round as f64 + 1.0, value))
                    })
                    .collect();
                (*seed, values)
            })
            .collect();
        let mut all: Vec<f64> = points
            .iter()
            .flat_map(|(_, values)| values.iter().map(|(_, v)| *v))
            .collect();
        let accuracy = key == "final_accuracy_pct";
        if accuracy {
            all.extend(baselines.iter().filter_map(|(_, v)| clip(*v)));
            all.extend(
                curves
                    .values()
                    .flatten()
                    .filter_map(|(_, metrics)| clip(*metrics.get("greedy_accuracy_pct")?)),
            );
        }
        let low = all.iter().copied().fold(f64::INFINITY, f64::min);
        let high = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (low, high) = if all.is_empty() {
            (0.0, 1.0)
        } else {
            let margin = ((high - low) * 0.1).max(1e-3);
            (low - margin, high + margin)
        };
        let mut chart = round_chart(area, caption, rounds, last, low..high)?;
        for (index, (seed, values)) in points.iter().enumerate() {
            let colour = SEED_COLOURS[index % MAX_SEEDS];
            chart
                .draw_series(LineSeries::new(
                    values.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(format!("seed {seed}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
        }
        if accuracy {
            // The greedy learning curve, where the run measured one
            // (`--greedy-every`): circles in the seed's colour.
            for (index, rounds) in curves.values().enumerate() {
                let colour = SEED_COLOURS[index % MAX_SEEDS];
                let greedy: Vec<(f64, f64)> = rounds
                    .iter()
                    .filter_map(|(round, metrics)| {
                        let value = clip(*metrics.get("greedy_accuracy_pct")?)?;
                        Some((*round as f64 + 1.0, value))
                    })
                    .collect();
                chart.draw_series(LineSeries::new(
                    greedy.iter().copied(),
                    colour.mix(0.6).stroke_width(1),
                ))?;
                chart.draw_series(
                    greedy
                        .iter()
                        .map(|point| Circle::new(*point, 4, colour.stroke_width(2))),
                )?;
            }
            for (name, value) in baselines {
                let Some(value) = clip(*value) else { continue };
                chart.draw_series(LineSeries::new(
                    [(0.5, value), (last + 0.5, value)],
                    BLACK.mix(0.35).stroke_width(1),
                ))?;
                chart.draw_series(std::iter::once(Text::new(
                    format!("{name} (eval)"),
                    (0.6, value),
                    (FONT, 11).into_font().color(&BLACK),
                )))?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font((FONT, 12))
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_curves_are_read_from_the_records_round_entries() {
        let text = r#"{"schema":1,"workload":"simic-learning","label":"t","environment":{"device":"cpu","torch":"x","cuda":"x","driver":"x","cpu":"x","git_rev":"x","tf32":false,"amp":"off","extra":{}},"params":{},"results":[
          {"impl":"rust","mode":"no-growth-eval","metrics":{"final_accuracy_pct":85.0},"error":null},
          {"impl":"rust","mode":"ppo-seed1-round-1","metrics":{"mean_episode_reward":2.0,"final_accuracy_pct":84.0},"error":null},
          {"impl":"rust","mode":"ppo-seed1-round-0","metrics":{"mean_episode_reward":1.0,"final_accuracy_pct":83.0},"error":null},
          {"impl":"rust","mode":"ppo-seed0-round-0","metrics":{"mean_episode_reward":0.5},"error":null},
          {"impl":"rust","mode":"ppo-seed0-greedy-eval","metrics":{"final_accuracy_pct":85.0},"error":null}
        ],"telemetry_names":[]}"#;
        let record = BaselineRecord::from_json(text).expect("a record");
        let curves = curves(&record);
        assert_eq!(curves.len(), 2);
        let seed1: Vec<usize> = curves[&1].iter().map(|(round, _)| *round).collect();
        assert_eq!(seed1, [0, 1], "sorted by round");
        let dir = tempfile::tempdir().expect("tempdir");
        let (png, svg) = draw(&record, &dir.path().join("r.json")).expect("drawn");
        assert!(std::fs::metadata(png).expect("png").len() > 1000);
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert!(
            svg.contains("seed 1") && svg.contains("no-growth (eval)"),
            "legend and baselines"
        );
        assert!(!svg.contains("<circle"), "no greedy curve, no circles");

        // A greedy learning curve is drawn as circles, one per point.
        let curved = text.replace(
            r#""final_accuracy_pct":84.0}"#,
            r#""final_accuracy_pct":84.0,"greedy_accuracy_pct":86.5}"#,
        );
        let record = BaselineRecord::from_json(&curved).expect("a record");
        let (_, svg) = draw(&record, &dir.path().join("g.json")).expect("drawn");
        let svg = std::fs::read_to_string(svg).expect("svg");
        assert_eq!(svg.matches("<circle").count(), 1, "one greedy point");
    }
}
