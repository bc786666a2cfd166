//! The crate's floors (issue #12): a module may use only modules on lower floors, so the import
//! graph has no cycles and nothing reaches up. Lowest first:
//!
//! 0. `error`, `stats`, `util`: know nothing of KV caches, models or benchmarks;
//! 1. `kv`: cache schemes and attention over their stored form;
//! 2. `model`: the decoder that takes the cache from outside;
//! 3. `quality`: perplexity, ROUGE, passkey through the cache;
//! 4. `measure` (the sweep runner) and `plan` (capacity arithmetic);
//! 5. `serve`: the serving load test (scheduler, block pool, workload, metrics);
//! 6. `report`: turns finished results into bytes;
//! 7. `cli`: parses, dispatches.
//!
//! The test reads every `src/**/*.rs`, drops comments, collects the `crate::<module>`
//! references of each top-level module (paths and `use crate::{a, b}` groups) and fails on a
//! reference to a higher floor, to another module of the same floor, or on any cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const FLOORS: &[&[&str]] = &[
    &["error", "stats", "util"],
    &["kv"],
    &["model"],
    &["quality"],
    &["measure", "plan"],
    &["serve"],
    &["report"],
    &["cli"],
];

fn floor(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a Rust file without `//` comments (doc comments included) and string literals'
/// contents, so a path named in prose or a message does not count as a reference.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_str && c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// Top-level modules named after `crate::` in `code`: `crate::kv::X` gives `kv`,
/// `crate::{kv, model::Y}` gives `kv` and `model`.
fn references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            found.insert(name);
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// `module → modules it references` for every top-level module of `src/`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let refs = references(&code_only(&text));
        let entry = g.entry(module.clone()).or_default();
        // `Error`, `Result` re-exported at the root are the error module's.
        for r in refs {
            let r = if r == "Error" || r == "Result" {
                "error".to_string()
            } else {
                r
            };
            if r != module {
                entry.insert(r);
            }
        }
    }
    g
}

/// The parser itself on hand-written snippets: paths, groups, comments and strings.
#[test]
fn reference_parser_by_hand() {
    let code = code_only(
        "use crate::kv::{A, B};\nuse crate::{model::M, error::Result};\n\
         // crate::cli in a comment\nlet s = \"crate::report\"; crate::stats::f();\n",
    );
    let refs: Vec<String> = references(&code).into_iter().collect();
    assert_eq!(refs, ["error", "kv", "model", "stats"]);
}

/// No module references one on a higher floor or another of its own floor; every module is on
/// a floor; and (following from that, checked anyway) the graph has no cycle.
#[test]
fn no_reference_reaches_up_and_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    // The scan sees the references it must (a scanner finding nothing would pass vacuously).
    assert!(
        g["cli"].contains("report") && g["measure"].contains("quality"),
        "{g:?}"
    );
    let mut problems = Vec::new();
    for (m, refs) in &g {
        let Some(fm) = floor(m) else {
            problems.push(format!(
                "src/{m} is on no floor: add it to FLOORS in tests/layers.rs"
            ));
            continue;
        };
        for r in refs {
            match floor(r) {
                Some(fr) if fr < fm => {}
                Some(fr) => problems.push(format!(
                    "{m} (floor {fm}) uses crate::{r} (floor {fr}): move what it needs down"
                )),
                None => problems.push(format!("{m} uses crate::{r}, which is on no floor")),
            }
        }
    }
    // Depth-first search for a cycle, independent of the floor numbers.
    fn visit<'a>(
        m: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(i) = stack.iter().position(|s| *s == m) {
            return Some(format!("{} → {m}", stack[i..].join(" → ")));
        }
        if !done.insert(m) {
            return None;
        }
        stack.push(m);
        for r in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(r, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(c) = visit(m, &g, &mut Vec::new(), &mut done) {
            problems.push(format!("import cycle: {c}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
