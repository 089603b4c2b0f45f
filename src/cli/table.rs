//! `ringrec table ...`: create, import, export, inspect and verify table files, plus a hidden
//! multi-rank command, `hold` (memory measurement).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;
use mpi::traits::Root;

use ringrec::embedding::format::{capacity_for_rows, OptimizerKind, StorageDtype};
use ringrec::embedding::host::HostTable;
use ringrec::embedding::init;
use ringrec::embedding::params::read_params_header;
use ringrec::embedding::table::{EmbeddingTable, TableConfig};
use ringrec::topology::Topology;

/// Shape and initialisation flags of a new table.
#[derive(clap::Args, Clone, Debug)]
pub struct TableArgs {
    /// Values per row (import: defaults to the parameter file's dim).
    /// [env: RINGREC_TABLE_DIM]
    #[arg(long)]
    pub dim: Option<u32>,
    /// Slots in the table, rounded up to a power of two; at most 80% hold rows
    /// (import: defaults to what the parameter file needs).
    /// [env: RINGREC_TABLE_CAPACITY]
    #[arg(long = "table-capacity")]
    pub capacity: Option<u64>,
    /// Row storage: f32, f16 or bf16 (arithmetic is f32 either way) [default: f32]
    /// [env: RINGREC_TABLE_DTYPE]
    #[arg(long)]
    pub dtype: Option<StorageDtype>,
    /// Sparse optimizer: sgd or adagrad (row-wise; keeps one f32 per row) [default: sgd]
    /// [env: RINGREC_TABLE_OPTIMIZER]
    #[arg(long)]
    pub optimizer: Option<OptimizerKind>,
    /// Seed of the initial rows of unseen keys [default: 0] [env: RINGREC_TABLE_SEED]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Initial rows are uniform in [-s, s]; default 1/sqrt(dim).
    #[arg(long)]
    pub init_scale: Option<f32>,
}

impl TableArgs {
    /// The table configuration, with `dim` and `capacity` defaults supplied by the caller.
    pub fn config(&self, default_dim: Option<u32>, default_capacity: u64) -> anyhow::Result<TableConfig> {
        let dim = super::or_env(self.dim, "RINGREC_TABLE_DIM")?.or(default_dim).context("--dim is required")?;
        let mut cfg = TableConfig::new(dim, super::or_env(self.capacity, "RINGREC_TABLE_CAPACITY")?.unwrap_or(default_capacity));
        cfg.dtype = super::or_env(self.dtype, "RINGREC_TABLE_DTYPE")?.unwrap_or(StorageDtype::F32);
        cfg.optimizer = super::or_env(self.optimizer, "RINGREC_TABLE_OPTIMIZER")?.unwrap_or(OptimizerKind::Sgd);
        cfg.seed = super::or_env(self.seed, "RINGREC_TABLE_SEED")?.unwrap_or(0);
        cfg.init_scale = self.init_scale;
        Ok(cfg)
    }
}

/// `ringrec table ...`.
#[derive(clap::Subcommand, Debug)]
pub enum TableCommand {
    /// Create an empty table file (with block checksums, verified by every open; an update
    /// clears them).
    Create {
        /// The table file to create (must not exist).
        path: PathBuf,
        /// Shape of the table.
        #[command(flatten)]
        table: TableArgs,
    },
    /// Create a table file from a binary sparse-parameter file (see `ringrec::embedding::params`),
    /// with block checksums.
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
    /// Check a table file in full: header, layout, the index (every key where a lookup finds
    /// it) and, for a saved table, every block against its checksum. Exits non-zero on damage.
    Verify {
        /// The table file.
        path: PathBuf,
    },
    /// (Measurement) Open the host table with N rows, touch every row from every rank and
    /// report each rank's Pss, gathered to rank 0 as one JSON line. Run under mpirun.
    #[command(hide = true)]
    Hold(HoldArgs),
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


/// Runs a `ringrec table` command.
pub fn run(cmd: TableCommand) -> anyhow::Result<()> {
    match cmd {
        TableCommand::Create { path, table } => {
            let cfg = table.config(None, 1 << 20)?;
            let mut t = EmbeddingTable::create(&path, &cfg)?;
            t.seal()?;
            t.flush()?;
            print_out(&t.inspect().to_string())
        }
        TableCommand::Import { params, path, table } => {
            let (ph, _) = read_params_header(&params)?;
            let cfg = table.config(Some(ph.dim), capacity_for_rows(ph.count))?;
            let mut t = EmbeddingTable::import_params(&params, &path, &cfg)?;
            t.seal()?;
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
        TableCommand::Verify { path } => print_out(&EmbeddingTable::verify(&path)?.to_string()),
        TableCommand::Hold(_) => bail!("`table hold` runs under MPI (main dispatches it)"),
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
pub fn hold(topo: &Topology, a: &HoldArgs) -> anyhow::Result<()> {
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
        let mut ht = HostTable::open(topo, &cfg, None)?;
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

