//! Which rank this process is, read once from whatever started it: the
//! workspace's one reader of launcher environments, beside
//! [`crate::device::for_rank`] (the rank's device).
//!
//! Three launchers are understood, checked in this order:
//!
//! - **torchrun** (`torchrun --no-python ...`, any number of nodes) and
//!   `esper`'s own one-host launcher, which sets the same variables:
//!   `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` (default
//!   `127.0.0.1`) and `MASTER_PORT`. `esper`'s launcher also hands rank 0
//!   the socket it keeps bound to that port (`ESPER_MASTER_LISTEN_FD`,
//!   [`crate::dist::ENV_MASTER_LISTEN_FD`]).
//! - **Slurm** (`srun`), when `WORLD_SIZE` is unset and `SLURM_NTASKS` is
//!   above 1: `SLURM_PROCID` is the rank, `SLURM_NTASKS` the world size,
//!   `SLURM_LOCALID` the local rank; the rendezvous is `MASTER_ADDR` if set,
//!   otherwise the first host of `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`;
//!   a compressed list such as `gpu[07-10,12],cpu3` gives `gpu07`), on
//!   `MASTER_PORT` if set, otherwise [`SLURM_PORT_BASE`] plus the job id
//!   modulo [`SLURM_PORT_SPAN`], so that two jobs sharing a node meet on
//!   different ports.
//! - nothing: `Ok(None)`, a single process (a one-task Slurm job too).
//!
//! Every variable is checked before anything reaches libtorch: a count that
//! is not a number, a rank outside the world, a port that is not one, an
//! empty node list are typed errors naming the variable.
//!
//! (Not a doctest, as everywhere in torch-ext: a doctest binary would not
//! find libtorch; the unit tests below run the same lookups.)
//!
//! ```ignore
//! use std::time::Duration;
//! use torch_ext::launcher::{Launcher, RankEnv};
//!
//! let vars = [
//!     ("SLURM_NTASKS", "8"),
//!     ("SLURM_PROCID", "5"),
//!     ("SLURM_LOCALID", "1"),
//!     ("SLURM_JOB_NODELIST", "gpu[07-10]"),
//!     ("SLURM_JOB_ID", "4242"),
//! ];
//! let lookup = |name: &str| {
//!     vars.iter()
//!         .find(|(key, _)| *key == name)
//!         .map(|(_, value)| (*value).to_owned())
//! };
//! let env = RankEnv::from_vars(&lookup, Duration::from_secs(60))?.expect("a rank");
//! assert_eq!(env.launcher, Launcher::Slurm);
//! assert_eq!((env.rendezvous.rank, env.rendezvous.world_size), (5, 8));
//! assert_eq!(env.local_rank, Some(1));
//! assert_eq!(env.rendezvous.host, "gpu07");
//! # Ok::<(), torch_ext::Error>(())
//! ```

use std::time::Duration;

use crate::dist::{
    ENV_MASTER_ADDR, ENV_MASTER_LISTEN_FD, ENV_MASTER_PORT, ENV_RANK, ENV_WORLD_SIZE, Rendezvous,
};
use crate::error::{Error, Result};

/// torchrun's (and esper's launcher's) local rank.
pub const ENV_LOCAL_RANK: &str = "LOCAL_RANK";
/// Slurm's rank of the task.
pub const ENV_SLURM_PROCID: &str = "SLURM_PROCID";
/// Slurm's number of tasks.
pub const ENV_SLURM_NTASKS: &str = "SLURM_NTASKS";
/// Slurm's rank of the task on its node.
pub const ENV_SLURM_LOCALID: &str = "SLURM_LOCALID";
/// Slurm's node list of the job.
pub const ENV_SLURM_JOB_NODELIST: &str = "SLURM_JOB_NODELIST";
/// Slurm's node list (older name).
pub const ENV_SLURM_NODELIST: &str = "SLURM_NODELIST";
/// Slurm's job id.
pub const ENV_SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// The first port a Slurm job's store is served on without `MASTER_PORT`.
pub const SLURM_PORT_BASE: u16 = 29_500;
/// Ports above [`SLURM_PORT_BASE`] a Slurm job may pick by its id.
pub const SLURM_PORT_SPAN: u64 = 20_000;

/// What started this process as a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// torchrun, or esper's own launcher (the same variables).
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
}

impl Launcher {
    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "slurm",
        }
    }
}

/// This process's place in a job (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// Where the ranks meet, this rank and the world size.
    pub rendezvous: Rendezvous,
    /// The rank on its node (its GPU), when the launcher says.
    pub local_rank: Option<usize>,
    /// Who started the process.
    pub launcher: Launcher,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "launcher environment",
        message: message.into(),
    }
}

fn count(name: &str, text: &str) -> Result<usize> {
    text.trim()
        .parse::<usize>()
        .map_err(|_| invalid(format!("{name}={text:?} is not a non-negative integer")))
}

fn port(name: &str, text: &str) -> Result<u16> {
    match text.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(invalid(format!(
            "{name}={text:?} is not a port (1 to 65535)"
        ))),
    }
}

