//! Compiles the protobuf contracts with prost-build, parsing them with protox so
//! that no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/esper/leyline/v1/contracts.proto";
    println!("cargo:rerun-if-changed={proto}");
    let file_descriptors = protox::compile([proto], ["proto"])?;
    let mut config = prost_build::Config::new();
    config.type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]");
    config.btree_map(["."]);
    config.compile_fds(file_descriptors)?;
    Ok(())
}
