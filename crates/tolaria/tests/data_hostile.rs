//! Hostile input at every entry point of the data layer: non-finite and
//! absurd numbers, sizes near the integer limits, malformed IDX and CIFAR-10
//! bytes. Every case must end in a typed error naming the field (or the
//! format problem), never a panic, an abort or a silently corrupted data set.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use leyline::testing::{extreme_f32, extreme_f64, extreme_i64, extreme_u64, extreme_usize};
use proptest::prelude::*;
use tch::Tensor;
use tolaria::data::cifar10::{self, RECORD_SIZE};
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};
use tolaria::data::idx::{self, IMAGES_MAGIC, LABELS_MAGIC};
use tolaria::data::limits::{
    MAX_CLASSES, MAX_IDX_BYTES, MAX_SAMPLES, MAX_SYNTHETIC_VALUES, TRAILING_PROBE_BYTES,
};
use tolaria::data::shuffle::permutation;
use tolaria::data::synthetic::{self, BlobTaskOptions, ImageTaskOptions};
use tolaria::data::{DataError, Dataset, FormatError, Normalisation, SplitSize};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn idx_bytes(magic: u32, dims: &[u32], values: &[u8]) -> Vec<u8> {
    let mut bytes = magic.to_be_bytes().to_vec();
    for dim in dims {
        bytes.extend_from_slice(&dim.to_be_bytes());
    }
    bytes.extend_from_slice(values);
    bytes
}

/// A Fashion-MNIST folder with 2 training and 1 test sample.
fn fashion_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: Vec<u8>| {
        std::fs::write(dir.path().join(name), gzip(&bytes)).unwrap();
    };
    write(
        fashion_mnist::TRAIN_IMAGES_FILE,
        idx_bytes(IMAGES_MAGIC, &[2, 28, 28], &[7; 2 * 784]),
    );
    write(
        fashion_mnist::TRAIN_LABELS_FILE,
        idx_bytes(LABELS_MAGIC, &[2], &[1, 2]),
    );
    write(
        fashion_mnist::TEST_IMAGES_FILE,
        idx_bytes(IMAGES_MAGIC, &[1, 28, 28], &[7; 784]),
    );
    write(
        fashion_mnist::TEST_LABELS_FILE,
        idx_bytes(LABELS_MAGIC, &[1], &[3]),
    );
    dir
}

fn field_of(err: &DataError) -> Option<&str> {
    match err {
        DataError::InvalidField { field, .. } => Some(field),
        _ => None,
    }
}

// ---------------------------------------------------------------- normalisation

#[test]
fn normalisation_refuses_zero_negative_and_non_finite_std_and_non_finite_mean() {
    let cases: [(Vec<f32>, Vec<f32>, &str); 9] = [
        (vec![0.5], vec![0.0], "std[0]"),
        (vec![0.5], vec![-0.3], "std[0]"),
        (vec![0.5], vec![f32::NAN], "std[0]"),
        (vec![0.5], vec![f32::INFINITY], "std[0]"),
        (vec![0.1, 0.2], vec![1.0, -0.0], "std[1]"),
        (vec![f32::NAN], vec![1.0], "mean[0]"),
        (vec![f32::NEG_INFINITY], vec![1.0], "mean[0]"),
        // Finite but (0 - 3e38) / 1e-30 overflows f32.
        (vec![3e38], vec![1e-30], "std[0]"),
        (vec![0.5, 0.5], vec![1.0], "std.len()"),
    ];
    for (mean, std, field) in cases {
        let err = Normalisation::new(mean.clone(), std.clone()).unwrap_err();
        assert_eq!(field_of(&err), Some(field), "{mean:?} / {std:?}: {err}");
        assert!(err.to_string().contains(field), "{err}");
    }
    let err = Normalisation::new(Vec::new(), Vec::new()).unwrap_err();
    assert_eq!(field_of(&err), Some("mean.len()"), "{err}");
    let err = Normalisation::identity(0).unwrap_err();
    assert_eq!(field_of(&err), Some("channels"), "{err}");
    let err = Normalisation::identity(usize::MAX).unwrap_err();
    assert_eq!(field_of(&err), Some("channels"), "{err}");
    let ok = Normalisation::new(vec![0.2860], vec![0.3530]).unwrap();
    assert_eq!(ok, Normalisation::fashion_mnist());
}

