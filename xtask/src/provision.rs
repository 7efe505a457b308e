//! Provisioning: libtorch 2.11.0 from PyPI into a venv outside the repository,
//! a git-ignored link to it inside the repository, and the Debian packages the
//! project needs. Idempotent; a provisioned machine passes the check in a few
//! milliseconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// libtorch version tch 0.24 requires.
pub(crate) const TORCH_VERSION: &str = "2.11.0";

/// What pip installs: torch plus the CUDA header packages the C++ shim needs.
const PIP_REQUIREMENTS: &[&str] = &[
    "torch==2.11.0",
    "nvidia-cuda-cccl==13.0.85.*",
    "nvidia-cuda-crt==13.0.88.*",
];

/// Debian packages: the Fashion-MNIST data set, promtool, the English text of
/// the language-model task (`fortunes`), and `xz` (`cargo xtask bundle`
/// packs the GPU test binaries with it; not in every minimal image).
pub(crate) const APT_PACKAGES: &[&str] = &[
    "dataset-fashion-mnist",
    "prometheus",
    "fortunes",
    "xz-utils",
];

/// Git-ignored link in the repository root to the venv's site-packages.
pub(crate) const TORCH_LINK: &str = ".esper-torch";

/// Stamp written into site-packages once the install is verified.
const STAMP_FILE: &str = ".esper-provisioned";

fn stamp_contents() -> String {
    format!("torch {TORCH_VERSION}\n{}\n", PIP_REQUIREMENTS.join("\n"))
}

/// Makes sure libtorch and the system packages are in place.
pub(crate) fn ensure(root: &Path) -> Result<()> {
    ensure_torch(root)?;
    ensure_apt_packages()?;
    Ok(())
}

fn ensure_torch(root: &Path) -> Result<()> {
    let link = root.join(TORCH_LINK);
    if std::fs::read_to_string(link.join(STAMP_FILE)).is_ok_and(|stamp| stamp == stamp_contents()) {
        return Ok(());
    }
    let venv = venv_dir()?;
    eprintln!(
        "==> provisioning libtorch {TORCH_VERSION} into {} (first run: about 2.8 GB and 5 minutes)",
        venv.display()
    );
    let venv_python = venv.join("bin/python");
    if !venv_python.exists() {
        create_venv(&venv)?;
    }
    pip_install(&venv_python)?;
    let site_packages = verify_torch(&venv_python)?;
    durable::write_file(&site_packages.join(STAMP_FILE), stamp_contents().as_bytes())
        .with_context(|| format!("cannot write the stamp in {}", site_packages.display()))?;
    replace_link(&link, &site_packages)?;
    eprintln!(
        "==> libtorch ready: {} -> {}",
        TORCH_LINK,
        site_packages.display()
    );
    Ok(())
}

fn venv_dir() -> Result<PathBuf> {
    let cache = if let Some(dir) = std::env::var_os("ESPER_CACHE_DIR") {
        PathBuf::from(dir)
    } else if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(dir).join("esper-rs")
    } else if let Some(home) = std::env::var_os("HOME") {
        PathBuf::from(home).join(".cache/esper-rs")
    } else {
        bail!(
            "cannot choose a cache directory for libtorch: neither ESPER_CACHE_DIR, XDG_CACHE_HOME \
             nor HOME is set. Set ESPER_CACHE_DIR to a folder with about 3 GB free and run again."
        );
    };
    Ok(cache.join(format!("torch-{TORCH_VERSION}")))
}

