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
