//! One slot's swimlane of the run picture ([`draw_lane`]): the stage colours
//! per epoch, the alpha line and the blueprint's name where each seed
//! starts; and the epoch axis's labels, shared with the charts above.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{AXIS_HEIGHT, DrawResult, FONT, LABEL_AREA, last_epoch, stage_colour};
use crate::train::epoch_log::EpochRecord;

/// How many epoch labels an axis asks for (plotters picks round values).
pub(super) fn x_label_count(epochs: usize) -> usize {
    epochs.clamp(2, 20)
}

/// Whole epochs only: plotters may place a tick between two epochs.
pub(super) fn epoch_label(value: &f64) -> String {
    if (value - value.round()).abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        String::new()
    }
}

/// One slot's lane: stage colours per epoch, the alpha line, and the
/// blueprint's name where each seed starts.
pub(super) fn draw_lane<DB>(
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
