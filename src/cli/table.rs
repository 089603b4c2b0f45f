//! `ringrec table ...`: create, import, export and inspect table files, plus two hidden
//! multi-rank commands, `hold` (memory measurement) and `selftest` (the checks the
//! multi-process tests assert on).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::Communicator;
use mpi::traits::Root;

use ringrec::embedding::format::{capacity_for_rows, OptimizerKind, StorageDtype};
use ringrec::embedding::host::HostTable;
use ringrec::embedding::init;
use ringrec::embedding::params::read_params_header;
use ringrec::embedding::table::{EmbeddingTable, TableConfig};
use ringrec::embedding::TableError;
use ringrec::hash::fnv1a64;
use ringrec::topology::Topology;

/// Shape and initialisation flags of a new table.
#[derive(clap::Args, Clone, Debug)]
pub struct TableArgs {
    /// Values per row (import: defaults to the parameter file's dim).
    #[arg(long, env = "RINGREC_TABLE_DIM")]
    pub dim: Option<u32>,
    /// Slots in the table, rounded up to a power of two; at most 80% hold rows
    /// (import: defaults to what the parameter file needs).
    #[arg(long = "table-capacity", env = "RINGREC_TABLE_CAPACITY")]
    pub capacity: Option<u64>,
    /// Row storage: f32, f16 or bf16 (arithmetic is f32 either way).
    #[arg(long, default_value = "f32", env = "RINGREC_TABLE_DTYPE")]
    pub dtype: StorageDtype,
    /// Sparse optimizer: sgd or adagrad (row-wise; keeps one f32 per row).
    #[arg(long, default_value = "sgd", env = "RINGREC_TABLE_OPTIMIZER")]
    pub optimizer: OptimizerKind,
    /// Seed of the initial rows of unseen keys.
    #[arg(long, default_value_t = 0, env = "RINGREC_TABLE_SEED")]
    pub seed: u64,
    /// Initial rows are uniform in [-s, s]; default 1/sqrt(dim).
    #[arg(long)]
    pub init_scale: Option<f32>,
}

impl TableArgs {
    /// The table configuration, with `dim` and `capacity` defaults supplied by the caller.
    pub fn config(&self, default_dim: Option<u32>, default_capacity: u64) -> anyhow::Result<TableConfig> {
        let dim = self.dim.or(default_dim).context("--dim is required")?;
        let mut cfg = TableConfig::new(dim, self.capacity.unwrap_or(default_capacity));
        cfg.dtype = self.dtype;
        cfg.optimizer = self.optimizer;
        cfg.seed = self.seed;
        cfg.init_scale = self.init_scale;
        Ok(cfg)
    }
}

