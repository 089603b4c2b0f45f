//! The runtime configuration from `RINGREC_*` environment variables, read and validated in
//! one place: [`RuntimeConfig::from_env`] (read once by [`crate::topology::Topology`], so
//! every module takes its settings from `topo.config`), and the parsers the engine's
//! settings ([`crate::engine::EngineConfig::from_env`]) use. A value that does not parse is
//! an error naming the variable and an accepted example, never silently a default.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{CommError, CommResult};

/// For an option enum: `ALL`, `name()` (the word on the command line and in logs),
/// `FromStr` (that word, any case; else an error listing the choices), `Display`, and a
/// setting of one word ([`crate::settings::Word`]).
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
        impl $crate::settings::Word for $t {
            fn parse_word(s: &str) -> Result<$t, String> {
                s.trim().parse()
            }
            fn word(&self) -> String {
                self.name().to_string()
            }
        }
        $crate::settings::word_settings!($t);
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
    /// `RINGREC_CHECKPOINT_BACKGROUND`: checkpoints written by a background thread from a
    /// snapshot taken between steps (`false`: synchronously, as the step's last act).
    pub checkpoint_background: bool,
    /// `RINGREC_FAULT_SLOW_CHECKPOINT`: the background writer waits this long before
    /// writing (tests of a checkpoint due while one is still being written).
    pub fault_slow_checkpoint: Option<Duration>,
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
            checkpoint_background: true,
            fault_slow_checkpoint: None,
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
        c.fault_once = var_os("RINGREC_FAULT_ONCE").map(PathBuf::from);
        c.log_sparse = flag("RINGREC_LOG_SPARSE").map_err(invalid)?.unwrap_or(false);
        c.checkpoint_background = flag("RINGREC_CHECKPOINT_BACKGROUND").map_err(invalid)?.unwrap_or(c.checkpoint_background);
        c.fault_slow_checkpoint = seconds("RINGREC_FAULT_SLOW_CHECKPOINT").map_err(invalid)?.flatten();
        Ok(c)
    }
}

/// Who reads a `RINGREC_*` variable (each through [`var`], the one reader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// [`RuntimeConfig::from_env`]: the process's settings (`topo.config`).
    Runtime,
    /// `EngineConfig::from_env`: the engine's knobs.
    Engine,
    /// The command line: the default of a flag ([`cli_default`]).
    Command,
    /// The CUDA library probes (`device::libs`; before MPI, for `ringrec info`).
    CudaLibs,
    /// `--device host` (`device::host_kernels`): the tests' random delays and faults.
    HostKernels,
}

impl Reader {
    /// Its name in the documentation's table.
    pub fn name(self) -> &'static str {
        match self {
            Reader::Runtime => "runtime",
            Reader::Engine => "engine",
            Reader::Command => "command line",
            Reader::CudaLibs => "CUDA libraries",
            Reader::HostKernels => "tests",
        }
    }
}

/// One `RINGREC_*` variable: the one list ([`VARIABLES`]) from which the documentation's
/// table is made (docs/configuration.md, checked by a test) and against which every read
/// is checked.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    /// `RINGREC_...`.
    pub name: &'static str,
    /// Its value when unset, as a user would write it.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// Who reads it.
    pub reader: Reader,
    /// Whether every rank of a training job must have the same value (it is part of a
    /// protocol): compared at the start (`TrainConfig::settings`).
    pub agreed: bool,
}

const fn v(name: &'static str, agreed: bool, default: &'static str, reader: Reader, meaning: &'static str) -> Variable {
    Variable { name, agreed, default, meaning, reader }
}

