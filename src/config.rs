//! The runtime configuration from `RINGREC_*` environment variables, read and validated in
//! one place: [`RuntimeConfig::from_env`] (read once by [`crate::topology::Topology`], so
//! every module takes its settings from `topo.config`), and the parsers the engine's
//! settings ([`crate::engine::EngineConfig::from_env`]) use. A value that does not parse is
//! an error naming the variable and an accepted example, never silently a default.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{CommError, CommResult};

/// For an option enum: `ALL`, `name()` (the word on the command line and in logs),
/// `FromStr` (that word, any case; else an error listing the choices) and `Display`.
macro_rules! named_enum {
    ($t:ident { $($v:ident => $n:literal),+ $(,)? }) => {
        impl $t {
            /// Every choice.
            pub const ALL: &'static [$t] = &[$($t::$v),+];
            /// Its name on the command line and in logs.
            pub fn name(self) -> &'static str {
                match self { $($t::$v => $n),+ }
            }
        }
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<$t, String> {
                $t::ALL.iter().copied().find(|v| v.name().eq_ignore_ascii_case(s)).ok_or_else(|| format!("`{s}` is not one of {}", [$($n),+].join(", ")))
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}
pub(crate) use named_enum;

/// The process-level settings (see the table of docs/configuration.md).
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// `RINGREC_RANKS_PER_HOST`: cut each host into simulated hosts of this many ranks.
    pub ranks_per_host: Option<usize>,
    /// `RINGREC_JOB_ID`: names shared segments (else rank 0 makes one).
    pub job_id: Option<String>,
    /// `RINGREC_SHM_DIR`: where shared segments and host tables live.
    pub shm_dir: PathBuf,
    /// `RINGREC_VERIFY`: MPI-based collectives agree on a header before each call.
    pub verify: bool,
    /// `RINGREC_COMM_TIMEOUT_SECONDS`: how long a wait on peers may last.
    pub comm_timeout: Duration,
    /// `RINGREC_SHM_CHUNK_BYTES`: the per-rank slot of the shared-memory collectives.
    pub shm_chunk_bytes: usize,
    /// `RINGREC_RING_CHUNK_BYTES`: the pipeline chunk of the ring allreduce.
    pub ring_chunk_bytes: usize,
    /// `RINGREC_ALLOW_SHARED_GPU`: let ranks of a machine share a GPU (tests).
    pub allow_shared_gpu: bool,
    /// `RINGREC_FAULT_EXIT=rank:step`: that rank exits abruptly before that step (tests of
    /// failure handling).
    pub fault_exit: Option<(usize, u64)>,
    /// `RINGREC_FAULT_NAN=rank:step`: that rank's gradients of that step (0-based: after
    /// `step` steps) are made NaN (tests of `--nan-policy`).
    pub fault_nan: Option<(usize, u64)>,
    /// `RINGREC_FAULT_ONCE=path`: the fault fires only while `path` does not exist, and
    /// creates it (a relaunched job runs on: tests of `ringrec launch --restarts`).
    pub fault_once: Option<PathBuf>,
    /// `RINGREC_LOG_SPARSE`: every rank prints its sparse-exchange totals at the end.
    pub log_sparse: bool,
}

impl Default for RuntimeConfig {
    fn default() -> RuntimeConfig {
        RuntimeConfig {
            ranks_per_host: None,
            job_id: None,
            shm_dir: PathBuf::from("/dev/shm"),
            verify: true,
            comm_timeout: Duration::from_secs(300),
            shm_chunk_bytes: 1 << 20,
            ring_chunk_bytes: 512 << 10,
            allow_shared_gpu: false,
            fault_exit: None,
            fault_nan: None,
            fault_once: None,
            log_sparse: false,
        }
    }
}

