//! What a training or evaluation round says of itself: its progress line
//! ([`round_summary`]) and the share of its decisions on which the policy
//! chose each op ([`insert_chosen_fractions`]), for the learning curve.

/// A round's reward, accuracies, seeds and lifecycle counts (with the
/// blueprints germinated, where any was), for progress.
pub(super) fn round_summary(report: &crate::vectorized::RoundReport) -> String {
    let blueprints = if report.actions.germinated.is_empty() {
        String::new()
    } else {
        let grown: Vec<String> = report
            .actions
            .germinated
            .iter()
            .map(|(blueprint, count)| format!("{blueprint} {count}"))
            .collect();
        format!(" ({})", grown.join(", "))
    };
    let imitation = report.imitation.map_or(String::new(), |figures| {
        format!(
            "; imitation of {}: {} decisions imitated ({} ADVANCEs as WAIT), {} not \
             imitable",
            figures.demonstrator.name(),
            figures.imitated,
            figures.advances_as_wait,
            figures.not_imitable
        )
    });
    // An anchored PPO round: the demonstrator's labels and the term.
    let anchor = match (report.anchor, report.ppo.as_ref()) {
        (Some(figures), Some(ppo)) => format!(
            "; anchor to {}: {} labels, NLL {:.3} at {}",
            figures.demonstrator.name(),
            figures.imitated,
            ppo.anchor_loss,
            ppo.anchor_coef
        ),
        _ => String::new(),
    };
    format!(
        "reward {:.2}, acc {:?}, seeds {:.2}, germ {}{blueprints} foss {} prune \
         {}{imitation}{anchor}",
        report.mean_episode_reward,
        report.final_accuracies,
        report.mean_active_seeds,
        report.germinations,
        report.fossilizations,
        report.prunes
    )
}

/// The share of the round's decisions on which the policy chose each op
/// (`chosen_wait_fraction`, `chosen_germinate_fraction`, …): what it has
/// learned to do, beside what that did to the accuracy.
pub(super) fn insert_chosen_fractions(
    report: &crate::vectorized::RoundReport,
    metrics: &mut std::collections::BTreeMap<String, f64>,
) {
    for &op in leyline::LifecycleOp::ALL {
        metrics.insert(
            format!("chosen_{}_fraction", op.name().to_ascii_lowercase()),
            report.actions.chosen_fraction(op),
        );
    }
}
