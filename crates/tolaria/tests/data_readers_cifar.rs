//! The CIFAR-10 binary reader, on files the tests write themselves (the
//! real data set is not reachable here), and loaded data sets batching like
//! any other.

mod common;

use std::path::Path;

use common::{floats, longs, pixel_pattern};
use tolaria::data::cifar10::{self, Cifar10Options};
use tolaria::data::{DataError, Dataset, FormatError, Normalisation};

// ---------------------------------------------------------------- CIFAR-10

const RECORD: usize = 3073;

/// `n` CIFAR records: label `(i + salt) % 10`, pixels from `pixel_pattern`.
fn cifar_records(n: usize, salt: usize) -> Vec<u8> {
    let pixels = pixel_pattern(n * 3072, salt);
    let mut records = Vec::with_capacity(n * RECORD);
    for i in 0..n {
        records.push(((i + salt) % 10) as u8);
        records.extend_from_slice(&pixels[i * 3072..(i + 1) * 3072]);
    }
    records
}

/// Training file `k` (0-based) holds `2 + k` records; the test file 3.
fn write_cifar(dir: &Path) -> (Vec<Vec<u8>>, Vec<u8>) {
    std::fs::create_dir_all(dir).unwrap();
    let train: Vec<Vec<u8>> = (0..5).map(|k| cifar_records(2 + k, k)).collect();
    for (name, records) in cifar10::TRAIN_FILES.iter().zip(&train) {
        std::fs::write(dir.join(name), records).unwrap();
    }
    let test = cifar_records(3, 7);
    std::fs::write(dir.join(cifar10::TEST_FILE), &test).unwrap();
    (train, test)
}

fn split_records(records: &[u8]) -> (Vec<u8>, Vec<i64>) {
    let pixels = records
        .chunks(RECORD)
        .flat_map(|record| record[1..].to_vec())
        .collect();
    let labels = records
        .chunks(RECORD)
        .map(|record| record[0] as i64)
        .collect();
    (pixels, labels)
}

fn assert_cifar_message(err: &DataError, path: &Path) {
    let message = err.to_string();
    assert!(
        message.contains(&path.display().to_string()),
        "message does not name {}: {message}",
        path.display()
    );
    assert!(
        message.contains("ESPER_CIFAR10_DIR"),
        "message does not name the variable: {message}"
    );
}

#[test]
fn cifar_records_round_trip_in_file_order_chw() {
    let dir = tempfile::tempdir().unwrap();
    let (train_files, test_file) = write_cifar(dir.path());
    let options = Cifar10Options {
        normalisation: Normalisation::identity(3).unwrap(),
        ..Cifar10Options::from_dir(dir.path())
    };
    let (train, test) = cifar10::load(options).unwrap();
    assert_eq!(train.name(), "cifar10/train");
    assert_eq!(test.name(), "cifar10/test");
    assert_eq!(train.images().size(), vec![2 + 3 + 4 + 5 + 6, 3, 32, 32]);
    assert_eq!(test.images().size(), vec![3, 3, 32, 32]);
    let (train_pixels, train_labels) = split_records(&train_files.concat());
    assert_eq!(
        floats(train.images()),
        train_pixels
            .iter()
            .map(|&b| b as f32 / 255.0)
            .collect::<Vec<_>>()
    );
    assert_eq!(longs(train.labels()), train_labels);
    let (test_pixels, test_labels) = split_records(&test_file);
    assert_eq!(
        floats(test.images()),
        test_pixels
            .iter()
            .map(|&b| b as f32 / 255.0)
            .collect::<Vec<_>>()
    );
    assert_eq!(longs(test.labels()), test_labels);
    // CHW: byte 1 + 1024 * c + 32 * y + x of a record is pixel (c, y, x).
    let record = &test_file[RECORD..2 * RECORD];
    let value = test.images().double_value(&[1, 2, 5, 7]) as f32;
    assert_eq!(value, record[1 + 2 * 1024 + 5 * 32 + 7] as f32 / 255.0);
}