impl RuntimeConfig {
    /// The defaults overridden by the environment; the first bad value is an error.
    pub fn from_env() -> CommResult<RuntimeConfig> {
        let mut c = RuntimeConfig::default();
        let invalid = |e: String| CommError::Invalid(e);
        c.ranks_per_host = parse("RINGREC_RANKS_PER_HOST", "a number of ranks, e.g. 2 (0: real hosts only)", |s| s.parse::<usize>().ok())
            .map_err(invalid)?
            .filter(|k| *k > 0);
        c.job_id = var("RINGREC_JOB_ID");
        c.shm_dir = var("RINGREC_SHM_DIR").map_or(c.shm_dir, PathBuf::from);
        c.verify = flag("RINGREC_VERIFY").map_err(invalid)?.unwrap_or(c.verify);
        c.comm_timeout = seconds("RINGREC_COMM_TIMEOUT_SECONDS").map_err(invalid)?.flatten().unwrap_or(c.comm_timeout);
        let at_least = |min: usize| move |s: &str| parse_bytes(s).filter(|b| *b >= min);
        c.shm_chunk_bytes = parse("RINGREC_SHM_CHUNK_BYTES", "bytes >= 256, e.g. 1M", at_least(256)).map_err(invalid)?.unwrap_or(c.shm_chunk_bytes);
        c.ring_chunk_bytes = parse("RINGREC_RING_CHUNK_BYTES", "bytes >= 64, e.g. 512K", at_least(64)).map_err(invalid)?.unwrap_or(c.ring_chunk_bytes);
        c.allow_shared_gpu = flag("RINGREC_ALLOW_SHARED_GPU").map_err(invalid)?.unwrap_or(false);
        let rank_step = |s: &str| {
            let (r, st) = s.split_once(':')?;
            Some((r.trim().parse().ok()?, st.trim().parse().ok()?))
        };
        c.fault_exit = parse("RINGREC_FAULT_EXIT", "RANK:STEP, e.g. 1:5", rank_step).map_err(invalid)?;
        c.fault_nan = parse("RINGREC_FAULT_NAN", "RANK:STEP, e.g. 1:5", rank_step).map_err(invalid)?;
        c.fault_once = std::env::var_os("RINGREC_FAULT_ONCE").filter(|v| !v.is_empty()).map(PathBuf::from);
        c.log_sparse = flag("RINGREC_LOG_SPARSE").map_err(invalid)?.unwrap_or(false);
        Ok(c)
    }
}

/// The variable's value, `None` when unset or blank.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The variable parsed by `f`; an error naming it and `expected` when `f` refuses it.
pub fn parse<T>(name: &str, expected: &str, f: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>, String> {
    match var(name) {
        None => Ok(None),
        Some(v) => f(&v).map(Some).ok_or_else(|| format!("{name}={v:?} is not valid: expected {expected}")),
    }
}

/// A switch: `1`/`true`/`on` or `0`/`false`/`off`.
pub fn flag(name: &str) -> Result<Option<bool>, String> {
    parse(name, "1 or 0", |s| match s {
        "1" | "true" | "on" => Some(true),
        "0" | "false" | "off" => Some(false),
        _ => None,
    })
}

/// Seconds >= 0; `Some(None)` for 0 (which disables what it times).
pub fn seconds(name: &str) -> Result<Option<Option<Duration>>, String> {
    parse(name, "a number of seconds >= 0 (0 disables)", |s| s.parse::<f64>().ok().filter(|s| *s >= 0.0 && s.is_finite()).map(|s| (s > 0.0).then(|| Duration::from_secs_f64(s))))
}

/// Parses `128M`, `64K`, `1G` or plain bytes.
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_errors_that_name_the_variable() {
        std::env::set_var("RINGREC_RING_CHUNK_BYTES", "lots");
        let e = RuntimeConfig::from_env().unwrap_err().to_string();
        std::env::remove_var("RINGREC_RING_CHUNK_BYTES");
        assert!(e.contains("RINGREC_RING_CHUNK_BYTES=\"lots\" is not valid: expected bytes >= 64"), "{e}");
        std::env::set_var("RINGREC_SHM_CHUNK_BYTES", "2K");
        std::env::set_var("RINGREC_FAULT_EXIT", "1:7");
        let c = RuntimeConfig::from_env().unwrap();
        std::env::remove_var("RINGREC_SHM_CHUNK_BYTES");
        std::env::remove_var("RINGREC_FAULT_EXIT");
        assert_eq!((c.shm_chunk_bytes, c.fault_exit, c.verify), (2048, Some((1, 7)), true));
    }

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(parse_bytes("128M"), Some(128 << 20));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("12345"), Some(12345));
        assert_eq!(parse_bytes("1.5G"), None);
        assert_eq!(parse_bytes(""), None);
    }
}
