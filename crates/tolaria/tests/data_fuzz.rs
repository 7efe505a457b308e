//! Bounded in-test fuzzing of the pure-bytes readers: hundreds of thousands
//! of random and mutated-valid inputs (bit flips, truncations, extensions,
//! header edits, spliced chunks) through [`idx::parse_idx_reader`],
//! [`idx::parse_idx_gz`] and [`cifar10::parse_records`]. Every input must give
//! a typed error or an output that keeps the reader's invariants; a panic
//! fails the test and prints the input in hex.
//!
//! The inputs come from a seeded SplitMix64, so a failure reproduces exactly.
//! The loop takes a few seconds in a debug build (the count of inputs per
//! reader is printed with the time it took).

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use flate2::Compression;
use flate2::write::GzEncoder;
use leyline::rng::SplitMix64;
use tolaria::data::FormatError;
use tolaria::data::cifar10::{self, N_CLASSES, PIXELS_PER_IMAGE, RECORD_SIZE};
use tolaria::data::idx::{self, IdxArray};
use tolaria::data::limits::{MAX_IDX_BYTES, MAX_IDX_RANK};

/// Inputs per reader (raw IDX, gzipped IDX, CIFAR-10 records).
const RAW_IDX_INPUTS: usize = 500_000;
const GZ_IDX_INPUTS: usize = 200_000;
const CIFAR_INPUTS: usize = 100_000;

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Interesting 32-bit words for header edits.
const WORDS: [u32; 10] = [
    0,
    1,
    28,
    0x0000_0801,
    0x0000_0803,
    0x0000_08FF,
    0x7FFF_FFFF,
    0x8000_0000,
    u32::MAX,
    (MAX_IDX_BYTES as u32) / 28,
];

/// One random mutation of `seed` (possibly several stacked).
fn mutate(rng: &mut SplitMix64, seed: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    let rounds = 1 + rng.below(3);
    for _ in 0..rounds {
        let len = bytes.len() as u64;
        match rng.below(8) {
            // Flip one to four bits.
            0 => {
                for _ in 0..=rng.below(4) {
                    if len > 0 {
                        let at = rng.below(len) as usize;
                        bytes[at] ^= 1 << rng.below(8);
                    }
                }
            }
            // Set a byte to an interesting value.
            1 => {
                if len > 0 {
                    let at = rng.below(len) as usize;
                    bytes[at] = [0u8, 1, 0x7F, 0x80, 0xFF, 9, 10][rng.below(7) as usize];
                }
            }
            // Truncate.
            2 => bytes.truncate(rng.below(len + 1) as usize),
            // Extend with random bytes.
            3 => {
                for _ in 0..rng.below(64) {
                    bytes.push(rng.next_u64() as u8);
                }
            }
            // Overwrite a header word (magic or a dimension).
            4 => {
                let word = WORDS[rng.below(WORDS.len() as u64) as usize].to_be_bytes();
                let at = 4 * rng.below(5) as usize;
                for (offset, byte) in word.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + offset) {
                        *slot = *byte;
                    }
                }
            }
            // Duplicate a chunk somewhere else.
            5 => {
                if len > 1 {
                    let start = rng.below(len) as usize;
                    let end = (start + 1 + rng.below(32) as usize).min(bytes.len());
                    let chunk = bytes[start..end].to_vec();
                    let at = rng.below(bytes.len() as u64 + 1) as usize;
                    bytes.splice(at..at, chunk);
                }
            }
            // Remove a chunk.
            6 => {
                if len > 1 {
                    let start = rng.below(len) as usize;
                    let end = (start + 1 + rng.below(32) as usize).min(bytes.len());
                    bytes.drain(start..end);
                }
            }
            // Replace with random bytes.
            _ => {
                bytes = (0..rng.below(48)).map(|_| rng.next_u64() as u8).collect();
            }
        }
    }
    bytes
}

