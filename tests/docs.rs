//! The manual says what is true: README.md's and docs/*.md's runnable blocks run as written,
//! their excerpts of compiled files are word for word those files', and their links lead
//! somewhere. How blocks are marked, and where they run: docs/README.md, "Runnable blocks".

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::TempDir;

/// How long one runnable block may take.
const BLOCK_DEADLINE: Duration = Duration::from_secs(120);

/// A fenced code block of a Markdown page.
struct Block {
    /// The page, relative to the repository root.
    page: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The words after the opening backticks (`sh runnable`, `rust excerpt=PATH`).
    info: Vec<String>,
    /// The lines between the fences.
    body: String,
}

impl Block {
    /// Whether the fence's info string holds `word`.
    fn has(&self, word: &str) -> bool {
        self.info.iter().any(|w| w == word)
    }

    /// The value of `key=VALUE` in the info string.
    fn value(&self, key: &str) -> Option<&str> {
        self.info.iter().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    }
}

/// The repository root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, then docs/*.md in name order, relative to the root.
fn pages() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    let mut all = vec!["README.md".to_string()];
    all.extend(docs);
    all
}

fn read(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

/// The fenced blocks of `text` (fences of three backticks at the start of a line).
fn blocks(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(info)) => open = Some(Block { page: page.to_string(), line: i + 1, info: info.split_whitespace().map(String::from).collect(), body: String::new() }),
            (None, None) => {}
            (Some(b), Some(rest)) if rest.trim().is_empty() => out.push(b),
            (Some(mut b), _) => {
                b.body.push_str(line);
                b.body.push('\n');
                open = Some(b);
            }
        }
    }
    assert!(open.is_none(), "{page}: a code block is never closed");
    out
}

/// Each page's runnable blocks, in order, in one fresh directory per page (with `scripts/`
/// linked to the repository's), `ringrec` on PATH and the data directory inside it.
#[test]
fn runnable_blocks_run_as_written() {
    let bin = TempDir::new("docs-bin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ringrec"), bin.path("ringrec")).expect("link ringrec");
    let path = format!("{}:{}", bin.0.display(), std::env::var("PATH").unwrap_or_default());
    let mut failures = Vec::new();
    let mut ran = 0;
    for page in pages() {
        let runnable: Vec<Block> = blocks(&page, &read(&page)).into_iter().filter(|b| b.has("runnable")).collect();
        if runnable.is_empty() {
            continue;
        }
        let dir = TempDir::new("docs");
        std::os::unix::fs::symlink(root().join("scripts"), dir.path("scripts")).expect("link scripts");
        for (i, b) in runnable.iter().enumerate() {
            let mut cmd = Command::new("bash");
            cmd.args(["-e", "-o", "pipefail", "-c", &b.body]).current_dir(&dir.0).env("PATH", &path).env("RINGREC_DATA_DIR", dir.path("data"));
            let job = common::run_with_timeout(cmd, BLOCK_DEADLINE);
            ran += 1;
            eprintln!("{}:{}: exit {:?} in {:.1} s", b.page, b.line, job.code, job.elapsed.as_secs_f64());
            if job.code != Some(0) || job.timed_out {
                let why = if job.timed_out { format!("ran past {} s", BLOCK_DEADLINE.as_secs()) } else { format!("exit status {:?}", job.code) };
                let skipped = runnable.len() - i - 1;
                failures.push(format!(
                    "{}:{}: the runnable block failed ({why}){}:\n{}--- stdout\n{}--- stderr\n{}",
                    b.page,
                    b.line,
                    if skipped > 0 { format!("; the page's {skipped} later block(s) not run") } else { String::new() },
                    b.body,
                    job.stdout,
                    job.stderr
                ));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran > 0, "no runnable block found in README.md and docs/*.md");
}

/// Every ```rust block is an excerpt of a compiled file, and its lines are that file's.
#[test]
fn rust_blocks_are_excerpts_of_compiled_files() {
    let mut checked = 0;
    for page in pages() {
        for b in blocks(&page, &read(&page)).into_iter().filter(|b| b.info.first().map(String::as_str) == Some("rust")) {
            let Some(file) = b.value("excerpt") else {
                panic!("{}:{}: a ```rust block must be `rust excerpt=PATH` (an excerpt of a file the build compiles)", b.page, b.line);
            };
            let source = read(file);
            let lines: Vec<&str> = source.lines().map(str::trim).collect();
            let mut at = 0;
            for (k, want) in b.body.lines().enumerate() {
                let want = want.trim();
                if want.is_empty() || want.starts_with("// ...") {
                    continue;
                }
                match lines[at..].iter().position(|l| *l == want) {
                    Some(p) => at += p + 1,
                    None => panic!("{}:{}: `{want}` is not in {file} (after the excerpt's previous line)", b.page, b.line + 1 + k),
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no excerpt found");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every relative link and image of the pages (outside code blocks) names a file that
/// exists, and an anchor into a Markdown file names one of its headings.
#[test]
fn links_lead_somewhere() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        let dir = Path::new(&page).parent().unwrap_or(Path::new(""));
        let mut fence = false;
        for (i, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                fence = !fence;
            }
            if fence {
                continue;
            }
            for (start, _) in line.match_indices("](") {
                let rest = &line[start + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, hash) = target.split_once('#').map_or((target, None), |(f, a)| (f, Some(a)));
                let path: PathBuf = if file.is_empty() { PathBuf::from(&page) } else { dir.join(file) };
                let full = root().join(&path);
                if !full.exists() {
                    broken.push(format!("{page}:{}: {target}: no file {}", i + 1, path.display()));
                } else if let Some(a) = hash.filter(|_| full.extension().is_some_and(|e| e == "md")) {
                    if !anchors(&std::fs::read_to_string(&full).unwrap_or_default()).iter().any(|h| h == a) {
                        broken.push(format!("{page}:{}: {target}: no heading with anchor #{a} in {}", i + 1, path.display()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
