//! Process groups for data-parallel training: libtorch's c10d, not anything
//! home-made.
//!
//! A [`ProcessGroup`] is a `c10d::TCPStore` rendezvous (rank 0 serves it on
//! `host:port`) plus one libtorch backend: `ProcessGroupGloo` for CPU tensors
//! ([`DistBackend::Gloo`]) or `ProcessGroupNCCL` for CUDA tensors
//! ([`DistBackend::Nccl`]). The collectives ([`ProcessGroup::all_reduce_`],
//! [`ProcessGroup::broadcast_`], [`ProcessGroup::barrier`]) work in place.
//!
//! # A port nobody can take
//!
//! A launcher that picks a free port and lets rank 0 bind it later races
//! every other process on the host: an outgoing connection can be given
//! the same port in between, and rank 0 then fails with `EADDRINUSE`. A
//! launcher that keeps the port bound hands rank 0 the listening socket
//! instead ([`Rendezvous::listen_fd`], from [`ENV_MASTER_LISTEN_FD`]);
//! `esper --nproc` does, so its groups always meet.
//!
//! # Timeouts and dead peers
//!
//! Every rendezvous and collective carries the [`Rendezvous::timeout`]. With
//! Gloo a collective blocks the caller and fails with an error when a peer
//! closed its connection (it died) or the timeout passed; the error comes
//! back as [`Error::Cpp`]. With NCCL a collective is queued on the device and
//! the caller's current stream is ordered after it; libtorch's NCCL watchdog
//! enforces the timeout and ends the process with its own message.
//!
//! # NVLink multicast
//!
//! The GPU hosts this project runs on must keep NVLink multicast off
//! ([`MULTICAST_OFF`]). [`ProcessGroup::new`] refuses an NCCL group in a
//! process whose environment does not say so, and launchers should pass
//! [`MULTICAST_OFF`] to every process they start.
//!
//! (Not a doctest: like the other libtorch crates, torch-ext has none, since a
//! doctest binary is linked outside `target/` and would not find libtorch.)
//!
//! ```ignore
//! use std::time::Duration;
//! use torch_ext::dist::{DistBackend, ProcessGroup, ReduceOp, Rendezvous};
//!
//! # fn main() -> torch_ext::Result<()> {
//! // RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as a launcher sets them.
//! let Some(rendezvous) = Rendezvous::from_env(Duration::from_secs(60))? else {
//!     return Ok(()); // not launched as part of a group
//! };
//! let group = ProcessGroup::new(&rendezvous, DistBackend::Gloo, tch::Device::Cpu)?;
//! let grads = tch::Tensor::ones([4], (tch::Kind::Float, tch::Device::Cpu));
//! group.all_reduce_(&grads, ReduceOp::Sum)?; // now world_size everywhere
//! # Ok(())
//! # }
//! ```

use std::ffi::{CString, c_void};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

/// The environment that keeps NVLink multicast off in NCCL, PyTorch's
/// symmetric memory and NVSHMEM. Set in every process of an NCCL group.
pub const MULTICAST_OFF: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

/// The variables [`Rendezvous::from_env`] reads (torchrun's names; Slurm's
/// are in [`crate::launcher`]).
pub const ENV_RANK: &str = "RANK";
/// The group's size.
pub const ENV_WORLD_SIZE: &str = "WORLD_SIZE";
/// The address rank 0 serves the store on.
pub const ENV_MASTER_ADDR: &str = "MASTER_ADDR";
/// The port rank 0 serves the store on.
pub const ENV_MASTER_PORT: &str = "MASTER_PORT";
/// Rank 0 only, set by `esper`'s launcher: the descriptor of a socket the
/// launcher bound to [`ENV_MASTER_PORT`] on loopback and listens on, which
/// rank 0 inherited and serves the store on ([`Rendezvous::listen_fd`]).
pub const ENV_MASTER_LISTEN_FD: &str = "ESPER_MASTER_LISTEN_FD";

/// Which libtorch backend carries the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DistBackend {
    /// `ProcessGroupGloo`: CPU tensors, TCP between processes.
    Gloo,
    /// `ProcessGroupNCCL`: CUDA tensors on one device per process.
    Nccl,
}

impl DistBackend {
    /// The backend's name as c10d spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gloo => "gloo",
            Self::Nccl => "nccl",
        }
    }

    /// Gloo for a CPU device, NCCL for a CUDA device.
    pub fn for_device(device: Device) -> Self {
        if device.is_cuda() {
            Self::Nccl
        } else {
            Self::Gloo
        }
    }

    fn code(self) -> i32 {
        match self {
            Self::Gloo => 0,
            Self::Nccl => 1,
        }
    }
}

/// How an all-reduce combines the ranks' tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            Self::Sum => 0,
            Self::Max => 1,
            Self::Min => 2,
        }
    }
}

