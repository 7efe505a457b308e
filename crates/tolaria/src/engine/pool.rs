//! The process-wide CUDA graph memory pools, one per device and lane, that
//! every engine captures into.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tch::{Device, Kind, Tensor};
use torch_ext::{CudaGraph, CudaStream, GraphPool};

use crate::error::{Error, Result, TorchResultExt};

/// One graph memory pool per CUDA device and *lane* for the whole process:
/// every engine of that lane captures into it. Graphs of one pool may reuse
/// each other's intermediate memory, which is safe only while they never
/// replay at the same time: engines that run concurrently on different
/// streams take different lanes ([`EngineConfig::pool_lane`](super::EngineConfig::pool_lane)). A one-kernel *keeper* graph captured into the
/// pool when it is made lives as long as the process: the caching allocator
/// frees a pool once no graph uses it, and capturing into a freed pool's id
/// is an internal error, so without the keeper the second trainer after the
/// first one's graphs were dropped could not capture at all.
pub fn shared_pool(device_index: usize, lane: usize) -> Result<GraphPool> {
    struct Shared {
        pool: GraphPool,
        _keeper: CudaGraph,
        _cell: Tensor,
    }
    static POOLS: OnceLock<Mutex<HashMap<(usize, usize), Shared>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut pools = pools.lock().map_err(|_| Error::InvalidConfig {
        field: "graph pool",
        reason: "the process-wide graph pool table is poisoned".to_owned(),
    })?;
    if let Some(shared) = pools.get(&(device_index, lane)) {
        return Ok(shared.pool);
    }
    let pool = GraphPool::new()?;
    let stream = CudaStream::from_pool(device_index, false)?;
    let cell = Tensor::f_zeros([1], (Kind::Float, Device::Cuda(device_index))).op("keeper cell")?;
    let keeper = CudaGraph::capture(&stream, Some(&pool), 1, || {
        cell.shallow_clone()
            .f_add_scalar_(1.0)
            .map(|_| ())
            .map_err(|error| error.to_string())
    })?;
    let _ = pools.insert(
        (device_index, lane),
        Shared {
            pool,
            _keeper: keeper,
            _cell: cell,
        },
    );
    Ok(pool)
}
