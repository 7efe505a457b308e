//! The Fashion-MNIST (gzipped IDX) reader, on files the tests write
//! themselves, plus one test on the real Fashion-MNIST files when they are
//! installed. The CIFAR-10 reader's tests are in `data_readers_cifar.rs`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{floats, longs, pixel_pattern};
use flate2::Compression;
use flate2::write::GzEncoder;
use tempfile::TempDir;
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};
use tolaria::data::{DataError, FormatError, Normalisation};

// ---------------------------------------------------------------- helpers

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;
const N_TRAIN: usize = 12;
const N_TEST: usize = 5;

fn idx_bytes(magic: u32, dims: &[u32], values: &[u8]) -> Vec<u8> {
    let mut bytes = magic.to_be_bytes().to_vec();
    for dim in dims {
        bytes.extend_from_slice(&dim.to_be_bytes());
    }
    bytes.extend_from_slice(values);
    bytes
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn labels_pattern(n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 3 + salt) % 10) as u8).collect()
}

struct FashionFixture {
    dir: TempDir,
    train_pixels: Vec<u8>,
    train_labels: Vec<u8>,
    test_pixels: Vec<u8>,
    test_labels: Vec<u8>,
}

impl FashionFixture {
    /// Four valid gzipped IDX files with 12 training and 5 test samples.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fixture = Self {
            dir,
            train_pixels: pixel_pattern(N_TRAIN * 784, 1),
            train_labels: labels_pattern(N_TRAIN, 1),
            test_pixels: pixel_pattern(N_TEST * 784, 2),
            test_labels: labels_pattern(N_TEST, 2),
        };
        fixture.write_idx(
            fashion_mnist::TRAIN_IMAGES_FILE,
            IMAGES_MAGIC,
            &[N_TRAIN as u32, 28, 28],
            &fixture.train_pixels,
        );
        fixture.write_idx(
            fashion_mnist::TRAIN_LABELS_FILE,
            LABELS_MAGIC,
            &[N_TRAIN as u32],
            &fixture.train_labels,
        );
        fixture.write_idx(
            fashion_mnist::TEST_IMAGES_FILE,
            IMAGES_MAGIC,
            &[N_TEST as u32, 28, 28],
            &fixture.test_pixels,
        );
        fixture.write_idx(
            fashion_mnist::TEST_LABELS_FILE,
            LABELS_MAGIC,
            &[N_TEST as u32],
            &fixture.test_labels,
        );
        fixture
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write_idx(&self, name: &str, magic: u32, dims: &[u32], values: &[u8]) {
        std::fs::write(self.path(name), gzip(&idx_bytes(magic, dims, values))).unwrap();
    }

    fn options(&self) -> FashionMnistOptions {
        FashionMnistOptions::from_dir(self.dir.path())
    }

    fn load_err(&self) -> DataError {
        match fashion_mnist::load(self.options()) {
            Ok(_) => panic!("loading the damaged fixture succeeded"),
            Err(err) => err,
        }
    }
}

/// The message names `path` and carries the Fashion-MNIST remedy.
fn assert_fashion_message(err: &DataError, path: &Path) {
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()),
        "message does not name {}: {message}",
        path.display()
    );
    assert!(
        message.contains("ESPER_FASHION_MNIST_DIR"),
        "message does not name the variable: {message}"
    );
    assert!(
        message.contains("FashionMnistOptions::dir"),
        "message does not name the option: {message}"
    );
    assert!(
        message.contains("cargo xtask provision"),
        "message does not say how to install: {message}"
    );
}

// ---------------------------------------------------------------- Fashion-MNIST

#[test]
fn fashion_pixels_and_labels_round_trip_exactly() {
    let fixture = FashionFixture::new();
    let options = FashionMnistOptions {
        normalisation: Normalisation::identity(1).unwrap(),
        ..fixture.options()
    };
    let (train, test) = fashion_mnist::load(options).unwrap();
    assert_eq!(train.name(), "fashion-mnist/train");
    assert_eq!(test.name(), "fashion-mnist/test");
    assert_eq!(train.images().size(), vec![N_TRAIN as i64, 1, 28, 28]);
    assert_eq!(test.images().size(), vec![N_TEST as i64, 1, 28, 28]);
    assert_eq!(train.images().kind(), tch::Kind::Float);
    assert_eq!(train.labels().kind(), tch::Kind::Int64);
    assert_eq!(train.n_classes(), 10);
    for (dataset, pixels, labels) in [
        (&train, &fixture.train_pixels, &fixture.train_labels),
        (&test, &fixture.test_pixels, &fixture.test_labels),
    ] {
        let expected: Vec<f32> = pixels.iter().map(|&byte| byte as f32 / 255.0).collect();
        assert_eq!(floats(dataset.images()), expected);
        assert_eq!(
            longs(dataset.labels()),
            labels.iter().map(|&label| label as i64).collect::<Vec<_>>()
        );
    }
}

