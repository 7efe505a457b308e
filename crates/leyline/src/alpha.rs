//! Alpha blending contracts: controller mode, schedule curve, blend algorithm.

contract_enum! {
    /// Direction the alpha controller is moving.
    pub enum AlphaMode {
        /// Alpha is at its target.
        Hold = 0 => "HOLD",
        /// Ramping up towards the target.
        Up = 1 => "UP",
        /// Ramping down towards the target (blend-out freeze on).
        Down = 2 => "DOWN",
    }
}

contract_enum! {
    /// Shape of the alpha schedule.
    pub enum AlphaCurve {
        /// `t`.
        Linear = 1 => "LINEAR",
        /// `0.5 (1 - cos(pi t))`.
        Cosine = 2 => "COSINE",
        /// Logistic curve rescaled to [0, 1] over t in [0, 1].
        Sigmoid = 3 => "SIGMOID",
    }
}

contract_enum! {
    /// How a seed's output is combined with the host features.
    pub enum AlphaAlgorithm {
        /// `h + a (s - h)`.
        Add = 1 => "ADD",
        /// `h (1 + a tanh(s - x))` (the "valve").
        Multiply = 2 => "MULTIPLY",
        /// `lerp(h, s, a g(x))` with a learned gate.
        Gate = 3 => "GATE",
    }
}

/// Default sigmoid steepness of the alpha controller.
pub const DEFAULT_SIGMOID_STEEPNESS: f64 = 12.0;
/// Smallest sigmoid steepness the controller accepts.
pub const MIN_SIGMOID_STEEPNESS: f64 = 0.1;
