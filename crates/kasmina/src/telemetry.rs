//! What Kasmina's telemetry says: the lifecycle events (germinated, stage
//! changed, gate evaluated, fossilized, pruned) and the per-seed gauges.
//!
//! Kasmina has no emitting trait or handle of its own: every slot, lifecycle
//! and model holds the workspace's one handle, [`leyline::Telemetry`] (a Nissa
//! hub's `Hub::telemetry()`, a [`leyline::Collector`] in tests, or
//! [`leyline::Telemetry::disabled`]), and builds metrics with
//! [`leyline::metric`]. As the reference requires, telemetry can never fail a
//! lifecycle operation: emission returns nothing, and the handle contains a
//! panicking emitter.
//!
//! The conventions Kasmina's packets follow:
//!
//! - Lifecycle events: one packet per event, source `kasmina.<slot>`
//!   ([`slot_source`]), event names only from `leyline::telemetry`
//!   (`KASMINA_SEED_*`), at the level leyline lists for the event. Attributes
//!   carry `slot_id`, `seed_id`, `blueprint_id`, `alpha`, `epochs_in_stage`,
//!   `stage` and the event's own fields (`from`/`to`,
//!   `gate`/`passed`/`target_stage`/checks, `reason`/`initiator`, `params`).
//! - Per-seed gauges (`kasmina.seed.*`), emitted on demand by
//!   `MorphogeneticModel::emit_seed_metrics`: one packet per seed, source
//!   `kasmina.<slot>`, level Debug, with `slot_id` / `seed_id` attributes on
//!   every metric; then `kasmina.seeds.active` from source [`SOURCE`].

use crate::host::SlotId;

/// Source of the model-wide packets (`kasmina.seeds.active`): leyline's
/// [`leyline::telemetry::sources::KASMINA`].
pub use leyline::telemetry::sources::KASMINA as SOURCE;

/// Source of one slot's packets: `kasmina.<slot>`.
pub fn slot_source(slot: SlotId) -> String {
    format!("{SOURCE}.{slot}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_sources_name_the_slot() {
        assert_eq!(slot_source(SlotId::new(0, 1)), "kasmina.r0c1");
    }
}
