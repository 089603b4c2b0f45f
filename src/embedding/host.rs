//! The host-shared table (design 003, step 1): the host leader (local rank 0) creates the
//! table in `/dev/shm`, fills it (empty, or from a sparse-parameter file), and every other
//! local rank maps the same file read-only. One copy per host, not per rank.
//!
//! Protocol of [`HostTable::open`], collective over the ranks of one host:
//! 1. the leader creates `ringrec-<job>-h<host>-table` exclusively and initialises it;
//! 2. the leader broadcasts a status (empty = ok, else its error message) to the host, so a
//!    leader failure (corrupt import file, full `/dev/shm`) reaches every local rank as an
//!    error instead of a hang;
//! 3. the others open the file read-only; an all-reduce of their success tells everyone;
//! 4. the leader unlinks the name: the memory lives while a rank maps it, and from here
//!    nothing is left in `/dev/shm` however the job ends (normal exit, error, or a kill);
//!    a kill before this step leaves the file, which the next job's start removes
//!    ([`crate::stale`]).
//!
//! Between update and lookup phases the caller runs [`HostTable::sync`] (a host barrier).
//!
//! **Growth** (with a [`TablePolicy`], [`super::manage`]): the leader builds the larger
//! table in a new file `ringrec-<job>-h<host>-table-<n>` during an update, marks the old
//! one replaced (a header flag) and keeps it mapped. At the host barrier that follows, every
//! local rank sees the flag and the host remaps, collectively like `open`: the others map
//! the new file read-only, an all-reduce of their success tells everyone (a failure is an
//! error on every local rank of the host), the leader unlinks the new name, and every rank
//! unmaps the old table, whose memory is then freed (its name went at `open`).

use std::path::{Path, PathBuf};

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::Communicator;
use mpi::traits::Root;

use super::error::{TableError, TableResult};
use super::manage::{self, Growth, TablePolicy};
use super::table::{EmbeddingTable, TableConfig};
use super::update::UpdateStats;
use crate::hostsync::HostBarrier;
use crate::topology::{Group, Topology};

/// Path of this host's shared table: `<shm dir>/ringrec-<job>-h<host>-table`.
pub fn host_table_path(topo: &Topology) -> PathBuf {
    topo.segment_path("table")
}

/// Removes a file when dropped, unless disarmed: the leader holds one for the table it
/// created, so the segment goes away on normal and on error exit (unwinding included).
#[derive(Debug)]
pub struct SegmentGuard {
    path: Option<PathBuf>,
    /// Unlinked by a second SIGTERM/SIGINT while armed ([`crate::signals`]).
    _tracked: Option<crate::signals::Tracked>,
}

