//! Named settings over a [`SimicConfig`]: `section.field=value`, so that a
//! study can depart from the reference's defaults one constant at a time
//! and say exactly which (`esper bench simic-learning --set
//! reward.rent_weight=0`). Seven sections:
//!
//! - `reward.<field>`: any field of [`crate::rewards::RewardConfig`]
//!   (`reward.rent_weight=0`, `reward.mode=sparse`);
//! - `ppo.<field>`: any field of [`crate::ppo::PpoConfig`]
//!   (`ppo.entropy_coef=0.1`);
//! - `floor.<head>`: the sampling probability floor of one action head
//!   ([`leyline::HEAD_NAMES`]: `floor.op=0.05`), `0` for none;
//! - `slot.<field>`: any field of every slot's
//!   [`kasmina::lifecycle::SlotConfig`], chiefly the reference's
//!   auto-forward flags (`slot.auto_forward_g2=true`); with all three
//!   `auto_forward_g*` on, ADVANCE leaves the action space
//!   (`masks.disable_advance`), as at the reference's HEAD, and returns
//!   when one is turned off again;
//! - `blueprint.<name>`: `false` takes a blueprint out of the learned
//!   policy's action space (its mask; [`tamiyo::masks::MaskConfig::excluding`]),
//!   `true` offers it again (`blueprint.conv_small=false`). Not a reference
//!   option: the baselines' scripted controllers and the heuristic are not
//!   affected, and a topology with every blueprint excluded is an error when
//!   its masks are computed;
//! - `imitation.<field>`: the imitation warm-up ([`super::ImitationConfig`],
//!   not a reference option): `imitation.updates=8` makes the first eight
//!   PPO updates imitate the demonstrator, `imitation.demonstrator=heuristic`
//!   (or `max_growth`) names it, `imitation.epochs=32` sets the passes of
//!   each imitation update; `imitation.anchor_weight=1` keeps the PPO
//!   updates after it near the demonstrator (its labels' negative
//!   log-likelihood in PPO's loss), `imitation.anchor_decay=0.9` lets go of
//!   it update by update;
//! - `trainer.<field>`: the environments' trainer settings in which
//!   [`SimicConfig::reference`] departs from Tolaria's defaults
//!   ([`TRAINER_FIELDS`]): `trainer.overlap_weight_grads=true` gives the
//!   environments' steps the weight gradients' side stream,
//!   `trainer.cudnn_benchmark=true` lets cuDNN time its algorithms,
//!   `trainer.graph_warmup_steps=3` warms a step up three times before its
//!   capture.
//!
//! A preset names a list of settings ([`PRESETS`], [`preset`]): `growth`
//! is the set under which the learned greedy policy first beat no growth
//! significantly at L = 150 (`baselines/perf/simic-learning/NOTES.md`,
//! "A cost for putting germination off"); `growth-imitate` adds the ESCROW
//! reward with its twin term and eight imitation updates of max growth,
//! under which it recovers nearly all of max growth's gain; the
//! reference's defaults stay the defaults.
//!
//! A value is read as JSON where it parses (numbers, `true`, `null`, lists)
//! and as a string otherwise (`reward.mode=sparse`). An unknown section,
//! field or head, a value of the wrong type and a value the section's own
//! checks refuse are errors naming the setting, and leave the configuration
//! as it was. What the learning protocol measured with which settings is in
//! `baselines/perf/simic-learning/NOTES.md`.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::SimicConfig;
use crate::{Error, Result};

/// The `growth` preset: no parameter rent, the op head's sampling floor at
/// 0.02, the reference's three auto-forward flags, and the germination
/// delay cost at -0.1 (each a departure from the reference's defaults,
/// measured in `baselines/perf/simic-learning/NOTES.md`).
pub const GROWTH: [&str; 6] = [
    "reward.rent_weight=0",
    "floor.op=0.02",
    "slot.auto_forward_g1=true",
    "slot.auto_forward_g2=true",
    "slot.auto_forward_g3=true",
    "reward.germination_delay_cost=-0.1",
];

