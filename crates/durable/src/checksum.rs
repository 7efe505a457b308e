//! The checksum of every durable file: FNV-1a, 64 bits, written as 16 lower
//! hex digits. Not cryptographic: it finds torn writes and bit rot, not
//! tampering.

use serde::{Deserialize, Serialize};

/// FNV-1a, 64 bits, of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// [`fnv1a64`] as 16 lower hex digits.
pub fn fnv1a64_hex(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a64(bytes))
}

/// One file of a checkpoint directory: its name, size and checksum, as the
/// manifest's `files` list records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileChecksum {
    /// File name inside the directory.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// [`fnv1a64_hex`] of the contents.
    pub fnv1a64: String,
}

impl FileChecksum {
    /// The entry of `name` holding `bytes`.
    pub fn of(name: &str, bytes: &[u8]) -> FileChecksum {
        FileChecksum {
            name: name.to_owned(),
            bytes: bytes.len() as u64,
            fnv1a64: fnv1a64_hex(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a64_hex(b"a"), "af63dc4c8601ec8c");
    }
}