#[test]
fn a_loaded_data_set_never_holds_non_finite_pixels() {
    // The only way to a normalisation is through the checked constructor, so
    // every loaded pixel is finite: check the extreme bytes 0 and 255.
    let dir = tempfile::tempdir().unwrap();
    let mut pixels = vec![0u8; 784];
    pixels[1] = 255;
    let write = |name: &str, bytes: Vec<u8>| {
        std::fs::write(dir.path().join(name), gzip(&bytes)).unwrap();
    };
    write(
        fashion_mnist::TRAIN_IMAGES_FILE,
        idx_bytes(IMAGES_MAGIC, &[1, 28, 28], &pixels),
    );
    write(
        fashion_mnist::TRAIN_LABELS_FILE,
        idx_bytes(LABELS_MAGIC, &[1], &[0]),
    );
    write(
        fashion_mnist::TEST_IMAGES_FILE,
        idx_bytes(IMAGES_MAGIC, &[1, 28, 28], &pixels),
    );
    write(
        fashion_mnist::TEST_LABELS_FILE,
        idx_bytes(LABELS_MAGIC, &[1], &[9]),
    );
    let normalisation = Normalisation::new(vec![-1e31], vec![1e-8]).unwrap_err();
    assert_eq!(field_of(&normalisation), Some("std[0]"));
    let options = FashionMnistOptions {
        normalisation: Normalisation::new(vec![0.9], vec![1e-3]).unwrap(),
        ..FashionMnistOptions::from_dir(dir.path())
    };
    let (train, _) = fashion_mnist::load(options).unwrap();
    let finite = train.images().isfinite().all().int64_value(&[]);
    assert_eq!(finite, 1);
}

// ---------------------------------------------------------------- IDX

#[test]
fn an_idx_header_promising_more_than_the_bound_fails_before_allocating() {
    // 20 bytes whose header promises (2^32 - 1)^3 bytes.
    let header = idx_bytes(IMAGES_MAGIC, &[u32::MAX, u32::MAX, u32::MAX], &[]);
    let err = idx::parse_idx_gz(gzip(&header).as_slice()).unwrap_err();
    assert!(
        matches!(err, FormatError::TooLarge { bytes, limit, .. }
            if bytes == u128::from(u32::MAX).pow(3) && limit == MAX_IDX_BYTES),
        "{err:?}"
    );
    // Just above the bound, and through the loader (the file is named).
    let dir = fashion_fixture();
    let path = dir.path().join(fashion_mnist::TRAIN_IMAGES_FILE);
    let just_above = (MAX_IDX_BYTES / 784 + 1) as u32;
    std::fs::write(
        &path,
        gzip(&idx_bytes(IMAGES_MAGIC, &[just_above, 28, 28], &[])),
    )
    .unwrap();
    let err = fashion_mnist::load(FashionMnistOptions::from_dir(dir.path())).unwrap_err();
    assert!(
        matches!(err, DataError::Format { ref path, source: FormatError::TooLarge { .. }, .. }
            if path.ends_with(fashion_mnist::TRAIN_IMAGES_FILE)),
        "{err:?}"
    );
}

#[test]
fn an_idx_dimension_of_zero_is_refused() {
    let err =
        idx::parse_idx_reader(idx_bytes(IMAGES_MAGIC, &[2, 0, 28], &[]).as_slice()).unwrap_err();
    assert!(
        matches!(err, FormatError::EmptyDimension { index: 1 }),
        "{err:?}"
    );
}

