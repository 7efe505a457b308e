//! `cargo xtask bench`: builds release and runs the benchmark workloads.
//!
//! Each workload is one row of [`WORKLOADS`]: a release binary of some
//! package, invoked with `--out baselines/perf/<workload>/<label>.json
//! --label <label> [--quick]`. A workload whose binary does not build (yet)
//! is skipped with a note. `tolaria-reference` also runs the Python peers
//! (`bench/python/tolaria_reference.py`) when a python3 with torch is found,
//! merging their entries into the same record. After each workload a table
//! is printed; `--compare LABEL` adds before/after against a committed record.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// One benchmark workload: how to build and run it.
struct Workload {
    /// Record name (DESIGN.md §6).
    name: &'static str,
    /// Cargo package holding the binary.
    package: &'static str,
    /// Binary name.
    binary: &'static str,
    /// Arguments before `--out/--label/--quick`.
    args: &'static [&'static str],
    /// Python peer script (relative to the root) merged into the record.
    python_peers: Option<&'static str>,
}

/// The workloads, in run order. Adding one is one line.
const WORKLOADS: &[Workload] = &[
    Workload {
        name: "tolaria-reference",
        package: "esper",
        binary: "esper",
        args: &["bench", "tolaria-reference"],
        python_peers: Some("bench/python/tolaria_reference.py"),
    },
    Workload {
        name: "nissa-emit",
        package: "nissa",
        binary: "nissa-bench",
        args: &[],
        python_peers: None,
    },
    Workload {
        name: "kasmina-prefetch",
        package: "kasmina",
        binary: "kasmina-bench",
        args: &[],
        python_peers: None,
    },
];

/// Metric columns shown in tables when a record has them, in this order.
const TABLE_KEYS: &[(&str, &str)] = &[
    ("epoch_ms_p50", "p50 ms"),
    ("epoch_ms_p95", "p95 ms"),
    ("epoch_ms_max", "max ms"),
    ("replay_us_per_step", "replay us"),
    ("bare_replays_ms_p50", "bare ms"),
    ("capture_ms", "capture ms"),
    ("h2d_ms_p50", "h2d ms"),
    ("peak_device_memory_bytes", "peak bytes"),
];

/// Options of `cargo xtask bench`.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) label: Option<String>,
    pub(crate) workloads: Vec<String>,
    pub(crate) compare: Option<String>,
    pub(crate) quick: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str| -> Result<String> {
                match args.next() {
                    Some(value) => Ok(value.clone()),
                    None => bail!("{flag} needs a value"),
                }
            };
            match arg.as_str() {
                "--label" => options.label = Some(value("--label")?),
                "--workload" => options.workloads.push(value("--workload")?),
                "--compare" => options.compare = Some(value("--compare")?),
                "--quick" => options.quick = true,
                other => bail!("unknown bench option `{other}` (see `cargo xtask help`)"),
            }
        }
        for name in &options.workloads {
            if !WORKLOADS.iter().any(|workload| workload.name == name) {
                let known: Vec<&str> = WORKLOADS.iter().map(|workload| workload.name).collect();
                bail!("unknown workload `{name}` (known: {})", known.join(", "));
            }
        }
        Ok(options)
    }
}

pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    let started = std::time::Instant::now();
    let label = options.label.clone().unwrap_or_else(default_label);
    let git_rev = git_rev(root);
    let selected: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|workload| {
            options.workloads.is_empty()
                || options.workloads.iter().any(|name| name == workload.name)
        })
        .collect();
    let mut written = Vec::new();
    for workload in selected {
        eprintln!(
            "==> [{}] building {} (release)",
            workload.name, workload.binary
        );
        let built = crate::cargo(root)
            .args([
                "build",
                "--release",
                "-p",
                workload.package,
                "--bin",
                workload.binary,
            ])
            .status();
        if !matches!(built, Ok(status) if status.success()) {
            eprintln!(
                "==> [{}] skipped: `{}` of package `{}` does not build (yet)",
                workload.name, workload.binary, workload.package
            );
            continue;
        }
        let binary = root.join("target/release").join(workload.binary);
        let out = root
            .join("baselines/perf")
            .join(workload.name)
            .join(format!("{label}.json"));
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut command = Command::new(&binary);
        command
            .args(workload.args)
            .arg("--out")
            .arg(&out)
            .args(["--label", &label])
            .env("ESPER_GIT_REV", &git_rev)
            .current_dir(root);
        if options.quick {
            command.arg("--quick");
        }
        crate::run_step(
            &format!("[{}] {}", workload.name, binary.display()),
            &mut command,
        )?;
        if let Some(script) = workload.python_peers {
            run_python_peers(root, script, &out, options.quick)?;
        }
        let record = read_record(&out)?;
        print_table(&record);
        if let Some(before_label) = &options.compare {
            let before_path = out.with_file_name(format!("{before_label}.json"));
            match read_record(&before_path) {
                Ok(before) => print_comparison(&before, &record),
                Err(error) => eprintln!("==> no comparison: {error:#}"),
            }
        }
        written.push(out);
    }
    for path in &written {
        eprintln!("==> wrote {}", path.display());
    }
    eprintln!(
        "==> bench finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs the Python peers with a python that has torch (ESPER_BENCH_PYTHON,
/// then python3, then the provisioned venv), merging into `record`.
fn run_python_peers(root: &Path, script: &str, record: &Path, quick: bool) -> Result<()> {
    let Some(python) = python_with_torch(root) else {
        eprintln!("==> python peers skipped: no python3 with torch found");
        return Ok(());
    };
    let mut command = Command::new(&python);
    command
        .arg(root.join(script))
        .arg("--merge-into")
        .arg(record)
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(root);
    if quick {
        command.arg("--quick");
    }
    crate::run_step(
        &format!("python peers ({})", python.display()),
        &mut command,
    )
}

fn python_with_torch(root: &Path) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(python) = std::env::var("ESPER_BENCH_PYTHON") {
        candidates.push(PathBuf::from(python));
    }
    candidates.push(PathBuf::from("python3"));
    // The provisioned venv: `.esper-torch` is <venv>/lib/pythonX.Y/site-packages.
    if let Ok(site) = root.join(crate::provision::TORCH_LINK).canonicalize()
        && let Some(venv) = site.ancestors().nth(3)
    {
        candidates.push(venv.join("bin/python"));
    }
    candidates.into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import torch"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

fn default_label() -> String {
    let date = Command::new("date")
        .arg("+%F")
        .output()
        .ok()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .filter(|date| !date.is_empty())
        .unwrap_or_else(|| "undated".to_owned());
    let gpu = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|output| output.status.success());
    format!("{}-{date}", if gpu { "gpu" } else { "cpu" })
}

fn git_rev(root: &Path) -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |output| String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        )
}

fn read_record(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn entries(record: &Value) -> Vec<&Value> {
    record["results"]
        .as_array()
        .map(|results| results.iter().collect())
        .unwrap_or_default()
}

fn metric(entry: &Value, key: &str) -> Option<f64> {
    entry["metrics"][key].as_f64()
}

fn format_metric(key: &str, value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(value) if key.ends_with("_bytes") => format!("{value:.0}"),
        Some(value) => format!("{value:.4}"),
    }
}

/// Columns of [`TABLE_KEYS`] present in the record, or its first metrics.
fn columns(record: &Value) -> Vec<(String, String)> {
    let present = |key: &str| {
        entries(record)
            .iter()
            .any(|entry| metric(entry, key).is_some())
    };
    let mut columns: Vec<(String, String)> = TABLE_KEYS
        .iter()
        .filter(|(key, _)| present(key))
        .map(|(key, title)| ((*key).to_owned(), (*title).to_owned()))
        .collect();
    if columns.is_empty()
        && let Some(metrics) = entries(record)
            .iter()
            .find_map(|entry| entry["metrics"].as_object())
    {
        columns = metrics
            .keys()
            .take(6)
            .map(|key| (key.clone(), key.clone()))
            .collect();
    }
    columns
}

fn print_table(record: &Value) {
    let columns = columns(record);
    println!();
    println!(
        "{} on {} (label {}, rev {})",
        record["workload"].as_str().unwrap_or("?"),
        record["environment"]["device"].as_str().unwrap_or("?"),
        record["label"].as_str().unwrap_or("?"),
        record["environment"]["git_rev"].as_str().unwrap_or("?"),
    );
    let mut header = format!("{:<7} {:<24}", "impl", "mode");
    for (_, title) in &columns {
        header.push_str(&format!(" {title:>11}"));
    }
    println!("{header}");
    for entry in entries(record) {
        let mut line = format!(
            "{:<7} {:<24}",
            entry["impl"].as_str().unwrap_or("?"),
            entry["mode"].as_str().unwrap_or("?")
        );
        if let Some(error) = entry["error"].as_str() {
            let first_line = error.lines().next().unwrap_or("");
            line.push_str(&format!(
                " error: {}",
                first_line.chars().take(90).collect::<String>()
            ));
        } else {
            for (key, _) in &columns {
                line.push_str(&format!(" {:>11}", format_metric(key, metric(entry, key))));
            }
        }
        println!("{line}");
    }
}

