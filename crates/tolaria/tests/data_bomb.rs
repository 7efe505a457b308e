//! A gzip bomb through the Fashion-MNIST loader: a labels file whose header
//! promises 2 labels, followed by 256 MiB of zeros in further gzip members
//! (2.6 MB on disk). The loader must refuse it as trailing data while the
//! process's live heap stays far below what the bomb inflates to.
//!
//! One test in its own binary: it installs a counting global allocator and
//! reads the peak of the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use flate2::Compression;
use flate2::write::GzEncoder;
use tolaria::data::fashion_mnist::{self, FashionMnistOptions};
use tolaria::data::{DataError, FormatError};

/// The system allocator, counting live bytes and their peak.
struct PeakCounting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters only observe sizes.
unsafe impl GlobalAlloc for PeakCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(live, Ordering::SeqCst);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from `alloc` with this layout.
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOCATOR: PeakCounting = PeakCounting;

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

#[test]
fn a_gzip_bomb_is_refused_without_inflating_it() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.path().join(name), bytes).unwrap();
    write(
        fashion_mnist::TRAIN_IMAGES_FILE,
        gzip(&idx_bytes(0x803, &[2, 28, 28], &[7; 2 * 784])),
    );
    write(
        fashion_mnist::TEST_IMAGES_FILE,
        gzip(&idx_bytes(0x803, &[1, 28, 28], &[7; 784])),
    );
    write(
        fashion_mnist::TEST_LABELS_FILE,
        gzip(&idx_bytes(0x801, &[1], &[3])),
    );
    let mut bomb = gzip(&idx_bytes(0x801, &[2], &[1, 2]));
    let member = gzip(&vec![0u8; 1 << 20]);
    for _ in 0..256 {
        bomb.extend_from_slice(&member);
    }
    write(fashion_mnist::TRAIN_LABELS_FILE, bomb);
    drop(member);

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let err = fashion_mnist::load(FashionMnistOptions::from_dir(dir.path())).unwrap_err();
    let peak = PEAK.load(Ordering::SeqCst).saturating_sub(before);
    assert!(
        matches!(
            err,
            DataError::Format {
                source: FormatError::TrailingData {
                    expected_bytes: 10,
                    at_least: true,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    // The compressed bomb (2.6 MB) is read whole; its 256 MiB are not.
    assert!(
        peak < 16 << 20,
        "peak live heap {peak} bytes while refusing the bomb"
    );
}
