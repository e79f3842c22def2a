//! docs/PROTOCOL.md stays true to the protocol crate: its JSON examples parse into
//! `Command`, its ack examples parse into `Ack` (signatures verified), and every field of
//! `Command`, `Reason`, `Limits`, `Shed`, an `instances` entry and an `abort` entry (as
//! serialised) is named in it.

use std::collections::BTreeSet;

use brownout_protocol::{
    AbortEntry, AbortKind, Ack, Command, Criticality, EntryApplied, FeatureState, InstanceEntry,
    Limits, Reason, Shed, Tier,
};

const DOC: &str = include_str!("../../docs/PROTOCOL.md");

fn blocks(lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = DOC;
    while let Some(i) = rest.find(&fence) {
        let body = &rest[i + fence.len()..];
        let end = body.find("```").expect("unterminated code block");
        out.push(body[..end].to_string());
        rest = &body[end + 3..];
    }
    out
}

#[test]
fn json_examples_parse_as_commands() {
    let cmds: Vec<Command> = blocks("json")
        .iter()
        .map(|b| serde_json::from_str(b).expect(b))
        .collect();
    assert_eq!(cmds.len(), 3);
    assert_eq!(cmds[0].tier, Tier::T2);
    assert!(cmds[0].shed.is_none());
    assert_eq!(cmds[1].tier, Tier::T3);
    assert_eq!(
        cmds[1].shed.as_ref().unwrap().admit_min_criticality,
        Criticality::Critical
    );
    let g = &cmds[2];
    assert_eq!(g.feature_state("tool:code_exec"), FeatureState::Probe);
    let drained = g.instance_entry("gpu-3/engine-0").unwrap();
    assert!(drained.draining());
    assert_eq!(drained.entry.admit_rps, Some(20.0), "from \"*\"");
    assert_eq!(g.abort[1].kind, AbortKind::Trace);
    // The example is the fixture the protocol crate's signature test uses, byte for byte.
    let fixture = include_str!("../../protocol/fixtures/command_guards.json");
    assert!(
        blocks("json").iter().any(|b| b == fixture),
        "docs/PROTOCOL.md's guards example differs from protocol/fixtures/command_guards.json"
    );
    for c in &cmds {
        assert!(
            c.extra.is_empty(),
            "examples use only known fields: {:?}",
            c.extra
        );
    }
}

#[test]
fn ack_examples_parse() {
    let text = blocks("text")
        .into_iter()
        .find(|b| b.contains("nack:"))
        .expect("ack example block");
    // "<instance> <value>", each value sealed with the documented test key for that instance.
    let acks: Vec<Ack> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (inst, v) = l.split_once(' ').expect(l);
            Ack::parse_signed(v, b"brownout-test-key-0001", inst).expect(l)
        })
        .collect();
    assert_eq!(acks.len(), 5);
    assert!(matches!(
        acks[0],
        Ack::Applied {
            epoch: 3,
            version: 1042,
            entry: None,
            ..
        }
    ));
    let both = EntryApplied {
        own: true,
        default: true,
    };
    assert!(matches!(
        acks[1],
        Ack::Applied { version: 1044, entry: Some(e), .. } if e == both
    ));
    assert!(matches!(
        acks[2],
        Ack::Applied {
            entry: Some(EntryApplied {
                own: false,
                default: true
            }),
            ..
        }
    ));
    assert!(matches!(&acks[3], Ack::Refused { reason, .. } if reason == "bad_signature"));
}

fn keys(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(m) = v.as_object() {
        for (k, child) in m {
            let name = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.insert(name.clone());
            match k.as_str() {
                "reason" | "limits" | "shed" => keys(child, &name, out),
                // Map keys and list items: their fields, under `instances.*` / `abort.*`.
                "instances" | "abort" => {
                    let items: Vec<&serde_json::Value> = match child {
                        serde_json::Value::Object(m) => m.values().collect(),
                        serde_json::Value::Array(a) => a.iter().collect(),
                        _ => Vec::new(),
                    };
                    for it in items {
                        keys(it, &format!("{name}.*"), out);
                    }
                }
                _ => {}
            }
        }
    }
}

#[test]
fn every_field_is_documented() {
    // A command with every optional field set, so its JSON shows every field name.
    let mut c = Command::normal("prod", 1, 1, 0, 1);
    c.reason = Reason {
        trigger: "slo_burn".into(),
        slo: Some("s".into()),
        window: Some("5m/1h".into()),
        burn_rate: Some(1.0),
        detail: "d".into(),
    };
    c.limits = Limits {
        max_tokens_cap: Some(1),
        max_num_seqs: Some(1),
        user_concurrency: Some(1),
        probe_ratio: Some(0.5),
    };
    c.instances.insert(
        "i".into(),
        InstanceEntry {
            max_num_seqs: Some(1),
            drain: Some(true),
            admit_rps: Some(1.0),
            reason: "r".into(),
        },
    );
    c.abort.push(AbortEntry {
        id: "c".into(),
        kind: AbortKind::Conversation,
        until_ms: 1,
        reason: "r".into(),
    });
    c.shed = Some(Shed {
        admit_min_criticality: Criticality::Critical,
        retry_after_s: 1,
        jitter_ratio: 0.1,
        recovery_eta_ms: 1,
        admit_rps: Some(1.0),
    });
    let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    let mut names = BTreeSet::new();
    keys(&v, "", &mut names);
    assert!(names.len() >= 30, "{names:?}");
    for n in names {
        let leaf = n.rsplit('.').next().unwrap();
        assert!(
            DOC.contains(&format!("`{n}`")) || DOC.contains(&format!("\"{leaf}\"")),
            "field {n} is not described in docs/PROTOCOL.md"
        );
    }
}

#[test]
fn ed25519_signature_example_verifies() {
    let text = blocks("text")
        .into_iter()
        .find(|b| b.contains("key_id "))
        .expect("Ed25519 example block");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_string()
    };
    let pk = brownout_protocol::CommandPublicKey::parse(&field("pubkey")).unwrap();
    assert_eq!(pk.id(), field("key_id"));
    let json = include_str!("../../protocol/fixtures/command_t2.json");
    let v = brownout_protocol::CommandVerifier::ed25519([pk]);
    v.verify_bytes(json.as_bytes(), &field("sig")).unwrap();
    // The same seed signs it to the same bytes (Ed25519 is deterministic).
    let k = brownout_protocol::CommandSigningKey::from_seed(b"brownout-test-ed25519-seed-00001");
    assert_eq!(
        brownout_protocol::CommandSigner::Ed25519(k).sign_bytes(json.as_bytes()),
        field("sig")
    );
}