/// Runs `check` on `input`, turning a panic into a failure that shows the input.
fn no_panic(reader: &str, input: &[u8], check: impl FnOnce(&[u8])) {
    if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
        panic!("{reader} panicked on input {}", hex(input));
    }
}

/// What every successfully parsed IDX array must satisfy.
fn check_idx(input: &[u8], result: Result<IdxArray, FormatError>) {
    let Ok(array) = result else { return };
    let rank = array.dims().len();
    assert!(
        (1..=usize::from(MAX_IDX_RANK)).contains(&rank),
        "rank {rank} accepted from {}",
        hex(input)
    );
    assert!(array.dims().iter().all(|&dim| dim > 0));
    let product: usize = array.dims().iter().product();
    assert_eq!(product, array.values().len(), "input {}", hex(input));
    assert!(product as u64 <= MAX_IDX_BYTES);
    assert_eq!(array.magic() & 0xFFFF_FF00, 0x0000_0800);
}

#[test]
fn readers_survive_hundreds_of_thousands_of_hostile_inputs() {
    let mut rng = SplitMix64::new(0x5EED_F022);
    let idx_seeds = [
        idx_bytes(0x0000_0801, &[5], &[0, 1, 2, 3, 9]),
        idx_bytes(0x0000_0803, &[2, 3, 3], &[7; 18]),
        idx_bytes(0x0000_0802, &[1, 1], &[255]),
        idx_bytes(0x0000_0804, &[1, 2, 1, 2], &[1, 2, 3, 4]),
    ];

    let started = Instant::now();
    let mut accepted = 0usize;
    for _ in 0..RAW_IDX_INPUTS {
        let seed = &idx_seeds[rng.below(idx_seeds.len() as u64) as usize];
        let input = mutate(&mut rng, seed);
        no_panic("parse_idx_reader", &input, |input| {
            let result = idx::parse_idx_reader(input);
            accepted += usize::from(result.is_ok());
            check_idx(input, result);
        });
    }
    println!(
        "raw IDX: {RAW_IDX_INPUTS} inputs ({accepted} accepted) in {:.2?}",
        started.elapsed()
    );

    let gz_seeds: Vec<Vec<u8>> = idx_seeds.iter().map(|seed| gzip(seed)).collect();
    let started = Instant::now();
    let mut accepted = 0usize;
    for _ in 0..GZ_IDX_INPUTS {
        let seed = &gz_seeds[rng.below(gz_seeds.len() as u64) as usize];
        let input = mutate(&mut rng, seed);
        no_panic("parse_idx_gz", &input, |input| {
            let result = idx::parse_idx_gz(input);
            accepted += usize::from(result.is_ok());
            check_idx(input, result);
        });
    }
    println!(
        "gzipped IDX: {GZ_IDX_INPUTS} inputs ({accepted} accepted) in {:.2?}",
        started.elapsed()
    );

    let mut two_records = vec![3u8; 2 * RECORD_SIZE];
    two_records[RECORD_SIZE] = 9;
    let cifar_seeds = [two_records, vec![0u8; RECORD_SIZE]];
    let started = Instant::now();
    let mut accepted = 0usize;
    for _ in 0..CIFAR_INPUTS {
        let seed = &cifar_seeds[rng.below(cifar_seeds.len() as u64) as usize];
        let input = mutate(&mut rng, seed);
        no_panic("cifar10::parse_records", &input, |input| {
            if let Ok(records) = cifar10::parse_records(input) {
                accepted += 1;
                assert!(!records.is_empty());
                assert_eq!(records.len() * RECORD_SIZE, input.len());
                assert_eq!(records.pixels().len(), records.len() * PIXELS_PER_IMAGE);
                assert!(
                    records
                        .labels()
                        .iter()
                        .all(|&label| usize::from(label) < N_CLASSES)
                );
            }
        });
    }
    println!(
        "CIFAR-10 records: {CIFAR_INPUTS} inputs ({accepted} accepted) in {:.2?}",
        started.elapsed()
    );
}
