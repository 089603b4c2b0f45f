//! The shape of the source, checked: the layers ARCHITECTURE.md draws ("Bird's eye view")
//! and short functions.
//!
//! 1. **Layers.** Every file under `src/` (the library: not `main.rs`, `cli/` or the crate
//!    root `lib.rs`, which only declares and re-exports) may refer (`crate::...`, or a
//!    `super::` chain that leaves its layer) only to its own layer or the layers below it,
//!    in the order of [`LAYERS`]. Inside the base layer ([`BASE_ORDER`]) a module may refer
//!    only to the modules before it, so the base layer has no cycle either. Doc comments
//!    and strings do not count: they are not dependencies.
//! 2. **Short functions.** No `fn` in `src/` longer than [`MAX_FN_LINES`] lines, outside
//!    test code (`#[cfg(test)]` modules and `#[test]` functions).
//!
//! No mpirun: the tests read the files. The checkers are tested on small strings below, so
//! they cannot pass by seeing nothing.

use std::path::{Path, PathBuf};

/// The layers, lowest first, as ARCHITECTURE.md draws them; a layer may use the ones before
/// it. Each top-level module of the library is in one ([`layer_of_module`]).
const LAYERS: &[&str] = &["base", "data", "device", "comm", "embedding", "sparse", "engine", "model", "train"];

/// The base layer's modules (`src/*.rs`), lowest first: each may use only those before it.
/// `lib` stands for the crate root's own items (`eprint_line`).
const BASE_ORDER: &[&str] = &[
    "lib", "error", "hash", "dtype", "tensor", "header", "fileio", "frame", "signals", "onebit", "partition", "settings", "config", "group", "gather", "watchdog", "shm", "stale",
    "liveness", "topology", "control", "hostsync",
];

/// Items of the crate root that are not modules: (name, module they stand for).
const ROOT_ITEMS: &[(&str, &str)] = &[("eprint_line", "lib"), ("CommError", "error"), ("CommResult", "error"), ("init", "engine"), ("Runtime", "engine")];

/// The longest function allowed outside test code, in lines (from the line of `fn` to the
/// line of its closing brace).
const MAX_FN_LINES: usize = 100;

/// The layer of top-level module (or root item) `name`, as an index into [`LAYERS`].
fn layer_of_module(name: &str) -> Option<usize> {
    let name = ROOT_ITEMS.iter().find(|(n, _)| *n == name).map_or(name, |(_, m)| m);
    if BASE_ORDER.contains(&name) {
        return Some(0);
    }
    LAYERS.iter().position(|l| *l == name)
}

/// The base module `name` stands for (a root item stands for its module).
fn base_index(name: &str) -> Option<usize> {
    let name = ROOT_ITEMS.iter().find(|(n, _)| *n == name).map_or(name, |(_, m)| m);
    BASE_ORDER.iter().position(|m| *m == name)
}