#[test]
fn idx_magic_type_and_rank_are_checked() {
    let parse = |bytes: Vec<u8>| idx::parse_idx_reader(bytes.as_slice()).unwrap_err();
    assert!(matches!(
        parse(idx_bytes(0x0100_0801, &[1], &[0])),
        FormatError::NotIdx { found: 0x0100_0801 }
    ));
    assert!(matches!(
        parse(idx_bytes(0x0000_0D01, &[1], &[0, 0, 0, 0])),
        FormatError::UnsupportedType { type_code: 0x0D }
    ));
    assert!(matches!(
        parse(idx_bytes(0x0000_0800, &[], &[])),
        FormatError::BadRank { rank: 0, .. }
    ));
    assert!(matches!(
        parse(idx_bytes(0x0000_0805, &[1, 1, 1, 1, 1], &[0])),
        FormatError::BadRank { rank: 5, .. }
    ));
    assert!(matches!(
        parse(vec![0, 0]),
        FormatError::Truncated {
            expected_bytes: 4,
            found_bytes: 2
        }
    ));
    let array =
        idx::parse_idx_reader(idx_bytes(0x0000_0802, &[2, 3], &[1, 2, 3, 4, 5, 6]).as_slice())
            .unwrap();
    assert_eq!(array.dims(), &[2, 3]);
    assert_eq!(array.values(), &[1, 2, 3, 4, 5, 6]);
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.read += read as u64;
        Ok(read)
    }
}

#[test]
fn a_gzip_bomb_is_inflated_only_as_far_as_the_header_promises() {
    // Valid labels, then 64 MiB of zeros in further gzip members.
    let mut bomb = gzip(&idx_bytes(LABELS_MAGIC, &[2], &[1, 2]));
    let member = gzip(&vec![0u8; 1 << 20]);
    for _ in 0..64 {
        bomb.extend_from_slice(&member);
    }
    let mut counting = Counting {
        inner: MultiGzDecoder::new(bomb.as_slice()),
        read: 0,
    };
    let err = idx::parse_idx_reader(&mut counting).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::TrailingData {
                expected_bytes: 10,
                at_least: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        counting.read <= 10 + TRAILING_PROBE_BYTES + 512,
        "inflated {} bytes",
        counting.read
    );
}

#[test]
fn a_damaged_gzip_trailer_is_still_detected() {
    // The payload is read with `take`; the CRC at the end must still be checked.
    let mut compressed = gzip(&idx_bytes(LABELS_MAGIC, &[3], &[1, 2, 3]));
    let crc = compressed.len() - 8;
    compressed[crc] ^= 0xFF;
    let err = idx::parse_idx_gz(compressed.as_slice()).unwrap_err();
    assert!(matches!(err, FormatError::Read(_)), "{err:?}");
}

// ---------------------------------------------------------------- CIFAR-10

fn record(label: u8, pixel: u8) -> Vec<u8> {
    let mut record = vec![pixel; RECORD_SIZE];
    record[0] = label;
    record
}

#[test]
fn cifar_empty_files_short_records_and_bad_labels_are_refused() {
    assert!(matches!(
        cifar10::parse_records(&[]),
        Err(FormatError::Empty)
    ));
    let one = record(3, 9);
    assert!(matches!(
        cifar10::parse_records(&one[..RECORD_SIZE - 1]),
        Err(FormatError::BadRecordSize { size, .. }) if size == RECORD_SIZE as u64 - 1
    ));
    let mut two = record(1, 0);
    two.extend(record(10, 0));
    assert!(matches!(
        cifar10::parse_records(&two),
        Err(FormatError::LabelOutOfRange {
            sample: 1,
            label: 10,
            ..
        })
    ));
    let mut good = record(9, 200);
    good.extend(record(0, 100));
    let records = cifar10::parse_records(&good).unwrap();
    assert_eq!(records.labels(), &[9, 0]);
    assert_eq!(records.pixels().len(), 2 * 3072);
    assert_eq!(records.pixels()[3071], 200);
    assert_eq!(records.pixels()[3072], 100);

    // Through the loader: an empty file is named.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.bin");
    std::fs::write(&path, b"").unwrap();
    let err = cifar10::load_files(
        "x",
        std::slice::from_ref(&path),
        &Normalisation::identity(3).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(err, DataError::Format { path: ref p, source: FormatError::Empty, .. } if *p == path),
        "{err:?}"
    );
}

// ---------------------------------------------------------------- Dataset