/// `ringrec table ...`.
#[derive(clap::Subcommand, Debug)]
pub enum TableCommand {
    /// Create an empty table file.
    Create {
        /// The table file to create (must not exist).
        path: PathBuf,
        /// Shape of the table.
        #[command(flatten)]
        table: TableArgs,
    },
    /// Create a table file from a binary sparse-parameter file (see `ringrec::embedding::params`).
    Import {
        /// The sparse-parameter file.
        params: PathBuf,
        /// The table file to create (must not exist).
        path: PathBuf,
        /// Shape of the table.
        #[command(flatten)]
        table: TableArgs,
    },
    /// Export every row as TSV (`key<TAB>v0<TAB>v1...`, keys ascending).
    Export {
        /// The table file.
        path: PathBuf,
        /// Output file; `-` for stdout.
        #[arg(long, short, default_value = "-")]
        out: PathBuf,
        /// Write a binary sparse-parameter file instead of TSV.
        #[arg(long)]
        params: bool,
    },
    /// Print the header, row count, load factor and memory of a table file.
    Inspect {
        /// The table file.
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// (Measurement) Open the host table with N rows, touch every row from every rank and
    /// report each rank's Pss, gathered to rank 0 as one JSON line. Run under mpirun.
    #[command(hide = true)]
    Hold(HoldArgs),
    /// (Testing) Per-rank checks of the host table under mpirun; prints one line per rank.
    #[command(hide = true)]
    Selftest(SelftestArgs),
}

/// Arguments of `ringrec table hold`.
#[derive(clap::Args, Clone, Debug)]
pub struct HoldArgs {
    /// Rows in the table.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Values per row.
    #[arg(long, default_value_t = 64)]
    pub dim: u32,
    /// Row storage.
    #[arg(long, default_value = "f32")]
    pub dtype: StorageDtype,
    /// Give every rank its own `HashMap<u64, Vec<f32>>` copy instead (the baseline).
    #[arg(long)]
    pub per_rank_copy: bool,
}

/// Arguments of `ringrec table selftest`.
#[derive(clap::Args, Clone, Debug)]
pub struct SelftestArgs {
    /// Rows the leader writes.
    #[arg(long, default_value_t = 1000)]
    pub rows: u64,
    /// Values per row.
    #[arg(long, default_value_t = 8)]
    pub dim: u32,
    /// Row storage.
    #[arg(long, default_value = "f32")]
    pub dtype: StorageDtype,
    /// Optimizer.
    #[arg(long, default_value = "sgd")]
    pub optimizer: OptimizerKind,
    /// Have the leader import this sparse-parameter file first (a corrupt one tests the
    /// failure path).
    #[arg(long)]
    pub import: Option<PathBuf>,
    /// This world rank exits abruptly (status 3) right after the table is set up.
    #[arg(long)]
    pub fail_rank: Option<usize>,
}

/// Runs a `ringrec table` command.
pub fn run(cmd: TableCommand) -> anyhow::Result<()> {
    match cmd {
        TableCommand::Create { path, table } => {
            let cfg = table.config(None, 1 << 20)?;
            let t = EmbeddingTable::create(&path, &cfg)?;
            t.flush()?;
            print_out(&t.inspect().to_string())
        }
        TableCommand::Import { params, path, table } => {
            let (ph, _) = read_params_header(&params)?;
            let cfg = table.config(Some(ph.dim), capacity_for_rows(ph.count))?;
            let t = EmbeddingTable::import_params(&params, &path, &cfg)?;
            t.flush()?;
            eprintln!("imported {} records from {}", ph.count, params.display());
            print_out(&t.inspect().to_string())
        }
        TableCommand::Export { path, out, params } => {
            let t = EmbeddingTable::open_readonly(&path)?;
            let n = if params {
                if out == Path::new("-") {
                    bail!("--params needs an output file (--out FILE)");
                }
                t.export_params(&out)?
            } else if out == Path::new("-") {
                let stdout = std::io::stdout();
                let mut w = std::io::BufWriter::new(stdout.lock());
                match t.write_tsv(&mut w).and_then(|n| w.flush().map(|_| n)) {
                    Ok(n) => n,
                    // `ringrec table export t | head`: the reader left, not an error.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            } else {
                t.export_tsv(&out)?
            };
            eprintln!("exported {n} rows");
            Ok(())
        }
        TableCommand::Inspect { path, json } => {
            let t = EmbeddingTable::open_readonly(&path)?;
            let info = t.inspect();
            let text = if json { format!("{}\n", serde_json::to_string_pretty(&info)?) } else { info.to_string() };
            print_out(&text)
        }
        TableCommand::Hold(a) => hold(&a),
        TableCommand::Selftest(a) => selftest(&a),
    }
}

/// Prints to stdout; a closed pipe (`| head`) is not an error.
fn print_out(s: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// This process' proportional set size in KiB, from `/proc/self/smaps_rollup`.
pub fn pss_kib() -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").context("reading /proc/self/smaps_rollup")?;
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix("Pss:") {
            return rest.trim().trim_end_matches("kB").trim().parse().context("parsing Pss");
        }
    }
    bail!("no Pss line in /proc/self/smaps_rollup")
}

/// `ringrec table hold`: see [`TableCommand::Hold`].
pub fn hold(a: &HoldArgs) -> anyhow::Result<()> {
    let topo = Topology::init()?;
    let world = &topo.world.comm;
    let before = pss_kib()?;
    let d = a.dim as usize;
    const BATCH: usize = 8192;
    let keys: Vec<u64> = (0..a.rows).collect();
    let mut out = vec![0f32; BATCH * d];
    let mut check = 0f64;
    let mut table_bytes = 0u64;
    // Kept alive until every rank has measured.
    let mut _held_table = None;
    let mut _held_map = None;
    if a.per_rank_copy {
        let mut m: HashMap<u64, Vec<f32>> = HashMap::with_capacity(a.rows as usize);
        let scale = init::default_init_scale(a.dim);
        for k in &keys {
            let mut row = vec![0f32; d];
            init::init_row_f32(*k, 0, scale, &mut row);
            m.insert(*k, row);
        }
        for k in &keys {
            check += m.get(k).map_or(0.0, |r| r[0] as f64);
        }
        _held_map = Some(m);
    } else {
        let mut cfg = TableConfig::new(a.dim, capacity_for_rows(a.rows));
        cfg.dtype = a.dtype;
        let mut ht = HostTable::open(&topo, &cfg, None)?;
        if ht.is_leader() {
            let zeros = vec![0f32; BATCH * d];
            for c in keys.chunks(BATCH) {
                ht.apply_updates(c, &zeros[..c.len() * d], 0.0)?;
            }
        }
        ht.sync()?;
        for c in keys.chunks(BATCH) {
            let o = &mut out[..c.len() * d];
            ht.lookup(c, o)?;
            check += o.iter().step_by(d).map(|x| *x as f64).sum::<f64>();
        }
        table_bytes = ht.table().header().layout.file_len;
        _held_table = Some(ht);
    }
    world.barrier();
    let after = pss_kib()?;
    world.barrier();
    let mine = [before, after];
    let root = world.process_at_rank(0);
    if topo.rank == 0 {
        let mut all = vec![0u64; 2 * topo.size];
        root.gather_into_root(&mine[..], &mut all[..]);
        let before: Vec<u64> = all.chunks(2).map(|c| c[0]).collect();
        let after: Vec<u64> = all.chunks(2).map(|c| c[1]).collect();
        let line = serde_json::json!({
            "mode": if a.per_rank_copy { "per-rank-hashmap" } else { "host-table" },
            "ranks": topo.size,
            "rows": a.rows,
            "dim": a.dim,
            "dtype": a.dtype.name(),
            "table_bytes": table_bytes,
            "row_bytes_total": a.rows * a.dim as u64 * if a.per_rank_copy { 4 } else { a.dtype.size() },
            "pss_before_kib": before,
            "pss_after_kib": after,
            "sum_pss_before_kib": before.iter().sum::<u64>(),
            "sum_pss_after_kib": after.iter().sum::<u64>(),
            "checksum": check,
        });
        println!("{line}");
    } else {
        root.gather_into(&mine[..]);
    }
    Ok(())
}

/// Gradient the self test's leader applies to element `j` of `key`'s row.
fn selftest_grad(key: u64, j: usize) -> f32 {
    ((key.wrapping_mul(31).wrapping_add(j as u64)) % 17) as f32 / 17.0 - 0.5
}

/// `ringrec table selftest`: the per-rank checks of the multi-process tests. Prints
/// `rank R local_rank L host H rows_ok .. rows_digest .. unseen_ok .. unseen_digest .. write ..`
/// and fails (non-zero exit) when a check does not hold.
pub fn selftest(a: &SelftestArgs) -> anyhow::Result<()> {
    let topo = Topology::init()?;
    let d = a.dim as usize;
    let mut cfg = TableConfig::new(a.dim, capacity_for_rows(a.rows * 2));
    cfg.dtype = a.dtype;
    cfg.optimizer = a.optimizer;
    cfg.seed = 20240601;
    let mut ht = match HostTable::open(&topo, &cfg, a.import.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            // Every local rank gets the error together, so all can report it before any exits.
            println!("rank {} local_rank {} host {} error: {e}", topo.rank, topo.local_rank, topo.host_id);
            let _ = std::io::stdout().flush();
            topo.world.comm.barrier();
            return Err(e).with_context(|| format!("rank {}: opening the host table", topo.rank));
        }
    };
    if a.fail_rank == Some(topo.rank) {
        // An abrupt exit (no destructors, no MPI_Finalize), like a crash.
        eprintln!("rank {}: exiting on purpose (--fail-rank)", topo.rank);
        std::process::exit(3);
    }
    let lr = 0.1f32;
    let keys: Vec<u64> = (1..=a.rows).collect();
    let grads: Vec<f32> = keys.iter().flat_map(|k| (0..d).map(move |j| selftest_grad(*k, j))).collect();