// ---------------------------------------------------------------------------------------
// A small Rust lexer: identifiers and punctuation with their lines; comments, strings and
// character literals dropped.

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`, or one punctuation character.
    Punct(&'static str),
    /// A literal (number, string, character); its text does not matter here.
    Lit,
}

const PUNCT: &[&str] = &["{", "}", "(", ")", "[", "]", "#", "!", ";", ",", "<", ">", "=", "-", "+", "*", "&", "|", "^", "%", "/", ".", ":", "?", "@", "$", "~"];

/// The tokens of `src`, each with its 1-based line.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let is_ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&c, i) {
            line += c[i..end].iter().filter(|x| **x == '\n').count();
            out.push((Tok::Lit, line));
            i = end;
        } else if ch == '"' || ((ch == 'b' || ch == 'c') && next == Some('"')) {
            let start = line;
            i += if ch == '"' { 1 } else { 2 };
            while i < c.len() && c[i] != '"' {
                line += usize::from(c[i] == '\n');
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            out.push((Tok::Lit, start));
            i += 1;
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            // A character literal ('a', '\n', b'x') or a lifetime/label ('a).
            let j = if ch == 'b' { i + 1 } else { i };
            if c.get(j + 1) == Some(&'\\') {
                let mut k = j + 3;
                while k < c.len() && c[k] != '\'' {
                    k += 1;
                }
                out.push((Tok::Lit, line));
                i = k + 1;
            } else if c.get(j + 2) == Some(&'\'') {
                out.push((Tok::Lit, line));
                i = j + 3;
            } else {
                i = j + 1;
                while i < c.len() && is_ident(c[i]) {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.push((Tok::Lit, line));
        } else if is_ident(ch) {
            if ch == 'r' && next == Some('#') && c.get(i + 2).is_some_and(|x| is_ident(*x)) {
                i += 2;
            }
            let s = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.push((Tok::Ident(c[s..i].iter().collect()), line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Punct("::"), line));
            i += 2;
        } else {
            let p = PUNCT.iter().find(|p| p.starts_with(ch)).copied().unwrap_or("?");
            out.push((Tok::Punct(p), line));
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"..."`, `r#"..."#`, `br#"..."#`) starting at `i` ends, if one does.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if c.get(j) == Some(&'b') || c.get(j) == Some(&'c') {
        j += 1;
    }
    if c.get(j) != Some(&'r') || (i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')) {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|x| **x == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && c[j + 1..].iter().take(hashes).filter(|x| **x == '#').count() == hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is_punct(t: Option<&(Tok, usize)>, p: &str) -> bool {
    matches!(t, Some((Tok::Punct(q), _)) if *q == p)
}

// ---------------------------------------------------------------------------------------
// References to other modules.

/// One reference out of a file: the line, the path as written, and the module of the crate
/// root it lands in (its first segment after `crate::`).
#[derive(Debug, PartialEq)]
struct Reference {
    line: usize,
    path: String,
    target: String,
}

/// The first segments of the paths a `{...}` group starting at `toks[i]` names: `{a::b, c}`
/// gives `a` and `c`.
fn group_heads(toks: &[(Tok, usize)], i: usize) -> Vec<String> {
    let (mut depth, mut heads, mut expect) = (0, Vec::new(), true);
    for t in &toks[i..] {
        match &t.0 {
            Tok::Punct("{") => {
                depth += 1;
                expect = depth == 1;
            }
            Tok::Punct("}") => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(",") if depth == 1 => expect = true,
            Tok::Ident(s) if expect && depth == 1 => {
                heads.push(s.clone());
                expect = false;
            }
            _ => {}
        }
    }
    heads
}

/// Every reference of a file whose module path is `module` (`["comm", "ring"]` for
/// src/comm/ring.rs, `["comm"]` for src/comm/mod.rs) that reaches the crate root: `crate::x`
/// and `super::` chains that climb out of the file's top-level module (resolved against
/// inline `mod x { ... }` blocks).
fn references(src: &str, module: &[&str]) -> Vec<Reference> {
    let toks = lex(src);
    let mut out = Vec::new();
    // Inline modules open at each brace depth (None: a brace that is not a module's).
    let mut braces: Vec<Option<String>> = Vec::new();
    for (i, (t, line)) in toks.iter().enumerate() {
        match t {
            Tok::Punct("{") => {
                let inline = (i >= 2 && ident(toks.get(i - 2)) == Some("mod")).then(|| ident(toks.get(i - 1)).unwrap_or_default().to_string());
                braces.push(inline);
                continue;
            }
            Tok::Punct("}") => {
                braces.pop();
                continue;
            }
            _ => {}
        }
        let Some(word) = ident(Some(&toks[i])) else { continue };
        let chain_start = i == 0 || !is_punct(toks.get(i - 1), "::");
        if !chain_start || !is_punct(toks.get(i + 1), "::") {
            continue;
        }
        let (heads, path_end) = match word {
            "crate" => (heads_after(&toks, i + 2), i + 2),
            "super" => {
                let mut here: Vec<String> = module.iter().map(|s| s.to_string()).chain(braces.iter().flatten().cloned()).collect();
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && is_punct(toks.get(j + 1), "::") {
                    if here.pop().is_none() {
                        break;
                    }
                    j += 2;
                }
                if !here.is_empty() {
                    // Still inside the file's top-level module: not a reference out of it.
                    continue;
                }
                (heads_after(&toks, j), j)
            }
            _ => continue,
        };
        let written: String = toks[i..(path_end + 1).min(toks.len())]
            .iter()
            .map(|t| match &t.0 {
                Tok::Ident(s) => s.as_str(),
                Tok::Punct(p) => p,
                Tok::Lit => "_",
            })
            .collect();
        for target in heads {
            out.push(Reference { line: *line, path: written.clone(), target });
        }
    }
    out
}

