//! Counterfactual and Shapley attribution (reference §4.5, §9 item 14):
//! configuration sets and their deduplication, the factorial and sampled
//! Shapley plans, the estimators on games with known answers, and the fused
//! validation pass against one plain forward per configuration on small CPU
//! models with two seeds.

use kasmina::gate::{GateMode, GateThresholds, QualityGates};
use kasmina::groups::GroupKey;
use kasmina::host::{CnnHost, CnnHostConfig, SlotId, TransformerHost, TransformerHostConfig};
use kasmina::lifecycle::{GerminationOptions, SlotConfig};
use kasmina::model::MorphogeneticModel;
use leyline::{SeedStage, Telemetry};
use simic::Error;
use simic::counterfactual::shapley::{
    AUTO_FACTORIAL_PLAYERS, MAX_FACTORIAL_PLAYERS, MAX_PERMUTATIONS,
};
use simic::counterfactual::{
    Coalition, CoalitionValues, ConfigLabel, ConfigSet, CounterfactualReport, FusedConfig, OnAlpha,
    PlayerOptions, Players, RewardInputs, ShapleyConfig, ShapleyMethod, ShapleyPlan,
    ShapleyStrategy, SlotAlphas, SlotSnapshot, fused_validation, interactions, marginals,
};
use tch::{Device, Kind, Tensor};

// ---------------------------------------------------------------- helpers

/// `n` active seeds at alphas 0.5, 0.6, …, in slots r0c0, r0c1, ….
fn active_slots(n: u32) -> Vec<SlotSnapshot> {
    (0..n)
        .map(|col| SlotSnapshot {
            id: SlotId::new(0, col),
            alpha: 0.5 + 0.1 * f64::from(col % 5),
            on_path: true,
            fossilized: false,
        })
        .collect()
}

fn players(n: u32) -> Players {
    Players::new(active_slots(n), PlayerOptions::default()).expect("players")
}

fn sampled(permutations: usize, seed: u64) -> ShapleyConfig {
    ShapleyConfig {
        strategy: ShapleyStrategy::Sampled,
        permutations,
        seed,
    }
}

/// The values of every coalition a plan needs under `value`.
fn game(plan: &ShapleyPlan, value: impl FnMut(Coalition) -> f64) -> CoalitionValues {
    CoalitionValues::from_fn(plan.players(), plan.coalitions(), value).expect("values")
}

/// An additive game: 40 plus the weight of every member.
fn additive(weights: &[f64]) -> impl Fn(Coalition) -> f64 + '_ {
    move |coalition| {
        40.0 + weights
            .iter()
            .enumerate()
            .filter(|(player, _)| coalition.contains(*player))
            .map(|(_, weight)| weight)
            .sum::<f64>()
    }
}

const WEIGHTS: [f64; 5] = [1.5, -0.75, 3.25, 0.5, 2.0];

// ------------------------------------------------------------ config sets

#[test]
fn full_factorial_yields_two_to_the_n_unique_configurations() {
    for n in 0..=6u32 {
        let mut set = ConfigSet::new(players(n));
        let plan = set
            .add_shapley(&ShapleyConfig {
                strategy: ShapleyStrategy::Factorial,
                ..ShapleyConfig::default()
            })
            .expect("factorial");
        assert_eq!(plan.method(), ShapleyMethod::Exact);
        let expected = 1usize << n;
        assert_eq!(plan.coalitions().len(), expected, "n = {n}");
        assert_eq!(set.len(), expected, "n = {n}: configurations");
        let alphas = set.alphas();
        for (i, a) in alphas.iter().enumerate() {
            for b in alphas.iter().skip(i + 1) {
                assert_ne!(a, b, "n = {n}: duplicate configuration");
            }
        }
        let mut coalitions: Vec<Coalition> = set
            .entries()
            .iter()
            .map(|entry| entry.coalition.expect("every entry is a coalition"))
            .collect();
        coalitions.sort();
        coalitions.dedup();
        assert_eq!(coalitions.len(), expected);
    }
    // Auto is factorial up to 4 players, sampled above.
    for n in 0..=7usize {
        let plan = ShapleyPlan::new(n, &ShapleyConfig::default()).expect("auto");
        let want = if n <= AUTO_FACTORIAL_PLAYERS {
            ShapleyMethod::Exact
        } else {
            ShapleyMethod::Sampled
        };
        assert_eq!(plan.method(), want, "n = {n}");
    }
}

