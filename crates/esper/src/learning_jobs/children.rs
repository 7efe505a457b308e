//! The training and evaluating children of `simic-learning --jobs`: at most
//! so many at once, each on the least busy device, a failed one stopping
//! the others.

use std::path::Path;
use std::process::Child;
use std::thread;
use std::time::Duration;

use anyhow::{Result, bail};

/// Runs one child per seed of `pending` (taken from the back), at most
/// `jobs` at once and at most `per_device` on one device, each started on
/// the least busy of `devices` by `spawn`; waits for all. A child that
/// fails kills the others and ends the run with an error naming the seed.
pub(super) fn run_children(
    mut pending: Vec<usize>,
    jobs: usize,
    per_device: usize,
    devices: &[torch_ext::DeviceChoice],
    parts_dir: &Path,
    spawn: &dyn Fn(usize, torch_ext::DeviceChoice) -> Result<Child>,
) -> Result<()> {
    let mut running: Vec<(usize, Child, usize)> = Vec::new();
    let start_next =
        |running: &mut Vec<(usize, Child, usize)>, pending: &mut Vec<usize>| -> Result<()> {
            while running.len() < jobs {
                let slot = least_busy(devices.len(), running.iter().map(|(_, _, slot)| *slot));
                let on_slot = running.iter().filter(|(_, _, s)| *s == slot).count();
                if on_slot >= per_device {
                    return Ok(());
                }
                let Some(seed) = pending.pop() else {
                    return Ok(());
                };
                let child = spawn(seed, devices[slot])?;
                running.push((seed, child, slot));
            }
            Ok(())
        };
    start_next(&mut running, &mut pending)?;
    while !running.is_empty() {
        let mut finished = None;
        for (index, (seed, child, _)) in running.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                finished = Some((index, *seed, status));
                break;
            }
        }
        match finished {
            Some((index, seed, status)) => {
                running.swap_remove(index);
                if !status.success() {
                    kill_all(&mut running);
                    bail!(
                        "seed {seed}'s child process failed ({status}); its log is above, and \
                         what is done is kept in {}",
                        parts_dir.display()
                    );
                }
                start_next(&mut running, &mut pending).inspect_err(|_| kill_all(&mut running))?;
            }
            None => thread::sleep(Duration::from_millis(200)),
        }
    }
    Ok(())
}

fn kill_all(running: &mut [(usize, Child, usize)]) {
    for (_, child, _) in running.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The index of the device (of `count`) that runs the fewest of the
/// children on `busy` (their device indices), the first of those on a tie.
pub(super) fn least_busy(count: usize, busy: impl Iterator<Item = usize>) -> usize {
    let mut load = vec![0_usize; count.max(1)];
    for slot in busy {
        if let Some(n) = load.get_mut(slot) {
            *n = n.saturating_add(1);
        }
    }
    load.iter()
        .enumerate()
        .min_by_key(|(index, n)| (**n, *index))
        .map_or(0, |(index, _)| index)
}
