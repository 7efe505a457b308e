//! The dependent team's view, checked by `cargo xtask test`:
//!
//! 1. `cargo package --list` succeeds for every library crate (the metadata
//!    a registry needs is there and the package's files are found);
//! 2. a small project outside the workspace (`xtask/consumer`: its
//!    `Cargo.toml.in` and `src/main.rs`, copied into a temporary folder
//!    outside the repository, so this repository's `.cargo/config.toml`
//!    does not apply) depends on `leyline`, `kasmina` and `tolaria` by path
//!    and runs their READMEs' examples, built with exactly what the crates'
//!    READMEs tell a dependent to provide: `LIBTORCH` (the torch wheel's
//!    `torch` folder), `LIBTORCH_CXX11_ABI=1`, and an rpath to libtorch's
//!    and the CUDA runtime's libraries. Its build folder is
//!    `target/consumer`, apart from the workspace's (other flags).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::{provision, run_step};

/// Every library crate (the `esper` binary and xtask are not published).
pub(crate) const LIBRARY_CRATES: &[&str] = &[
    "durable",
    "leyline",
    "nissa",
    "torch-ext",
    "kasmina",
    "tolaria",
    "tamiyo",
    "simic",
];

/// `cargo package --list` for every library crate.
pub(crate) fn check_packages(root: &Path) -> Result<()> {
    for name in LIBRARY_CRATES {
        run_step(
            &format!("cargo package --list -p {name}"),
            crate::cargo(root)
                .args(["package", "--list", "--allow-dirty", "-p", name])
                .stdout(std::process::Stdio::null()),
        )?;
    }
    Ok(())
}

/// Builds and runs the consumer project (see the module docs).
pub(crate) fn run_consumer(root: &Path) -> Result<()> {
    let source = root.join("xtask").join("consumer");
    let folder = std::env::temp_dir().join(format!("esper-consumer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(folder.join("src"))
        .with_context(|| format!("creating {}", folder.display()))?;
    let crates = root.join("crates");
    let manifest = std::fs::read_to_string(source.join("Cargo.toml.in"))
        .context("reading xtask/consumer/Cargo.toml.in")?
        .replace("@CRATES@", &crates.to_string_lossy());
    durable::write_file(&folder.join("Cargo.toml"), manifest.as_bytes())?;
    std::fs::copy(
        source.join("src").join("main.rs"),
        folder.join("src").join("main.rs"),
    )
    .context("copying the consumer's main.rs")?;
    // The workspace's lock file pins the same versions the crates are
    // tested with.
    std::fs::copy(root.join("Cargo.lock"), folder.join("Cargo.lock"))
        .context("copying Cargo.lock")?;
    let site: PathBuf = std::fs::canonicalize(root.join(provision::TORCH_LINK))
        .context("the provisioned libtorch (run `cargo xtask provision`)")?;
    let torch = site.join("torch");
    let rpath = format!(
        "-C link-arg=-Wl,-rpath,{}:{}",
        torch.join("lib").display(),
        site.join("nvidia").join("cu13").join("lib").display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = std::process::Command::new(cargo);
    command
        .current_dir(&folder)
        .args(["run", "--quiet"])
        .env("LIBTORCH", &torch)
        .env("LIBTORCH_CXX11_ABI", "1")
        .env("RUSTFLAGS", rpath)
        .env("CARGO_TARGET_DIR", root.join("target").join("consumer"))
        // Line tables only, as the workspace's debug builds: full debug
        // information changes nothing checked (1.1 GB of target/consumer
        // with line tables, 1.2 GB without, measured on a fresh clone).
        .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
        // Nothing of this workspace's cargo settings may leak in.
        .env_remove("ESPER_TORCH_SITE")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    let result = run_step(
        "a project outside the workspace depends on leyline, kasmina and tolaria",
        &mut command,
    );
    let _ = std::fs::remove_dir_all(&folder);
    result
}