#[test]
fn shapley_configurations_include_all_off_and_all_on() {
    for n in [1u32, 3, 5, 7] {
        let mut set = ConfigSet::new(players(n));
        let plan = set.add_shapley(&sampled(4, 9)).expect("sampled");
        let full = Coalition::full(n as usize);
        let coalitions = plan.coalitions();
        assert!(coalitions.contains(&Coalition::EMPTY), "n = {n}");
        assert!(coalitions.contains(&full), "n = {n}");
        for player in 0..n as usize {
            assert!(coalitions.contains(&full.without(player)), "each-off");
        }
        let all_off = set.index_of(ConfigLabel::AllOff).expect("all-off label");
        let all_on = set.index_of(ConfigLabel::AllOn).expect("all-on label");
        let entries = set.entries();
        assert_eq!(entries[all_off].coalition, Some(Coalition::EMPTY));
        assert_eq!(entries[all_on].coalition, Some(full));
        // All off: every player's alpha forced to 0.
        assert!(
            entries[all_off]
                .alphas
                .as_slice()
                .iter()
                .all(|alpha| *alpha == Some(0.0))
        );
        // All on at the current alphas changes nothing.
        assert_eq!(entries[all_on].alphas, SlotAlphas::unchanged(n as usize));
    }
}

#[test]
fn the_per_epoch_set_follows_the_reference_and_is_deduplicated() {
    // Hand-counted distinct configurations (players "on" at their current
    // alpha, so main = all on, solo-on = solo-off for two players, pairs =
    // solo-offs for three, committed = all off):
    // n=1: main, off                      -> 2
    // n=2: main, {1}, {0}, {}             -> 4
    // n=3: main, 3 off, 3 on, {}          -> 8
    // n=4: main, 4 off, 4 on, {}, 6 pairs -> 16
    // n=5: main, 5 off, 5 on, committed {} -> 12 (no all-off label, no pairs)
    for (n, distinct, labels) in [
        (0u32, 1usize, 2usize),
        (1, 2, 4),
        (2, 4, 7),
        (3, 8, 12),
        (4, 16, 17),
        (5, 12, 12),
    ] {
        let set = ConfigSet::counterfactual(players(n)).expect("set");
        assert_eq!(set.len(), distinct, "n = {n}: distinct");
        assert_eq!(set.labels().len(), labels, "n = {n}: labels");
        let slot = |col| SlotId::new(0, col);
        assert_eq!(set.index_of(ConfigLabel::Main), Some(0));
        assert_eq!(
            set.index_of(ConfigLabel::AllOff).is_some(),
            (2..=4).contains(&n),
            "n = {n}: all-off"
        );
        assert_eq!(
            set.index_of(ConfigLabel::Pair(slot(0), slot(1))).is_some(),
            (3..=4).contains(&n),
            "n = {n}: pairs"
        );
        let committed = set.index_of(ConfigLabel::Committed).expect("committed");
        assert_eq!(
            set.entries()[committed].coalition,
            Some(Coalition::EMPTY),
            "n = {n}: committed = all off"
        );
    }
    // A solo-on of one player is the main configuration.
    let set = ConfigSet::counterfactual(players(1)).expect("set");
    assert_eq!(
        set.index_of(ConfigLabel::SoloOn(SlotId::new(0, 0))),
        Some(0)
    );
}