impl SegmentGuard {
    /// Guards `path`.
    pub fn new(path: &Path) -> SegmentGuard {
        SegmentGuard { path: Some(path.to_path_buf()), _tracked: crate::signals::track(path) }
    }
    /// Removes the file now (ignoring "not found") and disarms the guard.
    pub fn remove_now(&mut self) -> std::io::Result<()> {
        self._tracked = None;
        match self.path.take() {
            Some(p) => match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
    /// Keeps the file: the guard will not remove it.
    pub fn disarm(&mut self) {
        self.path = None;
        self._tracked = None;
    }
    /// The guarded path, while armed.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl Drop for SegmentGuard {
    fn drop(&mut self) {
        let _ = self.remove_now();
    }
}

/// This rank's handle on its host's shared table: read-write on the leader, read-only on
/// every other local rank.
pub struct HostTable {
    table: EmbeddingTable,
    path: PathBuf,
    leader: bool,
    /// The host barrier of [`HostTable::sync`].
    barrier: HostBarrier,
    /// The leader's pool for updates: the threads of every local rank (they wait in the
    /// host barrier while the leader applies), when the host has several ranks.
    pool: Option<rayon::ThreadPool>,
    _guard: Option<SegmentGuard>,
    /// Growth, eviction and expiry (none: a fixed table that fails when full).
    policy: Option<TablePolicy>,
    /// The ranks of this host (a private communicator): the remap after a growth.
    local: Group,
    /// Remaps so far: the `n`-th grown table is `<path>-<n>`.
    remaps: u64,
    /// Leader: the table a growth replaced, mapped until the host has remapped, and the
    /// guard of the new table's name, unlinked then.
    retired: Option<(EmbeddingTable, SegmentGuard)>,
    /// Leader: growths not yet taken by [`HostTable::take_growths`].
    growths: Vec<Growth>,
    /// Leader: the next growth's file, made ahead.
    ahead: manage::Ahead,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTable").field("path", &self.path).field("leader", &self.leader).field("table", &self.table).finish()
    }
}

const STATUS_LEN: usize = 1024;

/// Updates of at least this many keys use the leader's host-wide pool.
pub const POOL_MIN_UPDATES: usize = 32 * 1024;

fn encode_status(msg: &str) -> [u8; STATUS_LEN] {
    let mut buf = [0u8; STATUS_LEN];
    let b = msg.as_bytes();
    let n = b.len().min(STATUS_LEN - 1);
    buf[..n].copy_from_slice(&b[..n]);
    if n == 0 {
        buf[0] = b'?';
    }
    buf
}

/// What the host leader fills a new host table from.
#[derive(Clone, Copy, Debug)]
pub enum TableSource<'a> {
    /// An empty table of this shape.
    New(&'a TableConfig),
    /// A table of this shape filled from a sparse-parameter file.
    Import(&'a TableConfig, &'a Path),
    /// A byte-exact copy of a table saved with [`EmbeddingTable::save`] (checkpoints),
    /// verified against its checksums and required to match this shape
    /// ([`EmbeddingTable::check_matches`]): a table of another dim fails here, not at the
    /// first lookup.
    Saved(&'a Path, &'a TableConfig),
}

impl HostTable {
    /// Sets up the host table; collective over the ranks of this host (`topo.local`).
    /// The leader creates it from `cfg` (empty, or filled from the sparse-parameter file
    /// `import`), then every other local rank maps it read-only. Every local rank gets the
    /// same success or failure.
    pub fn open(topo: &Topology, cfg: &TableConfig, import: Option<&Path>) -> TableResult<HostTable> {
        match import {
            Some(p) => HostTable::open_from(topo, TableSource::Import(cfg, p)),
            None => HostTable::open_from(topo, TableSource::New(cfg)),
        }
    }

    /// [`HostTable::open`] from any [`TableSource`].
    pub fn open_from(topo: &Topology, source: TableSource<'_>) -> TableResult<HostTable> {
        HostTable::open_tagged(topo, source, "table")
    }

