//! `cargo xtask bundle`: the bench bundle for the GPU machine, which has no
//! Rust toolchain and no network. Release `esper` (every benchmark workload
//! runs through it), the GPU test binaries (xz-compressed as `tests.tar.xz`), the
//! Python peers, `scripts/bundle_run.sh` as `run.sh` and `scripts/bundle_study.sh`
//! as `study.sh` (a `simic-learning` run over several device calls), stripped, in the
//! git-ignored `bundle/` with the Fashion-MNIST files, under 60 MiB.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Largest bundle `cargo xtask bundle` accepts: the device carry limit is 64
/// MiB for the whole working tree (about 3.7 MB of sources), and the bundle
/// holds the gzipped Fashion-MNIST files (about 31 MB) beside the binaries.
const BUNDLE_LIMIT_BYTES: u64 = 60 * 1024 * 1024;

/// The GPU test binaries, xz-compressed (`run.sh` unpacks them into `tests/`).
const TESTS_ARCHIVE: &str = "tests.tar.xz";

/// GPU test targets carried in the bundle: (package, test target).
const BUNDLE_TESTS: &[(&str, &str)] = &[
    ("torch-ext", "gpu"),
    ("torch-ext", "gpu_dist"),
    ("tolaria", "gpu"),
    ("tolaria", "gpu_optim"),
    ("tolaria", "gpu_engine"),
    ("kasmina", "gpu_cuda"),
    ("tolaria", "data_dataset"),
    ("torch-ext", "device_select"),
    ("simic", "vectorized"),
    ("simic", "gpu"),
    ("simic", "driven_rounds"),
    ("tamiyo", "graphed"),
    ("tamiyo", "staged"),
];

/// `cargo xtask bundle`: release binaries, GPU test binaries, Python peers and
/// `run.sh` in the git-ignored `bundle/`, stripped, under 60 MiB.
pub(crate) fn run(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("`cargo xtask bundle` takes no arguments");
    }
    // Only this command's own entries are replaced: other tools may keep
    // their files in `bundle/` too.
    let bundle = root.join("bundle");
    let tests = bundle.join("tests");
    if tests.exists() {
        std::fs::remove_dir_all(&tests).with_context(|| format!("removing {}", tests.display()))?;
    }
    let packed = bundle.join(TESTS_ARCHIVE);
    // The gzipped archive of earlier bundles would ride along unused.
    let stale_gz = bundle.join("tests.tar.gz");
    if stale_gz.exists() {
        std::fs::remove_file(&stale_gz)
            .with_context(|| format!("removing {}", stale_gz.display()))?;
    }
    if packed.exists() {
        std::fs::remove_file(&packed).with_context(|| format!("removing {}", packed.display()))?;
    }
    std::fs::create_dir_all(&tests)?;
    crate::run_step(
        "cargo build --release -p esper",
        crate::cargo(root).args(["build", "--release", "-p", "esper", "--bin", "esper"]),
    )?;
    copy_stripped(&root.join("target/release/esper"), &bundle.join("esper"))?;
    // No examples: with the Fashion-MNIST files the bundle is at the carry
    // limit. A profiler on the GPU machine runs `esper bench tolaria-fmnist`
    // with one variant instead of the `train_fmnist` example.
    let stale = bundle.join("train_fmnist");
    if stale.exists() {
        std::fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    for (package, test) in BUNDLE_TESTS {
        match test_executable(root, package, test) {
            Ok(executable) => {
                let name = format!("{}_{test}", package.replace('-', "_"));
                copy_stripped(&executable, &bundle.join("tests").join(name))?;
            }
            Err(error) => eprintln!("==> bundle: no `{package}` test `{test}`: {error:#}"),
        }
    }
    // The test binaries compress to about a sixteenth with xz (12.2 MB
    // gzipped, 3.5 MB with xz), which leaves the bundle room under the carry
    // limit for the corpus beside Fashion-MNIST. `run.sh` unpacks them.
    crate::run_step(
        "tar cJf bundle/tests.tar.xz tests",
        Command::new("tar")
            .arg("cJf")
            .arg(&packed)
            .arg("-C")
            .arg(&bundle)
            .arg("tests"),
    )?;
    std::fs::remove_dir_all(&tests).with_context(|| format!("removing {}", tests.display()))?;
    // Every peer imports peer_common.py from its own folder: both go in,
    // or the bundle is not built.
    for peer in [
        "peer_common.py",
        "tolaria_reference.py",
        "tolaria_fmnist.py",
        "tolaria_lm.py",
    ] {
        let path = root.join("bench/python").join(peer);
        std::fs::copy(&path, bundle.join(peer))
            .with_context(|| format!("copying {} into the bundle", path.display()))?;
    }
    copy_fashion_mnist(&bundle)?;
    copy_corpus(&bundle)?;
    // The fake CIFAR-10 generator of the project's shared tools, when this
    // checkout sits beside them (`simic-cifar` generates its data with it on
    // the GPU machine).
    let fake_cifar = root.join("../shared/tools/make_fake_cifar.py");
    if fake_cifar.is_file() {
        std::fs::copy(&fake_cifar, bundle.join("make_fake_cifar.py"))?;
    }
    for (script, name) in [
        ("scripts/bundle_run.sh", "run.sh"),
        ("scripts/bundle_study.sh", "study.sh"),
    ] {
        let target = bundle.join(name);
        std::fs::copy(root.join(script), &target)?;
        set_executable(&target)?;
    }
    std::fs::write(
        bundle.join("GIT_REV"),
        format!("{}\n", crate::probe::git_rev(root)),
    )?;
    let total = folder_size(&bundle)?;
    eprintln!(
        "==> bundle: {} ({:.1} MB in all)",
        bundle.display(),
        total as f64 / 1e6
    );
    if total > BUNDLE_LIMIT_BYTES {
        bail!("bundle is {total} bytes, over the {BUNDLE_LIMIT_BYTES}-byte limit");
    }
    Ok(())
}