/// The first host of a Slurm node list: `gpu[07-10,12],cpu3` gives
/// `gpu07`, `node5` gives `node5`; `None` for an empty or malformed list.
pub fn first_host(nodelist: &str) -> Option<String> {
    let list = nodelist.trim();
    // The first item: up to the first comma outside brackets.
    let mut depth = 0_usize;
    let mut end = list.len();
    for (index, character) in list.char_indices() {
        match character {
            '[' => depth = depth.saturating_add(1),
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = index;
                break;
            }
            _ => {}
        }
    }
    let item = list.get(..end)?.trim();
    if item.is_empty() {
        return None;
    }
    let Some(open) = item.find('[') else {
        return (!item.contains(']')).then(|| item.to_owned());
    };
    let prefix = item.get(..open)?;
    let inside = item.get(open.checked_add(1)?..)?;
    let close = inside.find(']')?;
    let ranges = inside.get(..close)?;
    let suffix = inside.get(close.checked_add(1)?..)?;
    let first = ranges.split(',').next()?.split('-').next()?.trim();
    if prefix.is_empty() && first.is_empty()
        || first.is_empty()
        || !first.chars().all(|c| c.is_ascii_digit())
        || suffix.contains('[')
    {
        return None;
    }
    Some(format!("{prefix}{first}{suffix}"))
}

impl RankEnv {
    /// Reads the process's environment (see the module docs).
    pub fn from_env(timeout: Duration) -> Result<Option<RankEnv>> {
        RankEnv::from_vars(&|name| std::env::var(name).ok(), timeout)
    }

