//! Bounded in-test fuzz loops over the text decoders of the lifecycle side
//! (issue 9): slot ids, blueprint names and serialised alpha controllers
//! (checkpoints). Hundreds of thousands of mutated inputs, seeded, a few
//! seconds: none may panic, and whatever is accepted must be valid.

use kasmina::alpha::AlphaController;
use kasmina::blueprint::Blueprint;
use kasmina::host::{SlotId, Topology};

// The seeded stream that drives the mutations is leyline's one generator
// (`leyline::rng::SplitMix64`, multiply-and-reject `below`).
use leyline::rng::SplitMix64;

/// Mutates `seed` a few times: byte flips, insertions, deletions, splices
/// of interesting fragments.
fn mutate(rng: &mut SplitMix64, seed: &[u8]) -> Vec<u8> {
    const FRAGMENTS: &[&[u8]] = &[
        b"r",
        b"c",
        b"0",
        b"9",
        b"4294967296",
        b"-",
        b"+",
        b" ",
        b"\0",
        b"\xff",
        b"NaN",
        b"1e999",
        b"-0.0",
        b"\"",
        b"{",
        b"}",
        b":",
        b",",
        b"null",
        b"cnn:",
        b"transformer:",
    ];
    let mut bytes = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if !bytes.is_empty() => {
                let index = at.min(bytes.len() - 1);
                bytes[index] ^= 1 << rng.below(8);
            }
            1 if !bytes.is_empty() => {
                bytes.remove(at.min(bytes.len() - 1));
            }
            2 => bytes.insert(at, rng.below(256) as u8),
            _ => {
                let fragment = FRAGMENTS[rng.below(FRAGMENTS.len() as u64) as usize];
                bytes.splice(at..at, fragment.iter().copied());
            }
        }
    }
    bytes
}

#[test]
fn slot_ids_and_blueprint_names_survive_mutation() {
    let mut rng = SplitMix64::new(9);
    let seeds: &[&[u8]] = &[
        b"r0c1",
        b"r12c3",
        b"conv_light",
        b"cnn:norm",
        b"transformer:lora",
    ];
    let mut accepted = 0u32;
    for round in 0..200_000u64 {
        let seed = seeds[(round % seeds.len() as u64) as usize];
        let bytes = mutate(&mut rng, seed);
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(id) = SlotId::parse(&text) {
            accepted += 1;
            assert_eq!(SlotId::parse(&id.to_string()).expect("canonical"), id);
            assert!(text.starts_with('r') && text.contains('c'), "{text:?}");
        }
        for topology in [Topology::Cnn, Topology::Transformer] {
            if let Ok(blueprint) = Blueprint::from_name(topology, &text) {
                assert!(text.ends_with(blueprint.name()), "{text:?} -> {blueprint}");
            }
        }
    }
    assert!(accepted > 0, "the loop never produced a valid slot id");
}

#[test]
fn serialised_alpha_controllers_survive_mutation() {
    let mut controller = AlphaController::new(0.25).expect("controller");
    controller
        .retarget(0.75, 6, None, Some(4.0))
        .expect("retarget");
    controller.step();
    let json = serde_json::to_string(&controller).expect("encode");
    let mut rng = SplitMix64::new(10);
    let mut accepted = 0u32;
    for _ in 0..100_000 {
        let bytes = mutate(&mut rng, json.as_bytes());
        if let Ok(decoded) = serde_json::from_slice::<AlphaController>(&bytes) {
            accepted += 1;
            for value in [
                decoded.alpha(),
                decoded.alpha_start(),
                decoded.alpha_target(),
            ] {
                assert!(
                    (0.0..=1.0).contains(&value),
                    "{:?}",
                    String::from_utf8_lossy(&bytes)
                );
            }
            assert!(decoded.steepness().is_finite() && decoded.steepness() >= 0.1);
            assert!(decoded.steps_done() <= decoded.steps_total());
        }
    }
    assert!(accepted > 0, "the loop never produced a valid controller");
}
