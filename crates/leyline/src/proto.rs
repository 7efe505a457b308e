//! Generated protobuf messages (`proto/esper/leyline/v1/contracts.proto`).
//!
//! Enum-valued fields hold contract integers; use [`crate::codec`] to decode
//! and validate them, or the typed accessors in this module.

#![allow(missing_docs, unreachable_pub, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/esper.leyline.v1.rs"));