fn print_comparison(before: &Value, after: &Value) {
    let columns = columns(after);
    println!();
    println!(
        "before {} (rev {}) -> after {} (rev {}), after/before in parentheses",
        before["label"].as_str().unwrap_or("?"),
        before["environment"]["git_rev"].as_str().unwrap_or("?"),
        after["label"].as_str().unwrap_or("?"),
        after["environment"]["git_rev"].as_str().unwrap_or("?"),
    );
    for entry in entries(after) {
        let (implementation, mode) = (
            entry["impl"].as_str().unwrap_or("?"),
            entry["mode"].as_str().unwrap_or("?"),
        );
        let Some(old) = entries(before).into_iter().find(|old| {
            old["impl"].as_str() == Some(implementation) && old["mode"].as_str() == Some(mode)
        }) else {
            println!("{implementation:<7} {mode:<24} (new)");
            continue;
        };
        let mut line = format!("{implementation:<7} {mode:<24}");
        if let Some(error) = entry["error"].as_str().or(old["error"].as_str()) {
            let first_line = error.lines().next().unwrap_or("");
            line.push_str(&format!(
                " (error: {})",
                first_line.chars().take(80).collect::<String>()
            ));
        }
        for (key, title) in &columns {
            if let (Some(was), Some(now)) = (metric(old, key), metric(entry, key)) {
                let ratio = if was == 0.0 { f64::NAN } else { now / was };
                line.push_str(&format!(
                    " {title}: {} -> {} ({ratio:.2}x);",
                    format_metric(key, Some(was)),
                    format_metric(key, Some(now))
                ));
            }
        }
        println!("{line}");
    }
}

/// Largest bundle `cargo xtask bundle` accepts (the device carry limit is 64 MiB
/// for the whole working tree).
const BUNDLE_LIMIT_BYTES: u64 = 40 * 1024 * 1024;

/// GPU test targets carried in the bundle: (package, test target).
const BUNDLE_TESTS: &[(&str, &str)] = &[
    ("torch-ext", "gpu"),
    ("tolaria", "gpu"),
    ("kasmina", "gpu_cuda"),
    ("tolaria", "data_dataset"),
];

/// `cargo xtask bundle`: release binaries, GPU test binaries, Python peers and
/// `run.sh` in the git-ignored `bundle/`, stripped, under 40 MB.
pub(crate) fn bundle(root: &Path, args: &[String]) -> Result<()> {
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
    std::fs::create_dir_all(&tests)?;
    crate::run_step(
        "cargo build --release -p esper",
        crate::cargo(root).args(["build", "--release", "-p", "esper", "--bin", "esper"]),
    )?;
    copy_stripped(&root.join("target/release/esper"), &bundle.join("esper"))?;
    for (package, test) in BUNDLE_TESTS {
        match test_executable(root, package, test) {
            Ok(executable) => {
                let name = format!("{}_{test}", package.replace('-', "_"));
                copy_stripped(&executable, &bundle.join("tests").join(name))?;
            }
            Err(error) => eprintln!("==> bundle: no `{package}` test `{test}`: {error:#}"),
        }
    }
    std::fs::copy(
        root.join("bench/python/tolaria_reference.py"),
        bundle.join("tolaria_reference.py"),
    )?;
    let run_script = bundle.join("run.sh");
    std::fs::copy(root.join("scripts/bundle_run.sh"), &run_script)?;
    set_executable(&run_script)?;
    std::fs::write(bundle.join("GIT_REV"), format!("{}\n", git_rev(root)))?;
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

    fn parse(args: &[&str]) -> Result<Options> {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        Options::parse(&args)
    }

    #[test]
    fn options_parse_known_flags() {
        let options = parse(&[
            "--label",
            "x",
            "--workload",
            "nissa-emit",
            "--compare",
            "y",
            "--quick",
        ])
        .expect("valid options");
        assert_eq!(options.label.as_deref(), Some("x"));
        assert_eq!(options.workloads, ["nissa-emit"]);
        assert_eq!(options.compare.as_deref(), Some("y"));
        assert!(options.quick);
    }

    #[test]
    fn options_reject_unknown_flags_workloads_and_missing_values() {
        for (args, expected) in [
            (&["--fast"][..], "unknown bench option"),
            (&["--workload", "simic-everything"], "unknown workload"),
            (&["--label"], "--label needs a value"),
        ] {
            let error = parse(args).err().map(|error| error.to_string());
            assert!(
                error.as_deref().is_some_and(|text| text.contains(expected)),
                "{args:?}: {error:?}"
            );
        }
    }

    #[test]
    fn every_workload_has_a_distinct_name() {
        let mut names: Vec<&str> = WORKLOADS.iter().map(|workload| workload.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), WORKLOADS.len());
    }
}