    // Unseen keys read the same on every rank, before any write.
    let unseen: Vec<u64> = (0..100u64).map(|i| 1_000_000_000 + i * 7919).collect();
    let mut u = vec![0f32; unseen.len() * d];
    ht.lookup(&unseen, &mut u)?;
    let mut unseen_ok = true;
    let mut want = vec![0f32; d];
    for (k, row) in unseen.iter().zip(u.chunks_exact(d)) {
        ht.table().init_row(*k, &mut want);
        unseen_ok &= row.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
    }

    let write = if ht.is_leader() {
        ht.apply_updates(&keys, &grads, lr)?;
        "leader_wrote"
    } else {
        match ht.apply_updates(&keys, &grads, lr) {
            Err(TableError::ReadOnly) => "write_refused",
            Err(e) => bail!("rank {}: a non-leader write failed with the wrong error: {e}", topo.rank),
            Ok(_) => bail!("rank {}: a non-leader write succeeded", topo.rank),
        }
    };
    ht.sync()?;

    let mut rows = vec![0f32; keys.len() * d];
    ht.lookup(&keys, &mut rows)?;
    // Expected: the initial row, one step, rounded to storage (SGD); Adagrad is checked for
    // equality across ranks through the digest.
    let mut rows_ok = ht.table().live_rows() == a.rows && ht.table().generation() >= 1;
    if a.optimizer == OptimizerKind::Sgd && a.import.is_none() {
        let mut w = vec![0f32; d];
        for (k, row) in keys.iter().zip(rows.chunks_exact(d)) {
            ht.table().init_row(*k, &mut w);
            for (j, x) in w.iter_mut().enumerate() {
                *x -= lr * selftest_grad(*k, j);
            }
            round_to(a.dtype, &mut w);
            rows_ok &= row.iter().zip(&w).all(|(x, y)| x.to_bits() == y.to_bits());
        }
    }
    let rows_digest = fnv1a64(bytemuck::cast_slice(&rows));
    let unseen_digest = fnv1a64(bytemuck::cast_slice(&u));
    println!(
        "rank {} local_rank {} host {} rows_ok {} rows_digest {:016x} unseen_ok {} unseen_digest {:016x} write {} live_rows {} generation {} segment {}",
        topo.rank,
        topo.local_rank,
        topo.host_id,
        rows_ok,
        rows_digest,
        unseen_ok,
        unseen_digest,
        write,
        ht.table().live_rows(),
        ht.table().generation(),
        ht.path().display()
    );
    let _ = std::io::stdout().flush();
    let ok = u8::from(rows_ok && unseen_ok);
    let mut all_ok = 0u8;
    topo.world.comm.all_reduce_into(&ok, &mut all_ok, SystemOperation::min());
    let path = ht.path().to_path_buf();
    drop(ht);
    topo.world.comm.barrier();
    if topo.rank == 0 && all_ok == 1 {
        println!("selftest ok: {} ranks on {} hosts", topo.size, topo.num_hosts);
    }
    if topo.is_leader() && path.exists() {
        bail!("rank {}: {} still exists after the table was dropped", topo.rank, path.display());
    }
    if all_ok == 0 {
        bail!("rank {}: host table checks failed (rows_ok {rows_ok}, unseen_ok {unseen_ok})", topo.rank);
    }
    Ok(())
}

fn round_to(dtype: StorageDtype, v: &mut [f32]) {
    use ringrec::embedding::init::Elem;
    match dtype {
        StorageDtype::F32 => {}
        StorageDtype::F16 => half::f16::round(v),
        StorageDtype::Bf16 => half::bf16::round(v),
    }
}
