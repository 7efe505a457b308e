//! `esper train --controller ppo --nproc 2` on the CPU: two processes with
//! Gloo train PPO updates and end with bit-identical policies (each rank
//! prints its policy's fingerprint); killing one rank makes the run stop
//! with an error naming it well within the stated collective timeout, and
//! the newest checkpoint stays whole; a rank that hangs (SIGSTOP) ends the
//! job at the collective timeout (`ESPER_DIST_TIMEOUT_S`) with the hung rank
//! named. The same job
//! started as two "nodes" the way torchrun (`RANK`, `WORLD_SIZE`, ...) or
//! Slurm's srun (`SLURM_PROCID`, `SLURM_NTASKS`, ...) would start it trains
//! the same policy, bit for bit. A two-rank run cut back to an older
//! checkpoint resumes, under esper's launcher and started as torchrun
//! would, to the uninterrupted run's policy; resumed as one process it is
//! refused and nothing changes. With the provisioned venv's real torchrun:
//! two torchrun invocations as nodes 0 and 1 train the same policy, and
//! the scaling bench's `--torchrun` entries run. `simic-growth --gpus 1,2`
//! on two CPU ranks (CIFAR-10 files the test writes) drives seeds in every
//! rank and sums the ranks into one record.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::free_port;

const ESPER: &str = env!("CARGO_BIN_EXE_esper");

/// The collective timeout `esper train` states (`train::ranks::DIST_TIMEOUT`).
const STATED_TIMEOUT: Duration = Duration::from_secs(120);

fn ppo_args(run_dir: &Path, rounds: &str) -> Vec<String> {
    [
        "train",
        "--controller",
        "ppo",
        "--task",
        "synthetic",
        "--train-samples",
        "256",
        "--epochs",
        "2",
        "--envs",
        "2",
        "--rounds",
        rounds,
        "--batch-size",
        "64",
        "--slots",
        "r0c0,r0c1,r0c2",
        "--device",
        "cpu",
        "--nproc",
        "2",
        "--run-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([run_dir.to_str().expect("utf-8 path").to_owned()])
    .collect()
}

#[test]
fn two_cpu_ranks_end_with_one_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let output = Command::new(ESPER)
        .args(ppo_args(&run_dir, "2"))
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let fingerprint = |rank: usize| -> String {
        let prefix = format!("rank {rank} of 2: policy fingerprint ");
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no fingerprint of rank {rank}: {stdout}"))
            .to_owned()
    };
    assert_eq!(fingerprint(0), fingerprint(1), "the ranks' policies differ");
    // Rank 0 alone wrote the run: one line per round, the policy.
    let rounds = std::fs::read_to_string(run_dir.join("rounds.jsonl")).expect("rounds.jsonl");
    assert_eq!(rounds.lines().count(), 2, "{rounds}");
    assert!(run_dir.join("policy.safetensors").is_file());
    assert!(stdout.contains("round 2/2: reward"), "{stdout}");
}

/// Runs a long two-rank PPO run with a checkpoint every round (and `env`),
/// sends rank 1 `signal` once rank 0 has written its first round, and
/// returns how the run ended, how long after the signal, and the
/// launcher's stderr from then on.
fn signal_rank_1(
    run_dir: &Path,
    env: &[(&str, String)],
    signal: &str,
) -> (std::process::ExitStatus, Duration, String) {
    let mut args = ppo_args(run_dir, "200");
    args.extend(["--checkpoint-every".to_owned(), "1".to_owned()]);
    let mut child = Command::new(ESPER)
        .args(&args)
        .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("esper starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let rank1 = lines
        .by_ref()
        .map(|line| line.expect("stderr line"))
        .find_map(|line| {
            line.strip_prefix("rank 1/2: pid ")
                .map(|pid| pid.trim().parse::<i32>().expect("pid"))
        })
        .expect("the launcher names rank 1's pid");
    // Past the rendezvous: rank 0 has written its first round.
    let rounds = run_dir.join("rounds.jsonl");
    let start = Instant::now();
    while std::fs::read_to_string(&rounds).map_or(0, |t| t.lines().count()) < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no round was written"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = Command::new("kill")
        .args([signal, &rank1.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let signalled = Instant::now();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let exit = child.wait().expect("esper exits");
    (exit, signalled.elapsed(), rest.join("\n"))
}

/// The run's whole checkpoints (`round-*`), oldest first.
fn checkpoints(run_dir: &Path) -> Vec<std::path::PathBuf> {
    let mut saved: Vec<_> = std::fs::read_dir(run_dir.join("checkpoints"))
        .expect("checkpoints")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("round-"))
        })
        .collect();
    saved.sort();
    saved
}