    /// [`HostTable::open_from`] under the segment tag `tag` (`"table"`: [`host_table_path`]):
    /// the table's file `ringrec-<job>-h<host>-<tag>`, its grown files (`-<n>` after it) and
    /// its host barrier (`<tag>-barrier`) are named by it, so a process may hold several host
    /// tables of different tags at once.
    pub fn open_tagged(topo: &Topology, source: TableSource<'_>, tag: &str) -> TableResult<HostTable> {
        // The leader may fill a big table first: a peer still answering is working on it.
        let _w = crate::watchdog::waiting_on_work("the host leader setting up the host table");
        let path = topo.segment_path(tag);
        let comm = &topo.local.comm;
        let leader = topo.is_leader();

        // 1-2. Leader creates and fills; everyone learns how that went.
        let mut status = [0u8; STATUS_LEN];
        let mut made: Option<(EmbeddingTable, SegmentGuard)> = None;
        let mut leader_err = None;
        if leader {
            let attempt = match source {
                TableSource::Saved(saved, want) => EmbeddingTable::load(saved, &path).and_then(|t| {
                    let guard = SegmentGuard::new(&path);
                    t.check_matches(want)?;
                    Ok((t, guard))
                }),
                TableSource::New(cfg) | TableSource::Import(cfg, _) => EmbeddingTable::create(&path, cfg).and_then(|mut t| {
                    let guard = SegmentGuard::new(&path);
                    if let TableSource::Import(_, p) = source {
                        if let Err(e) = t.load_params(p) {
                            drop(t);
                            drop(guard);
                            return Err(e);
                        }
                    }
                    Ok((t, guard))
                }),
            };
            match attempt {
                Ok(x) => made = Some(x),
                Err(e) => {
                    status = encode_status(&e.to_string());
                    leader_err = Some(e);
                }
            }
        }
        comm.process_at_rank(0).broadcast_into(&mut status[..]);
        if status[0] != 0 {
            return Err(leader_err.unwrap_or_else(|| TableError::Leader(String::from_utf8_lossy(&status).trim_end_matches('\0').to_string())));
        }

        // 3. The others map it read-only.
        let mut mine = None;
        let mut peer_err = None;
        if !leader {
            match EmbeddingTable::open_readonly(&path) {
                Ok(t) => mine = Some(t),
                Err(e) => peer_err = Some(e),
            }
        }
        let ok = u8::from(peer_err.is_none());
        let mut all_ok = 0u8;
        comm.all_reduce_into(&ok, &mut all_ok, SystemOperation::min());

        // 4. Unlink the name once everyone has mapped it (or nobody will).
        let (table, guard) = match made {
            Some((t, mut g)) => {
                let _ = g.remove_now();
                (t, Some(g))
            }
            None => match mine {
                Some(t) => (t, None),
                None => {
                    return Err(peer_err.unwrap_or_else(|| TableError::Peer("host table: this rank could not open the table".into())));
                }
            },
        };
        if all_ok == 0 {
            return Err(match peer_err {
                Some(e) => e,
                None => TableError::Peer(format!(
                    "host table {}: a local rank of host {} could not open it; see that rank's error",
                    path.display(),
                    topo.host_id
                )),
            });
        }
        let barrier = HostBarrier::new(topo, &format!("{tag}-barrier"), "host table sync")?;
        let threads = rayon::current_num_threads() * topo.local_size;
        let pool = (leader && topo.local_size > 1).then(|| rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("ringrec-apply-{i}")).build().ok()).flatten();
        let local = topo.local.duplicate();
        Ok(HostTable { table, path, leader, barrier, pool, _guard: guard, policy: None, local, remaps: 0, retired: None, growths: Vec::new(), ahead: manage::Ahead::default() })
    }

    /// Manages the table from now on under `policy` (growth, eviction, expiry: see
    /// [`super::manage`]); every local rank of every host must set the same one.
    pub fn set_policy(&mut self, policy: TablePolicy) {
        self.policy = Some(policy);
    }

    /// The policy, if the table is managed.
    pub fn policy(&self) -> Option<&TablePolicy> {
        self.policy.as_ref()
    }

    /// The growths of this host's table since the last call (the leader's; empty on the
    /// other ranks).
    pub fn take_growths(&mut self) -> Vec<Growth> {
        std::mem::take(&mut self.growths)
    }

