//! `Dataset`: shuffling, splitting, batching, selection, class counts, device
//! moves, and the seeded permutation behind them.

use std::collections::BTreeSet;

use leyline::rng::SplitMix64;
use proptest::prelude::*;
use tch::{Device, Kind, Tensor};
use tolaria::data::shuffle::{epoch_seed, permutation};
use tolaria::data::{DataError, Dataset, SplitSize};

/// `n` samples of shape `[2]`: sample `i` is `[i, -i]`, label `i % 3`, so a
/// batch tells which samples it holds.
fn numbered(n: usize) -> Dataset {
    let values: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
    let images = Tensor::from_slice(&values).reshape([n as i64, 2]);
    let labels = Tensor::from_slice(&(0..n as i64).map(|i| i % 3).collect::<Vec<_>>());
    Dataset::new("numbered", images, labels, 3).unwrap()
}

/// The sample ids of a batch, after checking labels and the second feature
/// still belong to the same sample.
fn ids(images: &Tensor, labels: &Tensor) -> Vec<i64> {
    let first: Vec<f32> = Vec::try_from(&images.select(1, 0)).unwrap();
    let second: Vec<f32> = Vec::try_from(&images.select(1, 1)).unwrap();
    let labels: Vec<i64> = Vec::try_from(labels).unwrap();
    first
        .iter()
        .zip(&second)
        .zip(&labels)
        .map(|((&id, &negative), &label)| {
            assert_eq!(negative, -id, "features of one sample were split");
            assert_eq!(label, id as i64 % 3, "label does not belong to its sample");
            id as i64
        })
        .collect()
}

fn dataset_ids(dataset: &Dataset) -> Vec<i64> {
    ids(dataset.images(), dataset.labels())
}

fn epoch(
    dataset: &Dataset,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
) -> Vec<Vec<i64>> {
    dataset
        .batches(batch_size, seed, drop_last)
        .unwrap()
        .map(|batch| {
            let (images, labels) = batch.unwrap();
            ids(&images, &labels)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_epoch_visits_every_sample_exactly_once(
        n in 0usize..60, batch_size in 1usize..12, seed in any::<u64>(), shuffle in any::<bool>()
    ) {
        let dataset = numbered(n);
        let batches = epoch(&dataset, batch_size, shuffle.then_some(seed), false);
        prop_assert_eq!(batches.len(), n.div_ceil(batch_size));
        for (batch_idx, batch) in batches.iter().enumerate() {
            let expected = if batch_idx + 1 == batches.len() { n - batch_idx * batch_size } else { batch_size };
            prop_assert_eq!(batch.len(), expected);
        }
        let mut seen: Vec<i64> = batches.concat();
        if !shuffle {
            prop_assert_eq!(&seen, &(0..n as i64).collect::<Vec<_>>());
        }
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..n as i64).collect::<Vec<_>>());
    }

    #[test]
    fn drop_last_skips_only_the_partial_batch(
        n in 0usize..60, batch_size in 1usize..12, seed in any::<u64>()
    ) {
        let dataset = numbered(n);
        let batches = epoch(&dataset, batch_size, Some(seed), true);
        prop_assert_eq!(batches.len(), n / batch_size);
        prop_assert!(batches.iter().all(|batch| batch.len() == batch_size));
        // The kept batches are exactly the full batches of the same order.
        let full = epoch(&dataset, batch_size, Some(seed), false);
        prop_assert_eq!(&batches[..], &full[..n / batch_size]);
        let seen: BTreeSet<i64> = batches.concat().into_iter().collect();
        prop_assert_eq!(seen.len(), (n / batch_size) * batch_size);
    }

    #[test]
    fn permutation_is_a_permutation(n in 0usize..500, seed in any::<u64>()) {
        let mut order = permutation(n, seed).unwrap();
        prop_assert_eq!(&order, &permutation(n, seed).unwrap());
        order.sort_unstable();
        prop_assert_eq!(order, (0..n as i64).collect::<Vec<_>>());
    }

    #[test]
    fn split_parts_are_disjoint_and_cover_everything(
        n in 0usize..80, fraction in 0.0f64..=1.0, seed in proptest::option::of(any::<u64>())
    ) {
        let dataset = numbered(n);
        let (first, second) = dataset.split(SplitSize::Fraction(fraction), seed).unwrap();
        prop_assert_eq!(first.len(), (fraction * n as f64).round() as usize);
        prop_assert_eq!(first.len() + second.len(), n);
        let mut all = dataset_ids(&first);
        all.extend(dataset_ids(&second));
        if seed.is_none() {
            prop_assert_eq!(&all, &(0..n as i64).collect::<Vec<_>>());
        }
        all.sort_unstable();
        prop_assert_eq!(all, (0..n as i64).collect::<Vec<_>>());
    }
}