fn create_venv(venv: &Path) -> Result<()> {
    let python = std::env::var("ESPER_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let version = Command::new(&python).arg("--version").output();
    if !version.as_ref().is_ok_and(|output| output.status.success()) {
        bail!(
            "Python 3 is needed once, to install libtorch {TORCH_VERSION} from PyPI, but `{python}` \
             could not be run. Install Python 3.10 or newer with venv and pip (on Debian: \
             `apt-get install python3 python3-venv python3-pip`), or point ESPER_PYTHON at one, \
             then run this command again."
        );
    }
    if let Some(parent) = venv.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let status = Command::new(&python)
        .args(["-m", "venv"])
        .arg(venv)
        .status()
        .with_context(|| format!("cannot run `{python} -m venv`"))?;
    if !status.success() {
        bail!(
            "`{python} -m venv {}` failed. On Debian the venv module is a separate package: \
             `apt-get install python3-venv`. Then run this command again.",
            venv.display()
        );
    }
    Ok(())
}

fn pip_install(venv_python: &Path) -> Result<()> {
    let status = Command::new(venv_python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "on",
        ])
        .args(PIP_REQUIREMENTS)
        .status()
        .with_context(|| format!("cannot run pip from {}", venv_python.display()))?;
    if !status.success() {
        bail!(
            "pip could not install {}. This step needs the PyPI registry (about 2.8 GB of \
             downloads) and about 5 GB of free disk in the cache directory. Check the network \
             and disk, or set ESPER_CACHE_DIR to a folder with room, then run this command again; \
             it resumes where it stopped.",
            PIP_REQUIREMENTS.join(" ")
        );
    }
    Ok(())
}

/// Checks the installed torch version and returns the venv's site-packages.
fn verify_torch(venv_python: &Path) -> Result<PathBuf> {
    let output = Command::new(venv_python)
        .args([
            "-c",
            "import os, torch; print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))",
        ])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", venv_python.display()))?;
    if !output.status.success() {
        bail!(
            "torch was installed but cannot be imported by {}. Delete that venv and run this \
             command again to reinstall it.",
            venv_python.display()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let version = lines.next().unwrap_or_default().trim().to_owned();
    let site_packages = PathBuf::from(lines.next().unwrap_or_default().trim());
    let base_version = version.split('+').next().unwrap_or_default();
    if base_version != TORCH_VERSION {
        bail!(
            "the venv has torch {version}, but tch 0.24 needs libtorch {TORCH_VERSION} exactly. \
             Delete the venv ({}) and run this command again, or install torch=={TORCH_VERSION} \
             into it yourself.",
            venv_python
                .parent()
                .and_then(Path::parent)
                .map(|venv| venv.display().to_string())
                .unwrap_or_default()
        );
    }
    if !site_packages.join("torch/lib").is_dir() {
        bail!(
            "torch {version} has no lib folder under {}; the install is incomplete. Delete the \
             venv and run this command again.",
            site_packages.display()
        );
    }
    Ok(site_packages)
}

fn replace_link(link: &Path, target: &Path) -> Result<()> {
    match std::fs::symlink_metadata(link) {
        Ok(metadata) if metadata.is_dir() && !metadata.file_type().is_symlink() => bail!(
            "{} is a real folder, not the link provisioning manages; move it away and run again",
            link.display()
        ),
        Ok(_) => std::fs::remove_file(link)
            .with_context(|| format!("cannot replace {}", link.display()))?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} -> {}", link.display(), target.display()))
}

/// Installs missing Debian packages (idempotent; a no-op when all are there).
fn ensure_apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|package| !dpkg_installed(package))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if Command::new("apt-get")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        bail!(
            "the Debian packages {} are needed (the Fashion-MNIST data set and promtool), but \
             apt-get is not available here. Install them with your system's package manager, \
             then run this command again.",
            missing.join(" ")
        );
    }
    let as_root = is_root();
    let sudo = !as_root
        && Command::new("sudo")
            .arg("-n")
            .arg("true")
            .status()
            .is_ok_and(|s| s.success());
    if !as_root && !sudo {
        bail!(
            "the Debian packages {} are needed, and installing them needs root. Run \
             `sudo apt-get update && sudo apt-get install -y {}` once, then run this command again.",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("==> installing Debian packages: {}", missing.join(" "));
    let apt = |args: &[&str]| -> Result<()> {
        let mut command = if sudo {
            let mut command = Command::new("sudo");
            command.args(["-n", "apt-get"]);
            command
        } else {
            Command::new("apt-get")
        };
        command.env("DEBIAN_FRONTEND", "noninteractive").args(args);
        let status = command.status().context("cannot run apt-get")?;
        if !status.success() {
            bail!(
                "`apt-get {}` failed. The Debian package registry must be reachable; fix that \
                 and run this command again.",
                args.join(" ")
            );
        }
        Ok(())
    };
    apt(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(missing.iter().copied());
    apt(&install)?;
    Ok(())
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|output| {
            output.status.success()
                && String::from_utf8_lossy(&output.stdout).contains("ok installed")
        })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}
