//! Checkpoint directories end to end: what a writer leaves, what a reader
//! refuses, and what a crash (a partial folder) looks like.

use std::path::{Path, PathBuf};

use durable::{CheckpointWriter, Error, list, read_checked, remove_partial};
use serde_json::json;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("durable-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn write_one(root: &Path, name: &str, payload: &[u8]) -> PathBuf {
    let mut writer = CheckpointWriter::begin(root, name).unwrap();
    writer.write("payload.bin", payload).unwrap();
    writer.write("second.txt", b"two").unwrap();
    writer.commit(json!({ "name": name, "n": 3 })).unwrap()
}

#[test]
fn a_committed_directory_reads_back_with_its_body_and_files() {
    let root = scratch("roundtrip");
    let dir = write_one(&root, "4", b"abcdef");
    assert_eq!(dir, root.join("4"));
    let checked = read_checked(&dir).unwrap();
    assert_eq!(checked.body["name"], "4");
    assert_eq!(checked.body["n"], 3);
    assert!(!checked.body.contains_key("files"), "files are taken out");
    let names: Vec<_> = checked.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["payload.bin", "second.txt"]);
    assert_eq!(checked.files[0].bytes, 6);
    assert_eq!(checked.file("payload.bin"), Some(dir.join("payload.bin")));
    assert_eq!(checked.file("absent"), None);
    // The manifest on disk is the envelope with the file list in the body.
    let text: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert!(text["checksum"].as_str().unwrap().starts_with("fnv1a64:"));
    assert_eq!(text["manifest"]["files"][1]["name"], "second.txt");
    assert_eq!(list(&root).unwrap().complete, ["4"]);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_file_that_was_cut_short_or_changed_or_removed_is_refused() {
    let root = scratch("damage");
    let dir = write_one(&root, "1", b"0123456789");
    std::fs::write(dir.join("payload.bin"), b"01234").unwrap();
    let error = read_checked(&dir).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Size {
                recorded: 10,
                found: 5,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("cut short"), "{error}");

    std::fs::write(dir.join("payload.bin"), b"0123456780").unwrap();
    let error = read_checked(&dir).unwrap_err();
    assert!(matches!(error, Error::FileChecksum { .. }), "{error}");

    std::fs::remove_file(dir.join("second.txt")).unwrap();
    std::fs::write(dir.join("payload.bin"), b"0123456789").unwrap();
    let error = read_checked(&dir).unwrap_err();
    assert!(matches!(error, Error::Missing { .. }), "{error}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn an_edited_or_torn_manifest_is_refused() {
    let root = scratch("manifest");
    let dir = write_one(&root, "2", b"x");
    let path = dir.join("manifest.json");
    let original = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, original.replace("\"n\": 3", "\"n\": 4")).unwrap();
    assert!(matches!(
        read_checked(&dir).unwrap_err(),
        Error::ManifestChecksum { .. }
    ));
    std::fs::write(&path, &original[..original.len() / 2]).unwrap();
    assert!(matches!(
        read_checked(&dir).unwrap_err(),
        Error::Manifest { .. }
    ));
    // A manifest that names a file outside the directory is refused before
    // anything is read.
    let mut envelope: serde_json::Value = serde_json::from_str(&original).unwrap();
    envelope["manifest"]["files"][0]["name"] = "../escape".into();
    let compact = serde_json::to_vec(&envelope["manifest"]).unwrap();
    envelope["checksum"] = format!("fnv1a64:{}", durable::fnv1a64_hex(&compact)).into();
    std::fs::write(&path, serde_json::to_vec(&envelope).unwrap()).unwrap();
    assert!(matches!(
        read_checked(&dir).unwrap_err(),
        Error::InvalidName { .. }
    ));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_crash_leaves_a_partial_folder_that_is_listed_and_cleared() {
    let root = scratch("partial");
    write_one(&root, "1", b"old");
    let mut writer = CheckpointWriter::begin(&root, "2").unwrap();
    writer.write("payload.bin", b"half").unwrap();
    // A crash: the writer is never committed nor dropped.
    std::mem::forget(writer);
    let listing = list(&root).unwrap();
    assert_eq!(listing.complete, ["1"]);
    assert_eq!(listing.partial, ["2"]);
    assert_eq!(remove_partial(&root).unwrap(), [".partial-2"]);
    assert_eq!(list(&root).unwrap().partial, Vec::<String>::new());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_writer_dropped_on_an_error_path_leaves_nothing() {
    let root = scratch("dropped");
    {
        let mut writer = CheckpointWriter::begin(&root, "3").unwrap();
        writer.write("payload.bin", b"x").unwrap();
    }
    assert_eq!(list(&root).unwrap(), durable::Listing::default());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_second_commit_of_a_name_replaces_the_first_whole() {
    let root = scratch("replace");
    write_one(&root, "5", b"first");
    let dir = write_one(&root, "5", b"second!");
    let checked = read_checked(&dir).unwrap();
    assert_eq!(checked.files[0].bytes, 7);
    assert_eq!(std::fs::read(dir.join("payload.bin")).unwrap(), b"second!");
    assert_eq!(
        list(&root).unwrap(),
        durable::Listing {
            complete: vec!["5".to_owned()],
            partial: Vec::new()
        }
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn bad_names_and_bodies_are_refused_with_typed_errors() {
    let root = scratch("names");
    for name in ["", ".hidden", "a/b", "a\\b"] {
        assert!(
            matches!(
                CheckpointWriter::begin(&root, name),
                Err(Error::InvalidName { .. })
            ),
            "{name:?}"
        );
    }
    let mut writer = CheckpointWriter::begin(&root, "6").unwrap();
    assert!(matches!(
        writer.write("manifest.json", b"x"),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        writer.write("../x", b"x"),
        Err(Error::InvalidName { .. })
    ));
    let error = CheckpointWriter::begin(&root, "7")
        .unwrap()
        .commit(json!({ "files": [] }))
        .unwrap_err();
    assert!(matches!(error, Error::Manifest { .. }), "{error}");
    let error = writer.commit(json!([1, 2])).unwrap_err();
    assert!(matches!(error, Error::Manifest { .. }), "{error}");
    assert_eq!(list(&root).unwrap(), durable::Listing::default());
    assert!(matches!(list(&root.join("absent")), Err(Error::Io { .. })));
    std::fs::remove_dir_all(&root).unwrap();
}
