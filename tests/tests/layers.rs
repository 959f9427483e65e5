//! The dependencies of each crate's top-level modules point one way (docs/architecture.md,
//! "Layers"): read as Cargo would read them if every top-level module (`src/x.rs` with
//! its `src/x/` folder; `lib.rs` and `main.rs` as the crate's root) were a crate of its
//! own, no module names another that names it back, directly or through others. Test
//! code (`#[cfg(test)]` items) is left aside; comments and string literals are not
//! read.
//!
//! `KNOWN` lists the loops not broken yet: it may only shrink. A loop that is not
//! listed fails the test, and so does a listed one that is gone (take it off).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Loops that still stand, each as its modules in order, per crate folder.
const KNOWN: &[(&str, &[&str])] = &[];

/// The crates whose layers are checked.
const CRATES: [&str; 4] = ["aggregator", "agent", "common", "cli"];

/// A reference from one top-level module to another: where, and what it names.
#[derive(Debug, Clone)]
struct Reference {
    file: PathBuf,
    line: usize,
    text: String,
}

/// The source with comments, string and character literals blanked (newlines kept, so
/// lines still count) and `#[cfg(test)]` items removed.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(0);
        if c == b'/' && next == b'/' {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == b'*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && (next == b'"' || next == b'#') && !ident_byte(prev(b, i)) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = find(b, j + 1, &close).map_or(b.len(), |e| e + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            let end = if next == b'\\' {
                find(b, i + 2, b"'").map(|e| e + 1)
            } else {
                let width = std::str::from_utf8(&b[i + 1..])
                    .ok()
                    .and_then(|s| s.chars().next())
                    .map_or(1, char::len_utf8);
                (b.get(i + 1 + width) == Some(&b'\'')).then_some(i + 2 + width)
            };
            match end {
                Some(end) => {
                    for &x in &b[i..end] {
                        blank(&mut out, x);
                    }
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    without_test_items(&text)
}

fn prev(b: &[u8], i: usize) -> u8 {
    if i == 0 { b' ' } else { b[i - 1] }
}

fn ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn find(b: &[u8], from: usize, what: &[u8]) -> Option<usize> {
    (from..b.len().saturating_sub(what.len() - 1)).find(|&k| &b[k..k + what.len()] == what)
}

/// `code` with every `#[cfg(test)]` item blanked: up to the `;` that ends it, or the
/// brace that closes its body.
fn without_test_items(code: &str) -> String {
    let mut b = code.as_bytes().to_vec();
    let mark = b"#[cfg(test)]";
    let mut from = 0;
    while let Some(at) = find(&b, from, mark) {
        let mut i = at + mark.len();
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        for x in &mut b[at..i.min(code.len())] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = i;
    }
    String::from_utf8(b).unwrap_or_default()
}

/// The top-level module a file under `src` belongs to (`lib` for the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    let name = first.trim_end_matches(".rs");
    match name {
        "main" | "lib" => "lib".to_owned(),
        other => other.to_owned(),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The first path segments a piece of code names after `crate::`, with their
/// lines: `crate::a::b` names `a`; `use crate::{a::x, b}` names `a` and `b`.
fn crate_names(code: &str) -> Vec<(usize, String, String)> {
    let mut found = Vec::new();
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(at) = find(b, from, b"crate::") {
        from = at + 7;
        if at > 0 && (ident_byte(b[at - 1]) || b[at - 1] == b'$') {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[at + 7..];
        let rest_trim = rest.trim_start();
        if let Some(group) = rest_trim.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth >= 1 {
                    item.push(ch);
                }
            }
            items.push(item);
            for it in items {
                let name: String = it
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((line, name, format!("crate::{{{}}}", it.trim())));
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                let text: String = rest
                    .chars()
                    .take_while(|c| !c.is_whitespace())
                    .take(60)
                    .collect();
                found.push((line, name, format!("crate::{text}")));
            }
        }
    }
    found
}

/// The files and folders of modules declared under `#[cfg(test)]` (`#[cfg(test)] mod
/// tests;` beside `src/api.rs` is `src/api/tests.rs`): test code.
fn test_module_files(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[cfg(test)]") {
            rest = &rest[at + 12..];
            let decl = rest.trim_start();
            let decl = decl.strip_prefix("pub(crate) ").unwrap_or(decl);
            let decl = decl.strip_prefix("pub ").unwrap_or(decl);
            let Some(name) = decl
                .strip_prefix("mod ")
                .and_then(|d| d.split_once(';'))
                .map(|(n, _)| n.trim())
                .filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_'))
            else {
                continue;
            };
            let stem = file.file_stem().unwrap().to_string_lossy();
            let dir = match stem.as_ref() {
                "lib" | "main" | "mod" => file.parent().unwrap().to_owned(),
                s => file.parent().unwrap().join(s),
            };
            out.push(dir.join(format!("{name}.rs")));
            out.push(dir.join(name));
        }
    }
    out
}

