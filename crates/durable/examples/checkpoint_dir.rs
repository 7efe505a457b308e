//! Writes a checkpoint directory, reads it back, damages one file and shows
//! the error a reader gets.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::temp_dir().join(format!("durable-example-{}", std::process::id()));
    let mut writer = durable::CheckpointWriter::begin(&root, "epoch-4")?;
    writer.write("weights.bin", &[0, 1, 2, 3, 4, 5, 6, 7])?;
    let dir = writer.commit(serde_json::json!({ "format": "example", "epoch": 4 }))?;
    println!("wrote {}", dir.display());

    let checked = durable::read_checked(&dir)?;
    println!(
        "read back epoch {} with {} file(s): {:?}",
        checked.body["epoch"],
        checked.files.len(),
        checked.files
    );

    std::fs::write(dir.join("weights.bin"), [0, 1, 2, 3])?;
    match durable::read_checked(&dir) {
        Ok(_) => println!("unexpected: the damaged directory was accepted"),
        Err(error) => println!("after cutting weights.bin short: {error}"),
    }
    std::fs::remove_dir_all(&root)?;
    Ok(())
}