/// What the `growth-imitate` preset adds to [`GROWTH`]: the ESCROW reward
/// with its twin term at weight 20, and the first eight PPO updates
/// imitating max growth. Under it every training seed's greedy policy
/// recovered 98% of max growth's gain on `fmnist-impaired` at L = 150
/// (`baselines/perf/simic-learning/NOTES.md`, "The imitation warm-up on
/// the GPU").
pub const IMITATE: [&str; 3] = [
    "reward.mode=escrow",
    "reward.twin_delta_weight=20",
    "imitation.updates=8",
];

/// Every preset by name: the lists of settings it applies, in order.
pub const PRESETS: [(&str, &[&[&str]]); 2] = [
    ("growth", &[&GROWTH]),
    ("growth-imitate", &[&GROWTH, &IMITATE]),
];

/// The settings of the preset `name`, in order; an unknown name is an
/// error that lists the known ones.
pub fn preset(name: &str) -> Result<Vec<&'static str>> {
    PRESETS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, lists)| lists.iter().flat_map(|list| list.iter().copied()).collect())
        .ok_or_else(|| Error::InvalidConfig {
            field: "preset",
            reason: format!(
                "no preset {name:?} (presets: {})",
                PRESETS.map(|(known, _)| known).join(", ")
            ),
        })
}

/// The fields of `trainer.<field>`: the environments' trainer settings in
/// which [`SimicConfig::reference`] departs from Tolaria's defaults. The
/// others are Simic's to set (each environment's seed and graph pool lane,
/// the counterfactual samples) or flags of their own (batch size,
/// precision, execution mode).
pub const TRAINER_FIELDS: [&str; 3] = [
    "overlap_weight_grads",
    "cudnn_benchmark",
    "graph_warmup_steps",
];

/// Applies every setting of `settings` in order (see the module docs); on
/// an error `config` is unchanged.
pub fn apply_all(config: &mut SimicConfig, settings: &[String]) -> Result<()> {
    let mut next = config.clone();
    for setting in settings {
        apply(&mut next, setting)?;
    }
    *config = next;
    Ok(())
}

