//! What a kept set of baselines must share with a run to be kept for it:
//! [`without_policy_only`] takes out of a setup's description
//! ([`super::LearningSetup::describe`]) everything that only the learned
//! policy's training reads, so two runs that train the policy differently
//! on the same environments share one set of baselines.

/// The prefixes of the settings no baseline depends on: the twin term's
/// weight (the baselines run without a twin), the blueprints taken out of
/// the learned policy's masks (the baselines' controllers do not use them),
/// PPO's and the heads' entropy floors (`ppo.*`, `floor.*`: nothing but
/// the policy's update reads them), and the imitation warm-up
/// (`imitation.*`: it drives the training rounds only).
const POLICY_ONLY_SETTINGS: [&str; 5] = [
    "reward.twin_delta_weight=",
    "blueprint.",
    "ppo.",
    "floor.",
    "imitation.",
];

/// The fields of [`LearningSetup::describe`]'s head (each followed by its
/// value) no baseline depends on: how long and how the policy trains and
/// how often its greedy curve is read. The baselines run their own
/// evaluation rounds on the shared environments.
const POLICY_ONLY_FIELDS: [&str; 3] = ["rounds", "ppo-epochs", "greedy-every"];

/// `setup` ([`LearningSetup::describe`]) without the fields of
/// [`POLICY_ONLY_FIELDS`] in its head and the settings of
/// [`POLICY_ONLY_SETTINGS`] in its settings list; a string of another form
/// is returned as it is.
pub(super) fn without_policy_only(setup: &str) -> String {
    let Some((head, rest)) = setup.split_once(" settings [") else {
        return setup.to_owned();
    };
    let Some(list) = rest.strip_suffix(']') else {
        return setup.to_owned();
    };
    let mut fields = Vec::new();
    let mut words = head.split(' ');
    while let Some(word) = words.next() {
        if POLICY_ONLY_FIELDS.contains(&word) {
            let _value = words.next();
        } else {
            fields.push(word);
        }
    }
    let kept: Vec<&str> = list
        .split(' ')
        .filter(|setting| {
            !POLICY_ONLY_SETTINGS
                .iter()
                .any(|prefix| setting.starts_with(prefix))
        })
        .collect();
    format!("{} settings [{}]", fields.join(" "), kept.join(" "))
}