/// Where and how the ranks of one group meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// The address rank 0 serves the TCP store on (loopback for one host).
    pub host: String,
    /// The store's port.
    pub port: u16,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// How many processes the group has.
    pub world_size: usize,
    /// The limit on the rendezvous and on every collective.
    pub timeout: Duration,
    /// Rank 0 only: a socket already bound to `port` and listening, which
    /// the store serves instead of binding `port` itself (and takes over:
    /// the group closes it). `None` binds `port`.
    pub listen_fd: Option<RawFd>,
}

impl Rendezvous {
    /// The rendezvous of this process's launcher: torchrun's (and esper's
    /// launcher's) [`ENV_RANK`], [`ENV_WORLD_SIZE`], [`ENV_MASTER_ADDR`]
    /// (default `127.0.0.1`) and [`ENV_MASTER_PORT`], or Slurm's
    /// (`crate::launcher::RankEnv` reads them and says which). `Ok(None)`
    /// when no launcher started the process as part of a group.
    pub fn from_env(timeout: Duration) -> Result<Option<Self>> {
        Ok(crate::launcher::RankEnv::from_env(timeout)?.map(|env| env.rendezvous))
    }

    /// Checks rank, size, port and timeout before anything reaches libtorch.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "Rendezvous";
        if self.world_size == 0 || i32::try_from(self.world_size).is_err() {
            return Err(invalid(
                OP,
                format!("world size {} is not in 1..2^31", self.world_size),
            ));
        }
        if self.rank >= self.world_size {
            return Err(invalid(
                OP,
                format!("rank {} is outside 0..{}", self.rank, self.world_size),
            ));
        }
        if self.port == 0 {
            return Err(invalid(
                OP,
                "port 0 cannot be met at: name the store's port",
            ));
        }
        if self.timeout.is_zero() || i64::try_from(self.timeout.as_millis()).is_err() {
            return Err(invalid(OP, "timeout must be between 1 ms and i64::MAX ms"));
        }
        if self.host.is_empty() || self.host.contains('\0') {
            return Err(invalid(
                OP,
                format!("host {:?} is not an address", self.host),
            ));
        }
        match self.listen_fd {
            Some(fd) if self.rank != 0 => Err(invalid(
                OP,
                format!(
                    "rank {} was given listening socket {fd}, but only rank 0 serves the store",
                    self.rank
                ),
            )),
            Some(fd) if fd < 0 => Err(invalid(OP, format!("{fd} is not a descriptor"))),
            _ => Ok(()),
        }
    }

    /// Checks that [`Rendezvous::listen_fd`] is a TCP socket bound to
    /// [`Rendezvous::port`] (it is not closed here).
    fn check_listen_fd(&self) -> Result<()> {
        let Some(fd) = self.listen_fd else {
            return Ok(());
        };
        let bound = bound_port(fd).map_err(|error| {
            invalid(
                "ProcessGroup::new",
                format!("descriptor {fd} is not a bound TCP socket ({error})"),
            )
        })?;
        if bound != self.port {
            return Err(invalid(
                "ProcessGroup::new",
                format!(
                    "the listening socket {fd} is bound to port {}, not the store's port {}",
                    bound, self.port
                ),
            ));
        }
        Ok(())
    }
}

/// The port the socket `fd` is bound to (`getsockname`, which reads the
/// descriptor and changes nothing; any descriptor number is safe to ask
/// about).
fn bound_port(fd: RawFd) -> std::io::Result<u16> {
    // SAFETY: `storage` is a zeroed `sockaddr_storage`, large enough for any
    // address, and `length` says so; `getsockname` writes at most that much.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let status = unsafe {
        libc::getsockname(
            fd,
            (&raw mut storage).cast::<libc::sockaddr>(),
            &raw mut length,
        )
    };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says `storage` holds a `sockaddr_in`.
            let address = unsafe { &*(&raw const storage).cast::<libc::sockaddr_in>() };
            Ok(u16::from_be(address.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says `storage` holds a `sockaddr_in6`.
            let address = unsafe { &*(&raw const storage).cast::<libc::sockaddr_in6>() };
            Ok(u16::from_be(address.sin6_port))
        }
        family => Err(std::io::Error::other(format!(
            "address family {family}, not TCP over IPv4 or IPv6"
        ))),
    }
}

fn invalid(op: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        message: message.into(),
    }
}

/// One process's membership of a c10d group. Dropping it leaves the group.
#[derive(Debug)]
pub struct ProcessGroup {
    raw: NonNull<c_void>,
    rank: usize,
    world_size: usize,
    backend: DistBackend,
    device: Device,
}