#[test]
fn overrides_that_change_nothing_are_the_same_configuration() {
    let slots = vec![
        SlotSnapshot {
            id: SlotId::new(0, 0),
            alpha: 0.5,
            on_path: true,
            fossilized: false,
        },
        // Incubating (alpha 0): on the path, not a player.
        SlotSnapshot {
            id: SlotId::new(0, 1),
            alpha: 0.0,
            on_path: true,
            fossilized: false,
        },
        // Fossil: not a player by default.
        SlotSnapshot {
            id: SlotId::new(1, 0),
            alpha: 1.0,
            on_path: true,
            fossilized: true,
        },
        // Empty slot.
        SlotSnapshot {
            id: SlotId::new(1, 1),
            alpha: 0.0,
            on_path: false,
            fossilized: false,
        },
    ];
    let players = Players::new(slots.clone(), PlayerOptions::default()).expect("players");
    assert_eq!(players.slot_ids(), vec![SlotId::new(0, 0)]);
    let mut set = ConfigSet::counterfactual(players).expect("set");
    assert_eq!(set.len(), 2);
    // The current alphas spelt out, and an override of the empty slot,
    // are the main configuration.
    let spelt = SlotAlphas::new(vec![Some(0.5), Some(0.0), Some(1.0), Some(0.7)]).expect("a");
    assert_eq!(set.insert(ConfigLabel::AllOn, &spelt, None).expect("in"), 0);
    // Switching the fossil off is new.
    let no_fossil = SlotAlphas::new(vec![None, None, Some(0.0), None]).expect("a");
    assert_eq!(
        set.insert(ConfigLabel::AllOff, &no_fossil, None)
            .expect("in"),
        2
    );
    assert_eq!(set.len(), 3);
    assert!(
        set.insert(ConfigLabel::AllOff, &SlotAlphas::unchanged(3), None)
            .is_err(),
        "wrong slot count"
    );
    assert!(SlotAlphas::new(vec![Some(1.5)]).is_err());
    assert!(SlotAlphas::new(vec![Some(f64::NAN)]).is_err());

    // With fossils playing, "committed" is the fossil alone.
    let options = PlayerOptions {
        include_fossils: true,
        on_alpha: OnAlpha::Current,
    };
    let players = Players::new(slots, options).expect("players");
    assert_eq!(
        players.slot_ids(),
        vec![SlotId::new(0, 0), SlotId::new(1, 0)]
    );
    let set = ConfigSet::counterfactual(players).expect("set");
    let committed = set.index_of(ConfigLabel::Committed).expect("committed");
    assert_eq!(
        set.entries()[committed].alphas.as_slice(),
        [Some(0.0), None, None, None]
    );
    assert_eq!(
        set.index_of(ConfigLabel::SoloOn(SlotId::new(1, 0))),
        Some(committed)
    );
}

// ---------------------------------------------------------------- Shapley

#[test]
fn antithetic_pairs_are_reverses() {
    let plan = ShapleyPlan::new(6, &sampled(10, 42)).expect("plan");
    let orders = plan.permutations();
    assert_eq!(orders.len(), 20);
    for pair in orders.chunks(2) {
        let reversed: Vec<usize> = pair[0].iter().rev().copied().collect();
        assert_eq!(pair[1], reversed);
        let mut sorted = pair[0].clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..6).collect::<Vec<_>>());
    }
    assert_eq!(
        ShapleyPlan::new(6, &sampled(10, 42)).expect("again"),
        plan,
        "seeded"
    );
    assert_ne!(
        ShapleyPlan::new(6, &sampled(10, 43))
            .expect("other")
            .permutations(),
        orders
    );
    // Every prefix of every order is measured.
    let coalitions = plan.coalitions();
    for order in orders {
        for k in 0..=order.len() {
            assert!(coalitions.contains(&Coalition::of(&order[..k])));
        }
    }
}

#[test]
fn shapley_values_are_exact_for_an_additive_game() {
    let configs = [
        ShapleyConfig::default(),
        sampled(1, 5),
        sampled(10, 6),
        ShapleyConfig {
            strategy: ShapleyStrategy::Factorial,
            ..ShapleyConfig::default()
        },
    ];
    for n in [2usize, 3, 5] {
        let weights = &WEIGHTS[..n];
        for config in &configs {
            let plan = ShapleyPlan::new(n, config).expect("plan");
            if n == 5 && config.strategy == ShapleyStrategy::Auto {
                assert_eq!(plan.method(), ShapleyMethod::Sampled);
            }
            let values = plan
                .estimate(&game(&plan, additive(weights)))
                .expect("estimate");
            assert_eq!(values.len(), n);
            for (value, weight) in values.iter().zip(weights) {
                assert!(
                    (value.mean - weight).abs() < 1e-9,
                    "n = {n} {config:?}: {} vs {weight}",
                    value.mean
                );
                assert!(value.std < 1e-9, "additive marginals do not vary");
            }
        }
    }
}

