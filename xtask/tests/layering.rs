//! Architecture invariant: dependencies point down the crate list of
//! DESIGN.md §2 (leyline at the bottom), and leyline, nissa and xtask never
//! depend on tch. Read straight from every crate's `Cargo.toml`; leyline's
//! sources are also scanned, so the contracts never read the environment,
//! run commands or touch files (machine probing is the `esper` binary's and
//! xtask's).

use std::path::{Path, PathBuf};

/// Crates from the bottom of the stack to the top (DESIGN.md §2).
/// `durable` (atomic files and checkpoint directories, no tch) sits below
/// them all, beside leyline.
const LAYERS: &[&str] = &[
    "durable",
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
const TORCH_FREE: &[&str] = &["durable", "leyline", "nissa", "xtask"];

/// Crates that may depend on nothing of the workspace (tooling) but the
/// torch-free foundations of [`TOOLING_MAY_USE`].
const TOOLING: &[&str] = &["xtask"];

/// Workspace crates tooling may use: `durable`, so that xtask's records are
/// written by the same atomic writer as every other record.
const TOOLING_MAY_USE: &[&str] = &["durable"];

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
    // A crate's tests may turn on its own features through a path
    // dev-dependency on itself (leyline's `testing`); that is no edge.
    if let Some(dev) = value
        .get("dev-dependencies")
        .and_then(toml::Value::as_table)
        && dev.contains_key(&name)
        && let Some(at) = dependencies
            .iter()
            .rposition(|dependency| *dependency == name)
    {
        dependencies.remove(at);
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
                None if TOOLING.contains(&manifest.name.as_str())
                    && !TOOLING_MAY_USE.contains(&dependency.as_str()) =>
                {
                    problems.push(format!(
                        "{} (tooling) must not depend on workspace crate {dependency}",
                        manifest.name
                    ))
                }
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

/// The workspace crates tamiyo may use: the ones below it that it needs
/// (contracts, the libtorch extensions, the model side, the trainer's
/// controller trait). Not nissa: like every producer it emits through
/// `leyline::Telemetry`.
const TAMIYO_MAY_USE: &[&str] = &["leyline", "torch-ext", "kasmina", "tolaria"];

#[test]
fn tamiyo_sits_above_tolaria_and_nothing_below_uses_it() {
    let manifests = all_manifests();
    let tamiyo = manifests
        .iter()
        .find(|manifest| manifest.name == "tamiyo")
        .expect("crate tamiyo");
    let workspace: Vec<&str> = manifests.iter().map(|m| m.name.as_str()).collect();
    let mut problems = Vec::new();
    for dependency in &tamiyo.dependencies {
        if workspace.contains(&dependency.as_str())
            && !TAMIYO_MAY_USE.contains(&dependency.as_str())
        {
            problems.push(format!(
                "tamiyo depends on {dependency}; it may use only {TAMIYO_MAY_USE:?}"
            ));
        }
    }
    let tamiyo_layer = layer_of("tamiyo").expect("tamiyo is in the layer list");
    for manifest in &manifests {
        let below = layer_of(&manifest.name).is_some_and(|layer| layer < tamiyo_layer)
            || TOOLING.contains(&manifest.name.as_str());
        if below && manifest.dependencies.iter().any(|dep| dep == "tamiyo") {
            problems.push(format!(
                "{} depends on tamiyo, which sits above it",
                manifest.name
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Dependencies a crate must not take although the layer order would allow
/// them, because what they serve is owned elsewhere: (crate, dependency, why).
const NOT_OWNED_HERE: &[(&str, &str, &str)] = &[(
    "kasmina",
    "flate2",
    "data sets (and their gzip readers) belong to tolaria::data",
)];

#[test]
fn crates_take_no_dependency_of_a_concern_they_do_not_own() {
    let manifests = all_manifests();
    let mut problems = Vec::new();
    for &(name, dependency, why) in NOT_OWNED_HERE {
        let manifest = manifests
            .iter()
            .find(|manifest| manifest.name == name)
            .unwrap_or_else(|| panic!("crate {name} not found"));
        if manifest.dependencies.iter().any(|dep| dep == dependency) {
            problems.push(format!("{name} depends on {dependency}: {why}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The Rust sources under `dir`, recursively.
fn rust_sources(dir: &Path) -> Vec<PathBuf> {
    let mut sources = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.filter_map(|entry| entry.ok().map(|entry| entry.path())) {
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                sources.push(path);
            }
        }
    }
    sources.sort();
    sources
}

#[test]
fn kasmina_is_the_model_side_and_holds_no_data_layer() {
    let src = workspace_root().join("crates/kasmina/src");
    for gone in ["data", "data.rs", "device.rs"] {
        assert!(
            !src.join(gone).exists(),
            "crates/kasmina/src/{gone}: data sets live in tolaria::data, device selection in \
             torch_ext::device"
        );
    }
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("kasmina's lib.rs");
    for line in lib.lines().map(str::trim) {
        assert!(
            !matches!(
                line,
                "pub mod data;" | "mod data;" | "pub mod device;" | "mod device;"
            ),
            "kasmina declares `{line}`"
        );
    }
    for path in rust_sources(&workspace_root().join("crates/kasmina")) {
        let text = std::fs::read_to_string(&path).expect("readable source");
        let code = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"));
        for line in code {
            assert!(
                !line.contains("tolaria::"),
                "{}: `{}`: kasmina must not reach the trainer side",
                path.display(),
                line.trim()
            );
        }
    }
}

/// Optimizer code kasmina's library must not hold: the trainer owns every
/// optimizer (`tolaria::optim`); kasmina exposes parameter groups and
/// records when one appears or goes.
const OPTIMIZER_CODE: &[&str] = &[
    "sgd_step",
    "adamw_step",
    "optimizer_step",
    "step_seed_optimizers",
    "reset_optimizer_state",
    "struct Sgd",
];

/// `(line number, pattern)` for each code line of `text` (comments skipped)
/// holding one of [`OPTIMIZER_CODE`].
fn optimizer_code(text: &str) -> Vec<(usize, &'static str)> {
    let code = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"));
    code.flat_map(|(index, line)| {
        OPTIMIZER_CODE
            .iter()
            .filter(move |pattern| line.contains(**pattern))
            .map(move |pattern| (index + 1, *pattern))
    })
    .collect()
}

#[test]
fn kasmina_holds_no_optimizer_and_exposes_parameter_groups() {
    let src = workspace_root().join("crates/kasmina/src");
    for gone in ["optim.rs", "optim"] {
        assert!(
            !src.join(gone).exists(),
            "crates/kasmina/src/{gone}: optimizers are the trainer's (tolaria::optim)"
        );
    }
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("kasmina's lib.rs");
    assert!(lib.lines().all(|line| !line.trim().ends_with("mod optim;")));
    let mut problems = Vec::new();
    for path in rust_sources(&src) {
        let text = std::fs::read_to_string(&path).expect("readable source");
        for (line, pattern) in optimizer_code(&text) {
            problems.push(format!("{}:{line}: `{pattern}`", path.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "optimizer code in kasmina:\n{}",
        problems.join("\n")
    );
    let model = std::fs::read_to_string(src.join("model.rs")).expect("kasmina's model.rs");
    for api in ["pub fn parameter_groups(", "pub fn drain_group_events("] {
        assert!(model.contains(api), "MorphogeneticModel lost `{api}`");
    }
    let sample = "// sgd_step in a comment\nfused::sgd_step(&p, &g, &b, lr)?;\n";
    assert_eq!(optimizer_code(sample), [(2, "sgd_step")], "the scan works");
}

#[test]
fn torch_ext_owns_the_one_device_selection() {
    let root = workspace_root();
    let device = std::fs::read_to_string(root.join("crates/torch-ext/src/device.rs"))
        .expect("crates/torch-ext/src/device.rs");
    assert!(device.contains("pub fn select(choice: DeviceChoice)"));
    assert!(device.contains("pub fn for_rank("));
    let mut problems = Vec::new();
    for path in rust_sources(&root.join("crates")) {
        let text = std::fs::read_to_string(&path).expect("readable source");
        for pattern in [
            "fn resolve_device",
            "fn cuda_if_available",
            "enum DeviceChoice",
        ] {
            if text.contains(pattern) && !path.ends_with("torch-ext/src/device.rs") {
                problems.push(format!("{}: `{pattern}`", path.display()));
            }
        }
        // A rank's device comes from `torch_ext::device::for_rank`.
        let in_torch_ext = path
            .components()
            .any(|part| part.as_os_str() == "torch-ext");
        if !in_torch_ext && text.contains("cuda::set_device(") {
            problems.push(format!("{}: `cuda::set_device(`", path.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "device selection outside torch_ext::device:\n{}",
        problems.join("\n")
    );
}

/// `(pattern, the one file allowed to hold it)`: things with one owner.
const ONE_OWNER: &[(&str, &str)] = &[
    ("struct SplitMix64", "leyline/src/rng.rs"),
    ("0xBF58_476D_1CE4_E5B9", "leyline/src/rng.rs"),
    ("trait TorchResultExt", "torch-ext/src/error.rs"),
    ("const SOURCE: &str = \"", "leyline/src/telemetry.rs"),
    ("0xcbf2_9ce4_8422_2325", "durable/src/checksum.rs"),
];

/// Files that may rename a file into place: durable's writers. Everything
/// else writes records and checkpoints through them.
const RENAME_OWNERS: &[&str] = &["durable/src/file.rs", "durable/src/dir.rs"];

#[test]
fn atomic_writes_have_one_owner() {
    let root = workspace_root();
    let mut problems = Vec::new();
    let mut sources = rust_sources(&root.join("crates"));
    sources.extend(rust_sources(&root.join("xtask").join("src")));
    for path in sources {
        if path.components().any(|part| part.as_os_str() == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        if text.contains("fs::rename(") && !RENAME_OWNERS.iter().any(|owner| path.ends_with(owner))
        {
            problems.push(format!("{}: `fs::rename(`", path.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "atomic writes outside durable:\n{}",
        problems.join("\n")
    );
}

#[test]
fn random_numbers_error_mapping_and_sources_have_one_owner() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for path in rust_sources(&root.join("crates")) {
        let text = std::fs::read_to_string(&path).expect("readable source");
        for &(pattern, owner) in ONE_OWNER {
            if text.contains(pattern) && !path.ends_with(owner) {
                problems.push(format!(
                    "{}: `{pattern}` (owned by {owner})",
                    path.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "a second owner:\n{}",
        problems.join("\n")
    );
}

/// What leyline's sources must not contain: contracts do not read the
/// environment, run commands, touch files or the network, or reach libtorch.
/// Machine probing and record writing live where records are written (the
/// `esper` binary, xtask).
const NOT_IN_CONTRACTS: &[&str] = &[
    "std::env",
    "env::var",
    "std::process",
    "Command::new",
    "std::fs",
    "std::net",
    "/proc/",
    "tch::",
    "torch_ext",
    "torch_sys",
];

/// `(line number, pattern)` for each code line of `text` (comments skipped)
/// holding one of [`NOT_IN_CONTRACTS`].
fn environment_uses(text: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for pattern in NOT_IN_CONTRACTS {
            if line.contains(pattern) {
                found.push((index + 1, *pattern));
            }
        }
    }
    found
}

#[test]
fn leyline_has_no_dependency_on_the_environment_or_tch() {
    let src = workspace_root().join("crates/leyline/src");
    let sources = rust_sources(&src);
    assert!(
        sources.len() > 5,
        "leyline sources not found under {}",
        src.display()
    );
    let mut problems = Vec::new();
    for path in sources {
        let text = std::fs::read_to_string(&path).expect("readable source");
        for (line, pattern) in environment_uses(&text) {
            problems.push(format!("{}:{line}: `{pattern}`", path.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "leyline keeps contracts only (probe the machine in esper or xtask):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_contract_scan_catches_probing_and_skips_comments() {
    let probing = "fn rev() -> String {\n    std::env::var(\"ESPER_GIT_REV\").unwrap_or_default()\n}\n\
                   fn cpu() -> String { std::fs::read_to_string(\"/proc/cpuinfo\").unwrap() }\n\
                   fn git() { std::process::Command::new(\"git\"); }\n\
                   fn device() -> tch::Device { tch::Device::Cpu }\n";
    let patterns: Vec<&str> = environment_uses(probing)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    for expected in [
        "std::env",
        "std::fs",
        "/proc/",
        "std::process",
        "Command::new",
        "tch::",
    ] {
        assert!(
            patterns.contains(&expected),
            "{expected} not caught: {patterns:?}"
        );
    }
    assert!(environment_uses("//! reads `std::env` nowhere\n// tch:: neither\n").is_empty());
    assert!(environment_uses("pub struct AdaptationCommand;\n").is_empty());
}

/// Names of emitting traits, handles and collectors that telemetry once had
/// outside leyline; none may be defined again (`leyline::emit` is the one way
/// out).
const RETIRED_TELEMETRY_TYPES: &[&str] = &[
    "TelemetryEmitter",
    "LifecycleTelemetry",
    "MemoryCollector",
    "TelemetryOut",
    "NullSink",
    "CollectingSink",
];

/// `(line number, what)` for each telemetry definition on a code line of
/// `text` (comments skipped): a trait whose name ends in `Emitter` or starts
/// with `TelemetryOut`, a `fn metric` constructor, or a type, trait or alias
/// named in [`RETIRED_TELEMETRY_TYPES`].
fn telemetry_definitions(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let words: Vec<&str> = code
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|word| !word.is_empty())
            .collect();
        for pair in words.windows(2) {
            let [keyword, name] = pair else { continue };
            let what = match *keyword {
                "trait" if name.ends_with("Emitter") || name.starts_with("TelemetryOut") => {
                    Some(format!("trait {name}"))
                }
                "fn" if *name == "metric" => Some("fn metric".to_owned()),
                "struct" | "enum" | "type" | "trait" if RETIRED_TELEMETRY_TYPES.contains(name) => {
                    Some(format!("{keyword} {name}"))
                }
                _ => None,
            };
            if let Some(what) = what {
                found.push((index + 1, what));
            }
        }
    }
    found
}

#[test]
fn telemetry_has_one_emitting_trait_and_one_metric_constructor_in_leyline() {
    let root = workspace_root();
    let mut found = Vec::new();
    for path in rust_sources(&root.join("crates")) {
        // Only library and binary sources; tests may define helper emitters.
        if !path.components().any(|part| part.as_os_str() == "src") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        let file = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        for (line, what) in telemetry_definitions(&text) {
            found.push((file.clone(), line, what));
        }
    }
    let kinds: Vec<(&str, &str)> = found
        .iter()
        .map(|(file, _, what)| (file.as_str(), what.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("crates/leyline/src/emit.rs", "trait Emitter"),
            ("crates/leyline/src/emit.rs", "fn metric"),
        ],
        "telemetry leaves every crate through leyline::emit (one Emitter trait, one Telemetry \
         handle, one metric constructor); found {found:#?}"
    );
}

#[test]
fn the_telemetry_scan_catches_second_emitters_and_skips_comments() {
    let second = "pub trait TelemetryOut: Send {\n\
                  pub trait TelemetryEmitter: Send + Sync {\n\
                  pub(crate) fn metric(name: &str, value: f64) -> TelemetryMetric {\n\
                  pub struct CollectingSink {\n\
                  pub type LifecycleTelemetry = leyline::Telemetry;\n";
    let found: Vec<String> = telemetry_definitions(second)
        .into_iter()
        .map(|(_, what)| what)
        .collect();
    assert_eq!(
        found,
        [
            "trait TelemetryOut",
            "trait TelemetryEmitter",
            "fn metric",
            "struct CollectingSink",
            "type LifecycleTelemetry",
        ]
    );
    assert!(telemetry_definitions("//! a `trait Emitter` elsewhere\n// fn metric(\n").is_empty());
    assert!(
        telemetry_definitions("impl leyline::Emitter for Hub {\nlet m = metric(n, v);\n")
            .is_empty()
    );
}

/// The normal (library) dependencies of `crates/<name>`, dev and build ones
/// left out.
fn library_dependencies(name: &str) -> Vec<String> {
    let path = workspace_root()
        .join("crates")
        .join(name)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: toml::Table =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    value
        .get("dependencies")
        .and_then(toml::Value::as_table)
        .map(|table| table.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn producers_emit_through_leyline_without_depending_on_nissa() {
    // Kasmina not at all (its tests use leyline::Collector); tolaria's
    // library neither (its tests may deliver to a hub).
    let kasmina = all_manifests()
        .into_iter()
        .find(|manifest| manifest.name == "kasmina")
        .expect("crate kasmina");
    assert!(
        !kasmina.dependencies.iter().any(|dep| dep == "nissa"),
        "kasmina depends on nissa: lifecycle telemetry leaves through leyline::Telemetry"
    );
    assert!(
        !library_dependencies("tolaria")
            .iter()
            .any(|dep| dep == "nissa"),
        "tolaria's library depends on nissa: the trainer emits through leyline::Telemetry"
    );
}

/// Tolaria's general modules: the engine and what it is built from. None of
/// them may use the special `tolaria-reference` path (`tolaria::reference`),
/// which sits beside the engine and uses it, never the other way round.
const TOLARIA_GENERAL: &[&str] = &[
    "engine",
    "amp",
    "data",
    "optim",
    "controller",
    "governor",
    "grad_agg",
    "seed_metrics",
];

/// How a tolaria source would name the reference path.
const REFERENCE_PATH: &[&str] = &[
    "crate::reference",
    "tolaria::reference",
    "super::super::reference",
];

/// `(line number, pattern)` for each code line of `text` (comments skipped)
/// that names the reference path.
fn reference_uses(text: &str) -> Vec<(usize, &'static str)> {
    let code = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"));
    code.flat_map(|(index, line)| {
        REFERENCE_PATH
            .iter()
            .filter(move |pattern| line.contains(**pattern))
            .map(move |pattern| (index + 1, *pattern))
    })
    .collect()
}

#[test]
fn tolaria_general_modules_do_not_use_the_reference_path() {
    let src = workspace_root().join("crates/tolaria/src");
    assert!(
        src.join("reference/mod.rs").is_file(),
        "the special path lives in crates/tolaria/src/reference/"
    );
    let mut problems = Vec::new();
    for module in TOLARIA_GENERAL {
        let mut sources = rust_sources(&src.join(module));
        let file = src.join(format!("{module}.rs"));
        if file.is_file() {
            sources.push(file);
        }
        assert!(
            !sources.is_empty(),
            "crates/tolaria/src/{module}: no sources found"
        );
        for path in sources {
            let text = std::fs::read_to_string(&path).expect("readable source");
            for (line, pattern) in reference_uses(&text) {
                problems.push(format!("{}:{line}: `{pattern}`", path.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "tolaria's general modules use the special reference path (it may use them, not the \
         other way round):\n{}",
        problems.join("\n")
    );
    let sample =
        "//! like `crate::reference::Trainer`\nuse crate::reference::config::TrainerConfig;\n";
    assert_eq!(
        reference_uses(sample),
        [(2, "crate::reference")],
        "the scan works"
    );
}

/// The library crates another team depends on, one by one.
const LIBRARY_CRATES: &[&str] = &[
    "durable",
    "leyline",
    "nissa",
    "torch-ext",
    "kasmina",
    "tolaria",
    "tamiyo",
    "simic",
];

#[test]
fn library_crates_carry_registry_metadata_and_say_what_a_dependent_needs() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for name in LIBRARY_CRATES {
        let folder = root.join("crates").join(name);
        let manifest = std::fs::read_to_string(folder.join("Cargo.toml")).expect("Cargo.toml");
        for key in [
            "description",
            "license",
            "repository",
            "readme",
            "keywords",
            "categories",
            "rust-version",
        ] {
            if !manifest
                .lines()
                .any(|line| line.trim_start().starts_with(key))
            {
                problems.push(format!("crates/{name}/Cargo.toml lacks `{key}`"));
            }
        }
        let readme = std::fs::read_to_string(folder.join("README.md")).unwrap_or_default();
        if !readme.contains("## Using it from another project") {
            problems.push(format!(
                "crates/{name}/README.md does not say what a dependent needs"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