// SAFETY: c10d backends are used from any thread (their work runs on their own
// threads); the handle holds no thread-local state. Not `Sync`: callers issue
// collectives from one thread at a time, in the same order on every rank.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the group `rendezvous` describes; blocks until every rank has
    /// arrived or the timeout passes. `device` is where the group's tensors
    /// live: the CPU for Gloo, one CUDA device for NCCL.
    pub fn new(rendezvous: &Rendezvous, backend: DistBackend, device: Device) -> Result<Self> {
        const OP: &str = "ProcessGroup::new";
        rendezvous.validate()?;
        rendezvous.check_listen_fd()?;
        let device_index = match (backend, device) {
            (DistBackend::Gloo, Device::Cpu) => 0,
            (DistBackend::Gloo, other) => {
                return Err(invalid(
                    OP,
                    format!("Gloo groups carry CPU tensors, not {other:?}"),
                ));
            }
            (DistBackend::Nccl, Device::Cuda(index)) => {
                crate::cuda::ensure_available()?;
                check_multicast_off()?;
                i32::try_from(index).map_err(|_| invalid(OP, "CUDA index out of range"))?
            }
            (DistBackend::Nccl, other) => {
                return Err(invalid(
                    OP,
                    format!("NCCL groups carry CUDA tensors, not {other:?}"),
                ));
            }
        };
        let host = CString::new(rendezvous.host.as_str())
            .map_err(|_| invalid(OP, "host contains a NUL byte"))?;
        let rank = i32::try_from(rendezvous.rank).map_err(|_| invalid(OP, "rank out of range"))?;
        let world = i32::try_from(rendezvous.world_size)
            .map_err(|_| invalid(OP, "world size out of range"))?;
        let timeout_ms = i64::try_from(rendezvous.timeout.as_millis())
            .map_err(|_| invalid(OP, "timeout out of range"))?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` outlives the call; `raw` is a live out-parameter that
        // owns a new Group on success, released in `Drop`.
        unsafe {
            ffi::check(
                OP,
                ffi::esper_dist_new(
                    host.as_ptr(),
                    i32::from(rendezvous.port),
                    rank,
                    world,
                    backend.code(),
                    device_index,
                    timeout_ms,
                    rendezvous.listen_fd.unwrap_or(-1),
                    &mut raw,
                ),
            )?
        };
        let raw = NonNull::new(raw).ok_or(Error::Cpp {
            op: OP,
            message: "shim returned a null group".to_owned(),
        })?;
        Ok(Self {
            raw,
            rank: rendezvous.rank,
            world_size: rendezvous.world_size,
            backend,
            device,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many processes the group has.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The backend carrying the collectives.
    pub fn backend(&self) -> DistBackend {
        self.backend
    }

    /// Where the group's tensors live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Combines `tensor` across every rank with `op`, in place. Every rank
    /// must call it with a tensor of the same shape and dtype.
    pub fn all_reduce_(&self, tensor: &Tensor, op: ReduceOp) -> Result<()> {
        self.check_tensor("ProcessGroup::all_reduce_", tensor)?;
        // SAFETY: `self.raw` is the live group; `tensor` is borrowed for the call.
        unsafe {
            ffi::check(
                "ProcessGroup::all_reduce_",
                ffi::esper_dist_all_reduce(self.raw.as_ptr(), ffi::tensor_ptr(tensor), op.code()),
            )
        }
    }

    /// Overwrites `tensor` on every rank with rank `root`'s.
    pub fn broadcast_(&self, tensor: &Tensor, root: usize) -> Result<()> {
        const OP: &str = "ProcessGroup::broadcast_";
        self.check_tensor(OP, tensor)?;
        if root >= self.world_size {
            return Err(invalid(
                OP,
                format!("root {root} is outside 0..{}", self.world_size),
            ));
        }
        let root = i32::try_from(root).map_err(|_| invalid(OP, "root out of range"))?;
        // SAFETY: `self.raw` is the live group; `tensor` is borrowed for the call.
        unsafe {
            ffi::check(
                OP,
                ffi::esper_dist_broadcast(self.raw.as_ptr(), ffi::tensor_ptr(tensor), root),
            )
        }
    }

    /// Returns once every rank has called it (or fails at the timeout).
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: `self.raw` is the live group.
        unsafe {
            ffi::check(
                "ProcessGroup::barrier",
                ffi::esper_dist_barrier(self.raw.as_ptr()),
            )
        }
    }

    fn check_tensor(&self, op: &'static str, tensor: &Tensor) -> Result<()> {
        if !tensor.defined() {
            return Err(invalid(op, "tensor is undefined"));
        }
        if tensor.device() != self.device {
            return Err(invalid(
                op,
                format!(
                    "tensor is on {:?}, the group's tensors on {:?}",
                    tensor.device(),
                    self.device
                ),
            ));
        }
        if !tensor.is_contiguous() {
            return Err(invalid(op, "tensor is not contiguous"));
        }
        Ok(())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `self.raw` owns the Group and is freed exactly once, here.
        unsafe { ffi::esper_dist_free(self.raw.as_ptr()) };
    }
}

/// Refuses an NCCL group unless every [`MULTICAST_OFF`] variable is set to
/// its off value in this process's environment.
pub fn check_multicast_off() -> Result<()> {
    for (name, value) in MULTICAST_OFF {
        match std::env::var(name) {
            Ok(actual) if actual == value => {}
            Ok(actual) => {
                return Err(invalid(
                    "check_multicast_off",
                    format!("{name}={actual}: NVLink multicast must stay off ({name}={value})"),
                ));
            }
            Err(_) => {
                return Err(invalid(
                    "check_multicast_off",
                    format!("{name} is not set: NVLink multicast must stay off ({name}={value})"),
                ));
            }
        }
    }
    Ok(())
}
