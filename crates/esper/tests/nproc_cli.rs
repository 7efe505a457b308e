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
//! two torchrun invocations as nodes 0 and 1 train the same policy. The
//! scaling bench's tests are in `scaling_cli.rs`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, venv_torchrun};

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