#[test]
fn shuffled_batches_depend_only_on_the_seed() {
    let dataset = numbered(100);
    let first = epoch(&dataset, 16, Some(7), false);
    assert_eq!(first, epoch(&dataset, 16, Some(7), false));
    assert_ne!(first, epoch(&dataset, 16, Some(8), false));
    assert_ne!(
        first.concat(),
        (0..100).collect::<Vec<i64>>(),
        "a shuffled epoch came out in stored order"
    );
    // Consecutive epochs of one run get different orders.
    let epoch_0 = epoch(&dataset, 16, Some(epoch_seed(42, 0)), false);
    let epoch_1 = epoch(&dataset, 16, Some(epoch_seed(42, 1)), false);
    assert_ne!(epoch_0, epoch_1);
    // The order is the documented permutation.
    assert_eq!(first.concat(), permutation(100, 7).unwrap());
}

#[test]
fn batches_report_their_count() {
    let dataset = numbered(10);
    assert_eq!(dataset.batches(4, None, false).unwrap().len(), 3);
    assert_eq!(dataset.batches(4, None, true).unwrap().len(), 2);
    assert_eq!(dataset.batches(20, None, true).unwrap().len(), 0);
    let mut batches = dataset.batches(3, Some(1), false).unwrap();
    batches.next();
    assert_eq!(batches.len(), 3);
    let err = dataset.batches(0, None, false).unwrap_err();
    assert!(
        matches!(err, DataError::InvalidField { ref field, .. } if field == "batch_size"),
        "{err:?}"
    );
}

#[test]
fn unshuffled_batches_are_views_of_the_data() {
    let dataset = numbered(10);
    let (images, _) = dataset
        .batches(4, None, false)
        .unwrap()
        .nth(1)
        .unwrap()
        .unwrap();
    // Writing through the batch shows in the data set: no copy was made.
    let mut view = images;
    let _ = view.fill_(99.0);
    assert_eq!(dataset.images().double_value(&[5, 0]), 99.0);
    assert_eq!(dataset.images().double_value(&[3, 0]), 3.0);
}

#[test]
fn shuffled_is_deterministic_and_a_permutation() {
    let dataset = numbered(50);
    let shuffled = dataset.shuffled(3).unwrap();
    assert_eq!(dataset_ids(&shuffled), permutation(50, 3).unwrap());
    assert!(
        shuffled
            .images()
            .equal(dataset.shuffled(3).unwrap().images())
    );
    assert!(
        !shuffled
            .images()
            .equal(dataset.shuffled(4).unwrap().images())
    );
    assert_eq!(
        shuffled.class_counts().unwrap(),
        dataset.class_counts().unwrap()
    );
}

#[test]
fn split_by_count_with_and_without_seed() {
    let dataset = numbered(10);
    let (head, tail) = dataset.split(SplitSize::Count(3), None).unwrap();
    assert_eq!(dataset_ids(&head), vec![0, 1, 2]);
    assert_eq!(dataset_ids(&tail), (3..10).collect::<Vec<_>>());
    assert_eq!(head.name(), "numbered/first");
    assert_eq!(tail.name(), "numbered/second");

    let (a, b) = dataset.split(SplitSize::Count(3), Some(11)).unwrap();
    let order = permutation(10, 11).unwrap();
    assert_eq!(dataset_ids(&a), order[..3]);
    assert_eq!(dataset_ids(&b), order[3..]);
    let (again, _) = dataset.split(SplitSize::Count(3), Some(11)).unwrap();
    assert_eq!(dataset_ids(&again), dataset_ids(&a));
}

#[test]
fn split_rejects_bad_sizes() {
    let dataset = numbered(10);
    for size in [
        SplitSize::Count(11),
        SplitSize::Fraction(1.5),
        SplitSize::Fraction(-0.1),
        SplitSize::Fraction(f64::NAN),
    ] {
        let err = dataset.split(size, Some(1)).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::InvalidField {
                    op: "Dataset::split",
                    ref field,
                    ..
                } if field == "size"
            ),
            "{size:?}: {err:?}"
        );
    }
}

#[test]
fn select_and_slice() {
    let dataset = numbered(10);
    assert_eq!(
        dataset_ids(&dataset.select(&[9, 0, 9]).unwrap()),
        vec![9, 0, 9]
    );
    assert_eq!(dataset_ids(&dataset.slice(4, 3).unwrap()), vec![4, 5, 6]);
    assert_eq!(dataset.slice(10, 0).unwrap().len(), 0);
    assert!(matches!(
        dataset.select(&[10]),
        Err(DataError::InvalidArgument { .. })
    ));
    assert!(matches!(
        dataset.select(&[-1]),
        Err(DataError::InvalidArgument { .. })
    ));
    assert!(matches!(
        dataset.slice(8, 3),
        Err(DataError::InvalidArgument { .. })
    ));
    assert!(matches!(
        dataset.slice(usize::MAX, 2),
        Err(DataError::InvalidArgument { .. })
    ));
}

