//! The CleanRL-style actor-critic for CartPole: two separate MLPs on the
//! 4 observations, `4 → 64 → 64` with tanh, ending in 2 action logits (the
//! actor) and 1 value (the critic), built on a tch `nn::VarStore`.
//!
//! Initialisation as CleanRL's `layer_init`: orthogonal weights with gain
//! √2 on the hidden layers, 0.01 on the actor's output and 1.0 on the
//! critic's, zero biases. The orthogonal matrices come from this module's
//! own seeded generator (normal draws on the host, then a QR decomposition
//! with the signs of `R`'s diagonal folded in), so a seed gives the same
//! network whatever else uses libtorch's global generator.

use tch::{Device, Kind, Tensor, nn};

use crate::error::TorchResultExt;
use crate::{Error, Result};
use leyline::rng::SplitMix64;

/// Observation width.
pub const OBSERVATIONS: i64 = 4;
/// Number of actions.
pub const ACTIONS: i64 = 2;
/// Hidden width.
pub const HIDDEN: i64 = 64;

/// One linear layer.
#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.f_linear(&self.weight, Some(&self.bias))
            .op("cartpole linear")
    }
}

/// Standard normal draws by Box–Muller.
fn normals(rng: &mut SplitMix64, count: usize) -> Vec<f64> {
    (0..count)
        .map(|_| {
            // 1 − u lies in (0, 1], so the logarithm is finite.
            let radius = (-2.0 * (1.0 - rng.next_f64()).ln()).sqrt();
            radius * (std::f64::consts::TAU * rng.next_f64()).cos()
        })
        .collect()
}

/// An `[rows, cols]` matrix with orthonormal rows or columns (whichever are
/// fewer), times `gain`, as `torch.nn.init.orthogonal_` defines it.
pub fn orthogonal(rows: i64, cols: i64, gain: f64, rng: &mut SplitMix64) -> Result<Tensor> {
    let (tall, wide) = if rows < cols {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let count = usize::try_from(tall.saturating_mul(wide)).map_err(|_| Error::InvalidInput {
        field: "orthogonal.shape",
        reason: format!("[{rows}, {cols}]"),
    })?;
    let draws = normals(rng, count);
    let a = Tensor::f_from_slice(&draws)
        .op("orthogonal")?
        .f_view([tall, wide])
        .op("orthogonal")?;
    let (q, r) = Tensor::f_linalg_qr(&a, "reduced").op("orthogonal qr")?;
    let signs = r
        .f_diagonal(0, 0, 1)
        .op("orthogonal")?
        .f_sign()
        .op("orthogonal")?;
    let q = q.f_mul(&signs).op("orthogonal")?;
    let q = if rows < cols {
        q.f_transpose(0, 1).op("orthogonal")?
    } else {
        q
    };
    q.f_mul_scalar(gain)
        .op("orthogonal")?
        .f_to_kind(Kind::Float)
        .op("orthogonal")?
        .f_contiguous()
        .op("orthogonal")
}

fn linear(
    path: &nn::Path<'_>,
    input: i64,
    output: i64,
    gain: f64,
    rng: &mut SplitMix64,
) -> Result<Linear> {
    let init = orthogonal(output, input, gain, rng)?
        .f_to_device(path.device())
        .op("cartpole init")?;
    Ok(Linear {
        weight: path.f_var_copy("weight", &init).op("cartpole weight")?,
        bias: path.f_zeros("bias", &[output]).op("cartpole bias")?,
    })
}

/// A three-layer tanh MLP.
#[derive(Debug)]
struct Mlp {
    layers: [Linear; 3],
}

impl Mlp {
    fn new(path: &nn::Path<'_>, output: i64, out_gain: f64, rng: &mut SplitMix64) -> Result<Mlp> {
        let hidden_gain = std::f64::consts::SQRT_2;
        Ok(Mlp {
            layers: [
                linear(&path.sub("0"), OBSERVATIONS, HIDDEN, hidden_gain, rng)?,
                linear(&path.sub("1"), HIDDEN, HIDDEN, hidden_gain, rng)?,
                linear(&path.sub("2"), HIDDEN, output, out_gain, rng)?,
            ],
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [first, second, out] = &self.layers;
        let h = first.forward(x)?.f_tanh().op("cartpole tanh")?;
        let h = second.forward(&h)?.f_tanh().op("cartpole tanh")?;
        out.forward(&h)
    }
}

/// The actor-critic (see the module docs).
#[derive(Debug)]
pub struct ActorCritic {
    vs: nn::VarStore,
    actor: Mlp,
    critic: Mlp,
}

impl ActorCritic {
    /// A fresh network on `device`, initialised from `seed`.
    pub fn new(device: Device, seed: u64) -> Result<ActorCritic> {
        let vs = nn::VarStore::new(device);
        let mut rng = SplitMix64::new(seed);
        let root = vs.root();
        let critic = Mlp::new(&root.sub("critic"), 1, 1.0, &mut rng)?;
        let actor = Mlp::new(&root.sub("actor"), ACTIONS, 0.01, &mut rng)?;
        Ok(ActorCritic { vs, actor, critic })
    }

    /// The variable store (every parameter).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Every trainable parameter.
    pub fn parameters(&self) -> Vec<Tensor> {
        self.vs.trainable_variables()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Action logits, `[n, 4] → [n, 2]`.
    pub fn logits(&self, observations: &Tensor) -> Result<Tensor> {
        self.actor.forward(observations)
    }

    /// Values, `[n, 4] → [n]`.
    pub fn values(&self, observations: &Tensor) -> Result<Tensor> {
        self.critic
            .forward(observations)?
            .f_squeeze_dim(-1)
            .op("cartpole value")
    }
}