#[test]
fn a_killed_rank_stops_the_run_with_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let (exit, took, rest) = signal_rank_1(&run_dir, &[], "-9");
    assert!(!exit.success(), "the run went on without rank 1");
    assert!(took < STATED_TIMEOUT, "stopped after {took:?}");
    assert!(rest.contains("rank 1 of 2 failed"), "{rest}");
    println!("stopped {took:?} after the kill:\n{rest}");
    // The newest whole checkpoint verifies and carries both ranks'
    // generators (a `.partial-` folder, if rank 0 was stopped while
    // writing, is what `--resume` reports and clears).
    let saved = checkpoints(&run_dir);
    let newest = saved.last().expect("a checkpoint before the kill");
    let checkpoint = simic::checkpoint::read_checkpoint(newest).expect("the newest verifies");
    assert_eq!(checkpoint.state.rank_rngs.len(), 2);
}

#[test]
fn a_hung_rank_ends_the_job_at_the_stated_timeout_and_is_named() {
    // A short collective timeout for the drill (the default is 120 s).
    const TIMEOUT_S: u64 = 15;
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    // Rank 1 hangs: alive, holding its connections, answering nothing.
    let (exit, took, rest) = signal_rank_1(
        &run_dir,
        &[("ESPER_DIST_TIMEOUT_S", TIMEOUT_S.to_string())],
        "-STOP",
    );
    assert!(!exit.success(), "the run went on without rank 1");
    // The timeout, the launcher's grace, and room for a round and a slow
    // machine.
    let bound = Duration::from_secs(TIMEOUT_S + 10 + 45);
    assert!(took < bound, "stopped after {took:?}");
    assert!(rest.contains("rank 1 did not stop"), "{rest}");
    println!("stopped {took:?} after rank 1 hung:\n{rest}");
    let saved = checkpoints(&run_dir);
    let newest = saved.last().expect("a checkpoint before the hang");
    simic::checkpoint::read_checkpoint(newest).expect("the newest verifies");
}

#[test]
fn a_bad_collective_timeout_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["0", "-3", "ten", "86401"] {
        let output = Command::new(ESPER)
            .args(ppo_args(&dir.path().join("run"), "1"))
            .env("ESPER_DIST_TIMEOUT_S", bad)
            .stdin(Stdio::null())
            .output()
            .expect("esper runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{bad}: {stderr}");
        assert!(stderr.contains("ESPER_DIST_TIMEOUT_S"), "{bad}: {stderr}");
    }
}

#[test]
fn devices_name_devices_and_do_not_combine_with_nproc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |extra: &[&str]| {
        let mut args: Vec<String> = ppo_args(&dir.path().join("run"), "1");
        let at = args.iter().position(|a| a == "--nproc").expect("--nproc");
        args.drain(at..at + 2);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Command::new(ESPER)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("esper runs")
    };
    let bad = run(&["--devices", "gpu0"]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("\"gpu0\" is not cpu or cuda:N"), "{stderr}");
    let both = run(&["--devices", "cpu,cpu", "--nproc", "2"]);
    assert!(!both.status.success());
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(stderr.contains("use one or the other"), "{stderr}");
}

/// Runs `ppo_args` without `--nproc` as two processes, each given `env(rank)`
/// as a launcher on its own node would, and returns each rank's policy
/// fingerprint.
fn two_nodes(run_dir: &Path, env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<String> {
    let mut args = ppo_args(run_dir, "2");
    let at = args
        .iter()
        .position(|arg| arg == "--nproc")
        .expect("--nproc");
    args.drain(at..at + 2);
    two_nodes_running(&args, env)
}

/// Runs `esper <args>` as two processes, each given `env(rank)`, and
/// returns each rank's policy fingerprint.
fn two_nodes_running(args: &[String], env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<String> {
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(ESPER)
                .args(args)
                .envs(env(rank))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a rank starts")
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let output = child.wait_with_output().expect("the rank ends");
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                output.status.success(),
                "rank {rank}: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let prefix = format!("rank {rank} of 2: policy fingerprint ");
            stdout
                .lines()
                .find_map(|line| line.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("no fingerprint of rank {rank}: {stdout}"))
                .to_owned()
        })
        .collect()
}

/// The reference: the two-round run under esper's own launcher, two ranks
/// on this host, in `run_dir`; rank 0's policy fingerprint.
fn launcher_fingerprint(run_dir: &Path) -> String {
    let output = Command::new(ESPER)
        .args(ppo_args(run_dir, "2"))
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("rank 0 of 2: policy fingerprint "))
        .expect("the launcher's rank 0 fingerprint")
        .to_owned()
}