#[test]
fn a_dataset_with_non_finite_values_is_refused_naming_the_sample() {
    let mut values = vec![0.5f32; 12];
    values[7] = f32::NAN;
    let images = Tensor::from_slice(&values).reshape([4, 3]);
    let labels = Tensor::from_slice(&[0i64, 1, 0, 1]);
    let err = Dataset::new("x", images, labels, 2).unwrap_err();
    assert!(
        matches!(err, DataError::NonFiniteValue { sample: 2, element: 1, value, .. } if value.is_nan()),
        "{err:?}"
    );
    let images = Tensor::from_slice(&[1.0f32, f32::NEG_INFINITY]).reshape([2, 1]);
    let err = Dataset::new("y", images, Tensor::from_slice(&[0i64, 0]), 1).unwrap_err();
    assert!(
        matches!(err, DataError::NonFiniteValue { sample: 1, element: 0, value, .. } if value == f64::NEG_INFINITY),
        "{err:?}"
    );
}

#[test]
fn f64_images_beyond_f32_range_are_refused_before_staging_makes_them_infinite() {
    // 1e300 is a finite f64 but an infinity once staged as f32.
    let images = Tensor::from_slice(&[0.25f64, -0.5, 1.0, -1e300, 2.0, 3.0]).reshape([3, 2]);
    let labels = Tensor::from_slice(&[0i64, 1, 0]);
    let err = Dataset::new("wide", images, labels, 2).unwrap_err();
    assert!(
        matches!(err, DataError::ValueOutOfRange { sample: 1, element: 1, value, limit, .. }
            if value == -1e300 && limit == f64::from(f32::MAX)),
        "{err:?}"
    );
    assert!(err.to_string().contains("beyond f32's range"), "{err}");
    // The largest f32 itself is accepted, as is an f32 tensor holding it.
    let edge = f64::from(f32::MAX);
    let images = Tensor::from_slice(&[edge, -edge]).reshape([2, 1]);
    assert!(Dataset::new("edge", images, Tensor::from_slice(&[0i64, 1]), 2).is_ok());
    let images = Tensor::from_slice(&[f32::MAX, f32::MIN]).reshape([2, 1]);
    assert!(Dataset::new("edge32", images, Tensor::from_slice(&[0i64, 1]), 2).is_ok());
}

#[test]
fn a_dataset_with_too_many_classes_is_refused() {
    let images = || Tensor::from_slice(&[0.0f32, 1.0]).reshape([2, 1]);
    let labels = || Tensor::from_slice(&[0i64, 1]);
    for classes in [usize::MAX, MAX_CLASSES + 1] {
        let err = Dataset::new("x", images(), labels(), classes).unwrap_err();
        assert_eq!(field_of(&err), Some("n_classes"), "{err}");
    }
    assert!(Dataset::new("x", images(), labels(), MAX_CLASSES).is_ok());
}

// ---------------------------------------------------------------- sizes

fn too_large(result: Result<Dataset, DataError>) -> bool {
    matches!(result, Err(DataError::TooLarge { .. }))
}

#[test]
fn synthetic_sizes_near_the_integer_limits_are_refused_before_allocating() {
    let blob = |options: BlobTaskOptions| synthetic::blob_task(&options);
    let base = BlobTaskOptions::small(1);
    assert!(too_large(blob(BlobTaskOptions {
        n_features: usize::MAX,
        n_classes: 2,
        ..base.clone()
    })));
    assert!(too_large(blob(BlobTaskOptions {
        n_samples: usize::MAX,
        ..base.clone()
    })));
    assert!(too_large(blob(BlobTaskOptions {
        n_samples: MAX_SAMPLES,
        n_features: MAX_SYNTHETIC_VALUES,
        ..base.clone()
    })));
    assert!(too_large(blob(BlobTaskOptions {
        n_classes: usize::MAX,
        ..base.clone()
    })));
    for (field, options) in [
        (
            "centre_range",
            BlobTaskOptions {
                centre_range: 1e300,
                ..base.clone()
            },
        ),
        (
            "noise_std",
            BlobTaskOptions {
                noise_std: f64::INFINITY,
                ..base.clone()
            },
        ),
        (
            "centre_range",
            BlobTaskOptions {
                centre_range: -1.0,
                ..base.clone()
            },
        ),
    ] {
        let err = blob(options).unwrap_err();
        assert_eq!(field_of(&err), Some(field), "{err}");
    }

    let image = |options: ImageTaskOptions| synthetic::image_task(&options);
    let fashion = ImageTaskOptions::fashion_like(4, 1);
    assert!(too_large(image(ImageTaskOptions {
        grid: usize::MAX / 2,
        ..fashion.clone()
    })));
    assert!(too_large(image(ImageTaskOptions {
        height: usize::MAX,
        width: 2,
        ..fashion.clone()
    })));
    assert!(too_large(image(ImageTaskOptions {
        n_samples: 1 << 20,
        channels: 1 << 20,
        ..fashion.clone()
    })));
    // Zero samples must not hide a huge width: the per-row buffers are sized
    // by the width alone (a release build once tried to allocate 8.8e18 bytes).
    assert!(too_large(image(ImageTaskOptions {
        n_samples: 0,
        width: usize::MAX / 2,
        ..fashion.clone()
    })));
    let err = image(ImageTaskOptions {
        noise_std: f64::NAN,
        ..fashion.clone()
    })
    .unwrap_err();
    assert_eq!(field_of(&err), Some("noise_std"), "{err}");
}