#[test]
fn exact_shapley_matches_hand_computed_games() {
    let exact = ShapleyConfig {
        strategy: ShapleyStrategy::Factorial,
        ..ShapleyConfig::default()
    };
    // Glove game: only the pair is worth 1 -> 1/2 each; every order gives
    // one player 0 and the other 1, so the std is 1/2.
    let plan = ShapleyPlan::new(2, &exact).expect("plan");
    let values = plan
        .estimate(&game(&plan, |c| if c.len() == 2 { 1.0 } else { 0.0 }))
        .expect("glove");
    for value in &values {
        assert!((value.mean - 0.5).abs() < 1e-12);
        assert!((value.std - 0.5).abs() < 1e-12);
        assert_eq!(value.samples, 2);
        assert!(value.exact);
    }
    // Majority of three: 1 when two or more -> 1/3 each.
    let plan = ShapleyPlan::new(3, &exact).expect("plan");
    let values = plan
        .estimate(&game(&plan, |c| if c.len() >= 2 { 1.0 } else { 0.0 }))
        .expect("majority");
    for value in &values {
        assert!((value.mean - 1.0 / 3.0).abs() < 1e-12);
    }
    // v = 10·[0 in S] + 6·[0 and 1 in S]: φ0 = 10 + 3, φ1 = 3, φ2 = 0.
    let values = plan
        .estimate(&game(&plan, |c| {
            let mut v = 0.0;
            if c.contains(0) {
                v += 10.0;
            }
            if c.contains(0) && c.contains(1) {
                v += 6.0;
            }
            v
        }))
        .expect("interaction game");
    let means: Vec<f64> = values.iter().map(|v| v.mean).collect();
    for (got, want) in means.iter().zip([13.0, 3.0, 0.0]) {
        assert!((got - want).abs() < 1e-12, "{means:?}");
    }
    // A missing coalition is refused.
    let mut partial = CoalitionValues::new(3).expect("values");
    partial.insert(Coalition::EMPTY, 1.0).expect("insert");
    assert!(matches!(
        plan.estimate(&partial),
        Err(Error::InvalidInput { .. })
    ));
}

// ------------------------------------------------------------- estimators

#[test]
fn interaction_terms_are_zero_for_additive_and_recover_a_planted_term() {
    for n in [2usize, 3] {
        let plan = ShapleyPlan::new(n, &ShapleyConfig::default()).expect("plan");
        let values = game(&plan, additive(&WEIGHTS[..n]));
        let terms = interactions(&values);
        assert_eq!(terms.len(), n * (n - 1) / 2);
        assert!(
            terms.iter().all(|term| term.value.abs() < 1e-12),
            "{terms:?}"
        );
        // Marginals of an additive factorial are the weights.
        for (marginal, weight) in marginals(&values).iter().zip(&WEIGHTS[..n]) {
            assert!((marginal.expect("measured") - weight).abs() < 1e-12);
        }
    }
    let plan = ShapleyPlan::new(3, &ShapleyConfig::default()).expect("plan");
    let base = additive(&WEIGHTS[..3]);
    let values = game(&plan, |c| {
        base(c)
            + if c.contains(0) && c.contains(2) {
                4.0
            } else {
                0.0
            }
    });
    let terms: Vec<(usize, usize, f64)> = interactions(&values)
        .iter()
        .map(|t| (t.first, t.second, t.value))
        .collect();
    assert_eq!(terms.len(), 3);
    for (first, second, value) in terms {
        let want = if (first, second) == (0, 2) { 4.0 } else { 0.0 };
        assert!((value - want).abs() < 1e-12, "I_{first}{second} = {value}");
    }
    // Not computed above three players.
    let plan = ShapleyPlan::new(4, &ShapleyConfig::default()).expect("plan");
    assert!(interactions(&game(&plan, additive(&WEIGHTS[..4]))).is_empty());
}