#[test]
fn two_nodes_started_as_torchrun_or_srun_would_train_the_nproc_runs_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reference = launcher_fingerprint(&dir.path().join("nproc"));

    // torchrun --nnodes 2 --nproc-per-node 1 --no-python: each node's
    // process gets RANK, WORLD_SIZE, LOCAL_RANK 0 and the rendezvous.
    let port = free_port();
    let torchrun = two_nodes(&dir.path().join("torchrun"), |rank| {
        vec![
            ("RANK".to_owned(), rank.to_string()),
            ("WORLD_SIZE".to_owned(), "2".to_owned()),
            ("LOCAL_RANK".to_owned(), "0".to_owned()),
            ("MASTER_ADDR".to_owned(), "127.0.0.1".to_owned()),
            ("MASTER_PORT".to_owned(), port.to_string()),
        ]
    });
    assert_eq!(torchrun, [reference.clone(), reference.clone()]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("torchrun").join("rounds.jsonl"))
            .expect("rank 0 wrote the rounds")
            .lines()
            .count(),
        2
    );

    // srun -N 2 -n 2: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the job's
    // node list, whose first host serves the store.
    let port = free_port();
    let srun = two_nodes(&dir.path().join("srun"), |rank| {
        vec![
            ("SLURM_PROCID".to_owned(), rank.to_string()),
            ("SLURM_NTASKS".to_owned(), "2".to_owned()),
            ("SLURM_LOCALID".to_owned(), "0".to_owned()),
            ("SLURM_JOB_NODELIST".to_owned(), "localhost".to_owned()),
            ("MASTER_PORT".to_owned(), port.to_string()),
        ]
    });
    assert_eq!(srun, [reference.clone(), reference]);
}

/// Every file under `dir` with its bytes, in order.
fn snapshot(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).expect("a folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("a file");
                files.push((path, bytes));
            }
        }
    }
    files.sort();
    files
}

/// A finished three-round run of two ranks with a checkpoint every round,
/// cut back to its oldest checkpoint as a run killed after its first round
/// would be (the newer checkpoints removed).
fn cut_run(run_dir: &Path) -> String {
    let mut args = ppo_args(run_dir, "3");
    args.extend(["--checkpoint-every".to_owned(), "1".to_owned()]);
    let output = Command::new(ESPER)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let saved = checkpoints(run_dir);
    assert!(saved.len() >= 2, "checkpoints: {saved:?}");
    for newer in &saved[1..] {
        std::fs::remove_dir_all(newer).expect("remove a newer checkpoint");
    }
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("rank 0 of 2: policy fingerprint "))
        .expect("rank 0's fingerprint")
        .to_owned()
}

#[test]
fn a_two_rank_run_resumes_from_rank_0s_checkpoint_under_either_launcher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = cut_run(&dir.path().join("whole"));

    // esper's launcher: `--resume RUN_DIR --nproc 2`.
    let run_dir = dir.path().join("nproc");
    let _ = cut_run(&run_dir);
    // As one process it is refused, naming the group size, and nothing
    // changes.
    let before = snapshot(&run_dir);
    let single = Command::new(ESPER)
        .args(["train", "--resume"])
        .arg(&run_dir)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stderr = String::from_utf8_lossy(&single.stderr);
    assert_eq!(single.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--nproc 2"), "{stderr}");
    assert!(
        before == snapshot(&run_dir),
        "a refused resume changed the run"
    );
    let output = Command::new(ESPER)
        .args(["train", "--resume"])
        .arg(&run_dir)
        .args(["--nproc", "2"])
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for rank in 0..2 {
        let line = format!("rank {rank} of 2: policy fingerprint {whole}");
        assert!(stdout.contains(&line), "rank {rank} differs: {stdout}");
    }
    let rounds = std::fs::read_to_string(run_dir.join("rounds.jsonl")).expect("rounds.jsonl");
    assert_eq!(rounds.lines().count(), 3, "every round once: {rounds}");

    // torchrun-style: two processes with RANK, WORLD_SIZE and the
    // rendezvous, each `esper train --resume RUN_DIR`.
    let run_dir = dir.path().join("torchrun");
    let _ = cut_run(&run_dir);
    let port = free_port();
    let args = [
        "train".to_owned(),
        "--resume".to_owned(),
        run_dir.to_str().expect("utf-8 path").to_owned(),
    ];
    let fingerprints = two_nodes_running(&args, |rank| {
        vec![
            ("RANK".to_owned(), rank.to_string()),
            ("WORLD_SIZE".to_owned(), "2".to_owned()),
            ("LOCAL_RANK".to_owned(), "0".to_owned()),
            ("MASTER_ADDR".to_owned(), "127.0.0.1".to_owned()),
            ("MASTER_PORT".to_owned(), port.to_string()),
        ]
    });
    assert_eq!(fingerprints, [whole.clone(), whole]);
    let rounds = std::fs::read_to_string(run_dir.join("rounds.jsonl")).expect("rounds.jsonl");
    assert_eq!(rounds.lines().count(), 3, "every round once: {rounds}");
}

