//! The pooled gradient buffers of one parameter layout and the checks of a
//! step's gradient lists against it.

use tch::{Device, Kind, Tensor};

use super::agg_error;
use crate::error::{Result, TorchResultExt};

/// One parameter's place in the rows: its shape, the strides of the
/// gradient the layout was made for, and the strides of its views when
/// they follow that gradient's channels-last order (`None`: plain views).
#[derive(Debug)]
pub(super) struct Layout {
    shape: Vec<i64>,
    out_strides: Vec<i64>,
    channels_last: Option<Vec<i64>>,
}

impl Layout {
    /// The layout of gradient `tensor`: views with its strides when it is
    /// dense channels-last, contiguous views otherwise.
    pub(super) fn of(tensor: &Tensor) -> Result<Layout> {
        let shape = tensor.size();
        let out_strides = tensor.stride();
        let channels_last = shape.len() == 4
            && !tensor.is_contiguous()
            && torch_ext::memory::is_channels_last(tensor)
                .map_err(|error| agg_error("out", error.to_string()))?;
        Ok(Layout {
            channels_last: channels_last.then(|| out_strides.clone()),
            shape,
            out_strides,
        })
    }
}

/// The pooled buffers of one layout.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) shapes: Vec<Vec<i64>>,
    /// The strides of the gradients the pool was made for (another layout
    /// of the same shapes makes a new pool).
    pub(super) out_strides: Vec<Vec<i64>>,
    pub(super) kind: Kind,
    pub(super) numel: i64,
    /// `[max_seeds + 1, numel]`; row 0 the teacher, row `1 + i` seed `i`.
    pub(super) rows: Tensor,
    /// Per-parameter views of every row, row after row.
    pub(super) row_views: Vec<Tensor>,
    /// `[1, numel]`: the aggregate.
    pub(super) aggregate: Tensor,
    /// Per-parameter views of the aggregate.
    pub(super) aggregate_views: Vec<Tensor>,
    /// `[max_seeds + 1]`: each row's weight in the aggregate (the fused
    /// PCGrad kernels' output).
    pub(super) weights: Tensor,
}

impl Pool {
    /// Allocates the rows, the aggregate and their per-parameter views.
    pub(super) fn new(
        layouts: Vec<Layout>,
        kind: Kind,
        device: Device,
        rows_max: i64,
    ) -> Result<Self> {
        let mut numels = Vec::with_capacity(layouts.len());
        let mut numel = 0i64;
        for shape in layouts.iter().map(|layout| &layout.shape) {
            let count = shape
                .iter()
                .try_fold(1i64, |acc, &dim| acc.checked_mul(dim))
                .ok_or_else(|| agg_error("out", format!("shape {shape:?} overflows")))?;
            numel = numel
                .checked_add(count)
                .ok_or_else(|| agg_error("out", "total numel overflows i64".into()))?;
            numels.push(count);
        }
        rows_max
            .checked_mul(numel)
            .ok_or_else(|| agg_error("out", format!("{rows_max} rows of {numel} overflow")))?;
        let rows = Tensor::f_zeros([rows_max, numel], (kind, device)).op("zeros rows")?;
        let aggregate = Tensor::f_zeros([1, numel], (kind, device)).op("zeros aggregate")?;
        let weights = Tensor::f_zeros([rows_max], (kind, device)).op("zeros weights")?;
        let views_of = |flat: &Tensor| -> Result<Vec<Tensor>> {
            let mut views = Vec::with_capacity(layouts.len());
            let mut offset = 0i64;
            for (layout, &count) in layouts.iter().zip(&numels) {
                let view = flat.f_narrow(0, offset, count).op("narrow")?;
                let view = match &layout.channels_last {
                    Some(strides) => view
                        .f_as_strided(layout.shape.as_slice(), strides.as_slice(), None::<i64>)
                        .op("as_strided")?,
                    None => view.f_view_(layout.shape.as_slice()).op("view")?,
                };
                views.push(view);
                offset = offset.saturating_add(count);
            }
            Ok(views)
        };
        let mut row_views = Vec::new();
        for row in 0..rows_max {
            row_views.extend(views_of(&rows.f_select(0, row).op("select row")?)?);
        }
        let aggregate_views = views_of(&aggregate.f_select(0, 0).op("select aggregate")?)?;
        let (shapes, out_strides) = layouts
            .into_iter()
            .map(|layout| (layout.shape, layout.out_strides))
            .unzip();
        Ok(Self {
            shapes,
            out_strides,
            kind,
            numel,
            rows,
            row_views,
            aggregate,
            aggregate_views,
            weights,
        })
    }
}

/// Checks one gradient list against the layout: count, defined (unless
/// `allow_undefined`: a gradient a source sends no part of), shape, dtype,
/// device.
pub(super) fn check_list(
    pool: &Pool,
    device: Device,
    field: &'static str,
    index: usize,
    tensors: &[Tensor],
    allow_undefined: bool,
) -> Result<()> {
    if tensors.len() != pool.shapes.len() {
        return Err(agg_error(
            field,
            format!(
                "list {index} has {} gradients, the layout has {}",
                tensors.len(),
                pool.shapes.len()
            ),
        ));
    }
    for (position, (tensor, shape)) in tensors.iter().zip(&pool.shapes).enumerate() {
        let place = || format!("list {index}, gradient {position}");
        if !tensor.defined() {
            if allow_undefined {
                continue;
            }
            return Err(agg_error(field, format!("{} is undefined", place())));
        }
        let size = tensor.size();
        if size != *shape {
            return Err(agg_error(
                field,
                format!("{}: shape {size:?}, the layout has {shape:?}", place()),
            ));
        }
        let kind = tensor.f_kind().op("kind")?;
        if kind != pool.kind {
            return Err(agg_error(
                field,
                format!(
                    "{}: dtype {kind:?}, the layout has {:?}",
                    place(),
                    pool.kind
                ),
            ));
        }
        if tensor.device() != device {
            return Err(agg_error(
                field,
                format!(
                    "{}: device {:?}, the aggregator is on {device:?}",
                    place(),
                    tensor.device()
                ),
            ));
        }
    }
    Ok(())
}