#[test]
fn marginals_and_reward_inputs_by_hand() {
    // Two players, every coalition measured:
    // v{} = 60, v{0} = 72, v{1} = 66, v{0,1} = 80 (the main accuracy).
    let mut values = CoalitionValues::new(2).expect("values");
    for (bits, value) in [(0b00, 60.0), (0b01, 72.0), (0b10, 66.0), (0b11, 80.0)] {
        values
            .insert(Coalition::from_bits(bits), value)
            .expect("insert");
    }
    // marginal_0 = (72 + 80)/2 − (60 + 66)/2 = 13; marginal_1 = (66 + 80)/2 − (60 + 72)/2 = 7.
    assert_eq!(marginals(&values), vec![Some(13.0), Some(7.0)]);
    // I_01 = 80 − 72 − 66 + 60 = 2.
    assert_eq!(interactions(&values)[0].value, 2.0);
    // c_0 = 80 − acc(0 off) = 80 − 66 = 14; c_1 = 80 − 72 = 8; T = 80 − 60 = 20.
    let inputs = RewardInputs::new(80.0, &values).expect("inputs");
    assert_eq!(inputs.contributions, vec![Some(14.0), Some(8.0)]);
    assert_eq!(inputs.total, Some(20.0));
    // Without all-off, T falls back to the lowest solo-off: 80 − 66 = 14.
    let mut no_all_off = CoalitionValues::new(2).expect("values");
    no_all_off
        .insert(Coalition::from_bits(0b01), 72.0)
        .expect("insert");
    no_all_off
        .insert(Coalition::from_bits(0b10), 66.0)
        .expect("insert");
    let inputs = RewardInputs::new(80.0, &no_all_off).expect("inputs");
    assert_eq!(inputs.total, Some(14.0));
    assert_eq!(marginals(&no_all_off), vec![Some(6.0), Some(-6.0)]);
    assert!(RewardInputs::new(f64::NAN, &values).is_err());
    assert!(values.insert(Coalition::from_bits(0b100), 1.0).is_err());
    assert!(values.insert(Coalition::EMPTY, f64::INFINITY).is_err());
    let no_players = RewardInputs::new(50.0, &CoalitionValues::new(0).expect("v")).expect("ok");
    assert_eq!(no_players.total, None);
}

#[test]
fn configurations_and_plans_refuse_bad_settings() {
    for permutations in [0, MAX_PERMUTATIONS + 1] {
        assert!(matches!(
            ShapleyPlan::new(5, &sampled(permutations, 0)),
            Err(Error::InvalidConfig {
                field: "ShapleyConfig.permutations",
                ..
            })
        ));
    }
    let factorial = ShapleyConfig {
        strategy: ShapleyStrategy::Factorial,
        ..ShapleyConfig::default()
    };
    assert!(ShapleyPlan::new(MAX_FACTORIAL_PLAYERS, &factorial).is_ok());
    assert!(matches!(
        ShapleyPlan::new(MAX_FACTORIAL_PLAYERS + 1, &factorial),
        Err(Error::InvalidConfig {
            field: "ShapleyConfig.strategy",
            ..
        })
    ));
    let mut bad = active_slots(1);
    bad[0].alpha = 1.5;
    assert!(Players::new(bad, PlayerOptions::default()).is_err());
    assert!(Players::new(active_slots(65), PlayerOptions::default()).is_err());
    assert!(matches!(
        FusedConfig {
            max_fused_samples: 0,
            ..FusedConfig::default()
        }
        .validate(),
        Err(Error::InvalidConfig {
            field: "FusedConfig.max_fused_samples",
            ..
        })
    ));
}

// ------------------------------------------------------------- fused pass

fn permissive() -> SlotConfig {
    SlotConfig {
        gates: QualityGates {
            mode: GateMode::Permissive,
            thresholds: GateThresholds::default(),
        },
        ..SlotConfig::default()
    }
}