/// The provisioned libtorch venv's torchrun (`ESPER_TORCHRUN` first), or
/// `None` with the reason printed.
fn venv_torchrun() -> Option<std::path::PathBuf> {
    let path = match std::env::var_os("ESPER_TORCHRUN") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let Some(site) = std::env::var_os("ESPER_TORCH_SITE") else {
                eprintln!(
                    "skipped: no ESPER_TORCH_SITE (the provisioned venv) and no ESPER_TORCHRUN"
                );
                return None;
            };
            Path::new(&site).join("../../../bin/torchrun")
        }
    };
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: no torchrun at {}", path.display());
        None
    }
}

#[test]
fn two_nodes_started_by_real_torchrun_train_the_nproc_runs_policy() {
    let Some(torchrun) = venv_torchrun() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let reference = launcher_fingerprint(&dir.path().join("nproc"));

    // Two torchrun invocations, node ranks 0 and 1, one process each, with a
    // static rendezvous on this host: what two machines of a job would run.
    let mut args = ppo_args(&dir.path().join("torchrun"), "2");
    let at = args
        .iter()
        .position(|arg| arg == "--nproc")
        .expect("--nproc");
    args.drain(at..at + 2);
    let port = free_port().to_string();
    let nodes: Vec<_> = (0..2)
        .map(|node| {
            Command::new(&torchrun)
                .args(["--nnodes", "2", "--nproc-per-node", "1", "--node-rank"])
                .arg(node.to_string())
                .args(["--master-addr", "127.0.0.1", "--master-port", &port])
                .arg("--no-python")
                .arg(ESPER)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("torchrun starts")
        })
        .collect();
    for (node, child) in nodes.into_iter().enumerate() {
        let output = child.wait_with_output().expect("torchrun ends");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "node {node}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let prefix = format!("rank {node} of 2: policy fingerprint ");
        let fingerprint = stdout
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no fingerprint from node {node}: {stdout}"));
        assert_eq!(fingerprint, reference, "node {node}");
    }
}

#[test]
fn the_scaling_bench_starts_each_count_under_torchrun_beside_its_own_launcher() {
    let Some(torchrun) = venv_torchrun() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("scaling.json");
    let record = bench_record(
        &[
            "bench",
            "simic-throughput",
            "--device",
            "cpu",
            "--gpus",
            "2",
            "--torchrun",
            "--quick",
        ],
        &record,
        ("ESPER_TORCHRUN", torchrun.as_os_str()),
    );
    let results = record["results"].as_array().expect("results");
    for mode in ["dp2-fp32-eager", "dp2-fp32-eager-torchrun"] {
        let entry = results
            .iter()
            .find(|entry| entry["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} entry: {record}"));
        assert!(entry["error"].is_null(), "{mode}: {}", entry["error"]);
        let eps = entry["metrics"]["eps"].as_f64().expect("eps");
        assert!(eps > 0.0, "{mode}: eps {eps}");
    }
}