#[test]
fn class_counts_count_each_label() {
    // Labels i % 3 over 10 samples: 0,3,6,9 / 1,4,7 / 2,5,8.
    assert_eq!(numbered(10).class_counts().unwrap(), vec![4, 3, 3]);
    assert_eq!(numbered(0).class_counts().unwrap(), vec![0, 0, 0]);
    let images = Tensor::zeros([4, 1], (Kind::Float, Device::Cpu));
    let labels = Tensor::from_slice(&[4i64, 4, 0, 4]);
    assert_eq!(
        Dataset::new("sparse", images, labels, 6)
            .unwrap()
            .class_counts()
            .unwrap(),
        vec![1, 0, 0, 0, 3, 0]
    );
}

#[test]
fn new_checks_its_inputs() {
    let images = || Tensor::zeros([3, 2], (Kind::Float, Device::Cpu));
    let is_field = |result: &Result<Dataset, DataError>, name: &str| matches!(result, Err(DataError::InvalidField { op: "Dataset::new", field, .. }) if field == name);
    let result = Dataset::new("x", images(), Tensor::from_slice(&[0i64, 1]), 2);
    assert!(
        matches!(
            result,
            Err(DataError::LengthMismatch {
                samples: 3,
                labels: 2,
                ..
            })
        ),
        "count mismatch: {result:?}"
    );
    for (labels, index, label) in [([0i64, 1, 2], 2, 2), ([0i64, -1, 1], 1, -1)] {
        let result = Dataset::new("x", images(), Tensor::from_slice(&labels), 2);
        assert!(
            matches!(
                result,
                Err(DataError::LabelOutOfRange { index: i, label: l, n_classes: 2, .. })
                    if i == index && l == label
            ),
            "{labels:?}: {result:?}"
        );
    }
    let result = Dataset::new("x", images(), Tensor::from_slice(&[0f32, 1.0, 1.0]), 2);
    assert!(is_field(&result, "labels"), "float labels: {result:?}");
    let result = Dataset::new(
        "x",
        images(),
        Tensor::zeros([3, 1], (Kind::Int64, Device::Cpu)),
        2,
    );
    assert!(is_field(&result, "labels"), "2-D labels: {result:?}");
    let result = Dataset::new(
        "x",
        images(),
        Tensor::zeros([3], (Kind::Int64, Device::Cpu)),
        0,
    );
    assert!(is_field(&result, "n_classes"), "no classes: {result:?}");
}

#[test]
fn device_moves_keep_the_data() {
    let dataset = numbered(6);
    let moved = dataset.to_device(Device::Cpu).unwrap();
    assert_eq!(dataset_ids(&moved), (0..6).collect::<Vec<_>>());
    let pinned = dataset.pin_memory().unwrap();
    assert!(pinned.images().equal(dataset.images()));
    assert_eq!(pinned.name(), dataset.name());
    if torch_ext::cuda::is_available() {
        assert!(pinned.is_pinned());
        let on_gpu = pinned.to_device(Device::Cuda(0)).unwrap();
        let ids_on_gpu = epoch(&on_gpu, 4, Some(5), false).concat();
        assert_eq!(
            ids_on_gpu,
            permutation(6, 5).unwrap(),
            "the same seed gives the same order on the GPU"
        );
    } else {
        println!("no CUDA: pin_memory returns the data set unchanged, GPU checks skipped");
        assert!(!pinned.is_pinned());
    }
}

#[test]
fn bounded_draws_cover_the_range_evenly() {
    let mut rng = SplitMix64::new(9);
    let mut counts = [0usize; 7];
    for _ in 0..70_000 {
        counts[rng.below(7) as usize] += 1;
    }
    // Each bucket expects 10,000 with standard deviation ~93.
    assert!(
        counts.iter().all(|&count| (9_500..10_500).contains(&count)),
        "{counts:?}"
    );
    assert_eq!(rng.below(0), 0);
    assert_eq!(rng.below(1), 0);
}

#[test]
fn normal_draws_have_unit_variance() {
    let mut rng = SplitMix64::new(1);
    let draws: Vec<f64> = (0..100_000).map(|_| rng.normal()).collect();
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    let variance = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64;
    assert!(mean.abs() < 0.02, "mean {mean}");
    assert!((variance - 1.0).abs() < 0.02, "variance {variance}");
    assert!(draws.iter().all(|x| x.abs() <= 2.0 * 3f64.sqrt()));
}
