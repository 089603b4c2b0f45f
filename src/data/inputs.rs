//! The inputs of `--data` and `--eval-data`: files, directories and globs, turned into the
//! list of data files in the order they are given.
//!
//! | input | stands for |
//! |---|---|
//! | a file | itself (a Criteo TSV, plain, `.gz` or `.zst`, a Parquet file or a prepared `.rrdata` cache) |
//! | a directory | every regular file in it, in natural name order, but hidden files (`.name`), caches (`.rrdata`), lock files (`.lock`) and the markers Spark and Arrow write beside Parquet parts (`_SUCCESS`, `_metadata`, `_common_metadata`) |
//! | a glob | the regular files its last component matches (`*` any run of characters, `?` one, `[0-8]` / `[!x]` one of / none of a set, as in the shell), in natural name order; hidden files only when the pattern starts with `.`, caches and lock files only when it ends with `.rrdata` or `.lock` |
//!
//! *Natural order* compares runs of digits by their value, so `day_2` comes before
//! `day_10` ([`natural_cmp`]). The directory part of a glob is taken literally. A path that
//! exists is never read as a glob. An input that names no data file — a missing path, a
//! glob that matches nothing, a directory without a data file — is
//! [`DataError::Input`], naming it.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use super::cache::CACHE_EXT;
use super::error::{DataError, DataResult};

/// Extension of the lock files next to caches (`<cache>.lock`).
const LOCK_EXT: &str = "lock";

/// The data files `specs` stand for, in order (see the module docs); `flag` names them in
/// errors.
pub fn resolve(flag: &'static str, specs: &[PathBuf]) -> DataResult<Vec<PathBuf>> {
    let mut files = Vec::new();
    for spec in specs {
        let err = |reason: String| DataError::Input { flag, spec: spec.clone(), reason };
        match std::fs::metadata(spec) {
            Ok(m) if m.is_file() => files.push(spec.clone()),
            Ok(m) if m.is_dir() => {
                let found = listing(spec, |name| !name.starts_with('.') && !is_own(name) && !MARKERS.contains(&name)).map_err(|e| err(e.to_string()))?;
                if found.is_empty() {
                    return Err(err(format!("the directory holds no data file (hidden files, .{CACHE_EXT} caches and .{LOCK_EXT} files are skipped)")));
                }
                files.extend(found);
            }
            Ok(m) => return Err(err(format!("{}, not a regular file or a directory", crate::fileio::special_kind(m.file_type()).map_or("it is not a regular file".into(), |k| format!("it is {k}"))))),
            Err(e) => {
                let name = spec.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if !name.contains(['*', '?', '[']) {
                    return Err(err(format!("cannot be read: {e}")));
                }
                let dir = match spec.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                let hidden = name.starts_with('.');
                let own = is_own(&name);
                let found = listing(dir, |n| glob_match(name.as_bytes(), n.as_bytes()) && (hidden || !n.starts_with('.')) && (own || !is_own(n)))
                    .map_err(|e| err(format!("cannot list {}: {e}", dir.display())))?;
                if found.is_empty() {
                    return Err(err(format!("matches no file in {}", dir.display())));
                }
                files.extend(found);
            }
        }
    }
    Ok(files)
}

/// Files Spark and Arrow write beside a directory's Parquet parts, which hold no rows.
const MARKERS: [&str; 3] = ["_SUCCESS", "_metadata", "_common_metadata"];

/// Whether `name` is a file ringrec writes beside data (a cache or a lock file).
fn is_own(name: &str) -> bool {
    Path::new(name).extension().is_some_and(|e| e == CACHE_EXT || e == LOCK_EXT)
}

/// The regular files of `dir` (links followed) whose names `keep` accepts, in natural order.
fn listing(dir: &Path, keep: impl Fn(&str) -> bool) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if keep(name) && entry.path().metadata().is_ok_and(|m| m.is_file()) {
            found.push(entry.path());
        }
    }
    found.sort_by(|a, b| natural_cmp(a.as_os_str().as_encoded_bytes(), b.as_os_str().as_encoded_bytes()));
    Ok(found)
}

