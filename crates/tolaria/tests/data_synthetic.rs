//! Seeded synthetic tasks: shapes, balance, bitwise reproducibility, and that
//! the classes are actually learnable.

use tch::{Kind, Tensor};
use tolaria::data::synthetic::{self, BlobTaskOptions, ImageTaskOptions};
use tolaria::data::{DataError, Dataset};

/// Accuracy of classifying `test` by the nearest class mean of `train`.
fn nearest_mean_accuracy(train: &Dataset, test: &Dataset) -> f64 {
    let flat_train = train.images().flatten(1, -1);
    let means: Vec<Tensor> = (0..train.n_classes() as i64)
        .map(|class| {
            let mask = train.labels().eq(class);
            flat_train
                .index_select(0, &mask.nonzero().squeeze_dim(1))
                .mean_dim(0, false, Kind::Float)
        })
        .collect();
    let means = Tensor::stack(&means, 0); // [classes, features]
    let flat_test = test.images().flatten(1, -1); // [n, features]
    let distances = flat_test
        .unsqueeze(1)
        .f_sub(&means.unsqueeze(0))
        .unwrap()
        .square()
        .sum_dim_intlist(2, false, Kind::Float);
    let predicted = distances.argmin(1, false);
    predicted
        .eq_tensor(test.labels())
        .to_kind(Kind::Float)
        .mean(Kind::Float)
        .double_value(&[])
}

fn bits(tensor: &Tensor) -> Vec<u32> {
    Vec::<f32>::try_from(&tensor.flatten(0, -1))
        .unwrap()
        .iter()
        .map(|value| value.to_bits())
        .collect()
}

#[test]
fn small_blob_task_is_16_by_16_with_4_balanced_classes() {
    let task = synthetic::blob_task(&BlobTaskOptions::small(0)).unwrap();
    assert_eq!(task.name(), "synthetic-blobs");
    assert_eq!(task.images().size(), vec![16, 16]);
    assert_eq!(task.images().kind(), Kind::Float);
    assert_eq!(task.n_classes(), 4);
    assert_eq!(task.class_counts().unwrap(), vec![4, 4, 4, 4]);
    // Four batches of four, as the workload runs it.
    assert_eq!(task.batches(4, None, true).unwrap().len(), 4);
}

#[test]
fn small_blob_task_is_bitwise_reproducible_and_seed_dependent() {
    let a = synthetic::blob_task(&BlobTaskOptions::small(42)).unwrap();
    let b = synthetic::blob_task(&BlobTaskOptions::small(42)).unwrap();
    assert_eq!(bits(a.images()), bits(b.images()));
    assert!(a.labels().equal(b.labels()));
    let c = synthetic::blob_task(&BlobTaskOptions::small(43)).unwrap();
    assert_ne!(bits(a.images()), bits(c.images()));
}

#[test]
fn blob_classes_are_separable_by_their_means() {
    // Class means of a larger draw with the small settings, checked on a
    // held-out half: the blobs are well apart relative to the noise.
    let mut accuracies = Vec::new();
    for seed in 0..10 {
        let options = BlobTaskOptions {
            n_samples: 400,
            ..BlobTaskOptions::small(seed)
        };
        let task = synthetic::blob_task(&options).unwrap();
        let (train, test) = task
            .split(tolaria::data::SplitSize::Fraction(0.5), Some(seed))
            .unwrap();
        accuracies.push(nearest_mean_accuracy(&train, &test));
    }
    let mean = accuracies.iter().sum::<f64>() / accuracies.len() as f64;
    assert!(mean > 0.9, "nearest-mean accuracy {accuracies:?}");
    // Noise exists: the task is not trivially a lookup of the centres.
    let task = synthetic::blob_task(&BlobTaskOptions::small(0)).unwrap();
    let first_class = task
        .images()
        .index_select(0, &Tensor::from_slice(&[0i64, 4]));
    assert!(!first_class.get(0).equal(&first_class.get(1)));
}

#[test]
fn image_task_shapes() {
    let fashion_like = synthetic::image_task(&ImageTaskOptions::fashion_like(30, 1)).unwrap();
    assert_eq!(fashion_like.images().size(), vec![30, 1, 28, 28]);
    assert_eq!(fashion_like.class_counts().unwrap(), vec![3; 10]);
    let cifar_like = synthetic::image_task(&ImageTaskOptions::cifar_like(20, 1)).unwrap();
    assert_eq!(cifar_like.images().size(), vec![20, 3, 32, 32]);
    assert_eq!(cifar_like.name(), "synthetic-images");
}

#[test]
fn image_task_is_bitwise_reproducible_and_seed_dependent() {
    let options = ImageTaskOptions::cifar_like(16, 5);
    let a = synthetic::image_task(&options).unwrap();
    let b = synthetic::image_task(&options).unwrap();
    assert_eq!(bits(a.images()), bits(b.images()));
    let c = synthetic::image_task(&ImageTaskOptions { seed: 6, ..options }).unwrap();
    assert_ne!(bits(a.images()), bits(c.images()));
}

#[test]
fn image_task_classes_differ_and_are_learnable() {
    let task = synthetic::image_task(&ImageTaskOptions::fashion_like(400, 3)).unwrap();
    let (train, test) = task
        .split(tolaria::data::SplitSize::Fraction(0.5), Some(3))
        .unwrap();
    let accuracy = nearest_mean_accuracy(&train, &test);
    assert!(accuracy > 0.9, "nearest-mean accuracy {accuracy}");
    // The template is piecewise constant over 7x7 cells: two pixels of one
    // cell share their class mean, pixels of different cells mostly do not.
    let class_0 = train
        .images()
        .index_select(0, &train.labels().eq(0).nonzero().squeeze_dim(1))
        .mean_dim(0, false, Kind::Float);
    let same_cell = (class_0.double_value(&[0, 0, 0]) - class_0.double_value(&[0, 6, 6])).abs();
    assert!(same_cell < 0.5, "pixels of one cell differ by {same_cell}");
}

#[test]
fn synthetic_tasks_reject_empty_shapes() {
    let err = synthetic::image_task(&ImageTaskOptions {
        channels: 0,
        ..ImageTaskOptions::fashion_like(4, 0)
    })
    .unwrap_err();
    assert!(
        matches!(err, DataError::InvalidField { ref field, .. } if field == "channels"),
        "{err:?}"
    );
    let err = synthetic::blob_task(&BlobTaskOptions {
        n_classes: 0,
        ..BlobTaskOptions::small(0)
    })
    .unwrap_err();
    assert!(
        matches!(err, DataError::InvalidField { ref field, .. } if field == "n_classes"),
        "{err:?}"
    );
    let err = synthetic::blob_task(&BlobTaskOptions {
        noise_std: f64::NAN,
        ..BlobTaskOptions::small(0)
    })
    .unwrap_err();
    assert!(
        matches!(err, DataError::InvalidField { ref field, .. } if field == "noise_std"),
        "{err:?}"
    );
    // Zero samples is a valid (empty) data set.
    let empty = synthetic::blob_task(&BlobTaskOptions {
        n_samples: 0,
        ..BlobTaskOptions::small(0)
    })
    .unwrap();
    assert!(empty.is_empty());
}
