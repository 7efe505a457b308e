//! Architecture invariant: dependencies point down the crate list of
//! DESIGN.md §2 (leyline at the bottom), and leyline, nissa and xtask never
//! depend on tch. Read straight from every crate's `Cargo.toml`.

use std::path::{Path, PathBuf};

/// Crates from the bottom of the stack to the top (DESIGN.md §2).
const LAYERS: &[&str] = &[
    "leyline",
    "nissa",
    "torch-ext",
    "kasmina",
    "tolaria",
    "tamiyo",
    "simic",
    "esper",
];

/// Crates that must build without libtorch.
const TORCH_FREE: &[&str] = &["leyline", "nissa", "xtask"];

/// Crates that may depend on nothing of the workspace (tooling).
const TOOLING: &[&str] = &["xtask"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

struct Manifest {
    name: String,
    /// Names of every dependency (normal, dev and build).
    dependencies: Vec<String>,
}

fn read_manifest(path: &Path) -> Manifest {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: toml::Table =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = value["package"]["name"]
        .as_str()
        .expect("package.name")
        .to_owned();
    let mut dependencies = Vec::new();
    let mut collect = |table: Option<&toml::Value>| {
        if let Some(table) = table.and_then(toml::Value::as_table) {
            for (key, spec) in table {
                // `package = "..."` renames: the real crate is the package.
                let real = spec
                    .get("package")
                    .and_then(toml::Value::as_str)
                    .unwrap_or(key);
                dependencies.push(real.to_owned());
            }
        }
    };
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        collect(value.get(section));
    }
    if let Some(targets) = value.get("target").and_then(toml::Value::as_table) {
        for target in targets.values() {
            for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
                collect(target.get(section));
            }
        }
    }
    Manifest { name, dependencies }
}

fn all_manifests() -> Vec<Manifest> {
    let root = workspace_root();
    let mut manifests = vec![read_manifest(&root.join("xtask/Cargo.toml"))];
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/ exists")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.join("Cargo.toml").is_file())
        .collect();
    crate_dirs.sort();
    for dir in crate_dirs {
        let manifest = read_manifest(&dir.join("Cargo.toml"));
        let folder = dir.file_name().and_then(|name| name.to_str()).unwrap_or("");
        assert_eq!(
            manifest.name, folder,
            "crates/<folder> must be named as its crate"
        );
        manifests.push(manifest);
    }
    manifests
}

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == name)
}

/// Every violation in a set of manifests, as readable lines.
fn violations(manifests: &[Manifest]) -> Vec<String> {
    let mut problems = Vec::new();
    for manifest in manifests {
        let own_layer = layer_of(&manifest.name);
        if own_layer.is_none() && !TOOLING.contains(&manifest.name.as_str()) {
            problems.push(format!(
                "{} is not in the layer list of DESIGN.md §2",
                manifest.name
            ));
        }
        for dependency in &manifest.dependencies {
            if TORCH_FREE.contains(&manifest.name.as_str())
                && (dependency == "tch" || dependency == "torch-sys" || dependency == "torch-ext")
            {
                problems.push(format!("{} must not depend on {dependency}", manifest.name));
            }
            let Some(dependency_layer) = layer_of(dependency) else {
                continue;
            };
            match own_layer {
                Some(own) if dependency_layer >= own => problems.push(format!(
                    "{} depends on {dependency}, which is not below it",
                    manifest.name
                )),
                None if TOOLING.contains(&manifest.name.as_str()) => problems.push(format!(
                    "{} (tooling) must not depend on workspace crate {dependency}",
                    manifest.name
                )),
                _ => {}
            }
        }
    }
    problems
}

#[test]
fn dependencies_point_down_the_layer_list() {
    let manifests = all_manifests();
    assert!(manifests.iter().any(|m| m.name == "leyline"));
    let problems = violations(&manifests);
    assert!(
        problems.is_empty(),
        "layering violations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_catches_upward_and_torch_dependencies() {
    let bad = vec![
        Manifest {
            name: "leyline".to_owned(),
            dependencies: vec!["kasmina".to_owned()],
        },
        Manifest {
            name: "nissa".to_owned(),
            dependencies: vec!["tch".to_owned()],
        },
        Manifest {
            name: "kasmina".to_owned(),
            dependencies: vec!["kasmina".to_owned(), "leyline".to_owned()],
        },
        Manifest {
            name: "xtask".to_owned(),
            dependencies: vec!["tch".to_owned()],
        },
    ];
    let problems = violations(&bad);
    assert_eq!(problems.len(), 4, "{problems:#?}");
}
