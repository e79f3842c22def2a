//! Every name both sides of a wire spell (`brownout_protocol::wire`: span attributes, headers,
//! metric names) is documented: each appears in the docs a user reads for it (docs/*.md and
//! the README). A constant added without a line of documentation fails here.

use brownout_protocol::wire;

#[test]
fn every_wire_name_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = std::fs::read_to_string(root.join("README.md")).unwrap();
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs += &std::fs::read_to_string(&p).unwrap();
        }
    }
    let missing: Vec<&str> = wire::attr::ALL
        .iter()
        .chain(wire::header::ALL)
        .chain(wire::metric::ALL)
        .copied()
        .filter(|n| !docs.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "wire names no doc mentions (document them in docs/SLO.md, SERVING.md or PROTOCOL.md): {missing:?}"
    );
}
