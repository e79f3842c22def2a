//! The code layout's two rules (docs/ARCHITECTURE.md §8), read from the source tree of every
//! crate of the workspace:
//!
//! - no import circle between sibling modules (the files and folders of one directory): every
//!   `crate::…`, `super::…` and `self::…` path outside comments, strings and inline
//!   `mod … { }` blocks (the unit tests) is resolved to the sibling it names;
//! - every module file is named in §8 (for the control plane: in its top-level module's row).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates and their library / binary roots.
const CRATES: &[(&str, &str)] = &[
    ("brownout", "src"),
    ("brownout-protocol", "protocol/src"),
    ("brownout-net", "net/src"),
    ("brownout-serving", "serving/src"),
    ("brownout-gpu-agent", "gpu-agent/src"),
    ("brownout-demo", "demo/src"),
    ("brownout-test-support", "test-support/src"),
];

/// Circles that exist today and are still to be broken (issue 40). The test fails when a circle
/// not listed here appears, and when a listed one is gone (take it off the list): the list only
/// shrinks.
const KNOWN_CIRCLES: &[&str] = &[
    // None left (issue 40): a new circle fails the test.
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One module file: its crate-relative module path (`["degrade", "acks"]`) and its text.
struct ModFile {
    module: Vec<String>,
    path: PathBuf,
}

fn module_files(src: &Path) -> Vec<ModFile> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src");
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            // `x/mod.rs` is module `x`; `lib.rs` is the crate root.
            if matches!(module.last().map(String::as_str), Some("mod")) || module == ["lib"] {
                module.pop();
            }
            out.push(ModFile { module, path: p });
        }
    }
    out
}

/// The text with comments, string and char literals blanked out.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…".
        let raw_start = if c == b'r' {
            Some(i + 1)
        } else if c == b'b' && b.get(i + 1) == Some(&b'r') {
            Some(i + 2)
        } else {
            None
        };
        let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if let Some(mut j) = raw_start.filter(|_| !prev_ident) {
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&b'"') {
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
                continue;
            }
            let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
            if b.get(i + 1 + ch_len) == Some(&b'\'') {
                i += 2 + ch_len;
                out.push_str("' '");
                continue;
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// The text without inline `mod name { … }` blocks (unit tests and other nested modules,
/// whose `super::` means the file itself).
fn without_inline_mods(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if at_word && code[i..].starts_with("mod ") {
            let mut j = i + 4;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b' ') {
                j += 1;
            }
            if b.get(j) == Some(&b'{') {
                let mut depth = 0;
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                i = j + 1;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    let start = i;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Parses a path tree from `i` (after a leading segment): `::a::b`, `::{a, b::c}`; pushes every
/// full path (`prefix` + segments) into `out`; returns where it stopped.
fn path_tree(b: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        let j = skip_ws(b, i);
        if !(b.get(j) == Some(&b':') && b.get(j + 1) == Some(&b':')) {
            break;
        }
        let k = skip_ws(b, j + 2);
        if b.get(k) == Some(&b'{') {
            let mut m = k + 1;
            loop {
                m = skip_ws(b, m);
                match b.get(m) {
                    None => return m,
                    Some(b'}') => return m + 1,
                    Some(b',') => m += 1,
                    Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
                        let (id, n) = ident_at(b, m);
                        let mut sub = path.clone();
                        sub.push(id);
                        m = path_tree(b, n, &sub, out);
                        // `as Alias` and anything else up to the next `,` or `}`.
                        while m < b.len() && b[m] != b',' && b[m] != b'}' {
                            m += 1;
                        }
                    }
                    Some(_) => m += 1,
                }
            }
        }
        let (id, n) = ident_at(b, k);
        if id.is_empty() {
            break;
        }
        path.push(id);
        i = n;
    }
    out.push(path);
    i
}

/// Every absolute module path a file's code names, resolved from `module` (the file's).
fn referenced(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !at_word || !(b[i].is_ascii_alphabetic()) {
            i += 1;
            continue;
        }
        let (id, n) = ident_at(b, i);
        let base: Option<Vec<String>> = match id.as_str() {
            "crate" => Some(Vec::new()),
            "self" if b.get(n) == Some(&b':') => Some(module.to_vec()),
            "super" if b.get(n) == Some(&b':') => {
                // A mod.rs / lib.rs is its folder's module: `super` is the folder's parent.
                let mut m = module.to_vec();
                m.pop();
                // `super::super::…`
                let mut j = n;
                while code[j..].starts_with("::super") {
                    m.pop();
                    j += "::super".len();
                }
                let mut paths = Vec::new();
                let end = path_tree(b, j, &m, &mut paths);
                out.extend(paths);
                i = end.max(n);
                continue;
            }
            _ => None,
        };
        match base {
            Some(m) => {
                let mut paths = Vec::new();
                let end = path_tree(b, n, &m, &mut paths);
                out.extend(paths);
                i = end.max(n);
            }
            None => i = n,
        }
    }
    out
}

/// For every directory module, the edges between its children: `(parent, from, to)`.
fn sibling_edges(files: &[ModFile]) -> BTreeMap<Vec<String>, BTreeSet<(String, String)>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f.path).expect("read source");
        let code = without_inline_mods(&code_only(&text));
        if f.module == ["main"] {
            continue; // the binary: another crate, whose `crate::` is itself
        }
        for target in referenced(&code, &f.module) {
            let common = f
                .module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= f.module.len() || common >= target.len() {
                continue; // a parent naming its child, or a child naming its ancestor
            }
            let parent = f.module[..common].to_vec();
            let mut to_mod = parent.clone();
            to_mod.push(target[common].clone());
            if !modules.contains(&to_mod) {
                continue; // an item of the parent (`super::Foo`), not a sibling
            }
            edges
                .entry(parent)
                .or_default()
                .insert((f.module[common].clone(), target[common].clone()));
        }
    }
    edges
}

