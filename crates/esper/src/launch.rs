//! One process per rank: `esper` starts copies of itself for a
//! data-parallel group and watches them.
//!
//! Each child gets torchrun's variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) for
//! `torch_ext::dist::Rendezvous::from_env`, and NVLink multicast turned off
//! (`torch_ext::dist::MULTICAST_OFF`) whatever the parent's environment
//! says. Rank 0 serves the c10d TCP store on a free loopback port, which
//! the launcher binds and keeps: rank 0 inherits the listening socket
//! (`torch_ext::dist::ENV_MASTER_LISTEN_FD`), so no other process on the
//! host can take the port before the store serves it.
//!
//! A data-parallel run cannot go on without one of its ranks. When a rank
//! fails, the others' next collective fails too (Gloo at once, NCCL at the
//! group's timeout); the launcher does not wait for that: it gives them
//! [`GRACE`] to stop on their own, then kills what is left, and reports the
//! first failure by rank, and any rank it had to kill (a rank that hangs
//! makes the others' next collective time out: `ESPER_DIST_TIMEOUT_S`,
//! 120 s by default; then it is the one still running). The collective
//! timeouts still stop the ranks when the launcher itself is gone.

use std::ffi::OsStr;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use torch_ext::dist::{
    ENV_MASTER_ADDR, ENV_MASTER_LISTEN_FD, ENV_MASTER_PORT, ENV_RANK, ENV_WORLD_SIZE, MULTICAST_OFF,
};
use torch_ext::launcher::ENV_LOCAL_RANK;

/// How long the other ranks get to stop by themselves after one failed.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Runs `esper <args>` as `nproc` ranks and waits for all of them. After the
/// first failure the others get `grace` to stop before they are killed.
pub(crate) fn run_ranks<S: AsRef<OsStr>>(nproc: usize, args: &[S], grace: Duration) -> Result<()> {
    if nproc == 0 {
        bail!("--nproc must be at least 1");
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the rendezvous's port")?;
    let port = listener
        .local_addr()
        .context("reading the rendezvous's port")?
        .port();
    let exe = std::env::current_exe().context("locating the esper binary")?;
    let mut children: Vec<Option<Child>> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let mut command = Command::new(&exe);
        command
            .args(args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_LOCAL_RANK, rank.to_string())
            .env(ENV_WORLD_SIZE, nproc.to_string())
            .env(ENV_MASTER_ADDR, "127.0.0.1")
            .env(ENV_MASTER_PORT, port.to_string())
            .env_remove(ENV_MASTER_LISTEN_FD)
            .envs(MULTICAST_OFF);
        if rank == 0 {
            serve_from(&mut command, &listener);
        }
        match command.spawn() {
            Ok(child) => {
                eprintln!("rank {rank}/{nproc}: pid {}", child.id());
                children.push(Some(child));
            }
            Err(error) => {
                kill_all(&mut children);
                return Err(error).context(format!("starting rank {rank}"));
            }
        }
    }
    // Rank 0 holds the socket now; the launcher's copy would only keep the
    // port open after rank 0 is gone.
    drop(listener);
    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut failed_at: Option<Instant> = None;
    let mut hung: Vec<usize> = Vec::new();
    loop {
        let mut running = 0;
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait().context("watching a rank")? {
                Some(status) => {
                    *slot = None;
                    if !status.success() && first_failure.is_none() {
                        eprintln!("rank {rank} failed ({status}); waiting for the others to stop");
                        first_failure = Some((rank, status));
                        failed_at = Some(Instant::now());
                    }
                }
                None => running += 1,
            }
        }
        if running == 0 {
            break;
        }
        if failed_at.is_some_and(|at| at.elapsed() > grace) {
            hung = children
                .iter()
                .enumerate()
                .filter_map(|(rank, slot)| slot.as_ref().map(|_| rank))
                .collect();
            eprintln!(
                "killing {} still running {} s after the failure",
                ranks_named(&hung),
                grace.as_secs()
            );
            kill_all(&mut children);
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    match first_failure {
        None => Ok(()),
        Some((rank, status)) if hung.is_empty() => {
            bail!("rank {rank} of {nproc} failed ({status})")
        }
        Some((rank, status)) => bail!(
            "rank {rank} of {nproc} failed ({status}); {} did not stop and {} killed (hung, or \
             stopped)",
            ranks_named(&hung),
            if hung.len() == 1 { "was" } else { "were" }
        ),
    }
}

/// Makes `command`'s process inherit `listener` (only that process: the
/// launcher's descriptors are closed on exec) and name it in
/// [`ENV_MASTER_LISTEN_FD`].
fn serve_from(command: &mut Command, listener: &TcpListener) {
    let fd = listener.as_raw_fd();
    command.env(ENV_MASTER_LISTEN_FD, fd.to_string());
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls `fcntl`, which is async-signal-safe; clearing close-on-exec
    // there changes the child's descriptor table, not the launcher's.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `rank 1` or `ranks 1, 3`.
fn ranks_named(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    if ranks.len() == 1 {
        format!("rank {}", list.join(""))
    } else {
        format!("ranks {}", list.join(", "))
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
}
