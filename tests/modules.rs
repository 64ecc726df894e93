//! No module circles in any crate (issue 35): within a crate, modules depend one
//! way, so each can be read, tested and replaced from the leaves up.
//!
//! For every crate under `host/`, `sdk/` and `policies/`, the graph of its top-level
//! modules (a file `src/x.rs` or a folder `src/x/`) with an edge `a → b` wherever
//! `a`'s code names `crate::b` (or `super::b` from a top-level file). Comments are
//! left out (a doc link is not a dependency), and so is a file's `#[cfg(test)] mod
//! tests` (a test may reach across). A strongly connected set of more than one
//! module is a circle; the test names every one it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `source` without comments and without its trailing `#[cfg(test)] mod tests`.
fn code_of(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => &source[..at],
        None => source,
    };
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("//") {
        // A `//` inside a string literal is rare in these sources and cuts the
        // rest of its line only: at worst an edge is missed, never invented.
        out.push_str(&rest[..at]);
        rest = rest[at..].find('\n').map_or("", |n| &rest[at + n..]);
    }
    out.push_str(rest);
    out
}

/// The modules `code` names as `crate::x` (or as `<up>x`, where `up` is the
/// `super::` path that leads from the file to the crate's root), and those it names
/// inside a `use crate::{x, y::z}` group.
fn named_modules(code: &str, up: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut names = BTreeSet::new();
    let mut found: Vec<(usize, usize)> = code.match_indices("crate::").map(|(at, m)| (at, m.len())).collect();
    // A top-level file's `super::x` is `crate::x` (host/sim/src/engine.rs's
    // `use super::stats`); a `super::` that stops below the root names a sibling
    // inside the module, no edge. The character before must not continue a path.
    let starts_path =
        |at: usize| code[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
    found.extend(code.match_indices(up).filter(|&(at, _)| starts_path(at)).map(|(at, m)| (at, m.len())));
    for (at, len) in found {
        let after = &code[at + len..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                names.insert(ident(item.trim()));
            }
        } else {
            names.insert(ident(after));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first).to_string();
        (name != "lib" && name != "main").then_some(name)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| top(p)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for f in &files {
        let Some(from) = top(f) else { continue };
        let code = code_of(&std::fs::read_to_string(f).expect("readable source"));
        // The file's depth below the root in modules (`x.rs`, `x/mod.rs`: 1).
        let rel = f.strip_prefix(src).expect("under src");
        let depth = rel.components().count() - usize::from(rel.ends_with("mod.rs"));
        for to in named_modules(&code, &"super::".repeat(depth)) {
            if to != from && modules.contains(&to) {
                g.get_mut(&from).expect("every module is a node").insert(to);
            }
        }
    }
    g
}

/// The circles of `g`: its strongly connected sets of more than one module
/// (Tarjan's algorithm).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.g[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    set.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in g.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn the_check_finds_a_circle_and_ignores_comments_and_tests() {
    let dir = std::env::temp_dir().join(format!("sluice-modules-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("c")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b, c::X};\n// crate::z\n").unwrap();
    std::fs::write(src.join("b.rs"), "fn f() { crate::a::g() }\n#[cfg(test)]\nmod tests { use crate::c; }\n").unwrap();
    std::fs::write(src.join("c").join("mod.rs"), "/// [`crate::a`]\npub struct X;\n").unwrap();
    std::fs::write(src.join("c").join("inner.rs"), "use super::X;\nfn f() { super::super::e::g() }\n").unwrap();
    std::fs::write(src.join("d.rs"), "use super::{a, c::X};\n").unwrap();
    std::fs::write(src.join("e.rs"), "pub fn g() {}\n").unwrap();
    let g = graph(&src);
    assert_eq!(g["a"], BTreeSet::from(["b".to_string(), "c".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["a".to_string()]), "its tests' `crate::c` is no dependency");
    assert_eq!(g["c"], BTreeSet::from(["e".to_string()]), "a doc link is no dependency; `super::super::e` is");
    assert_eq!(g["d"], BTreeSet::from(["a".to_string(), "c".to_string()]), "a top-level file's `super::`");
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".to_string()]]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_crate_has_a_module_circle() {
    let root = root();
    let mut crates = Vec::new();
    for parent in ["host", "policies"] {
        for e in std::fs::read_dir(root.join(parent)).expect("the workspace's folders").flatten() {
            if e.path().join("src").is_dir() {
                crates.push(e.path().join("src"));
            }
        }
    }
    crates.push(root.join("sdk").join("src"));
    assert!(crates.len() > 10, "found the crates: {crates:?}");
    let found: Vec<String> = crates
        .iter()
        .flat_map(|src| circles(&graph(src)).into_iter().map(move |c| format!("{}: {}", src.display(), c.join(" ↔ "))))
        .collect();
    assert!(found.is_empty(), "module circles (make the dependency one-way):\n{}", found.join("\n"));
}
