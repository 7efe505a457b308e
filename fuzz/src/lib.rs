//! The checks the fuzz targets run, shared so that each target stays one line.
//!
//! Each check feeds the input to a decoder and asserts the contract of
//! `crates/leyline/tests/fuzz_decoders.rs`: the input either decodes to a
//! value that passes validation and re-encodes to the same value through
//! both encodings, or the decoder returns a typed error. A broken invariant
//! panics, which libFuzzer reports as a crash with the input saved.

use std::fmt::Debug;

use leyline::baseline::BaselineRecord;
use leyline::codec::Contract;
use leyline::proto::{AdaptationCommand, GateResult, SeedMetricSet, SeedState, TelemetryPacket};

/// Number of contract messages the dispatching targets choose from.
pub const MESSAGES: u8 = 5;

fn re_encodes<T: Contract + PartialEq + Debug>(message: &T) {
    assert!(
        message.validate().is_ok(),
        "accepted but invalid: {message:?}"
    );
    let bytes = message
        .encode_protobuf()
        .expect("a validated message encodes");
    assert_eq!(
        T::decode_protobuf(&bytes).as_ref(),
        Ok(message),
        "protobuf round trip"
    );
    let json = message
        .to_json()
        .expect("a validated message encodes as JSON");
    assert_eq!(T::from_json(&json).as_ref(), Ok(message), "JSON round trip");
}

fn protobuf_as<T: Contract + PartialEq + Debug>(bytes: &[u8]) {
    if let Ok(message) = T::decode_protobuf(bytes) {
        re_encodes(&message);
    }
}

fn json_as<T: Contract + PartialEq + Debug>(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes)
        && let Ok(message) = T::from_json(text)
    {
        re_encodes(&message);
    }
}

/// Protobuf decoding: the first byte picks the message, the rest is decoded.
pub fn protobuf(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % MESSAGES {
        0 => protobuf_as::<SeedMetricSet>(bytes),
        1 => protobuf_as::<SeedState>(bytes),
        2 => protobuf_as::<GateResult>(bytes),
        3 => protobuf_as::<TelemetryPacket>(bytes),
        _ => protobuf_as::<AdaptationCommand>(bytes),
    }
}

/// JSON decoding: the first byte picks the message, the rest is parsed.
pub fn json(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % MESSAGES {
        0 => json_as::<SeedMetricSet>(bytes),
        1 => json_as::<SeedState>(bytes),
        2 => json_as::<GateResult>(bytes),
        3 => json_as::<TelemetryPacket>(bytes),
        _ => json_as::<AdaptationCommand>(bytes),
    }
}

/// Baseline record reading: a record read is written and read back equal.
pub fn baseline_record(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(record) = BaselineRecord::from_json(text)
    {
        let written = record.to_json_pretty().expect("a record read is writable");
        assert_eq!(
            BaselineRecord::from_json(&written),
            Ok(record),
            "record round trip"
        );
    }
}

/// IDX reading (raw and gzipped): the first byte picks the form. An accepted
/// array holds exactly the number of values its dimensions promise, and
/// reading is bounded by the header, never by the input's size.
#[cfg(feature = "torch")]
pub fn idx(data: &[u8]) {
    use tolaria::data::idx::{IdxArray, parse_idx_gz, parse_idx_reader};
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let parsed: Option<IdxArray> = if selector % 2 == 0 {
        parse_idx_reader(bytes).ok()
    } else {
        parse_idx_gz(bytes).ok()
    };
    if let Some(array) = parsed {
        let promised = array
            .dims()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .expect("accepted dimensions multiply without overflow");
        assert_eq!(array.values().len(), promised, "values match the header");
        assert!(array.dims().iter().all(|&d| d > 0), "no empty dimension");
    }
}

/// CIFAR-10 binary records: an accepted file holds whole records with labels
/// below 10.
#[cfg(feature = "torch")]
pub fn cifar10(data: &[u8]) {
    use tolaria::data::cifar10::{N_CLASSES, PIXELS_PER_IMAGE, parse_records};
    if let Ok(records) = parse_records(data) {
        assert!(!records.labels().is_empty(), "an accepted file is not empty");
        assert_eq!(
            records.pixels().len(),
            records.labels().len() * PIXELS_PER_IMAGE,
            "whole records"
        );
        assert!(
            records.labels().iter().all(|&l| usize::from(l) < N_CLASSES),
            "labels in range"
        );
    }
}

/// Alpha controllers read from JSON (checkpoints): an accepted controller
/// serialises and reads back equal, and its alpha is finite and in [0, 1].
#[cfg(feature = "torch")]
pub fn alpha_controller(data: &[u8]) {
    use kasmina::alpha::AlphaController;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(controller) = serde_json::from_str::<AlphaController>(text) {
        let alpha = controller.alpha();
        assert!((0.0..=1.0).contains(&alpha), "alpha {alpha} out of range");
        let again = serde_json::to_string(&controller).expect("an accepted controller serialises");
        let back: AlphaController =
            serde_json::from_str(&again).expect("a serialised controller reads back");
        assert_eq!(back, controller, "JSON round trip");
    }
}