#[test]
fn fashion_default_normalisation_uses_mean_0_2860_std_0_3530() {
    let fixture = FashionFixture::new();
    assert_eq!(
        FashionMnistOptions::default().normalisation,
        Normalisation::new(vec![0.2860], vec![0.3530]).unwrap()
    );
    let (train, _) = fashion_mnist::load(fixture.options()).unwrap();
    let got = floats(train.images());
    for (value, &byte) in got.iter().zip(&fixture.train_pixels) {
        let expected = (byte as f32 / 255.0 - 0.2860) / 0.3530;
        assert!(
            (value - expected).abs() < 1e-5,
            "byte {byte}: {value} vs {expected}"
        );
    }
    // Byte 0 and 255 are in the fixture, so the extremes are checked too.
    let min = got.iter().cloned().fold(f32::INFINITY, f32::min);
    let max = got.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    assert!((min - (-0.2860 / 0.3530)).abs() < 1e-5);
    assert!((max - ((1.0 - 0.2860) / 0.3530)).abs() < 1e-5);
}

#[test]
fn fashion_missing_directory_names_the_option_variable_and_provisioning() {
    let fixture = FashionFixture::new();
    let missing = fixture.path("nowhere");
    let err = fashion_mnist::load(FashionMnistOptions::from_dir(&missing)).unwrap_err();
    assert!(
        matches!(err, DataError::MissingDirectory { ref path, .. } if *path == missing),
        "{err:?}"
    );
    assert_fashion_message(&err, &missing);
    assert!(
        err.to_string()
            .contains("chosen by FashionMnistOptions::dir"),
        "{err}"
    );
}

#[test]
fn fashion_missing_file_is_named() {
    for name in [
        fashion_mnist::TRAIN_IMAGES_FILE,
        fashion_mnist::TRAIN_LABELS_FILE,
        fashion_mnist::TEST_IMAGES_FILE,
        fashion_mnist::TEST_LABELS_FILE,
    ] {
        let fixture = FashionFixture::new();
        std::fs::remove_file(fixture.path(name)).unwrap();
        let err = fixture.load_err();
        assert!(
            matches!(err, DataError::MissingFile { ref path, .. } if *path == fixture.path(name)),
            "{err:?}"
        );
        assert_fashion_message(&err, &fixture.path(name));
    }
}

#[test]
fn fashion_wrong_magic_number_is_reported_for_images_and_labels() {
    let fixture = FashionFixture::new();
    // A labels file where images belong: right data, wrong magic (0x801).
    fixture.write_idx(
        fashion_mnist::TRAIN_IMAGES_FILE,
        LABELS_MAGIC,
        &[N_TRAIN as u32],
        &fixture.train_labels,
    );
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::BadMagic {
                    expected: 0x803,
                    found: 0x801,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TRAIN_IMAGES_FILE));

    let fixture = FashionFixture::new();
    // Signed-byte type (0x09) instead of unsigned (0x08).
    fixture.write_idx(
        fashion_mnist::TEST_LABELS_FILE,
        0x0000_0901,
        &[N_TEST as u32],
        &fixture.test_labels,
    );
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::BadMagic {
                    expected: 0x801,
                    found: 0x901,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_LABELS_FILE));
}

#[test]
fn fashion_truncated_file_reports_promised_and_present_bytes() {
    let fixture = FashionFixture::new();
    // The header promises 12 images; only 11 and a half are there.
    let short = &fixture.train_pixels[..fixture.train_pixels.len() - 392 - 784];
    fixture.write_idx(
        fashion_mnist::TRAIN_IMAGES_FILE,
        IMAGES_MAGIC,
        &[N_TRAIN as u32, 28, 28],
        short,
    );
    let err = fixture.load_err();
    let promised = 16 + N_TRAIN as u64 * 784;
    assert!(
        matches!(err, DataError::Format { source: FormatError::Truncated { expected_bytes, found_bytes }, .. }
            if expected_bytes == promised && found_bytes == promised - 392 - 784),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TRAIN_IMAGES_FILE));

    // A header cut in the middle of the dimensions.
    let fixture = FashionFixture::new();
    std::fs::write(
        fixture.path(fashion_mnist::TEST_IMAGES_FILE),
        gzip(&IMAGES_MAGIC.to_be_bytes()[..]).as_slice(),
    )
    .unwrap();
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::Truncated {
                    expected_bytes: 16,
                    found_bytes: 4,
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_IMAGES_FILE));

    // Labels: header promises 5, 3 present.
    let fixture = FashionFixture::new();
    fixture.write_idx(
        fashion_mnist::TEST_LABELS_FILE,
        LABELS_MAGIC,
        &[N_TEST as u32],
        &fixture.test_labels[..3],
    );
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::Truncated {
                    expected_bytes: 13,
                    found_bytes: 11,
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_LABELS_FILE));
}