/// Whether `name` matches `pattern`: `*` matches any run of bytes, `?` one byte, a bracket
/// expression one byte of its set (`[abc]`, ranges `[0-8]`, `[!x]` / `[^x]` for the
/// complement; a `]` first in the set is itself; a `[` without its `]` is itself), any
/// other byte itself.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    // The classic two-pointer match: on a mismatch, let the last `*` take one more byte.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        let one = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(b'[') => match bracket(&pattern[p..], name[n]) {
                Some((matched, len)) => matched.then_some(len),
                None => (name[n] == b'[').then_some(1),
            },
            Some(&c) if c == b'?' || c == name[n] => Some(1),
            _ => None,
        };
        match one {
            Some(len) => {
                p += len;
                n += 1;
            }
            None => match star {
                Some((sp, sn)) => {
                    star = Some((sp, sn + 1));
                    (p, n) = (sp + 1, sn + 1);
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The bracket expression at the start of `pattern` against byte `c`: (whether `c` is in
/// its set, the expression's length), or `None` when the `[` has no closing `]`.
fn bracket(pattern: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut found = false;
    let mut first = true;
    loop {
        let lo = *pattern.get(i)?;
        if lo == b']' && !first {
            return Some((found != negate, i + 1));
        }
        first = false;
        match (pattern.get(i + 1), pattern.get(i + 2)) {
            (Some(b'-'), Some(&hi)) if hi != b']' => {
                found |= lo <= c && c <= hi;
                i += 3;
            }
            _ => {
                found |= lo == c;
                i += 1;
            }
        }
    }
}

/// Natural order of names: runs of ASCII digits compare by their value (`2 < 10`), the
/// rest byte by byte; names that are equal so (`day_02`, `day_2`) compare byte by byte.
pub fn natural_cmp(a: &[u8], b: &[u8]) -> Ordering {
    fn runs(s: &[u8]) -> impl Iterator<Item = &[u8]> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = *rest.first()?;
            let digit = first.is_ascii_digit();
            let end = rest.iter().position(|c| c.is_ascii_digit() != digit).unwrap_or(rest.len());
            let (run, next) = rest.split_at(end);
            rest = next;
            Some(run)
        })
    }
    let number = |r: &[u8]| -> Option<usize> { r.first().filter(|c| c.is_ascii_digit()).map(|_| r.iter().position(|&c| c != b'0').unwrap_or(r.len())) };
    let (mut x, mut y) = (runs(a), runs(b));
    loop {
        let (r, s) = match (x.next(), y.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(r), Some(s)) => (r, s),
        };
        let o = match (number(r), number(s)) {
            // Both numbers: leading zeros aside, the longer is larger, else digit by digit.
            (Some(zr), Some(zs)) => (r.len() - zr).cmp(&(s.len() - zs)).then_with(|| r[zr..].cmp(&s[zs..])),
            _ => r.cmp(s),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_numbers_by_value() {
        let mut names = vec!["day_10", "day_2", "day_1", "day_02", "day_", "day_1a", "day_1.tsv", "Day_3", "day_100", "a9b", "a10"];
        names.sort_by(|a, b| natural_cmp(a.as_bytes(), b.as_bytes()));
        assert_eq!(names, ["Day_3", "a9b", "a10", "day_", "day_1", "day_1.tsv", "day_1a", "day_02", "day_2", "day_10", "day_100"]);
        assert_eq!(natural_cmp(b"x18446744073709551616000", b"x9"), Ordering::Greater, "numbers longer than u64 compare too");
    }

    #[test]
    fn globs_match_stars_and_question_marks() {
        let m = |p: &str, n: &str| glob_match(p.as_bytes(), n.as_bytes());
        assert!(m("*", "anything"));
        assert!(m("day_*.tsv", "day_12.tsv"));
        assert!(m("day_?.tsv", "day_1.tsv"));
        assert!(!m("day_?.tsv", "day_12.tsv"));
        assert!(m("*a*b*", "xxaxxbxx"));
        assert!(!m("*a*b", "xxaxxbxx"));
        assert!(m("d*y*", "day"));
        assert!(!m("day", "days"));
        assert!(m("", ""));
        assert!(!m("", "a"));
    }

    #[test]
    fn globs_match_bracket_sets_as_the_shell_does() {
        let m = |p: &str, n: &str| glob_match(p.as_bytes(), n.as_bytes());
        let days = |p: &str| (0..12).filter(|d| m(p, &format!("day_{d}.tsv"))).collect::<Vec<_>>();
        assert_eq!(days("day_[0-8].tsv"), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(days("day_[!0-8].tsv"), [9]);
        assert_eq!(days("day_[^0-8].tsv"), [9]);
        assert_eq!(days("day_[159].tsv"), [1, 5, 9]);
        assert_eq!(days("day_1[01].tsv"), [10, 11]);
        assert_eq!(days("day_[2-35].tsv"), [2, 3, 5]);
        assert!(m("*[]]", "x]") && m("[]a]", "a") && !m("[]a]", "b"), "a ] first in the set is itself");
        assert!(m("[a-]", "-") && m("[a-]", "a"), "a - last in the set is itself");
        assert!(m("day[", "day[") && !m("day[", "day"), "a [ without ] is itself");
        assert!(m("*[0-9]*.tsv", "day_7x.tsv") && !m("*[0-9]*.tsv", "day_x.tsv"));
    }

    #[test]
    fn directories_globs_and_files_resolve_in_order() {
        let dir = std::env::temp_dir().join(format!("ringrec-inputs-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for name in ["day_10.tsv", "day_2.tsv", "day_1.tsv", ".hidden", "day_1.abc.rrdata", "day_1.abc.lock", "notes.txt"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let names = |v: Vec<PathBuf>| v.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect::<Vec<_>>();
        let r = |specs: &[PathBuf]| resolve("--data", specs);
        assert_eq!(names(r(std::slice::from_ref(&dir)).unwrap()), ["day_1.tsv", "day_2.tsv", "day_10.tsv", "notes.txt"]);
        assert_eq!(names(r(&[dir.join("day_*")]).unwrap()), ["day_1.tsv", "day_2.tsv", "day_10.tsv"]);
        assert_eq!(names(r(&[dir.join("*.rrdata")]).unwrap()), ["day_1.abc.rrdata"]);
        assert_eq!(names(r(&[dir.join(".*")]).unwrap()), [".hidden"]);
        assert_eq!(names(r(&[dir.join("day_10.tsv"), dir.join("day_?.tsv")]).unwrap()), ["day_10.tsv", "day_1.tsv", "day_2.tsv"]);
        let e = r(&[dir.join("day_*.csv")]).unwrap_err().to_string();
        assert_eq!(e, format!("--data {}: matches no file in {}", dir.join("day_*.csv").display(), dir.display()));
        let e = r(&[dir.join("sub")]).unwrap_err().to_string();
        assert!(e.ends_with("sub: the directory holds no data file (hidden files, .rrdata caches and .lock files are skipped)"), "{e}");
        let e = resolve("--eval-data", &[dir.join("missing.tsv")]).unwrap_err().to_string();
        assert!(e.starts_with("--eval-data ") && e.contains("missing.tsv: cannot be read: No such file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