#[test]
fn permutations_above_the_bound_are_refused() {
    for n in [usize::MAX, MAX_SAMPLES + 1] {
        let err = permutation(n, 1).unwrap_err();
        assert!(matches!(err, DataError::TooLarge { .. }), "{err:?}");
    }
    assert_eq!(permutation(3, 1).unwrap().len(), 3);
}

#[test]
fn splits_and_batches_validate_their_arguments() {
    let dataset = synthetic::blob_task(&BlobTaskOptions::small(2)).unwrap();
    for size in [
        SplitSize::Fraction(f64::NAN),
        SplitSize::Fraction(f64::INFINITY),
        SplitSize::Fraction(-0.0001),
        SplitSize::Fraction(1.0001),
        SplitSize::Count(usize::MAX),
    ] {
        let err = dataset.split(size, Some(1)).unwrap_err();
        assert_eq!(field_of(&err), Some("size"), "{size:?}: {err}");
    }
    let (all, none) = dataset.split(SplitSize::Fraction(1.0), Some(3)).unwrap();
    assert_eq!((all.len(), none.len()), (16, 0));
    let err = dataset.batches(0, Some(1), false).unwrap_err();
    assert_eq!(field_of(&err), Some("batch_size"), "{err}");
    let batches: Vec<_> = dataset
        .batches(usize::MAX, Some(1), false)
        .unwrap()
        .collect();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].as_ref().unwrap().0.size()[0], 16);
}

// ---------------------------------------------------------------- properties