/// Every `RINGREC_*` variable ringrec reads.
pub const VARIABLES: &[Variable] = &[
    v("RINGREC_RANKS_PER_HOST", true, "unset", Reader::Runtime, "cut each host into simulated hosts of k consecutive ranks (tests multi-host paths on one machine; 0: real hosts)"),
    v("RINGREC_JOB_ID", false, "made by rank 0", Reader::Runtime, "names the job's shared segments (e.g. `$SLURM_JOB_ID`)"),
    v("RINGREC_SHM_DIR", true, "/dev/shm", Reader::Runtime, "where shared segments and host tables live; each job's start removes what killed jobs left there (files nobody holds a lock on, older than 10 s)"),
    v("RINGREC_VERIFY", true, "1", Reader::Runtime, "MPI-based backends exchange a 32-byte header (count, dtype, op, root) before each collective; `0` skips it (`shm` always checks, for free)"),
    v("RINGREC_COMM_TIMEOUT_SECONDS", false, "300", Reader::Runtime, "any wait on peers (collectives, shared memory, barriers, MPI requests, NCCL) that lasts longer ends the job naming the ranks that did not arrive; a stopped or dead local rank is reported after min(3 s, half of it)"),
    v("RINGREC_SHM_CHUNK_BYTES", true, "1M", Reader::Runtime, "per-rank slot of the shared-memory collectives (pipeline piece; `K`/`M`/`G`, at least 256)"),
    v("RINGREC_RING_CHUNK_BYTES", true, "512K", Reader::Runtime, "pipeline chunk of the ring allreduce (at least 64)"),
    v("RINGREC_ALLOW_SHARED_GPU", true, "0", Reader::Runtime, "`1` lets ranks of a machine share a GPU (same PCI bus id; tests: NCCL itself refuses it)"),
    v("RINGREC_LOG_SPARSE", false, "0", Reader::Runtime, "`1`: every rank prints its sparse-exchange totals at the end of a run"),
    v("RINGREC_CHECKPOINT_BACKGROUND", false, "1", Reader::Runtime, "rank 0 copies the table (and the dense state) between steps and a background thread writes the checkpoint while training goes on (the table's memory twice meanwhile; without room for the copy the write is synchronous, said once); `0` writes synchronously"),
    v("RINGREC_FAULT_EXIT", false, "unset", Reader::Runtime, "tests: `RANK:STEP` makes that rank exit abruptly before that step"),
    v("RINGREC_FAULT_NAN", false, "unset", Reader::Runtime, "tests: `RANK:STEP` makes that rank's gradients of step STEP+1 NaN (`--nan-policy`)"),
    v("RINGREC_FAULT_SLOW_CHECKPOINT", false, "unset", Reader::Runtime, "tests: seconds the background checkpoint writer waits before writing"),
    v("RINGREC_FAULT_ONCE", false, "unset", Reader::Runtime, "tests: a path; the faults fire only while it does not exist (it is created when one fires)"),
    v("RINGREC_ENGINE_BACKEND", false, "best for the topology", Reader::Engine, "the engine's host collectives in library use: `mpi`, `ring`, `shm`, `hier` (`ringrec train` uses `--backend`)"),
    v("RINGREC_FUSION_THRESHOLD", false, "128M", Reader::Engine, "bytes per fused allreduce (`K`/`M`/`G`); `0` disables fusion"),
    v("RINGREC_CYCLE_TIME", false, "1", Reader::Engine, "ms between the engine's background cycles (an idle engine backs off to 16x, a submission restores it)"),
    v("RINGREC_CACHE_CAPACITY", true, "1024", Reader::Engine, "response-cache entries (`0` disables: every tensor is negotiated)"),
    v("RINGREC_COMPRESSION", true, "none", Reader::Engine, "`fp16`, `bf16`, `1bit` (signs + L2 scale times lambda, error feedback) or `1bit-l1` (signs + L1 scale) for float32 sum/avg, host and device tensors; `train --compression` overrides"),
    v("RINGREC_ONEBIT_LAMBDA", true, "1", Reader::Engine, "lambda of the `1bit` L2 form, in (0, 1]; `train --onebit-lambda` overrides"),
    v("RINGREC_ONEBIT_BLOCK", true, "256", Reader::Engine, "values per scale of 1-bit compression (`0`: one scale per tensor); `train --onebit-block` overrides"),
    v("RINGREC_TIMELINE", false, "unset", Reader::Engine, "rank 0 writes a Chrome trace (chrome://tracing, Perfetto) of every tensor's phases to this path"),
    v("RINGREC_STALL_CHECK_TIME_SECONDS", true, "60", Reader::Engine, "warn (on every rank) about tensors some ranks have not submitted after this long; `0` disables"),
    v("RINGREC_STALL_SHUTDOWN_TIME_SECONDS", true, "0", Reader::Engine, "stop the job with that message after this long (`0`: never)"),
    v("RINGREC_PY_DEVICE", true, "auto", Reader::Engine, "the Python module's device for CUDA tensors (DLPack): `auto` (the GPU when the extension has the cuda feature and a driver), `cuda`, `cpu` (none: CUDA tensors refused), `host` (a test hook: the host-kernels device, taking kDLCUDA capsules over host memory); made at the first CUDA tensor, not at `init()`"),
    v("RINGREC_AUTOTUNE", true, "0", Reader::Engine, "`1`: search the fusion threshold and cycle time in the first steps"),
    v("RINGREC_AUTOTUNE_LOG", false, "unset", Reader::Engine, "a CSV path where the autotuner logs its candidates"),
    v("RINGREC_AUTOTUNE_SAMPLE_SECONDS", false, "0.5", Reader::Engine, "how long the autotuner measures each candidate"),
    v("RINGREC_DATA_DIR", false, "~/.cache/ringrec", Reader::Command, "the default data set and TSV caches (`train`, `predict`, `bench step`: `--data-dir`)"),
    v("RINGREC_THREADS", false, "cores / ranks per host", Reader::Command, "threads per rank (`train`, `predict`: `--threads`)"),
    v("RINGREC_MAX_BAD_LINES", false, "1000", Reader::Command, "malformed input lines tolerated (`train`, `data prepare`: `--max-bad-lines`)"),
    v("RINGREC_TABLE_DIM", false, "unset", Reader::Command, "`table create`/`import`: `--dim`"),
    v("RINGREC_TABLE_CAPACITY", false, "unset", Reader::Command, "`table create`/`import`: `--table-capacity`"),
    v("RINGREC_TABLE_DTYPE", false, "f32", Reader::Command, "`table create`/`import`: `--dtype`"),
    v("RINGREC_TABLE_OPTIMIZER", false, "sgd", Reader::Command, "`table create`/`import`: `--optimizer`"),
    v("RINGREC_TABLE_SEED", false, "0", Reader::Command, "`table create`/`import`: `--seed`"),
    v("RINGREC_CUDA_LIB_DIR", false, "unset", Reader::CudaLibs, "directories (colon-separated) searched first for libcuda, libnvrtc, libcublas, libnccl (docs/gpus.md)"),
    v("RINGREC_HOST_DELAY_SEED", false, "unset", Reader::HostKernels, "`--device host` (tests): every queued device operation first sleeps a random 0..max µs drawn from the seed, so an ordering bug changes the results"),
    v("RINGREC_HOST_DELAY_MAX_US", false, "200", Reader::HostKernels, "`--device host` (tests): the longest of those delays"),
    v("RINGREC_HOST_FAULT", false, "unset", Reader::HostKernels, "`--device host` (tests): `no-stream-waits`, `no-staging-wait` or `no-write-back-wait` (the GPU cache's write-back before the host table is read) removes that wait on purpose (proves the delayed runs catch it)"),
];

