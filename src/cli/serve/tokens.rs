//! Bearer tokens: `ringrec serve token add NAME` makes one (32 random bytes, hex), shows it
//! once and keeps only its SHA-256 in `STATE_DIR/tokens` (mode 0600, one `name hash` line
//! each, written atomically under a lock). The service re-reads the file when it changes,
//! so a token added or removed while it runs takes effect at the next request.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

/// The token file of a state directory.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("tokens")
}

fn hash_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// (name, hash) of every line of the token file; a missing file has none.
fn read(file: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading the token file {}", file.display())),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some(n), Some(h)) if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) => out.push((n.to_string(), h.to_ascii_lowercase())),
            (None, _) => {}
            _ => bail!("{}: line {} is not `name sha256-hex`; fix or remove it (tokens are made with `ringrec serve token add`)", file.display(), i + 1),
        }
    }
    Ok(out)
}

/// Rewrites the token file under an exclusive lock (`tokens.lock`), with `change` applied.
fn update(state_dir: &Path, change: impl FnOnce(&mut Vec<(String, String)>) -> anyhow::Result<()>) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir).with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    let lock_path = state_dir.join("tokens.lock");
    let lock = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&lock_path).with_context(|| format!("opening {}", lock_path.display()))?;
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on an open descriptor; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", lock_path.display()));
    }
    let file = path(state_dir);
    let mut tokens = read(&file)?;
    change(&mut tokens)?;
    ringrec::fileio::write_atomic(&file, 0o600, |w| {
        for (n, h) in &tokens {
            writeln!(w, "{n} {h}")?;
        }
        Ok(())
    })?;
    Ok(())
}

fn valid_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        bail!("token name `{}`: use 1 to 64 letters, digits and `_.-`", name.escape_debug());
    }
    Ok(())
}

/// Makes a token for `name`, stores its hash and returns the token (shown once).
pub fn add(state_dir: &Path, name: &str) -> anyhow::Result<String> {
    valid_name(name)?;
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw)).context("reading /dev/urandom for a token")?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let hash = hash_hex(&token);
    update(state_dir, |t| {
        if t.iter().any(|(n, _)| n == name) {
            bail!("a token named `{name}` exists; remove it first (`ringrec serve token remove {name}`) or pick another name");
        }
        t.push((name.to_string(), hash));
        Ok(())
    })?;
    Ok(token)
}

/// Removes the token `name`; false when there was none.
pub fn remove(state_dir: &Path, name: &str) -> anyhow::Result<bool> {
    let mut found = false;
    update(state_dir, |t| {
        let before = t.len();
        t.retain(|(n, _)| n != name);
        found = t.len() != before;
        Ok(())
    })?;
    Ok(found)
}

/// The names of the tokens.
pub fn names(state_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(read(&path(state_dir))?.into_iter().map(|(n, _)| n).collect())
}

/// What tells one version of the token file from another: (mtime, length, inode).
type Stamp = (SystemTime, u64, u64);

/// The service's view of the token file, re-read when the file changes.
pub struct Tokens {
    file: PathBuf,
    cache: RwLock<Loaded>,
}

/// The token file as last read.
struct Loaded {
    /// Its stamp then (None: there was none).
    stamp: Option<Stamp>,
    /// (name, SHA-256 of the token) of each line.
    hashes: Vec<(String, [u8; 32])>,
}

fn stamp(file: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

fn unhex(h: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Tokens {
    /// The tokens of `state_dir` (read now: a malformed file is an error at start).
    pub fn open(state_dir: &Path) -> anyhow::Result<Tokens> {
        let t = Tokens { file: path(state_dir), cache: RwLock::new(Loaded { stamp: None, hashes: Vec::new() }) };
        t.reload()?;
        Ok(t)
    }

    fn reload(&self) -> anyhow::Result<()> {
        let st = stamp(&self.file);
        let hashes = read(&self.file)?.into_iter().filter_map(|(n, h)| unhex(&h).map(|d| (n, d))).collect();
        *self.cache.write().unwrap_or_else(|e| e.into_inner()) = Loaded { stamp: st, hashes };
        Ok(())
    }

    /// How many tokens there are.
    pub fn count(&self) -> usize {
        self.cache.read().unwrap_or_else(|e| e.into_inner()).hashes.len()
    }

    /// The name of the token `presented`, if it is one (compared in constant time per
    /// stored hash).
    pub fn check(&self, presented: &str) -> Option<String> {
        let changed = self.cache.read().unwrap_or_else(|e| e.into_inner()).stamp != stamp(&self.file);
        if changed {
            // A file being rewritten is replaced atomically; a malformed one keeps the old list.
            if let Err(e) = self.reload() {
                ringrec::eprint_line(&format!("ringrec serve: warning: {e:#}; keeping the tokens read before"));
            }
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for (name, h) in &cache.hashes {
            let diff = h.iter().zip(&digest).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(name.clone());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_tokens_are_stored_hashed_0600_and_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ringrec-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = add(&dir, "alice").expect("add");
        assert_eq!(a.len(), 64);
        let text = std::fs::read_to_string(path(&dir)).expect("file");
        assert!(!text.contains(&a), "the token itself is never stored");
        assert_eq!(text, format!("alice {}\n", hash_hex(&a)));
        let mode = std::fs::metadata(path(&dir)).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(add(&dir, "alice").is_err(), "names are unique");
        assert!(add(&dir, "bad name").is_err());
        let t = Tokens::open(&dir).expect("open");
        assert_eq!(t.check(&a).as_deref(), Some("alice"));
        assert_eq!(t.check("nope"), None);
        let b = add(&dir, "bob").expect("add");
        assert_eq!(t.check(&b).as_deref(), Some("bob"), "a token added later is seen");
        assert!(remove(&dir, "alice").expect("remove"));
        assert_eq!(t.check(&a), None, "a removed token is refused");
        assert_eq!(names(&dir).expect("names"), vec!["bob"]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