/// A small product (so the property tests stay fast when every size is valid).
fn small(sizes: &[usize]) -> bool {
    sizes
        .iter()
        .try_fold(1usize, |product, &size| product.checked_mul(size))
        .is_some_and(|product| product <= 4096)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn normalisation_is_either_refused_or_gives_finite_pixels(
        mean in extreme_f32(), std in extreme_f32()
    ) {
        match Normalisation::new(vec![mean], vec![std]) {
            Ok(normalisation) => {
                for byte in [0.0f32, 1.0] {
                    let value = (byte - normalisation.mean()[0]) / normalisation.std()[0];
                    prop_assert!(value.is_finite(), "{mean} / {std} gives {value}");
                }
            }
            Err(err) => prop_assert!(field_of(&err).is_some(), "{err:?}"),
        }
    }

    #[test]
    fn blob_tasks_never_panic(
        n_samples in extreme_usize(), n_features in extreme_usize(),
        n_classes in extreme_usize(), centre_range in extreme_f64(),
        noise_std in extreme_f64(), seed in extreme_u64(),
    ) {
        let options = BlobTaskOptions { n_samples, n_features, n_classes, centre_range, noise_std, seed };
        match options.validate() {
            Err(err) => prop_assert!(
                matches!(err, DataError::InvalidField { .. } | DataError::TooLarge { .. }),
                "{err:?}"
            ),
            Ok(()) if small(&[n_samples, n_features]) && small(&[n_classes, n_features]) => {
                let dataset = synthetic::blob_task(&options).unwrap();
                prop_assert_eq!(dataset.len(), n_samples);
                prop_assert_eq!(dataset.images().isfinite().all().int64_value(&[]), 1);
            }
            Ok(()) => {}
        }
    }

    #[test]
    fn image_tasks_never_panic(
        n_samples in extreme_usize(), channels in extreme_usize(), height in extreme_usize(),
        width in extreme_usize(), n_classes in extreme_usize(), grid in extreme_usize(),
        noise_std in extreme_f64(), seed in extreme_u64(),
    ) {
        let options = ImageTaskOptions { n_samples, channels, height, width, n_classes, grid, noise_std, seed };
        match options.validate() {
            Err(err) => prop_assert!(
                matches!(err, DataError::InvalidField { .. } | DataError::TooLarge { .. }),
                "{err:?}"
            ),
            Ok(()) if small(&[n_samples, channels, height, width])
                && small(&[n_classes, channels, grid, grid]) => {
                let dataset = synthetic::image_task(&options).unwrap();
                prop_assert_eq!(dataset.len(), n_samples);
                prop_assert_eq!(dataset.images().isfinite().all().int64_value(&[]), 1);
            }
            Ok(()) => {}
        }
    }

    #[test]
    fn dataset_operations_never_panic(
        fraction in extreme_f64(), count in extreme_usize(), batch_size in extreme_usize(),
        start in extreme_usize(), len in extreme_usize(), index in extreme_i64(),
        classes in extreme_usize(), seed in extreme_u64(),
    ) {
        let dataset = synthetic::blob_task(&BlobTaskOptions::small(seed)).unwrap();
        let n = dataset.len();
        match dataset.split(SplitSize::Fraction(fraction), Some(seed)) {
            Ok((first, second)) => {
                prop_assert!((0.0..=1.0).contains(&fraction));
                prop_assert_eq!(first.len() + second.len(), n);
            }
            Err(err) => prop_assert_eq!(field_of(&err), Some("size")),
        }
        match dataset.split(SplitSize::Count(count), None) {
            Ok((first, _)) => prop_assert_eq!(first.len(), count),
            Err(err) => prop_assert!(count > n, "{err:?}"),
        }
        match dataset.batches(batch_size, Some(seed), false) {
            Ok(batches) => prop_assert_eq!(batches.len(), n.div_ceil(batch_size)),
            Err(err) => prop_assert_eq!(field_of(&err), Some("batch_size")),
        }
        prop_assert_eq!(dataset.slice(start, len).is_ok(), start.checked_add(len).is_some_and(|end| end <= n));
        prop_assert_eq!(dataset.select(&[index]).is_ok(), (0..n as i64).contains(&index));
        let relabelled = Dataset::new("z", dataset.images().shallow_clone(), dataset.labels().shallow_clone(), classes);
        prop_assert_eq!(relabelled.is_ok(), (4..=MAX_CLASSES).contains(&classes), "{:?}", relabelled);
    }

    #[test]
    fn idx_headers_never_panic(magic in any::<u32>(), dims in proptest::collection::vec(any::<u32>(), 0..6), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let bytes = idx_bytes(magic, &dims, &tail);
        if let Ok(array) = idx::parse_idx_reader(bytes.as_slice()) {
            let product: usize = array.dims().iter().product();
            prop_assert_eq!(product, array.values().len());
            prop_assert_eq!(&bytes[bytes.len() - product..], array.values());
        }
    }

    #[test]
    fn permutations_never_panic(n in extreme_usize(), seed in extreme_u64()) {
        match permutation(n, seed) {
            Ok(mut order) => {
                prop_assert!(n <= MAX_SAMPLES);
                order.sort_unstable();
                prop_assert_eq!(order, (0..n as i64).collect::<Vec<_>>());
            }
            Err(err) => prop_assert!(n > MAX_SAMPLES && matches!(err, DataError::TooLarge { .. }), "{err:?}"),
        }
    }

    #[test]
    fn cifar_records_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..7000)) {
        match cifar10::parse_records(&bytes) {
            Ok(records) => {
                prop_assert_eq!(records.len() * RECORD_SIZE, bytes.len());
                prop_assert!(records.labels().iter().all(|&label| label < 10));
            }
            Err(err) => prop_assert!(!matches!(err, FormatError::Read(_)), "{err:?}"),
        }
    }
}
