//! Process topology: who am I among all ranks, on my host, and across hosts.
//!
//! Hosts are found with `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`. With
//! `RINGREC_RANKS_PER_HOST=k` every real host is further cut into groups of k consecutive
//! ranks that behave as separate hosts (own shared segments, own leader, cross-host traffic),
//! so multi-host paths run on one machine. `cross` joins the ranks with equal `local_rank`
//! (one per host). A process started without `mpirun` is a world of size 1 (MPI singleton).

use std::sync::Arc;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::Root;

use crate::config::RuntimeConfig;
pub use crate::group::{Group, MpiContext};
use crate::{CommError, CommResult};

/// Where this rank sits: world, host and cross-host coordinates.
pub struct Topology {
    /// This process' watchdog (see [`crate::watchdog`]); dropped first, before the
    /// communicators and MPI itself.
    watchdog: Option<crate::liveness::Watchdog>,
    /// Rank in the world.
    pub rank: usize,
    /// Number of ranks in the world.
    pub size: usize,
    /// Rank among the ranks of this (possibly simulated) host; 0 is the host leader.
    pub local_rank: usize,
    /// Number of ranks on this host.
    pub local_size: usize,
    /// Rank among the processes of this machine (equals `local_rank` unless
    /// `RINGREC_RANKS_PER_HOST` cuts the machine into simulated hosts): picks the GPU.
    pub machine_local_rank: usize,
    /// Processes on this machine.
    pub machine_local_size: usize,
    /// Rank among the ranks with the same `local_rank` (one per host).
    pub cross_rank: usize,
    /// Number of ranks with the same `local_rank`.
    pub cross_size: usize,
    /// Index of this host, 0..num_hosts, equal to the leader's `cross_rank`.
    pub host_id: usize,
    /// Number of hosts (simulated hosts count separately).
    pub num_hosts: usize,
    /// Name of the machine this rank runs on.
    pub hostname: String,
    /// Identifies the job on this machine: names shared segments so jobs never collide.
    pub job_id: String,
    /// `RINGREC_RANKS_PER_HOST`, when set.
    pub simulated_ranks_per_host: Option<usize>,
    /// True when MPI granted `MPI_THREAD_MULTIPLE` (several threads may call MPI at once).
    pub thread_multiple: bool,
    /// The runtime configuration (`RINGREC_*`), read once here.
    pub config: RuntimeConfig,
    /// host_id of every world rank.
    pub host_of_rank: Vec<usize>,
    /// local_rank of every world rank.
    pub local_rank_of_rank: Vec<usize>,
    /// All ranks.
    pub world: Group,
    /// The ranks of this host.
    pub local: Group,
    /// The ranks with this rank's local_rank, one per host.
    pub cross: Group,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.describe())
    }
}