/// The circles of one directory: each strongly connected set of two or more siblings, as
/// `a ↔ b ↔ …` sorted.
fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for (a, b) in edges {
                if *a == n && seen.insert(b.clone()) {
                    stack.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for n in &nodes {
        let comp: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[*n].contains(**m) && reaches[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if comp.len() >= 2 {
            out.insert(comp);
        }
    }
    out.into_iter().collect()
}

fn all_circles() -> Vec<String> {
    let mut found = Vec::new();
    for (krate, src) in CRATES {
        let files = module_files(&root().join(src));
        for (parent, edges) in sibling_edges(&files) {
            for c in circles(&edges) {
                let dir = if parent.is_empty() {
                    (*src).to_string()
                } else {
                    format!("{src}/{}", parent.join("/"))
                };
                found.push(format!("{krate} {dir}: {}", c.join(" <-> ")));
            }
        }
    }
    found
}

#[test]
fn the_resolver_sees_grouped_super_and_crate_paths() {
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let code = "use super::{acks::{AckLedger, X as Y}, metrics::M};\nfn f() { crate::a::b::c(); self::z::w; }";
    let refs = referenced(code, &m("degrade::handle"));
    assert!(refs.contains(&m("degrade::acks::AckLedger")), "{refs:?}");
    assert!(refs.contains(&m("degrade::acks::X")), "{refs:?}");
    assert!(refs.contains(&m("degrade::metrics::M")), "{refs:?}");
    assert!(refs.contains(&m("a::b::c")), "{refs:?}");
    assert!(refs.contains(&m("degrade::handle::z::w")), "{refs:?}");
    let hidden =
        code_only("// use super::x;\nlet s = \"crate::y::z\"; let c = '\"'; /* super::q */");
    assert!(referenced(&hidden, &m("a::b")).is_empty(), "{hidden}");
    let tests = without_inline_mods("fn a() {}\n#[cfg(test)]\nmod tests { use super::b::C; }\n");
    assert!(!tests.contains("super"), "{tests}");
    let e: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .map(|(x, y)| ((*x).to_string(), (*y).to_string()))
        .collect();
    assert_eq!(
        circles(&e),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
}

#[test]
fn no_import_circle_between_sibling_modules() {
    let found = all_circles();
    let known: BTreeSet<&str> = KNOWN_CIRCLES.iter().copied().collect();
    let new: Vec<&String> = found
        .iter()
        .filter(|c| !known.contains(c.as_str()))
        .collect();
    let gone: Vec<&&str> = KNOWN_CIRCLES
        .iter()
        .filter(|k| !found.iter().any(|c| c == *k))
        .collect();
    assert!(
        new.is_empty(),
        "import circles between sibling files (move the shared types down into a module both \
         import):\n{}",
        new.iter()
            .map(|c| format!("  {c}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        gone.is_empty(),
        "these circles are broken now; take them off KNOWN_CIRCLES: {gone:?}"
    );
}

/// §8's text, and the part of it that describes `krate` (for the control plane: one part per
/// top-level module, the rows of its table).
fn section8() -> String {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("read doc");
    let start = doc
        .find("## 8. Code layout")
        .expect("docs/ARCHITECTURE.md has §8 Code layout");
    let rest = &doc[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// The paragraph or table row of §8 that describes a crate.
fn crate_part<'a>(s8: &'a str, krate: &str) -> &'a str {
    let bold = format!("**`{krate}`**");
    if let Some(i) = s8.find(&bold) {
        let rest = &s8[i..];
        let end = rest.find("\n\n").unwrap_or(rest.len());
        // The control plane's paragraph is followed by its table.
        if krate == "brownout" {
            let end = rest.find("\nOther folders").unwrap_or(rest.len());
            return &rest[..end];
        }
        return &rest[..end];
    }
    let row = format!("| `{krate}` ");
    let i = s8
        .find(&row)
        .unwrap_or_else(|| panic!("§8 describes no crate {krate}"));
    let rest = &s8[i..];
    &rest[..rest.find('\n').unwrap_or(rest.len())]
}

fn named(part: &str, name: &str) -> bool {
    [
        format!("`{name}`"),
        format!("`{name}/"),
        format!("`{name}.rs`"),
        format!("/{name}.rs`"),
        format!("/{name}`"),
        format!("({name}/"),
        format!("`{name}` "),
    ]
    .iter()
    .any(|p| part.contains(p.as_str()))
}

#[test]
fn every_module_file_is_named_in_architecture_section_8() {
    let s8 = section8();
    let mut missing = Vec::new();
    for (krate, src) in CRATES {
        let part = crate_part(&s8, krate);
        for f in module_files(&root().join(src)) {
            let Some(name) = f.module.last() else {
                continue;
            };
            if name == "tests" || name == "main" {
                continue; // unit tests of their parent; the binary's entry point
            }
            // The control plane: a module's files are named in its top-level module's row.
            let scope = if *krate == "brownout" {
                let top = &f.module[0];
                part.lines()
                    .find(|l| {
                        l.starts_with(&format!("| `{top}`"))
                            || l.starts_with(&format!("| `{top}/`"))
                    })
                    .unwrap_or("")
            } else {
                part
            };
            if !named(scope, name) {
                missing.push(format!(
                    "{krate}: {} (`{name}`)",
                    f.path.strip_prefix(root()).unwrap_or(&f.path).display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "module files docs/ARCHITECTURE.md §8 does not name (add each to its crate's part, \
         for the control plane to its top-level module's row):\n  {}",
        missing.join("\n  ")
    );
}