/// Applies one `section.field=value` setting (see the module docs); on an
/// error `config` is unchanged.
pub fn apply(config: &mut SimicConfig, setting: &str) -> Result<()> {
    let refuse = |reason: String| Error::InvalidConfig {
        field: "setting",
        reason: format!("{setting:?}: {reason}"),
    };
    let (key, text) = setting
        .split_once('=')
        .ok_or_else(|| refuse("expected section.field=value".to_owned()))?;
    let (section, field) = key
        .split_once('.')
        .ok_or_else(|| refuse("expected section.field=value".to_owned()))?;
    if field.is_empty() {
        return Err(refuse("no field named".to_owned()));
    }
    let value: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()));
    match section {
        "reward" => {
            let reward = patched(&config.reward, field, value).map_err(refuse)?;
            reward.validate()?;
            config.reward = reward;
        }
        "ppo" => {
            let ppo = patched(&config.ppo, field, value).map_err(refuse)?;
            ppo.validate()?;
            config.ppo = ppo;
        }
        "floor" => {
            let head = leyline::HEAD_NAMES
                .iter()
                .position(|name| *name == field)
                .ok_or_else(|| {
                    refuse(format!(
                        "no action head {field:?} (heads: {})",
                        leyline::HEAD_NAMES.join(", ")
                    ))
                })?;
            let floor = value
                .as_f64()
                .ok_or_else(|| refuse("a floor is a number in [0, 1)".to_owned()))?;
            let mut sampling = config.sampling;
            let mut floors = sampling.floors.unwrap_or([0.0; leyline::NUM_ACTION_HEADS]);
            let slot = floors
                .get_mut(head)
                .ok_or_else(|| refuse(format!("no floor for head {field:?}")))?;
            *slot = floor;
            sampling.floors = Some(floors);
            sampling
                .validate()
                .map_err(|error| refuse(error.to_string()))?;
            config.sampling = sampling;
        }
        "slot" => {
            let slot: kasmina::lifecycle::SlotConfig =
                patched(&config.slot, field, value).map_err(refuse)?;
            slot.validate().map_err(|error| refuse(error.to_string()))?;
            config.slot = slot;
            config.masks.disable_advance =
                slot.auto_forward_g1 && slot.auto_forward_g2 && slot.auto_forward_g3;
        }
        "blueprint" => {
            let blueprint = leyline::BlueprintAction::ALL
                .iter()
                .copied()
                .find(|blueprint| {
                    *blueprint != leyline::BlueprintAction::Noop
                        && blueprint.blueprint_id() == field
                })
                .ok_or_else(|| {
                    let known: Vec<&str> = leyline::BlueprintAction::ALL
                        .iter()
                        .filter(|blueprint| **blueprint != leyline::BlueprintAction::Noop)
                        .map(|blueprint| blueprint.blueprint_id())
                        .collect();
                    refuse(format!(
                        "no blueprint {field:?} (blueprints: {})",
                        known.join(", ")
                    ))
                })?;
            let offered = value
                .as_bool()
                .ok_or_else(|| refuse("true (offered) or false (excluded)".to_owned()))?;
            config.masks = if offered {
                config.masks.including(blueprint)
            } else {
                config.masks.excluding(blueprint)
            };
        }
        "imitation" => {
            let mut imitation = config.imitation;
            match field {
                "updates" => {
                    imitation.updates = value.as_u64().ok_or_else(|| {
                        refuse("the imitation updates are a whole number, 0 for none".to_owned())
                    })?;
                }
                "demonstrator" => {
                    let name = value
                        .as_str()
                        .ok_or_else(|| refuse("a demonstrator's name".to_owned()))?;
                    imitation.demonstrator = super::imitation::Demonstrator::from_name(name)
                        .map_err(|error| refuse(error.to_string()))?;
                }
                "epochs" => {
                    imitation.epochs = value
                        .as_u64()
                        .and_then(|epochs| usize::try_from(epochs).ok())
                        .ok_or_else(|| {
                            refuse("the imitation epochs are a whole number".to_owned())
                        })?;
                }
                "anchor_weight" => {
                    imitation.anchor_weight = value
                        .as_f64()
                        .ok_or_else(|| refuse("the anchor's weight is a number".to_owned()))?;
                }
                "anchor_decay" => {
                    imitation.anchor_decay = value
                        .as_f64()
                        .ok_or_else(|| refuse("the anchor's decay is a number".to_owned()))?;
                }
                other => {
                    return Err(refuse(format!(
                        "no imitation field {other:?} (updates, demonstrator, epochs, \
                         anchor_weight, anchor_decay)"
                    )));
                }
            }
            imitation
                .validate()
                .map_err(|error| refuse(error.to_string()))?;
            config.imitation = imitation;
        }
        "trainer" => {
            if !TRAINER_FIELDS.contains(&field) {
                return Err(refuse(format!(
                    "no trainer field {field:?} among the settings (fields: {})",
                    TRAINER_FIELDS.join(", ")
                )));
            }
            config.trainer = patched(&config.trainer, field, value).map_err(refuse)?;
        }
        other => {
            return Err(refuse(format!(
                "unknown section {other:?} (reward, ppo, floor, slot, blueprint, imitation, \
                 trainer)"
            )));
        }
    }
    Ok(())
}