impl Topology {
    /// Initialises MPI, asking for thread level `MPI_THREAD_MULTIPLE` (the engine's
    /// background thread calls MPI while the training thread does too, on other
    /// communicators), and computes the topology. The first rank of each machine removes
    /// what killed jobs left in the shared-memory directory ([`crate::stale::sweep_shm`])
    /// before the job creates its own segments. Call once per process.
    pub fn init() -> CommResult<Topology> {
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| CommError::Mpi("MPI is already initialised in this process; call Topology::init once".into()))?;
        let ctx = Arc::new(MpiContext::new(universe));
        let world_comm = SimpleCommunicator::world();
        Self::from_world(world_comm, ctx, level == mpi::Threading::Multiple)
    }

    fn from_world(world_comm: SimpleCommunicator, ctx: Arc<MpiContext>, thread_multiple: bool) -> CommResult<Topology> {
        let rank = world_comm.rank() as usize;
        let size = world_comm.size() as usize;
        let config = RuntimeConfig::from_env()?;
        let per_host = config.ranks_per_host;

        // Real hosts: shared-memory split. Then simulated hosts inside them.
        let shared = world_comm.split_shared(rank as i32);
        let (machine_local_rank, machine_local_size) = (shared.rank() as usize, shared.size() as usize);
        // What killed jobs left in the shared-memory directory, removed once per machine
        // before this job creates its first segment (the heartbeat, below).
        if machine_local_rank == 0 {
            crate::stale::report(&config.shm_dir, &crate::stale::sweep_shm(&config.shm_dir));
        }
        let local_comm = match per_host {
            None => shared,
            Some(k) => shared
                .split_by_color_with_key(Color::with_value((rank / k) as i32), rank as i32)
                .ok_or_else(|| CommError::Mpi("split by simulated host failed".into()))?,
        };
        let local_rank = local_comm.rank() as usize;
        let local_size = local_comm.size() as usize;
        let cross_comm = world_comm
            .split_by_color_with_key(Color::with_value(local_rank as i32), rank as i32)
            .ok_or_else(|| CommError::Mpi("split by local rank failed".into()))?;
        let cross_rank = cross_comm.rank() as usize;
        let cross_size = cross_comm.size() as usize;

        // host_id = the leader's cross_rank, told to the whole host.
        let mut host_id = cross_rank as u64;
        local_comm.process_at_rank(0).broadcast_into(&mut host_id);
        let host_id = host_id as usize;

        // Everyone learns (host_id, local_rank) of every rank.
        let mine = [host_id as u64, local_rank as u64];
        let mut all = vec![0u64; 2 * size];
        world_comm.all_gather_into(&mine[..], &mut all[..]);
        let host_of_rank: Vec<usize> = all.chunks(2).map(|c| c[0] as usize).collect();
        let local_rank_of_rank: Vec<usize> = all.chunks(2).map(|c| c[1] as usize).collect();
        let num_hosts = host_of_rank.iter().copied().max().map_or(1, |m| m + 1);

        // Job id: RINGREC_JOB_ID, else made by rank 0 and broadcast.
        let mut id = [0u8; 48];
        if rank == 0 {
            let s = match &config.job_id {
                Some(s) => crate::shm::sanitize(s),
                None => {
                    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
                    format!("{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
                }
            };
            let b = s.as_bytes();
            let n = b.len().min(id.len());
            id[..n].copy_from_slice(&b[..n]);
        }
        world_comm.process_at_rank(0).broadcast_into(&mut id[..]);
        let job_id = String::from_utf8_lossy(&id).trim_end_matches('\0').to_string();

        let hostname = mpi::environment::processor_name().unwrap_or_else(|_| "unknown".into());
        let mut topo = Topology {
            watchdog: None,
            rank,
            size,
            local_rank,
            local_size,
            machine_local_rank,
            machine_local_size,
            cross_rank,
            cross_size,
            host_id,
            num_hosts,
            hostname,
            job_id,
            simulated_ranks_per_host: per_host,
            thread_multiple,
            config,
            host_of_rank,
            local_rank_of_rank,
            world: Group { comm: world_comm, ctx: ctx.clone() },
            local: Group { comm: local_comm, ctx: ctx.clone() },
            cross: Group { comm: cross_comm, ctx },
        };
        // The world rank of every rank of this host, in local-rank order.
        let mut local_world: Vec<usize> = (0..size).filter(|r| topo.host_of_rank[*r] == host_id).collect();
        local_world.sort_by_key(|r| topo.local_rank_of_rank[*r]);
        let beats = topo.segment_path("heartbeat");
        topo.watchdog = Some(crate::liveness::Watchdog::start(&topo.world.comm, &topo.local, &beats, local_world, topo.config.comm_timeout));
        Ok(topo)
    }

    /// Every rank learns whether all ranks succeeded at something each did alone (opening
    /// files, finding a GPU): every rank gets its own value, or every rank fails — the
    /// failing rank with its own message, the others with the lowest failing rank's
    /// ([`CommError::RankFailed`]). Collective over the world; use it before a collective
    /// that a failed rank would never join.
    pub fn agree<T>(&self, mine: Result<T, String>) -> CommResult<T> {
        let _w = crate::watchdog::waiting("every rank's agreement on a start-up step");
        let failing = if mine.is_err() { self.rank as i32 } else { i32::MAX };
        let mut first = 0i32;
        self.world.comm.all_reduce_into(&failing, &mut first, SystemOperation::min());
        if first == i32::MAX {
            return mine.map_err(CommError::Failed);
        }
        let mut msg = [0u8; 1024];
        if let Err(m) = &mine {
            let b = m.as_bytes();
            let n = b.len().min(msg.len() - 1);
            msg[..n].copy_from_slice(&b[..n]);
        }
        self.world.comm.process_at_rank(first).broadcast_into(&mut msg[..]);
        match mine {
            Err(m) => Err(CommError::Failed(m)),
            Ok(_) => Err(CommError::RankFailed { rank: first as usize, message: String::from_utf8_lossy(&msg).trim_end_matches('\0').to_string() }),
        }
    }

    /// The same topology over private copies of its communicators (collective over the
    /// world: each is duplicated), for a thread that runs collectives of its own beside
    /// the caller's (the engine's thread building a device's collectives). Without the
    /// watchdog, which stays this topology's.
    pub fn duplicate(&self) -> Topology {
        Topology {
            watchdog: None,
            rank: self.rank,
            size: self.size,
            local_rank: self.local_rank,
            local_size: self.local_size,
            machine_local_rank: self.machine_local_rank,
            machine_local_size: self.machine_local_size,
            cross_rank: self.cross_rank,
            cross_size: self.cross_size,
            host_id: self.host_id,
            num_hosts: self.num_hosts,
            hostname: self.hostname.clone(),
            job_id: self.job_id.clone(),
            simulated_ranks_per_host: self.simulated_ranks_per_host,
            thread_multiple: self.thread_multiple,
            config: self.config.clone(),
            host_of_rank: self.host_of_rank.clone(),
            local_rank_of_rank: self.local_rank_of_rank.clone(),
            world: self.world.duplicate(),
            local: self.local.duplicate(),
            cross: self.cross.duplicate(),
        }
    }

    /// True on local rank 0, the host leader that owns host-shared state.
    pub fn is_leader(&self) -> bool {
        self.local_rank == 0
    }

    /// True when every host has the same number of ranks (what `hier` needs).
    pub fn is_homogeneous(&self) -> bool {
        let mut counts = vec![0usize; self.num_hosts];
        for h in &self.host_of_rank {
            counts[*h] += 1;
        }
        counts.iter().all(|c| *c == self.local_size)
    }

    /// This host's shared segment `tag`: `<shm_dir>/ringrec-<job>-h<host>-<tag>`.
    pub fn segment_path(&self, tag: &str) -> std::path::PathBuf {
        crate::shm::segment_path(&self.config.shm_dir, &self.job_id, self.host_id, tag)
    }

    /// Every rank checks that every other runs with the same `settings` (name, value) —
    /// the ones that must match for ranks to work together (a model's shape, the data, the
    /// backends). A mismatch is the same error on every rank, naming each differing setting
    /// and every rank's value. Collective over the world; a digest of the list travels
    /// first, the lists themselves only when the digests differ.
    pub fn agree_settings(&self, settings: &[(&str, String)]) -> CommResult<()> {
        let shown: Vec<(&str, String, String)> = settings.iter().map(|(k, v)| (*k, v.clone(), v.clone())).collect();
        self.agree_settings_shown(&shown)
    }

    /// [`Topology::agree_settings`] for settings `(name, value, shown)`: the ranks compare
    /// `value`, and a mismatch shows each rank's `shown` (the value as that rank's user
    /// typed it, e.g. naming the environment variable that gave it).
    pub fn agree_settings_shown(&self, settings: &[(&str, String, String)]) -> CommResult<()> {
        let _w = crate::watchdog::waiting("every rank comparing its settings");
        let one_line = |v: &str| v.replace(['\t', '\n'], " ");
        let compared: String = settings.iter().map(|(k, v, _)| format!("{k}\t{}\n", one_line(v))).collect();
        let digest = crate::hash::fnv1a64(compared.as_bytes());
        let mut all = vec![0u64; self.size];
        self.world.comm.all_gather_into(&digest, &mut all[..]);
        if all.iter().all(|d| *d == digest) {
            return Ok(());
        }
        let text: String = settings.iter().map(|(k, v, shown)| format!("{k}\t{}\t{}\n", one_line(v), one_line(shown))).collect();
        let g = crate::gather::mpi_allgatherv(&self.world.comm, text.as_bytes())?;
        let mut by_rank: Vec<std::collections::BTreeMap<String, (String, String)>> = Vec::new();
        let mut at = 0;
        for c in &g.counts {
            let t = String::from_utf8_lossy(&g.data[at..at + c]);
            by_rank.push(t.lines().filter_map(|l| l.split_once('\t')).map(|(k, rest)| (k.to_string(), rest.split_once('\t').map_or((rest.to_string(), rest.to_string()), |(v, s)| (v.to_string(), s.to_string())))).collect());
            at += c;
        }
        Err(CommError::Failed(format!("the ranks were started with different settings that must match: {}; start every rank with the same command and environment", settings_mismatch(&by_rank))))
    }

    /// Ends the whole job now (`MPI_Abort` with `code`): for a rank that failed while its
    /// peers may wait for it. Never returns.
    pub fn abort(&self, code: i32) -> ! {
        crate::watchdog::end_job(&self.world.comm, code)
    }

    /// One line: `rank 1/4 local 1/2 cross 0/2 host 0 (name)`.
    pub fn describe(&self) -> String {
        format!(
            "rank {}/{} local_rank {}/{} cross_rank {}/{} host {} of {} ({}{})",
            self.rank,
            self.size,
            self.local_rank,
            self.local_size,
            self.cross_rank,
            self.cross_size,
            self.host_id,
            self.num_hosts,
            self.hostname,
            match self.simulated_ranks_per_host {
                Some(k) => format!(", simulated hosts of {k} ranks"),
                None => String::new(),
            }
        )
    }
}

/// The settings that differ between ranks (`by_rank[r]`: name -> (value, shown)), each as
/// `name: rank 0 has A, rank 1 has B` (at most 8 ranks named), in name order.
fn settings_mismatch(by_rank: &[std::collections::BTreeMap<String, (String, String)>]) -> String {
    let mut names: Vec<&String> = by_rank.iter().flat_map(|m| m.keys()).collect();
    names.sort();
    names.dedup();
    let missing = (String::new(), String::from("(not set)"));
    let mut parts = Vec::new();
    for name in names {
        let values: Vec<&(String, String)> = by_rank.iter().map(|m| m.get(name).unwrap_or(&missing)).collect();
        if values.iter().all(|v| v.0 == values[0].0) {
            continue;
        }
        let shown: Vec<String> = values.iter().enumerate().take(8).map(|(r, v)| format!("rank {r} has {}", v.1)).collect();
        let more = if values.len() > 8 { format!(" and {} more ranks", values.len() - 8) } else { String::new() };
        parts.push(format!("{name}: {}{more}", shown.join(", ")));
    }
    parts.join("; ")
}