/// Runs `esper ARGS --out RECORD` with one environment variable set, which
/// must succeed; returns the record it wrote.
fn bench_record(args: &[&str], record: &Path, env: (&str, &std::ffi::OsStr)) -> serde_json::Value {
    let output = Command::new(ESPER)
        .args(args)
        .arg("--out")
        .arg(record)
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .output()
        .expect("esper runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(record).expect("the record")).expect("JSON")
}

/// A small CIFAR-10 in the binary format (five training files of 110
/// records, a test file of 40), seeded pixels, every class present.
fn write_small_cifar(dir: &Path) {
    use tolaria::data::cifar10::{PIXELS_PER_IMAGE, TEST_FILE, TRAIN_FILES};
    let records = |n: usize, salt: usize| {
        let mut bytes = Vec::with_capacity(n * (1 + PIXELS_PER_IMAGE));
        for i in 0..n {
            bytes.push(u8::try_from((i + salt) % 10).expect("a class"));
            bytes.extend((0..PIXELS_PER_IMAGE).map(|p| ((p * 31 + i * 17 + salt) % 251) as u8));
        }
        bytes
    };
    for (k, name) in TRAIN_FILES.iter().enumerate() {
        std::fs::write(dir.join(name), records(110, k)).expect("a training file");
    }
    std::fs::write(dir.join(TEST_FILE), records(40, 9)).expect("the test file");
}

#[test]
fn the_growth_bench_drives_seeds_on_every_rank_and_sums_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cifar = dir.path().join("cifar");
    std::fs::create_dir_all(&cifar).expect("the data folder");
    write_small_cifar(&cifar);
    let record = dir.path().join("growth.json");
    let record = bench_record(
        &[
            "bench",
            "simic-growth",
            "--device",
            "cpu",
            "--gpus",
            "1,2",
            "--quick",
            "--episode",
            "4",
            "--rounds",
            "2",
            // A variant with a suffix runs on every count too (the ranks
            // read variants as the single-process bench does).
            "--variants",
            "fp32-eager,fp32-eager-fp32-policy",
        ],
        &record,
        ("ESPER_CIFAR10_DIR", cifar.as_os_str()),
    );
    assert!(
        record["params"]["scaling"]
            .as_str()
            .is_some_and(|s| s.contains("max-growth")),
        "{}",
        record["params"]
    );
    // `--rounds` reaches the ranks.
    assert_eq!(record["params"]["rounds"], 2, "{}", record["params"]);
    // No warm-up on the CPU, and the record says so.
    assert!(
        record["params"]["warmup"]
            .as_str()
            .is_some_and(|s| s.contains("none")),
        "{}",
        record["params"]
    );
    let results = record["results"].as_array().expect("results");
    for mode in [
        "dp1-fp32-eager",
        "dp2-fp32-eager",
        "dp1-fp32-eager-fp32-policy",
        "dp2-fp32-eager-fp32-policy",
    ] {
        let entry = results
            .iter()
            .find(|entry| entry["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} entry: {record}"));
        assert!(entry["error"].is_null(), "{mode}: {}", entry["error"]);
        let metrics = &entry["metrics"];
        assert!(
            metrics["eps"].as_f64().is_some_and(|e| e > 0.0),
            "{mode}: {metrics}"
        );
        // Max growth germinates at the first epoch the masks allow: a seed
        // lives from the third epoch of four on, in every environment.
        let seeds = metrics["active_seeds_per_env"]
            .as_f64()
            .expect("live seeds");
        assert!(seeds > 0.2, "{mode}: {metrics}");
        // The ranks' rollouts, apart from the update.
        assert!(
            metrics["rollout_ms_slowest_rank"]
                .as_f64()
                .is_some_and(|ms| ms > 0.0
                    && ms
                        >= metrics["rollout_ms_fastest_rank"]
                            .as_f64()
                            .unwrap_or(f64::INFINITY)),
            "{mode}: {metrics}"
        );
    }
    // Each variant also ran as the single-process bench right after its
    // one-GPU entry, which says how it compares.
    for variant in ["fp32-eager", "fp32-eager-fp32-policy"] {
        let mode = format!("single-process-{variant}");
        let single = results
            .iter()
            .find(|entry| entry["mode"] == mode.as_str())
            .unwrap_or_else(|| panic!("no {mode} entry: {record}"));
        assert!(single["error"].is_null(), "{mode}: {}", single["error"]);
        let eps = single["metrics"]["eps"].as_f64().expect("eps");
        let seeds = single["metrics"]["active_seeds_per_env"]
            .as_f64()
            .expect("live seeds");
        assert!(eps > 0.0 && seeds > 0.2, "{mode}: {}", single["metrics"]);
        let one = results
            .iter()
            .find(|entry| entry["mode"] == format!("dp1-{variant}").as_str())
            .expect("the one-GPU entry");
        let ratio = one["metrics"]["single_process_ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("no ratio: {}", one["metrics"]));
        let expected = one["metrics"]["eps"].as_f64().expect("eps") / eps;
        assert!(
            (ratio - expected).abs() < 1e-9,
            "{ratio} against {expected}"
        );
        // Two rounds: steady figures on both sides.
        assert!(
            one["metrics"]["single_process_ratio_steady"]
                .as_f64()
                .is_some(),
            "{}",
            one["metrics"]
        );
    }
    // Only the one-GPU entries carry the comparison.
    let two = results
        .iter()
        .find(|entry| entry["mode"] == "dp2-fp32-eager")
        .expect("the two-GPU entry");
    assert!(two["metrics"]["single_process_ratio"].is_null());
}
