//! The crate's floors (issue #12): a module may use only modules on lower floors, so the import
//! graph has no cycles and nothing reaches up. Lowest first:
//!
//! 0. `error`: the one error type every layer returns;
//! 1. `stats`, `util`: know nothing of KV caches, models or benchmarks;
//! 2. `kv`: cache schemes and attention over their stored form;
//! 3. `model`: the decoder that takes the cache from outside;
//! 4. `quality`: perplexity, ROUGE, passkey through the cache;
//! 5. `measure` (the sweep runner), `plan` (capacity arithmetic) and `perf` (the performance
//!    model of a step);
//! 6. `serve`: the serving load test (scheduler, block pool, workload, metrics);
//! 7. `report`: turns finished results into bytes;
//! 8. `app`: the measuring commands end to end (settings → plan → run folder → loop → report);
//! 9. `cli`: parses, dispatches.
//!
//! The first test reads every `src/**/*.rs`, drops comments, collects the `crate::<module>`
//! references of each top-level module (paths and `use crate::{a, b}` groups) and fails on a
//! reference to a higher floor, to another module of the same floor, or on any cycle.
//!
//! The second (issue #21) does the same for every pair of files: each file is a node, each
//! path it names (`crate::…`, `super::…`, `self::…`, a child module's name, in `use` trees and
//! in code) an edge to the file that *defines* the item — a name a `mod.rs` re-exports
//! (`pub use scheme::KvScheme`) is followed to where it is defined — and any cycle fails,
//! inside a folder as across them. Test code (`#[cfg(test)]` modules and files) is left out:
//! tests may reach anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const FLOORS: &[&[&str]] = &[
    &["error"],
    &["stats", "util"],
    &["kv"],
    &["model"],
    &["quality"],
    &["measure", "plan", "perf"],
    &["serve"],
    &["report"],
    &["app"],
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

// ---------------------------------------------------------------------------------------------
// The file-level graph (issue #21).

/// A module path from the crate root (`["kv", "formats", "fp8"]`; `[]` is `lib.rs`).
type ModPath = Vec<String>;

/// One file of the crate: its module path, its code (comments, strings and test modules
/// removed), the items it defines, its re-exports (`name → absolute path`) and globs.
struct FileMod {
    code: String,
    defines: BTreeSet<String>,
    reexports: BTreeMap<String, ModPath>,
    globs: Vec<ModPath>,
}

/// The module path of `file` under `src`: `kv/mod.rs` → `kv`, `kv/fp8.rs` → `kv::fp8`.
fn mod_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !["mod", "lib", "main"].contains(&stem) {
        parts.push(stem.to_string());
    }
    parts
}

