//! Compiles the protobuf contracts with prost-build, parsing them with protox so
//! that no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/esper/leyline/v1/contracts.proto";
    println!("cargo:rerun-if-changed={proto}");
    let file_descriptors = protox::compile([proto], ["proto"])?;
    let mut config = prost_build::Config::new();
    // Every JSON key must name a field: a misspelt key is an error naming it,
    // never a field silently left at its default. (The contracts have no
    // oneofs and no flattened fields, so the attribute applies to all.)
    config.type_attribute(
        ".",
        "#[derive(serde::Serialize, serde::Deserialize)]\n#[serde(deny_unknown_fields)]",
    );
    config.btree_map(["."]);
    config.compile_fds(file_descriptors)?;
    Ok(())
}
