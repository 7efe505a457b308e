//! A language model's [`Dataset`]: `[N, T]` token windows with the next
//! token at every position as targets.

use tch::{Kind, Tensor};

use super::Dataset;
use super::checks::check_labels;
use crate::data::limits::{MAX_CLASSES, MAX_SAMPLES, at_most, invalid_field};
use crate::data::{DataError, Result, torch_error};

impl Dataset {
    /// A language model's data set: `inputs` `[N, T]` token windows and
    /// `targets` `[N, T]`, the token after each input position, both `i64`
    /// in `0..vocabulary`, on one device (`T` at least 1).
    ///
    /// # Errors
    /// [`DataError::InvalidField`] for the vocabulary size (`1..=`
    /// [`MAX_CLASSES`]), tensors that are not 2-D `Int64` of one shape, or a
    /// device mismatch; [`DataError::TooLarge`] above [`MAX_SAMPLES`]
    /// windows; [`DataError::LabelOutOfRange`] naming the first window
    /// holding a token outside the vocabulary (in the inputs or the
    /// targets).
    pub fn sequences(
        name: impl Into<String>,
        inputs: Tensor,
        targets: Tensor,
        vocabulary: usize,
    ) -> Result<Self> {
        const OP: &str = "Dataset::sequences";
        let name = name.into();
        if vocabulary == 0 || vocabulary > MAX_CLASSES {
            return Err(invalid_field(
                OP,
                "vocabulary",
                vocabulary,
                format!("1..={MAX_CLASSES}"),
            ));
        }
        if !inputs.defined() || !targets.defined() {
            return Err(invalid_field(
                OP,
                "inputs, targets",
                (inputs.defined(), targets.defined()),
                "defined tensors",
            ));
        }
        let kinds = (
            inputs.f_kind().map_err(torch_error(OP))?,
            targets.f_kind().map_err(torch_error(OP))?,
        );
        let shape = inputs.size();
        let ([n, t], (Kind::Int64, Kind::Int64)) = (shape.as_slice(), kinds) else {
            return Err(invalid_field(
                OP,
                "inputs",
                (shape, kinds.0),
                "a 2-D Int64 tensor [windows, context]",
            ));
        };
        let (n, t) = (*n, *t);
        if targets.size() != shape || t < 1 {
            return Err(invalid_field(
                OP,
                "targets.shape",
                (targets.size(), kinds.1),
                format!("Int64 of the inputs' shape {shape:?}, context at least 1"),
            ));
        }
        at_most(
            OP,
            "windows",
            usize::try_from(n).unwrap_or(usize::MAX),
            MAX_SAMPLES,
        )?;
        if inputs.device() != targets.device() {
            return Err(invalid_field(
                OP,
                "targets.device",
                targets.device(),
                format!("the inputs' device {:?}", inputs.device()),
            ));
        }
        for tokens in [&inputs, &targets] {
            let flat = tokens.f_reshape([-1]).map_err(torch_error(OP))?;
            match check_labels(&name, &flat, vocabulary) {
                Ok(()) => {}
                Err(DataError::LabelOutOfRange { index, label, .. }) => {
                    // `t >= 1`: the window of the flat token index.
                    let window = index
                        .checked_div(usize::try_from(t).unwrap_or(1))
                        .unwrap_or(0);
                    return Err(DataError::LabelOutOfRange {
                        dataset: name,
                        index: window,
                        label,
                        n_classes: vocabulary,
                    });
                }
                Err(other) => return Err(other),
            }
        }
        Ok(Self {
            name,
            images: inputs,
            labels: targets,
            n_classes: vocabulary,
        })
    }

    /// Whether this is a language model's data set ([`Dataset::sequences`]):
    /// a target per position, not per sample.
    pub fn is_sequences(&self) -> bool {
        self.labels.dim() == 2
    }
}