/// `code` without the items behind `#[cfg(test)]` (a `mod … { }` block or one item up to its
/// `;` or closing brace); the names of `#[cfg(test)] mod name;` (test files) are returned.
fn strip_test_code(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_files = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        // The item: up to the first `;` or the end of its first brace block, whichever first.
        let semi = after.find(';');
        let brace = after.find('{');
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => {
                let item = after[..s].trim();
                if let Some(name) = item.split_whitespace().last() {
                    if item.contains("mod ") {
                        test_files.push(name.to_string());
                    }
                }
                s + 1
            }
            (_, Some(b)) => {
                let mut depth = 0;
                let mut end = after.len();
                for (j, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => {
                let item = after[..s].trim();
                if let (true, Some(name)) = (item.contains("mod "), item.split_whitespace().last())
                {
                    test_files.push(name.to_string());
                }
                s + 1
            }
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    (out, test_files)
}

/// The paths a `use` tree names, each as written (`super::a::{b, c::d as e}` gives
/// `super::a::b` and `super::a::c::d`, with the name each is visible under).
fn use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    fn walk(prefix: &[String], t: &str, out: &mut Vec<(Vec<String>, String)>) {
        let t = t.trim();
        if t.is_empty() {
            return;
        }
        if let Some(open) = t.find('{') {
            let head: Vec<String> = t[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            let mut p = prefix.to_vec();
            p.extend(head);
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        walk(&p, &inner[start..j], out);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            walk(&p, &inner[start..], out);
            return;
        }
        let (path, alias) = match t.split_once(" as ") {
            Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
            None => (t, None),
        };
        let mut segs = prefix.to_vec();
        segs.extend(path.split("::").map(|s| s.trim().to_string()));
        if segs.last().is_some_and(|s| s == "self") {
            segs.pop();
        }
        let name = alias.unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
        out.push((segs, name));
    }
    let mut out = Vec::new();
    walk(&[], tree, &mut out);
    out
}

/// `segs` (as written in module `at`) as an absolute module path; `None` for paths outside the
/// crate (`std::…`, a dependency) or not starting at a module (`Self::…`).
fn absolute(at: &ModPath, segs: &[String], children: &BTreeSet<String>) -> Option<ModPath> {
    let first = segs.first()?;
    let mut base = at.clone();
    let mut rest = segs;
    match first.as_str() {
        "crate" => {
            base.clear();
            rest = &segs[1..];
        }
        "self" => rest = &segs[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        s if children.contains(s) => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The file defining what absolute path `p` names: the longest module prefix, then a name it
/// re-exports followed to its source (globs too), else that module itself.
fn resolve(files: &BTreeMap<ModPath, FileMod>, p: &[String], depth: usize) -> Option<ModPath> {
    if depth > 16 {
        return None;
    }
    let mut cur: ModPath = Vec::new();
    for (i, seg) in p.iter().enumerate() {
        let mut next = cur.clone();
        next.push(seg.clone());
        if files.contains_key(&next) {
            cur = next;
            continue;
        }
        let m = files.get(&cur)?;
        if let Some(target) = m.reexports.get(seg) {
            let mut t = target.clone();
            t.extend(p[i + 1..].iter().cloned());
            return resolve(files, &t, depth + 1);
        }
        if !m.defines.contains(seg) {
            for g in &m.globs {
                let mut t = g.clone();
                t.extend(p[i..].iter().cloned());
                if let Some(r) = resolve(files, &t, depth + 1) {
                    if &r != g {
                        return Some(r);
                    }
                }
            }
        }
        return Some(cur);
    }
    Some(cur)
}

/// Every library file, parsed.
fn file_mods(src: &Path) -> BTreeMap<ModPath, FileMod> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut test_files: BTreeSet<ModPath> = BTreeSet::new();
    let mut files = BTreeMap::new();
    let item = |code: &str, kw: &str| -> Vec<String> {
        code.match_indices(kw)
            .filter(|(i, _)| *i == 0 || !code.as_bytes()[i - 1].is_ascii_alphanumeric())
            .map(|(i, _)| {
                code[i + kw.len()..]
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .filter(|n| !n.is_empty())
            .collect()
    };
    for f in paths {
        if f.file_name().is_some_and(|n| n == "main.rs") {
            continue;
        }
        let path = mod_path(src, &f);
        let (code, tests) = strip_test_code(&code_only(&std::fs::read_to_string(&f).unwrap()));
        for t in tests {
            let mut p = path.clone();
            p.push(t);
            test_files.insert(p);
        }
        let mut defines = BTreeSet::new();
        for kw in [
            "struct ",
            "enum ",
            "fn ",
            "trait ",
            "type ",
            "const ",
            "static ",
            "mod ",
            "union ",
            "macro_rules! ",
        ] {
            defines.extend(item(&code, kw));
        }
        files.insert(
            path.clone(),
            FileMod {
                code,
                defines,
                reexports: BTreeMap::new(),
                globs: Vec::new(),
            },
        );
    }
    files.retain(|p, _| !test_files.iter().any(|t| p.starts_with(t)));
    // Re-exports, now that every module's children are known.
    let keys: Vec<ModPath> = files.keys().cloned().collect();
    for k in &keys {
        let children = children_of(&keys, k);
        let code = files[k].code.clone();
        for stmt in use_statements(&code, true) {
            for (segs, name) in use_tree(&stmt) {
                if let Some(abs) = absolute(k, &segs, &children) {
                    let m = files.get_mut(k).unwrap();
                    if name == "*" {
                        let mut g = abs;
                        g.pop();
                        m.globs.push(g);
                    } else {
                        m.reexports.insert(name, abs);
                    }
                }
            }
        }
    }
    files
}

/// The child modules of `p` among `keys` (their last names).
fn children_of(keys: &[ModPath], p: &ModPath) -> BTreeSet<String> {
    keys.iter()
        .filter(|k| k.len() == p.len() + 1 && k.starts_with(p))
        .map(|k| k.last().unwrap().clone())
        .collect()
}

/// The trees of the `use` statements in `code` (`pub use …` only when `public`).
fn use_statements(code: &str, public: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("use ") {
        if i > 0
            && (code.as_bytes()[i - 1].is_ascii_alphanumeric() || code.as_bytes()[i - 1] == b'_')
        {
            continue;
        }
        let before = code[..i].trim_end();
        let is_pub = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        if public && !is_pub {
            continue;
        }
        let rest = &code[i + 4..];
        if let Some(end) = rest.find(';') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// `code` without its `pub use …;` and `pub(crate) use …;` statements.
fn without_reexports(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].trim_end();
        let public = before.ends_with("pub")
            || before.ends_with("pub(crate)")
            || before.ends_with("pub(super)");
        match (public, rest[i..].find(';')) {
            (true, Some(end)) => {
                let start = before.rfind("pub").unwrap_or(i);
                out.push_str(&rest[..start]);
                rest = &rest[i + end + 1..];
            }
            _ => {
                out.push_str(&rest[..i + 4]);
                rest = &rest[i + 4..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `file → files it uses` over the library.
fn file_graph(files: &BTreeMap<ModPath, FileMod>) -> BTreeMap<String, BTreeSet<String>> {
    let keys: Vec<ModPath> = files.keys().cloned().collect();
    let name = |p: &ModPath| {
        if p.is_empty() {
            "crate".to_string()
        } else {
            p.join("::")
        }
    };
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (k, f) in files {
        let children = children_of(&keys, k);
        // A re-export (`pub use child::X`) is a facade, not a use of the child by this file's
        // own code: references to it are followed to the child by `resolve`.
        let code = without_reexports(&f.code);
        let mut paths: Vec<Vec<String>> = use_statements(&code, false)
            .iter()
            .flat_map(|t| use_tree(t))
            .map(|(segs, _)| segs)
            .collect();
        // Paths in code: `crate::a::b`, `super::a`, `self::a`, `child::a`.
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            let starts = (c.is_ascii_alphabetic() || c == b'_')
                && (i == 0
                    || !(bytes[i - 1].is_ascii_alphanumeric()
                        || bytes[i - 1] == b'_'
                        || bytes[i - 1] == b':'));
            if !starts {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < bytes.len()
                && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_' || bytes[j] == b':')
            {
                j += 1;
            }
            let segs: Vec<String> = code[i..j]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if segs.len() > 1 && j < bytes.len() && bytes[j] != b'!' {
                paths.push(segs);
            }
            i = j.max(i + 1);
        }
        let entry = g.entry(name(k)).or_default();
        for segs in paths {
            let Some(abs) = absolute(k, &segs, &children) else {
                continue;
            };
            if let Some(target) = resolve(files, &abs, 0) {
                if &target != k && !target.is_empty() && !k.starts_with(&target)
                    || &target != k && target.len() > k.len()
                {
                    entry.insert(name(&target));
                } else if &target != k && !target.is_empty() {
                    // A child naming an item its parent module itself defines.
                    if files[&target]
                        .defines
                        .contains(abs.get(target.len()).map_or("", |s| s.as_str()))
                    {
                        entry.insert(name(&target));
                    }
                }
            }
        }
    }
    g
}

/// Cycles of `g` (one per strongly connected group, as a path).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit<'a>(
        m: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        out: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| *s == m) {
            out.push(format!("{} → {m}", stack[i..].join(" → ")));
            return;
        }
        if !done.insert(m) {
            return;
        }
        stack.push(m);
        for r in g.get(m).into_iter().flatten() {
            visit(r, g, stack, done, out);
        }
        stack.pop();
    }
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for m in g.keys() {
        visit(m, g, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

/// The file-level parser on hand-written snippets: use trees, test code, re-exports.
#[test]
fn file_level_parser_by_hand() {
    let paths: Vec<String> = use_tree("super::a::{b, c::{d as e, self}, f::*}")
        .into_iter()
        .map(|(p, n)| format!("{}={n}", p.join("::")))
        .collect();
    assert_eq!(
        paths,
        [
            "super::a::b=b",
            "super::a::c::d=e",
            "super::a::c=c",
            "super::a::f::*=*"
        ]
    );
    let (code, tests) = strip_test_code(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n use crate::x::Y;\n fn t() { {} }\n}\nfn b() {}\n#[cfg(test)]\nmod more;\n",
    );
    assert!(
        code.contains("fn a()") && code.contains("fn b()") && !code.contains("crate::x"),
        "{code}"
    );
    assert_eq!(tests, ["more"]);
    let children = BTreeSet::from(["fp8".to_string()]);
    let at = vec!["kv".to_string()];
    let abs = |s: &str| {
        absolute(
            &at,
            &s.split("::").map(String::from).collect::<Vec<_>>(),
            &children,
        )
    };
    assert_eq!(
        abs("super::model::M"),
        Some(vec!["model".into(), "M".into()])
    );
    assert_eq!(
        abs("fp8::E4M3"),
        Some(vec!["kv".into(), "fp8".into(), "E4M3".into()])
    );
    assert_eq!(abs("std::fmt"), None);
}

/// No file reaches back to a file that reaches it: the import graph of the library's files has
/// no cycle, inside a folder or across folders (issue #21).
#[test]
fn no_cycle_between_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = file_mods(&src);
    let g = file_graph(&files);
    // The scan resolves what it must: a re-exported name to its defining file, a sibling.
    assert!(
        g["measure::plan"].contains("measure::unit"),
        "{:?}",
        g["measure::plan"]
    );
    assert!(
        g["measure::sweep"].contains("kv::scheme"),
        "{:?}",
        g["measure::sweep"]
    );
    let c = cycles(&g);
    assert!(
        c.is_empty(),
        "{} import cycle(s) between files:\n{}",
        c.len(),
        c.join("\n")
    );
}