/// The documentation's table of [`VARIABLES`] (markdown: docs/configuration.md holds it
/// verbatim, which a test checks).
pub fn variables_table() -> String {
    let mut t = String::from("| variable | default | read by | same on every rank | what |\n|---|---|---|---|---|\n");
    for v in VARIABLES {
        t.push_str(&format!("| `{}` | {} | {} | {} | {} |\n", v.name, v.default, v.reader.name(), if v.agreed { "yes" } else { "no" }, v.meaning));
    }
    t
}

/// The variables the command line reads as the default of a flag ([`Reader::Command`]).
pub fn cli_default(name: &str) -> Option<String> {
    VARIABLES.iter().any(|v| v.name == name && v.reader == Reader::Command).then(|| var(name)).flatten()
}

/// The variable's value, `None` when unset or blank: the one place ringrec reads a
/// `RINGREC_*` variable (a name not in [`VARIABLES`] is a bug, caught in debug builds).
pub fn var(name: &str) -> Option<String> {
    var_os(name).map(|s| s.to_string_lossy().trim().to_string()).filter(|s| !s.is_empty())
}

/// The variable's raw value (paths, lists of directories), `None` when unset or empty.
pub fn var_os(name: &str) -> Option<std::ffi::OsString> {
    debug_assert!(VARIABLES.iter().any(|v| v.name == name), "{name} is not in config::VARIABLES");
    std::env::var_os(name).filter(|v| !v.is_empty())
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