#[test]
fn cifar_default_normalisation_is_per_channel() {
    let dir = tempfile::tempdir().unwrap();
    let (_, test_file) = write_cifar(dir.path());
    let (_, test) = cifar10::load(Cifar10Options::from_dir(dir.path())).unwrap();
    let mean = [0.4914f32, 0.4822, 0.4465];
    let std = [0.2470f32, 0.2435, 0.2616];
    let (pixels, _) = split_records(&test_file);
    for (i, (value, byte)) in floats(test.images()).iter().zip(pixels).enumerate() {
        let channel = (i / 1024) % 3;
        let expected = (byte as f32 / 255.0 - mean[channel]) / std[channel];
        assert!(
            (value - expected).abs() < 1e-5,
            "value {i} (channel {channel}): {value} vs {expected}"
        );
    }
}

#[test]
fn cifar_accepts_the_archive_sub_folder() {
    let root = tempfile::tempdir().unwrap();
    write_cifar(&root.path().join(cifar10::BATCHES_SUBDIR));
    let (train, test) = cifar10::load(Cifar10Options::from_dir(root.path())).unwrap();
    assert_eq!((train.len(), test.len()), (20, 3));
}

#[test]
fn cifar_load_files_reads_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (train_files, _) = write_cifar(dir.path());
    let batch = cifar10::load_files(
        "one",
        &[dir.path().join("data_batch_3.bin")],
        &Normalisation::identity(3).unwrap(),
    )
    .unwrap();
    assert_eq!(batch.name(), "one");
    let (_, labels) = split_records(&train_files[2]);
    assert_eq!(longs(batch.labels()), labels);
}

#[test]
fn cifar_file_size_not_a_multiple_of_3073_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (train_files, _) = write_cifar(dir.path());
    let path = dir.path().join("data_batch_2.bin");
    std::fs::write(&path, &train_files[1][..train_files[1].len() - 100]).unwrap();
    let err = cifar10::load(Cifar10Options::from_dir(dir.path())).unwrap_err();
    assert!(
        matches!(err, DataError::Format { source: FormatError::BadRecordSize { size, record_size: 3073 }, .. } if size == 3 * 3073 - 100),
        "{err:?}"
    );
    assert_cifar_message(&err, &path);
    assert!(
        err.to_string().contains("multiple of the 3073-byte"),
        "{err}"
    );
}

#[test]
fn cifar_label_out_of_range_names_record_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut test_file) = write_cifar(dir.path());
    test_file[2 * RECORD] = 10;
    let path = dir.path().join(cifar10::TEST_FILE);
    std::fs::write(&path, &test_file).unwrap();
    let err = cifar10::load(Cifar10Options::from_dir(dir.path())).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::LabelOutOfRange {
                    sample: 2,
                    label: 10,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert_cifar_message(&err, &path);
}

#[test]
fn cifar_missing_directory_and_file_are_named() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("nowhere");
    let err = cifar10::load(Cifar10Options::from_dir(&missing)).unwrap_err();
    assert!(
        matches!(err, DataError::MissingDirectory { ref path, .. } if *path == missing),
        "{err:?}"
    );
    assert_cifar_message(&err, &missing);
    assert!(err.to_string().contains("Cifar10Options::dir"), "{err}");

    write_cifar(root.path());
    let path = root.path().join("data_batch_4.bin");
    std::fs::remove_file(&path).unwrap();
    let err = cifar10::load(Cifar10Options::from_dir(root.path())).unwrap_err();
    assert!(
        matches!(err, DataError::MissingFile { path: ref missing_path, .. } if *missing_path == path),
        "{err:?}"
    );
    assert_cifar_message(&err, &path);
}

#[test]
fn loaded_data_sets_batch_like_any_other() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar(dir.path());
    let (train, _): (Dataset, Dataset) =
        cifar10::load(Cifar10Options::from_dir(dir.path())).unwrap();
    let sizes: Vec<i64> = train
        .batches(8, Some(1), false)
        .unwrap()
        .map(|batch| batch.unwrap().0.size()[0])
        .collect();
    assert_eq!(sizes, vec![8, 8, 4]);
}