    /// The file of the `n`-th grown table.
    fn grown_path(&self, n: u64) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!("-{n}"));
        PathBuf::from(name)
    }

    /// Whether this rank is the host leader (holds the read-write handle).
    pub fn is_leader(&self) -> bool {
        self.leader
    }
    /// The name the table was created under (unlinked once every local rank mapped it).
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The table, for lookups (every rank).
    pub fn table(&self) -> &EmbeddingTable {
        &self.table
    }
    /// The table for writing: the leader's handle, [`TableError::ReadOnly`] elsewhere.
    pub fn table_mut(&mut self) -> TableResult<&mut EmbeddingTable> {
        if self.leader {
            Ok(&mut self.table)
        } else {
            Err(TableError::ReadOnly)
        }
    }
    /// Gathers rows (see [`EmbeddingTable::lookup`]).
    pub fn lookup(&self, keys: &[u64], out: &mut [f32]) -> TableResult<()> {
        self.table.lookup(keys, out)
    }
    /// Applies updates on the leader — a large batch (at least [`POOL_MIN_UPDATES`] keys)
    /// with the threads of every local rank, which wait for it in [`HostTable::sync`];
    /// waking a pool costs more than it saves on small ones — and
    /// [`TableError::ReadOnly`] on other ranks.
    ///
    /// With a policy ([`HostTable::set_policy`]) the update is managed: the table may grow
    /// (the host's other ranks move to the new table in the next [`HostTable::sync`]),
    /// evict or expire rows ([`super::manage`]).
    pub fn apply_updates(&mut self, keys: &[u64], grads: &[f32], lr: f32) -> TableResult<UpdateStats> {
        self.apply_updates_with(keys, grads, lr, None)
    }

    /// [`HostTable::apply_updates`] with some rows held elsewhere (a GPU hot-row cache in
    /// write-back): `held` gives per key its gradient row in `grads` or
    /// [`super::update::HELD`] ([`EmbeddingTable::apply_updates_held`]).
    pub fn apply_updates_held(&mut self, keys: &[u64], grads: &[f32], lr: f32, held: &[u32]) -> TableResult<UpdateStats> {
        self.apply_updates_with(keys, grads, lr, Some(held))
    }

    fn apply_updates_with(&mut self, keys: &[u64], grads: &[f32], lr: f32, held: Option<&[u32]>) -> TableResult<UpdateStats> {
        if !self.leader {
            return Err(TableError::ReadOnly);
        }
        if self.retired.is_some() {
            return Err(TableError::Config("the host table grew and the host has not remapped it yet: run HostTable::sync between update batches".into()));
        }
        let grown = self.grown_path(self.remaps + 1);
        let (table, policy, ahead) = (&mut self.table, self.policy, &mut self.ahead);
        let mut apply = || match policy {
            None => match held {
                None => table.apply_updates(keys, grads, lr),
                Some(h) => table.apply_updates_held(keys, grads, lr, h),
            }
            .map(|stats| manage::Managed { stats, ..Default::default() }),
            Some(policy) => manage::apply_managed(table, keys, grads, lr, &policy, &grown, ahead, held),
        };
        let r = match &self.pool {
            Some(p) if keys.len() >= POOL_MIN_UPDATES => p.install(apply),
            _ => apply(),
        };
        match r {
            Ok(m) => {
                if let Some((g, old)) = m.growth {
                    self.retired = Some((old, SegmentGuard::new(&grown)));
                    self.growths.push(g);
                }
                Ok(m.stats)
            }
            Err(e) => {
                // A growth that failed after its file was made leaves nothing behind.
                if self.table.path() == grown {
                    let _ = std::fs::remove_file(&grown);
                }
                Err(e)
            }
        }
    }

    /// Host barrier that publishes the leader's writes: after it, every local rank reads the
    /// updated rows, and non-leaders refresh their view of the header. When the leader's
    /// update grew the table, the host then remaps it (collective over the host; see the
    /// module docs). A dead or stuck local rank is an error after the comm timeout, not a
    /// hang. The leader's next update must wait until every local rank has returned from
    /// this call (they read the header after the barrier); in training the next step's
    /// sparse exchange, which needs every rank, orders them.
    pub fn sync(&mut self) -> TableResult<()> {
        self.barrier.wait()?;
        let grown = if self.leader {
            self.retired.is_some()
        } else {
            self.table.refresh()?;
            self.table.header().replaced
        };
        if grown {
            self.remap()?;
        }
        Ok(())
    }

    /// Every local rank moves to the grown table (see the module docs).
    fn remap(&mut self) -> TableResult<()> {
        let _w = crate::watchdog::waiting("the local ranks mapping the grown host table");
        self.remaps += 1;
        let path = self.grown_path(self.remaps);
        let mut mine = None;
        if !self.leader {
            match EmbeddingTable::open_readonly(&path) {
                Ok(t) => self.table = t,
                Err(e) => mine = Some(e),
            }
        }
        let ok = u8::from(mine.is_none());
        let mut all_ok = 0u8;
        self.local.comm.all_reduce_into(&ok, &mut all_ok, SystemOperation::min());
        if let Some((old, mut guard)) = self.retired.take() {
            let _ = guard.remove_now();
            drop(old);
        }
        match (mine, all_ok) {
            (Some(e), _) => Err(e),
            (None, 0) => Err(TableError::Peer(format!("the host table grew into {}, and a local rank of this host could not map it; see that rank's error", path.display()))),
            (None, _) => Ok(()),
        }
    }
}