/// Moves every seed parameter away from the identity it is born as.
fn perturb_seeds(model: &MorphogeneticModel, scale: f64) {
    tch::no_grad(|| {
        for parameter in model.parameters() {
            if matches!(parameter.group, GroupKey::Seed(_)) {
                let noise = Tensor::randn_like(&parameter.tensor) * scale;
                let _ = parameter
                    .tensor
                    .shallow_clone()
                    .f_add_(&noise)
                    .expect("add");
            }
        }
    });
}

/// Germinates `blueprint` in `slot`, moves it to TRAINING and sets `alpha`.
fn grow(model: &mut MorphogeneticModel, slot: SlotId, blueprint: &str, alpha: f64) {
    model
        .germinate(slot, blueprint, GerminationOptions::new(blueprint))
        .expect("germinate");
    assert!(
        model
            .advance_stage(slot, Some(SeedStage::Training))
            .expect("g1")
            .passed
    );
    model
        .slot_mut(slot)
        .expect("slot")
        .set_alpha(alpha)
        .expect("alpha");
}

const R0C0: SlotId = SlotId { row: 0, col: 0 };
const R0C1: SlotId = SlotId { row: 0, col: 1 };
const R1C0: SlotId = SlotId { row: 1, col: 0 };

/// A small Fashion-MNIST CNN with slots r0c0 (empty), r1c0 and r0c1 (two
/// perturbed seeds at alphas 0.5 and 0.75; alphas exact in f32).
fn cnn_model() -> MorphogeneticModel {
    tch::manual_seed(21);
    let host = CnnHost::new(
        CnnHostConfig {
            base_channels: 2,
            ..CnnHostConfig::fashion_mnist()
        },
        Device::Cpu,
    )
    .expect("host");
    let mut model = MorphogeneticModel::new(
        host,
        &[R0C1, R0C0, R1C0],
        permissive(),
        Telemetry::disabled(),
    )
    .expect("model");
    grow(&mut model, R1C0, "conv_light", 0.5);
    grow(&mut model, R0C1, "conv_heavy", 0.75);
    perturb_seeds(&model, 3.0);
    model
}

/// libtorch's generator is global and the tests of this file run in
/// parallel: tests that draw from it hold this lock so their models and
/// data do not depend on the scheduling.
static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn global_rng() -> std::sync::MutexGuard<'static, ()> {
    GLOBAL_RNG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The model's logits under `config`, each overridden slot with a single
/// `[1, 1, …]` alpha (of `rank` dimensions) for the whole batch.
fn config_logits(
    model: &MorphogeneticModel,
    x: &Tensor,
    config: &SlotAlphas,
    rank: usize,
) -> Tensor {
    let shape: Vec<i64> = vec![1; rank];
    let tensors: Vec<Option<Tensor>> = config
        .as_slice()
        .iter()
        .map(|alpha| alpha.map(|a| Tensor::full(shape.as_slice(), a, (Kind::Float, Device::Cpu))))
        .collect();
    let references: Vec<Option<&Tensor>> = tensors.iter().map(Option::as_ref).collect();
    tch::no_grad(|| model.forward_with_alpha(x, &references, false)).expect("forward")
}

/// Labels that make accuracies differ between configurations wherever
/// their predictions differ: sample `i` is labelled with the prediction of
/// configuration `i mod K`.
fn labels_for(
    model: &MorphogeneticModel,
    x: &Tensor,
    configs: &[SlotAlphas],
    rank: usize,
) -> Tensor {
    let predictions: Vec<Tensor> = configs
        .iter()
        .map(|config| config_logits(model, x, config, rank).argmax(-1, false))
        .collect();
    let samples = x.size()[0];
    let rows: Vec<Tensor> = (0..samples)
        .map(|i| predictions[i as usize % predictions.len()].get(i))
        .collect();
    Tensor::stack(&rows, 0)
}

/// One plain forward per configuration ([`config_logits`]): (accuracy %,
/// mean loss).
fn one_by_one(
    model: &MorphogeneticModel,
    x: &Tensor,
    labels: &Tensor,
    configs: &[SlotAlphas],
    rank: usize,
) -> Vec<(f64, f64)> {
    configs
        .iter()
        .map(|config| {
            let logits = config_logits(model, x, config, rank);
            let classes = *logits.size().last().expect("classes");
            let flat = logits.reshape([-1, classes]);
            let targets = labels.reshape([-1]);
            let accuracy = 100.0
                * flat
                    .argmax(-1, false)
                    .eq_tensor(&targets)
                    .to_kind(Kind::Double)
                    .mean(Kind::Double)
                    .double_value(&[]);
            let loss = flat.cross_entropy_for_logits(&targets).double_value(&[]);
            (accuracy, loss)
        })
        .collect()
}

