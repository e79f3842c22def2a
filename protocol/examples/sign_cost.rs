//! What a command signature costs: Ed25519 (the default) against the HMAC-SHA256 compatibility
//! mode, signing and verifying the fixture command (`fixtures/command_t2.json`, the bytes the
//! control plane publishes), and the key-file lookup a reloading verifier adds.
//!
//! ```text
//! cargo run --release -p brownout-protocol --example sign_cost -- [iterations]
//! ```
//!
//! Prints ns per operation for each and the ratio Ed25519 / HMAC. A control plane signs one
//! command per decision (seconds apart) and every engine verifies it on each anti-entropy
//! re-read (every 2 s), so these numbers bound a cost paid a few times a second at most.

use std::hint::black_box;
use std::time::{Duration, Instant};

use brownout_protocol::command_keys::{CommandSigner, CommandSigningKey, CommandVerifier};

fn per_op(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let json = include_bytes!("../fixtures/command_t2.json");
    let key = CommandSigningKey::generate();
    let ed = CommandSigner::Ed25519(key.clone());
    let hm = CommandSigner::Hmac(b"an-hmac-compatibility-key-0123456789".to_vec());
    let ed_sig = ed.sign_bytes(json);
    let hm_sig = hm.sign_bytes(json);
    let ed_v = CommandVerifier::ed25519([key.public()]);
    let hm_v = CommandVerifier::hmac(b"an-hmac-compatibility-key-0123456789");
    let dir = std::env::temp_dir().join(format!("brownout-sign-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("command-signing.pub");
    std::fs::write(&file, format!("{}\n", key.public())).unwrap();
    let file_v = CommandVerifier::ed25519([])
        .with_key_file(&file, Duration::from_secs(300))
        .unwrap();

    let ed_sign = per_op(n, || {
        black_box(ed.sign_bytes(black_box(json)));
    });
    let hm_sign = per_op(n, || {
        black_box(hm.sign_bytes(black_box(json)));
    });
    let ed_verify = per_op(n, || {
        ed_v.verify_bytes(black_box(json), &ed_sig).unwrap();
    });
    let hm_verify = per_op(n, || {
        hm_v.verify_bytes(black_box(json), &hm_sig).unwrap();
    });
    let file_verify = per_op(n, || {
        file_v.verify_bytes(black_box(json), &ed_sig).unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
    println!("command of {} bytes, {n} iterations each", json.len());
    println!(
        "sign    ed25519 {ed_sign:>9.0} ns   hmac {hm_sign:>7.0} ns   ratio {:.1}",
        ed_sign / hm_sign
    );
    println!(
        "verify  ed25519 {ed_verify:>9.0} ns   hmac {hm_verify:>7.0} ns   ratio {:.1}",
        ed_verify / hm_verify
    );
    println!(
        "verify  ed25519 from a key file (reloading verifier) {file_verify:>9.0} ns   ratio to fixed keys {:.2}",
        file_verify / ed_verify
    );
}