/// Copies the four gzipped Fashion-MNIST files (about 30 MB; the GPU machine
/// has no copy) into `bundle/data/fashion-mnist`, from
/// `$ESPER_FASHION_MNIST_DIR` or Debian's package folder; without them the
/// bundle's `tolaria-fmnist` runs on synthetic images of the real size.
fn copy_fashion_mnist(bundle: &Path) -> Result<()> {
    const FILES: [&str; 4] = [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ];
    let source = std::env::var_os("ESPER_FASHION_MNIST_DIR").map_or_else(
        || PathBuf::from("/usr/share/datasets/fashion-mnist"),
        PathBuf::from,
    );
    let target = bundle.join("data/fashion-mnist");
    if !FILES.iter().all(|file| source.join(file).exists()) {
        eprintln!(
            "==> bundle: no Fashion-MNIST in {} (tolaria-fmnist will use synthetic images)",
            source.display()
        );
        return Ok(());
    }
    std::fs::create_dir_all(&target)?;
    for file in FILES {
        std::fs::copy(source.join(file), target.join(file))
            .with_context(|| format!("copying {file}"))?;
    }
    Ok(())
}

/// Copies the text corpus of the language-model tasks (Debian's fortunes
/// files, about 2.4 MB; the GPU machine has no copy) into
/// `bundle/data/fortunes`, from `$ESPER_TEXT_CORPUS_DIR` or the package's
/// folder: the regular files without an extension, as the corpus reader
/// takes them. Without them the bundle's `tolaria-lm` runs on synthetic text.
fn copy_corpus(bundle: &Path) -> Result<()> {
    let source = std::env::var_os("ESPER_TEXT_CORPUS_DIR")
        .map_or_else(|| PathBuf::from("/usr/share/games/fortunes"), PathBuf::from);
    let Ok(entries) = std::fs::read_dir(&source) else {
        eprintln!(
            "==> bundle: no text corpus in {} (tolaria-lm will use synthetic text)",
            source.display()
        );
        return Ok(());
    };
    let target = bundle.join("data/fortunes");
    std::fs::create_dir_all(&target)?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if entry.file_type()?.is_file() && !hidden && path.extension().is_none() {
            std::fs::copy(&path, target.join(entry.file_name()))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Builds `package`'s test target `test` in release and returns its executable.
fn test_executable(root: &Path, package: &str, test: &str) -> Result<PathBuf> {
    let output = crate::cargo(root)
        .args([
            "test",
            "--release",
            "--no-run",
            "-p",
            package,
            "--test",
            test,
            "--message-format=json-render-diagnostics",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("building {package} test {test}"))?;
    if !output.status.success() {
        bail!("`cargo test --no-run -p {package} --test {test}` failed");
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == test
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no test executable")
}

fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    let stripped = Command::new("strip")
        .arg("--strip-all")
        .arg(to)
        .status()
        .is_ok_and(|status| status.success());
    if !stripped {
        eprintln!("==> bundle: could not strip {} (kept as is)", to.display());
    }
    Ok(())
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut permissions = std::fs::metadata(path)?.permissions();
    permissions.set_mode(0o755);
    std::fs::set_permissions(path, permissions)?;
    Ok(())
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<()> {
    Ok(())
}

fn folder_size(path: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        total += if metadata.is_dir() {
            folder_size(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_test_target_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the workspace");
        for (package, test) in BUNDLE_TESTS {
            let source = root
                .join("crates")
                .join(package)
                .join("tests")
                .join(format!("{test}.rs"));
            assert!(source.is_file(), "{} is missing", source.display());
        }
    }
}