/// The modules a path names after `crate::` (at `toks[j]`): one ident, or a group's heads.
fn heads_after(toks: &[(Tok, usize)], j: usize) -> Vec<String> {
    match toks.get(j) {
        Some((Tok::Ident(s), _)) => vec![s.clone()],
        Some((Tok::Punct("{"), _)) => group_heads(toks, j),
        _ => Vec::new(),
    }
}

/// What is wrong with the references of one file (module path `module`), one line each:
/// an upward reference across layers, a base module using one after it in
/// [`BASE_ORDER`], a module missing from the tables.
fn layer_violations(file: &str, src: &str, module: &[&str]) -> Vec<String> {
    let me = module[0];
    let Some(my_layer) = layer_of_module(me) else {
        return vec![format!("{file}: module `{me}` is in no layer: add it to LAYERS/BASE_ORDER in tests/layers.rs and to ARCHITECTURE.md")];
    };
    let mut out = Vec::new();
    for r in references(src, module) {
        let Some(layer) = layer_of_module(&r.target) else {
            out.push(format!("{file}:{}: `{}` names `{}`, which is in no layer of tests/layers.rs", r.line, r.path, r.target));
            continue;
        };
        if layer > my_layer {
            out.push(format!("{file}:{}: `{}`: the {} layer uses the {} layer above it", r.line, r.path, LAYERS[my_layer], LAYERS[layer]));
        } else if layer == 0 && my_layer == 0 {
            let (mine, theirs) = (base_index(me).unwrap_or(0), base_index(&r.target).unwrap_or(0));
            if theirs > mine {
                out.push(format!("{file}:{}: `{}`: base module `{me}` uses `{}`, which comes after it in the base order", r.line, r.path, BASE_ORDER[theirs]));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Function lengths.

/// Functions longer than `max` lines outside test code: (name, first line, lines).
fn long_functions(src: &str, max: usize) -> Vec<(String, usize, usize)> {
    let toks = lex(src);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        // `#[cfg(test)]` or `#[test]` on the next item: skip that item.
        if is_punct(toks.get(i), "#") && is_punct(toks.get(i + 1), "[") {
            let attr: Vec<&str> = toks[i + 2..].iter().take_while(|t| t.0 != Tok::Punct("]")).filter_map(|t| ident(Some(t))).collect();
            let close = i + 2 + toks[i + 2..].iter().position(|t| t.0 == Tok::Punct("]")).unwrap_or(0);
            if attr == ["cfg", "test"] || attr == ["test"] {
                i = item_end(&toks, close + 1);
                continue;
            }
            i = close + 1;
            continue;
        }
        if ident(toks.get(i)) == Some("fn") {
            if let Some(name) = ident(toks.get(i + 1)) {
                if let Some(open) = body_start(&toks, i + 2) {
                    let end = matching_brace(&toks, open);
                    let lines = toks[end].1 - toks[i].1 + 1;
                    if lines > max {
                        out.push((name.to_string(), toks[i].1, lines));
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// The `{` of a function body whose signature starts at `toks[i]`, or None for a
/// declaration without a body (`fn f();`).
fn body_start(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, t) in toks.iter().enumerate().skip(i) {
        match t.0 {
            Tok::Punct("(") | Tok::Punct("[") => depth += 1,
            Tok::Punct(")") | Tok::Punct("]") => depth -= 1,
            Tok::Punct("{") if depth == 0 => return Some(k),
            Tok::Punct(";") if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// The index of the brace that closes the one at `toks[open]`.
fn matching_brace(toks: &[(Tok, usize)], open: usize) -> usize {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.0 {
            Tok::Punct("{") => depth += 1,
            Tok::Punct("}") => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    toks.len() - 1
}

/// The token after the item starting at `toks[i]` (its attributes and body included).
fn item_end(toks: &[(Tok, usize)], mut i: usize) -> usize {
    while is_punct(toks.get(i), "#") {
        i += 1 + toks[i..].iter().position(|t| t.0 == Tok::Punct("]")).unwrap_or(0);
    }
    for (k, t) in toks.iter().enumerate().skip(i) {
        match t.0 {
            Tok::Punct("{") => return matching_brace(toks, k) + 1,
            Tok::Punct(";") => return k + 1,
            _ => {}
        }
    }
    toks.len()
}

// ---------------------------------------------------------------------------------------
// The source tree.

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display())).flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The module path of `file` (relative to src/): `comm/ring.rs` -> [comm, ring],
/// `comm/mod.rs` -> [comm], `topology.rs` -> [topology].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_string());
        }
    }
    parts
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The library's files (not the binary's, not the crate root) with their module paths and
/// text.
fn library_files() -> Vec<(String, Vec<String>, String)> {
    let src = src_dir();
    rust_files(&src)
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(&src).ok()?.to_path_buf();
            let module = module_path(&rel);
            let skip = matches!(module.first().map(String::as_str), None | Some("main") | Some("lib") | Some("cli"));
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (!skip).then(|| (format!("src/{}", rel.display()), module, text))
        })
        .collect()
}

#[test]
fn no_module_uses_a_layer_above_it() {
    let files = library_files();
    assert!(files.len() > 50, "found only {} files under src/", files.len());
    let (mut bad, mut seen) = (Vec::new(), 0);
    for (file, module, text) in &files {
        let module: Vec<&str> = module.iter().map(String::as_str).collect();
        seen += references(text, &module).len();
        bad.extend(layer_violations(file, text, &module));
    }
    assert!(seen > 300, "found only {seen} references to other modules under src/: the lexer is broken");
    assert!(bad.is_empty(), "references against the layers of ARCHITECTURE.md (lowest first: {}; base: {}):\n{}", LAYERS.join(" < "), BASE_ORDER.join(" < "), bad.join("\n"));
}

#[test]
fn every_module_of_the_crate_root_is_in_a_layer() {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).expect("src/lib.rs");
    let toks = lex(&lib);
    let declared: Vec<&str> = toks.windows(2).filter(|w| ident(Some(&w[0])) == Some("mod")).filter_map(|w| ident(Some(&w[1]))).collect();
    assert!(declared.len() > 10, "found only {declared:?} in src/lib.rs");
    let missing: Vec<&&str> = declared.iter().filter(|m| layer_of_module(m).is_none()).collect();
    assert!(missing.is_empty(), "modules of src/lib.rs in no layer of tests/layers.rs: {missing:?}");
    let base_files: Vec<String> = rust_files(&src_dir()).iter().filter_map(|p| p.strip_prefix(src_dir()).ok()?.to_str().map(str::to_string)).filter(|p| !p.contains('/')).collect();
    for f in base_files.iter().filter(|f| *f != "lib.rs" && *f != "main.rs") {
        let m = f.trim_end_matches(".rs");
        assert!(base_index(m).is_some(), "src/{f} is a base module missing from BASE_ORDER in tests/layers.rs");
    }
    for m in BASE_ORDER.iter().filter(|m| **m != "lib") {
        assert!(base_files.contains(&format!("{m}.rs")), "BASE_ORDER in tests/layers.rs names `{m}`, but there is no src/{m}.rs");
    }
}

#[test]
fn no_function_is_over_100_lines() {
    let (mut long, files) = (Vec::new(), rust_files(&src_dir()));
    assert!(files.len() > 50, "found only {} files under src/", files.len());
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
        for (name, line, lines) in long_functions(&text, MAX_FN_LINES) {
            long.push(format!("{}:{line}: fn {name} has {lines} lines", p.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&p).display()));
        }
    }
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines outside test code (split each into named steps):\n{}", long.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The checkers, on small strings.

#[test]
fn an_upward_import_is_caught_and_a_downward_one_passes() {
    let up = "use std::sync::Arc;\nuse crate::engine::controller::Thing;\n";
    let v = layer_violations("src/watchdog.rs", up, &["watchdog"]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("src/watchdog.rs:2: `crate::engine`") && v[0].contains("the base layer uses the engine layer"), "{}", v[0]);
    let down = "use crate::topology::Topology;\nuse crate::comm::Collectives;\nfn f() { crate::dtype::DType::F32; }\n";
    assert_eq!(layer_violations("src/sparse/list.rs", down, &["sparse", "list"]), Vec::<String>::new());
}

#[test]
fn inline_paths_groups_and_macros_are_references() {
    let src = "fn f() {\n    let g = crate::comm::mpi_backend::x(1);\n}\nuse crate::{dtype::DType, sparse::{a, b}, CommError};\nmacro_rules! m { () => { $crate::train::x() } }\n";
    let r: Vec<(usize, String)> = references(src, &["device", "cpu"]).into_iter().map(|r| (r.line, r.target)).collect();
    assert_eq!(r, [(2, "comm".into()), (4, "dtype".into()), (4, "sparse".into()), (4, "CommError".into()), (5, "train".into())]);
    let v = layer_violations("src/device/cpu.rs", src, &["device", "cpu"]);
    assert_eq!(v.len(), 3, "comm, sparse and train are above device: {v:?}");
}

#[test]
fn comments_strings_and_visibility_are_not_references() {
    let src = "//! See [`crate::engine::Engine`].\n/* crate::train::x */\npub(crate) fn f() -> &'static str { \"crate::train::y\" }\nconst C: char = '\\''; // crate::engine\npub(super) fn g<'a>(x: &'a str) -> &'a str { x }\nlet s = r#\"crate::train \"quoted\" \"#;\n";
    assert_eq!(references(src, &["data", "x"]), Vec::<Reference>::new());
}

#[test]
fn super_chains_resolve_against_files_and_inline_modules() {
    // Inside the file's own top-level module: not a reference out of it.
    let inside = "use super::part;\nmod tests {\n    use super::*;\n    use super::super::compression::C;\n}\n";
    assert_eq!(references(inside, &["engine", "coordinator"]), Vec::<Reference>::new());
    // A base file at the root: `super::` is the crate root.
    let r = references("mod tests { use super::super::engine::X; }\nuse super::train::Y;\n", &["topology"]);
    let targets: Vec<&str> = r.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(targets, ["engine", "train"]);
    assert_eq!(layer_violations("src/topology.rs", "use super::train::Y;\n", &["topology"]).len(), 1);
}

#[test]
fn the_base_order_is_enforced() {
    // hostsync is above topology: topology may not use it; the reverse is fine.
    let v = layer_violations("src/topology.rs", "use crate::hostsync::PeerWatch;\n", &["topology"]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("comes after it in the base order"), "{}", v[0]);
    assert!(layer_violations("src/hostsync.rs", "use crate::topology::Topology;\nuse crate::{CommError, eprint_line};\n", &["hostsync"]).is_empty());
    assert_eq!(layer_violations("src/shm.rs", "use crate::nowhere::X;\n", &["shm"]).len(), 1, "an unknown module is reported");
}

#[test]
fn long_functions_are_found_outside_test_code() {
    let body = |n: usize| (0..n).map(|i| format!("    let x{i} = {i};\n")).collect::<String>();
    // 2 + 99 lines: 101, over; 2 + 98: exactly 100, fine.
    let src = format!(
        "pub fn long(a: u32) -> u32 {{\n{}}}\nfn fine() {{\n{}}}\ntrait T {{ fn decl(&self); }}\n#[cfg(test)]\nmod tests {{\n    fn helper() {{\n{}    }}\n}}\n#[test]\nfn a_test() {{\n{}}}\nfn takes(f: fn(u32) -> u32) -> impl Fn() {{ move || {{ let _ = f; }} }}\n",
        body(99),
        body(98),
        body(200),
        body(200)
    );
    let long = long_functions(&src, 100);
    assert_eq!(long, [("long".to_string(), 1, 101)]);
    // Braces inside strings and characters do not confuse the count.
    let tricky = format!("fn s() {{\n    let a = \"}}\";\n    let b = '}}';\n{}}}\n", body(97));
    assert_eq!(long_functions(&tricky, 100), [("s".to_string(), 1, 101)]);
}