/// `current` with `field` set to `value`, through its serde form (an
/// unknown field or a value of the wrong type is refused).
fn patched<T: Serialize + DeserializeOwned>(
    current: &T,
    field: &str,
    value: serde_json::Value,
) -> std::result::Result<T, String> {
    let mut object = serde_json::to_value(current).map_err(|error| error.to_string())?;
    let map = object
        .as_object_mut()
        .ok_or_else(|| "the section is not a table".to_owned())?;
    if !map.contains_key(field) {
        let mut known: Vec<&str> = map.keys().map(String::as_str).collect();
        known.sort_unstable();
        return Err(format!(
            "unknown field {field:?} (fields: {})",
            known.join(", ")
        ));
    }
    map.insert(field.to_owned(), value);
    serde_json::from_value(object).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_growth_preset_applies_and_an_unknown_one_is_named() {
        let mut config = SimicConfig::reference(150);
        let growth: Vec<String> = preset("growth")
            .expect("growth")
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        apply_all(&mut config, &growth).expect("the preset applies");
        assert_eq!(config.reward.rent_weight, 0.0);
        assert_eq!(config.reward.germination_delay_cost, -0.1);
        assert!(config.masks.disable_advance, "all three auto-forward flags");
        // `growth-imitate` is `growth` and three settings more, applied as
        // one list.
        let imitate = preset("growth-imitate").expect("growth-imitate");
        assert_eq!(imitate.get(..GROWTH.len()), Some(&GROWTH[..]));
        assert_eq!(imitate.get(GROWTH.len()..), Some(&IMITATE[..]));
        let mut imitating = SimicConfig::reference(150);
        let imitate: Vec<String> = imitate.iter().map(|s| (*s).to_owned()).collect();
        apply_all(&mut imitating, &imitate).expect("the preset applies");
        assert_eq!(imitating.imitation.updates, 8);
        assert_eq!(imitating.reward.twin_delta_weight, 20.0);
        assert_eq!(imitating.reward.rent_weight, 0.0);
        let error = preset("grow").expect_err("unknown").to_string();
        assert!(
            error.contains("\"grow\"") && error.contains("growth"),
            "{error}"
        );
    }

    fn config() -> SimicConfig {
        SimicConfig::reference(25)
    }

    #[test]
    fn a_reward_field_is_set_and_the_rest_is_kept() {
        let mut config = config();
        apply(&mut config, "reward.rent_weight=0").unwrap();
        assert_eq!(config.reward.rent_weight, 0.0);
        assert_eq!(
            config.reward.max_rent,
            SimicConfig::reference(25).reward.max_rent
        );
        apply(&mut config, "reward.mode=sparse").unwrap();
        assert_eq!(config.reward.mode, crate::rewards::RewardMode::Sparse);
        apply(&mut config, "reward.accuracy_delta_weight=1").unwrap();
        assert_eq!(config.reward.accuracy_delta_weight, 1.0);
        assert!(apply(&mut config, "reward.accuracy_delta_weight=-1").is_err());
        assert_eq!(config.reward.accuracy_delta_weight, 1.0);
        apply(&mut config, "reward.twin_delta_weight=0.5").unwrap();
        assert_eq!(config.reward.twin_delta_weight, 0.5);
        assert!(apply(&mut config, "reward.twin_delta_weight=-1").is_err());
        assert_eq!(config.reward.twin_delta_weight, 0.5);
        apply(&mut config, "reward.attribute_all_seeds=true").unwrap();
        assert!(config.reward.attribute_all_seeds);
        assert!(apply(&mut config, "reward.attribute_all_seeds=7").is_err());
        assert!(config.reward.attribute_all_seeds);
    }

    #[test]
    fn ppo_fields_and_floors_are_set() {
        let mut config = config();
        apply(&mut config, "ppo.entropy_coef=0.1").unwrap();
        assert_eq!(config.ppo.entropy_coef, 0.1);
        apply(&mut config, "floor.op=0.05").unwrap();
        let op = leyline::HEAD_NAMES.iter().position(|h| *h == "op").unwrap();
        assert_eq!(config.sampling.floors.unwrap()[op], 0.05);
    }

    #[test]
    fn auto_forward_on_every_gate_takes_advance_out_of_the_action_space() {
        let mut config = config();
        apply(&mut config, "slot.auto_forward_g1=true").unwrap();
        apply(&mut config, "slot.auto_forward_g2=true").unwrap();
        assert!(config.slot.auto_forward_g1 && config.slot.auto_forward_g2);
        assert!(!config.masks.disable_advance, "two of three gates");
        apply(&mut config, "slot.auto_forward_g3=true").unwrap();
        assert!(config.masks.disable_advance);
        apply(&mut config, "slot.auto_forward_g2=false").unwrap();
        assert!(!config.masks.disable_advance, "ADVANCE is back");
        assert!(
            config.masks.disable_set_alpha_target,
            "other mask rules kept"
        );
        config.validate().unwrap();
    }

    #[test]
    fn a_blueprint_setting_takes_it_out_of_the_learned_policys_masks_and_back() {
        use leyline::BlueprintAction;
        let mut config = config();
        apply(&mut config, "blueprint.conv_small=false").unwrap();
        assert!(config.masks.excludes(BlueprintAction::ConvSmall));
        assert!(!config.masks.excludes(BlueprintAction::ConvLight));
        assert!(
            config.masks.disable_set_alpha_target,
            "other mask rules kept"
        );
        let empty = tamiyo::masks::compute_masks(&[None, None, None], &config.masks).unwrap();
        let blueprints = empty.head(tamiyo::heads::BLUEPRINT);
        let index = |blueprint: BlueprintAction| usize::try_from(blueprint.value()).unwrap();
        assert!(!blueprints[index(BlueprintAction::ConvSmall)]);
        assert!(blueprints[index(BlueprintAction::ConvHeavy)]);
        apply(&mut config, "blueprint.conv_small=true").unwrap();
        assert_eq!(config.masks.excluded_blueprints, 0);
        config.validate().unwrap();
    }

    #[test]
    fn bad_settings_are_refused_and_change_nothing() {
        let before = config();
        for bad in [
            "reward.rent_weight",
            "rent_weight=0",
            "reward.=1",
            "reward.no_such_field=1",
            "reward.rent_weight=\"x\"",
            "reward.rent_weight=-1",
            "ppo.epochs=0",
            "floor.nohead=0.1",
            "floor.op=1.5",
            "floor.op=abc",
            "weights.x=1",
            "slot.auto_forward_g1=3",
            "slot.no_such_flag=true",
            "blueprint.no_such_blueprint=false",
            "blueprint.noop=false",
            "blueprint.conv_small=0",
            "trainer.seed=3",
            "trainer.batch_size=64",
            "trainer.overlap_weight_grads=3",
            "trainer.graph_warmup_steps=-1",
        ] {
            let mut config = before.clone();
            let error = apply_all(&mut config, &[bad.to_owned()]);
            assert!(error.is_err(), "{bad} was accepted");
            assert_eq!(config.reward, before.reward, "{bad}");
            assert_eq!(config.ppo, before.ppo, "{bad}");
            assert_eq!(config.sampling, before.sampling, "{bad}");
            assert_eq!(config.slot, before.slot, "{bad}");
            assert_eq!(config.masks, before.masks, "{bad}");
            assert_eq!(config.trainer.seed, before.trainer.seed, "{bad}");
            assert_eq!(
                config.trainer.batch_size, before.trainer.batch_size,
                "{bad}"
            );
            assert_eq!(
                config.trainer.overlap_weight_grads, before.trainer.overlap_weight_grads,
                "{bad}"
            );
            assert_eq!(
                config.trainer.graph_warmup_steps, before.trainer.graph_warmup_steps,
                "{bad}"
            );
        }
    }

    #[test]
    fn the_environments_trainer_settings_depart_from_the_reference_one_by_one() {
        let before = config();
        assert!(!before.trainer.overlap_weight_grads);
        assert!(!before.trainer.cudnn_benchmark);
        assert_eq!(before.trainer.graph_warmup_steps, 1);
        let mut config = before.clone();
        let settings = [
            "trainer.overlap_weight_grads=true".to_owned(),
            "trainer.graph_warmup_steps=3".to_owned(),
        ];
        apply_all(&mut config, &settings).expect("the settings apply");
        assert!(config.trainer.overlap_weight_grads);
        assert_eq!(config.trainer.graph_warmup_steps, 3);
        assert!(!config.trainer.cudnn_benchmark, "untouched");
        assert_eq!(config.trainer.batch_size, before.trainer.batch_size);
        let error = apply_all(&mut config, &["trainer.seed=1".to_owned()])
            .expect_err("not a setting")
            .to_string();
        assert!(error.contains("overlap_weight_grads"), "{error}");
    }
}