fn assert_same(fused: &simic::counterfactual::FusedValidation, reference: &[(f64, f64)]) {
    assert_eq!(fused.outcomes.len(), reference.len());
    for (index, (outcome, (accuracy, loss))) in fused.outcomes.iter().zip(reference).enumerate() {
        // Same correct count (one sample is several points).
        assert!(
            (outcome.accuracy - accuracy).abs() < 1e-9,
            "configuration {index}: accuracy {} vs {accuracy}",
            outcome.accuracy
        );
        assert!(
            (outcome.loss - loss).abs() < 1e-5 * loss.abs().max(1.0),
            "configuration {index}: loss {} vs {loss}",
            outcome.loss
        );
    }
}

#[test]
fn the_fused_pass_matches_one_forward_per_configuration_on_a_cnn() {
    let _rng = global_rng();
    let model = cnn_model();
    tch::manual_seed(22);
    let x = Tensor::randn([12, 1, 28, 28], (Kind::Float, Device::Cpu));

    // Players "on" at alpha 1: main, the two solo-offs (the other seed as it
    // is) and the four coalitions at alpha 1 are distinct.
    let options = PlayerOptions {
        include_fossils: false,
        on_alpha: OnAlpha::Full,
    };
    let players = Players::from_model(&model, options).expect("players");
    assert_eq!(players.slot_ids(), vec![R1C0, R0C1]);
    let mut set = ConfigSet::counterfactual(players).expect("set");
    let plan = set.add_shapley(&ShapleyConfig::default()).expect("plan");
    assert_eq!(set.len(), 7);
    let configs = set.alphas();
    let labels = labels_for(&model, &x, &configs, 4);
    let reference = one_by_one(&model, &x, &labels, &configs, 4);
    let distinct: std::collections::BTreeSet<u64> =
        reference.iter().map(|(a, _)| a.to_bits()).collect();
    assert!(
        distinct.len() > 1,
        "configurations should disagree: {reference:?}"
    );

    // Hand-computed forward counts for 12 samples, 7 configurations.
    for (budget, share, forwards) in [
        (1000, true, 1),  // 7 x 12 = 84 samples in one forward
        (1000, false, 1), // the same without the shared prefix
        (16, true, 6),    // group 7, chunk 2: 6 chunks
        (7, true, 12),    // group 7, chunk 1: 12 chunks
        (3, false, 36),   // groups of 3, 3 and 1, chunk 1: 12 x 3
    ] {
        let config = FusedConfig {
            max_fused_samples: budget,
            share_host_prefix: share,
        };
        let fused = fused_validation(&model, &x, &labels, &configs, &config).expect("fused");
        assert_eq!(fused.forwards, forwards, "budget {budget}");
        assert_eq!(fused.targets, 12);
        assert_same(&fused, &reference);
    }

    // The main configuration is the model's own forward.
    let main = set.index_of(ConfigLabel::Main).expect("main");
    let plain = one_by_one(&model, &x, &labels, &[SlotAlphas::unchanged(3)], 4);
    assert!((reference[main].0 - plain[0].0).abs() < 1e-9);

    // The report: c = main − solo-off, and the exact Shapley values add up
    // to v(all on) − v(all off) (efficiency).
    let fused =
        fused_validation(&model, &x, &labels, &configs, &FusedConfig::default()).expect("fused");
    let accuracies = fused.accuracies();
    let report = CounterfactualReport::new(&set, &accuracies, Some(&plan)).expect("report");
    for slot in [R1C0, R0C1] {
        let off = set.index_of(ConfigLabel::SoloOff(slot)).expect("solo-off");
        assert_eq!(
            report.contribution(slot),
            Some(accuracies[main] - accuracies[off])
        );
    }
    let all_on = accuracies[set.index_of(ConfigLabel::AllOn).expect("on")];
    let all_off = accuracies[set.index_of(ConfigLabel::AllOff).expect("off")];
    let shapley = report.shapley.as_ref().expect("shapley");
    let sum: f64 = shapley.iter().map(|v| v.mean).sum();
    assert!((sum - (all_on - all_off)).abs() < 1e-9);
    assert_eq!(report.reward.total, Some(accuracies[main] - all_off));
}