    /// [`RankEnv::from_env`] over any lookup of variables (tests, or a
    /// caller with its own environment).
    pub fn from_vars(
        vars: &dyn Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> Result<Option<RankEnv>> {
        let local_rank = |name: &str| -> Result<Option<usize>> {
            vars(name).map(|text| count(name, &text)).transpose()
        };
        let (rank, world_size, local, launcher, host, port_number, listen_fd) =
            if let Some(world) = vars(ENV_WORLD_SIZE) {
                let world_size = count(ENV_WORLD_SIZE, &world)?;
                let rank = vars(ENV_RANK)
                    .ok_or_else(|| invalid("WORLD_SIZE is set but RANK is not"))
                    .and_then(|text| count(ENV_RANK, &text))?;
                let port_number = vars(ENV_MASTER_PORT)
                    .ok_or_else(|| invalid("WORLD_SIZE is set but MASTER_PORT is not"))
                    .and_then(|text| port(ENV_MASTER_PORT, &text))?;
                let host = vars(ENV_MASTER_ADDR).unwrap_or_else(|| "127.0.0.1".to_owned());
                let listen_fd = vars(ENV_MASTER_LISTEN_FD)
                    .map(|text| {
                        text.trim()
                            .parse::<i32>()
                            .ok()
                            .filter(|fd| *fd >= 0)
                            .ok_or_else(|| {
                                invalid(format!(
                                    "{ENV_MASTER_LISTEN_FD}={text:?} is not a descriptor number"
                                ))
                            })
                    })
                    .transpose()?;
                (
                    rank,
                    world_size,
                    local_rank(ENV_LOCAL_RANK)?,
                    Launcher::Torchrun,
                    host,
                    port_number,
                    listen_fd,
                )
            } else if let Some(tasks) = vars(ENV_SLURM_NTASKS) {
                let world_size = count(ENV_SLURM_NTASKS, &tasks)?;
                if world_size <= 1 {
                    return Ok(None);
                }
                let rank = vars(ENV_SLURM_PROCID)
                    .ok_or_else(|| invalid("SLURM_NTASKS is set but SLURM_PROCID is not"))
                    .and_then(|text| count(ENV_SLURM_PROCID, &text))?;
                let host = match vars(ENV_MASTER_ADDR) {
                    Some(host) => host,
                    None => {
                        let list = vars(ENV_SLURM_JOB_NODELIST)
                            .or_else(|| vars(ENV_SLURM_NODELIST))
                            .ok_or_else(|| {
                                invalid(
                                    "a Slurm job of several tasks without MASTER_ADDR needs \
                                     SLURM_JOB_NODELIST (its first host serves the store)",
                                )
                            })?;
                        first_host(&list).ok_or_else(|| {
                            invalid(format!("SLURM_JOB_NODELIST={list:?} names no host"))
                        })?
                    }
                };
                let port_number = match vars(ENV_MASTER_PORT) {
                    Some(text) => port(ENV_MASTER_PORT, &text)?,
                    None => {
                        let job = vars(ENV_SLURM_JOB_ID)
                            .map(|text| count(ENV_SLURM_JOB_ID, &text))
                            .transpose()?
                            .unwrap_or(0);
                        let offset = u16::try_from((job as u64) % SLURM_PORT_SPAN)
                            .map_err(|_| invalid("the job's port offset does not fit a port"))?;
                        SLURM_PORT_BASE.checked_add(offset).ok_or_else(|| {
                            invalid("SLURM_PORT_BASE plus the job's offset is not a port")
                        })?
                    }
                };
                (
                    rank,
                    world_size,
                    local_rank(ENV_SLURM_LOCALID)?,
                    Launcher::Slurm,
                    host,
                    port_number,
                    None,
                )
            } else {
                return Ok(None);
            };
        let rendezvous = Rendezvous {
            host,
            port: port_number,
            rank,
            world_size,
            timeout,
            listen_fd,
        };
        rendezvous.validate()?;
        Ok(Some(RankEnv {
            rendezvous,
            local_rank: local,
            launcher,
        }))
    }
}

/// Whether a launcher started this process as one rank of several
/// (the variables [`RankEnv::from_env`] reads are there; it may still
/// refuse them).
pub fn launched_as_rank() -> bool {
    std::env::var_os(ENV_WORLD_SIZE).is_some()
        || std::env::var(ENV_SLURM_NTASKS)
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .is_some_and(|tasks| tasks > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<RankEnv>> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        RankEnv::from_vars(
            &|name| {
                owned
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            },
            Duration::from_secs(5),
        )
    }

    #[test]
    fn torchrun_variables_make_a_rank() {
        let rank = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(rank.launcher, Launcher::Torchrun);
        assert_eq!((rank.rendezvous.rank, rank.rendezvous.world_size), (3, 8));
        assert_eq!(rank.local_rank, Some(1));
        assert_eq!(
            (rank.rendezvous.host.as_str(), rank.rendezvous.port),
            ("node0", 29400)
        );
        // torchrun's variables win over Slurm's when both are set.
        let both = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "1234"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_PROCID", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(both.launcher, Launcher::Torchrun);
        assert_eq!(both.rendezvous.host, "127.0.0.1");
        assert_eq!(both.rendezvous.listen_fd, None);
        // esper's launcher hands rank 0 the socket it keeps bound.
        let served = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "1234"),
            ("ESPER_MASTER_LISTEN_FD", "7"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(served.rendezvous.listen_fd, Some(7));
    }

    #[test]
    fn slurm_variables_make_a_rank_with_the_first_node_as_rendezvous() {
        let rank = env(&[
            ("SLURM_NTASKS", "4"),
            ("SLURM_PROCID", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(rank.launcher, Launcher::Slurm);
        assert_eq!(rank.rendezvous.host, "gpu07");
        assert_eq!(rank.rendezvous.port, 29_500 + (123_456 % 20_000) as u16);
        assert_eq!(rank.local_rank, Some(0));
        // MASTER_ADDR and MASTER_PORT override.
        let set = env(&[
            ("SLURM_NTASKS", "2"),
            ("SLURM_PROCID", "1"),
            ("MASTER_ADDR", "login1"),
            ("MASTER_PORT", "4000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (set.rendezvous.host.as_str(), set.rendezvous.port),
            ("login1", 4000)
        );
        // One task is a single process.
        assert_eq!(
            env(&[("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0")]).unwrap(),
            None
        );
        assert_eq!(env(&[]).unwrap(), None);
    }

    #[test]
    fn bad_variables_are_typed_errors_naming_them() {
        for (pairs, needle) in [
            (
                &[("WORLD_SIZE", "2"), ("MASTER_PORT", "1")][..],
                "RANK is not",
            ),
            (&[("WORLD_SIZE", "two"), ("RANK", "0")][..], "WORLD_SIZE"),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")][..],
                "MASTER_PORT",
            ),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "5")][..],
                "outside",
            ),
            (
                &[("SLURM_NTASKS", "2"), ("SLURM_PROCID", "0")][..],
                "NODELIST",
            ),
            (
                &[
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_PROCID", "0"),
                    ("SLURM_JOB_NODELIST", "[]"),
                ][..],
                "names no host",
            ),
            (
                &[
                    ("WORLD_SIZE", "2"),
                    ("RANK", "0"),
                    ("MASTER_PORT", "5"),
                    ("LOCAL_RANK", "-1"),
                ][..],
                "LOCAL_RANK",
            ),
            (
                &[
                    ("WORLD_SIZE", "2"),
                    ("RANK", "0"),
                    ("MASTER_PORT", "5"),
                    ("ESPER_MASTER_LISTEN_FD", "three"),
                ][..],
                "ESPER_MASTER_LISTEN_FD",
            ),
            (
                &[
                    ("WORLD_SIZE", "2"),
                    ("RANK", "1"),
                    ("MASTER_PORT", "5"),
                    ("ESPER_MASTER_LISTEN_FD", "3"),
                ][..],
                "only rank 0 serves the store",
            ),
        ] {
            let error = env(pairs).unwrap_err().to_string();
            assert!(error.contains(needle), "{pairs:?}: {error}");
        }
    }

    #[test]
    fn node_lists_give_their_first_host() {
        for (list, first) in [
            ("node5", Some("node5")),
            ("gpu[07-10,12],cpu3", Some("gpu07")),
            ("a[3,5]", Some("a3")),
            ("x-[001-004]-ib", Some("x-001-ib")),
            ("n1,n2", Some("n1")),
            ("", None),
            ("[]", None),
            ("a[", None),
            ("a]", None),
            ("a[x-y]", None),
        ] {
            assert_eq!(first_host(list).as_deref(), first, "{list:?}");
        }
    }
}