#[test]
fn fashion_trailing_data_is_reported() {
    let fixture = FashionFixture::new();
    let mut long = fixture.train_labels.clone();
    long.push(3);
    fixture.write_idx(
        fashion_mnist::TRAIN_LABELS_FILE,
        LABELS_MAGIC,
        &[N_TRAIN as u32],
        &long,
    );
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::TrailingData {
                    expected_bytes: 20,
                    found_bytes: 21,
                    at_least: false,
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TRAIN_LABELS_FILE));
}

#[test]
fn fashion_cut_gzip_stream_and_plain_file_are_decompression_errors() {
    let fixture = FashionFixture::new();
    let path = fixture.path(fashion_mnist::TRAIN_IMAGES_FILE);
    let compressed = std::fs::read(&path).unwrap();
    std::fs::write(&path, &compressed[..compressed.len() / 2]).unwrap();
    let err = fixture.load_err();
    assert!(matches!(err, DataError::Decompress { .. }), "{err:?}");
    assert_fashion_message(&err, &path);

    let fixture = FashionFixture::new();
    let path = fixture.path(fashion_mnist::TEST_LABELS_FILE);
    std::fs::write(
        &path,
        idx_bytes(LABELS_MAGIC, &[N_TEST as u32], &fixture.test_labels),
    )
    .unwrap();
    let err = fixture.load_err();
    assert!(matches!(err, DataError::Decompress { .. }), "{err:?}");
    assert_fashion_message(&err, &path);
}

#[test]
fn fashion_label_out_of_range_names_sample_and_file() {
    for bad_label in [10u8, 255] {
        let fixture = FashionFixture::new();
        let mut labels = fixture.test_labels.clone();
        labels[3] = bad_label;
        fixture.write_idx(
            fashion_mnist::TEST_LABELS_FILE,
            LABELS_MAGIC,
            &[N_TEST as u32],
            &labels,
        );
        let err = fixture.load_err();
        assert!(
            matches!(err, DataError::Format { source: FormatError::LabelOutOfRange { sample: 3, label, n_classes: 10 }, .. } if label == bad_label),
            "{err:?}"
        );
        assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_LABELS_FILE));
    }
}

#[test]
fn fashion_wrong_image_dimensions_are_reported() {
    let fixture = FashionFixture::new();
    let pixels = pixel_pattern(N_TRAIN * 32 * 32, 3);
    fixture.write_idx(
        fashion_mnist::TRAIN_IMAGES_FILE,
        IMAGES_MAGIC,
        &[N_TRAIN as u32, 32, 32],
        &pixels,
    );
    let err = fixture.load_err();
    assert!(
        matches!(err, DataError::BadDimensions { ref expected, ref found, .. }
            if expected.contains("28x28") && found.contains("32x32")),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TRAIN_IMAGES_FILE));
}

#[test]
fn fashion_image_and_label_counts_must_agree() {
    let fixture = FashionFixture::new();
    fixture.write_idx(
        fashion_mnist::TEST_LABELS_FILE,
        LABELS_MAGIC,
        &[4],
        &fixture.test_labels[..4],
    );
    let err = fixture.load_err();
    assert!(
        matches!(
            err,
            DataError::CountMismatch {
                images: 5,
                labels: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_LABELS_FILE));
    assert_fashion_message(&err, &fixture.path(fashion_mnist::TEST_IMAGES_FILE));
}

#[test]
fn fashion_rejects_a_normalisation_with_the_wrong_channel_count() {
    let fixture = FashionFixture::new();
    let options = FashionMnistOptions {
        normalisation: Normalisation::cifar10(),
        ..fixture.options()
    };
    let err = fashion_mnist::load(options).unwrap_err();
    assert!(
        matches!(err, DataError::InvalidField { ref field, .. } if field == "normalisation.channels"),
        "{err:?}"
    );
}

/// The real files from Debian's `dataset-fashion-mnist`, when installed.
#[test]
fn real_fashion_mnist_has_60000_train_and_10000_test_samples_balanced() {
    let dir = fashion_mnist::data_dir(&FashionMnistOptions::default());
    if !dir.join(fashion_mnist::TRAIN_IMAGES_FILE).is_file() {
        println!(
            "skipping: Fashion-MNIST is not installed in {} (run `cargo xtask provision` or set {})",
            dir.display(),
            fashion_mnist::DIR_ENV
        );
        return;
    }
    let (train, test) = fashion_mnist::load(FashionMnistOptions::default()).unwrap();
    assert_eq!(train.len(), 60_000);
    assert_eq!(test.len(), 10_000);
    assert_eq!(train.sample_shape(), vec![1, 28, 28]);
    assert_eq!(train.class_counts().unwrap(), vec![6_000; 10]);
    assert_eq!(test.class_counts().unwrap(), vec![1_000; 10]);
    // Normalised with the data set's own statistics: mean near 0, std near 1.
    let mean = train.images().mean(tch::Kind::Float).double_value(&[]);
    let std = train.images().std(true).double_value(&[]);
    assert!(mean.abs() < 0.01, "train mean {mean}");
    assert!((std - 1.0).abs() < 0.01, "train std {std}");
}