/// The modules the crate's root names by a bare path (`board::Board`, `use scrape::{..}`).
fn root_names(code: &str, modules: &BTreeSet<String>) -> Vec<(usize, String, String)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    for m in modules {
        let pat = format!("{m}::");
        let mut from = 0;
        while let Some(at) = find(b, from, pat.as_bytes()) {
            from = at + pat.len();
            let before = prev(b, at);
            if ident_byte(before) || before == b':' {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            found.push((line, m.clone(), pat.clone()));
        }
    }
    found
}

/// Each top-level module's references to the others, for one crate.
fn graph(krate: &str) -> BTreeMap<String, BTreeMap<String, Vec<Reference>>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate);
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let tests = test_module_files(&files);
    files.retain(|f| !tests.iter().any(|t| f.starts_with(t)));
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeMap<String, Vec<Reference>>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file);
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let mut names = crate_names(&code);
        if from == "lib" {
            // The crate's root names its modules without `crate::`.
            names.extend(root_names(&code, &modules));
        }
        for (line, name, text) in names {
            // A name that is no module is an item of the crate's root.
            let to = if modules.contains(&name) {
                name
            } else {
                "lib".to_owned()
            };
            if to == from {
                continue;
            }
            edges
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_default()
                .push(Reference {
                    file: file.strip_prefix(&root).unwrap().to_owned(),
                    line,
                    text,
                });
        }
    }
    edges
}

/// The loops of a graph: its strongly connected components of more than one module.
fn loops(edges: &BTreeMap<String, BTreeMap<String, Vec<Reference>>>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges
        .keys()
        .chain(edges.values().flat_map(BTreeMap::keys))
        .collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for next in edges.get(&n).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        let scc: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[*n].contains(**m) && reaches[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

#[test]
fn each_crates_top_level_modules_point_one_way() {
    let mut problems = Vec::new();
    let mut known_seen = BTreeSet::new();
    for krate in CRATES {
        let edges = graph(krate);
        for scc in loops(&edges) {
            let known = KNOWN.iter().position(|(k, mods)| {
                *k == krate
                    && mods
                        .iter()
                        .map(|m| (*m).to_owned())
                        .collect::<BTreeSet<_>>()
                        == scc
            });
            if let Some(i) = known {
                known_seen.insert(i);
                continue;
            }
            let mut text = format!("{krate}: a loop of {} modules: {:?}\n", scc.len(), scc);
            for from in &scc {
                for (to, refs) in edges.get(from).into_iter().flatten() {
                    if scc.contains(to) {
                        let r = &refs[0];
                        text.push_str(&format!(
                            "  {from} -> {to}: {}:{} {} ({} references)\n",
                            r.file.display(),
                            r.line,
                            r.text,
                            refs.len()
                        ));
                    }
                }
            }
            problems.push(text);
        }
    }
    for (i, (krate, mods)) in KNOWN.iter().enumerate() {
        if !known_seen.contains(&i) {
            problems.push(format!(
                "{krate}: the known loop {mods:?} is gone or changed: take it off KNOWN"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_reader_sees_what_the_compiler_sees() {
    let code = code_only(
        "use crate::{a::X, b};\n// crate::c\nlet s = \"crate::d\"; let c = '{';\n#[cfg(test)]\nmod tests { use crate::e; }\nfn f<'a>() { crate::g::h(); }\n",
    );
    let names: Vec<String> = crate_names(&code).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(names, ["a", "b", "g"]);
}