#[test]
fn the_fused_pass_checks_shapes_before_libtorch() {
    let _rng = global_rng();
    let model = cnn_model();
    let x = Tensor::randn([4, 1, 28, 28], (Kind::Float, Device::Cpu));
    let labels = Tensor::zeros([4], (Kind::Int64, Device::Cpu));
    let configs = vec![SlotAlphas::unchanged(3)];
    let config = FusedConfig::default();
    let shape_error = |result: simic::Result<_>| matches!(result, Err(Error::ShapeMismatch { .. }));
    assert!(shape_error(fused_validation(
        &model,
        &x,
        &labels,
        &[SlotAlphas::unchanged(2)],
        &config
    )));
    assert!(shape_error(fused_validation(
        &model,
        &x,
        &labels.to_kind(Kind::Float),
        &configs,
        &config
    )));
    assert!(shape_error(fused_validation(
        &model,
        &x,
        &labels.narrow(0, 0, 3),
        &configs,
        &config
    )));
    assert!(shape_error(fused_validation(
        &model,
        &Tensor::zeros([] as [i64; 0], (Kind::Float, Device::Cpu)),
        &labels,
        &configs,
        &config
    )));
    assert!(matches!(
        fused_validation(&model, &x, &labels, &[], &config),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        fused_validation(
            &model,
            &x.narrow(0, 0, 0),
            &labels.narrow(0, 0, 0),
            &configs,
            &config
        ),
        Err(Error::InvalidInput { .. })
    ));
    // The host refuses an input of the wrong sample shape (Kasmina's check).
    assert!(
        fused_validation(
            &model,
            &Tensor::zeros([4, 3, 28, 28], (Kind::Float, Device::Cpu)),
            &labels,
            &configs,
            &config
        )
        .is_err()
    );
}

#[test]
fn the_fused_pass_matches_one_forward_per_configuration_on_a_transformer() {
    let _rng = global_rng();
    tch::manual_seed(23);
    let host_config = TransformerHostConfig::tiny();
    let vocab = host_config.vocab_size;
    let host = TransformerHost::new(host_config, Device::Cpu).expect("host");
    let (first, second) = (SlotId::new(0, 0), SlotId::new(0, 1));
    let mut model = MorphogeneticModel::new(
        host,
        &[first, second],
        SlotConfig::default(),
        Telemetry::disabled(),
    )
    .expect("model");
    grow(&mut model, first, "lora", 0.5);
    grow(&mut model, second, "mlp_small", 0.75);
    perturb_seeds(&model, 0.3);
    let x = Tensor::randint(vocab, [4, 12], (Kind::Int64, Device::Cpu));
    let players = Players::from_model(&model, PlayerOptions::default()).expect("players");
    assert_eq!(players.len(), 2);
    let set = ConfigSet::counterfactual(players).expect("set");
    assert_eq!(set.len(), 4);
    let configs = set.alphas();
    let labels = labels_for(&model, &x, &configs, 3);
    let reference = one_by_one(&model, &x, &labels, &configs, 3);
    let losses: std::collections::BTreeSet<u64> =
        reference.iter().map(|(_, l)| l.to_bits()).collect();
    assert_eq!(losses.len(), 4, "the seeds matter: {reference:?}");
    for share in [true, false] {
        let config = FusedConfig {
            max_fused_samples: 8,
            share_host_prefix: share,
        };
        let fused = fused_validation(&model, &x, &labels, &configs, &config).expect("fused");
        assert_eq!(fused.targets, 48, "4 sequences x 12 tokens");
        assert_eq!(fused.forwards, 2, "group 4, chunk 2: 2 chunks");
        assert_same(&fused, &reference);
    }
}
