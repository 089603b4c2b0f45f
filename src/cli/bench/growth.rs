//! `ringrec bench growth`: a stream of many distinct keys through a managed table that
//! starts small, on the host leader's real update path ([`apply_managed`]: plan, grow,
//! apply). Every step brings `--new-per-step` keys never seen before and
//! `--hot-per-step` Zipf draws over the keys seen so far (the oldest are the hottest), as
//! a CTR stream with a long tail does. One line per growth: the pause (building the new
//! table: create, rehash), the steps since the previous growth and their median update
//! time, and the pause amortised over those steps as a multiple of one step's time (the
//! target of issue 16: at most 1.5).

use std::path::PathBuf;
use std::time::Instant;

use ringrec::embedding::{apply_managed, Ahead, EmbeddingTable, Evict, OptimizerKind, SegmentGuard, StorageDtype, TableConfig, TablePolicy};
use ringrec::sparse::workload::{key_of, zipf_ids};

/// Flags of `ringrec bench growth`.
#[derive(clap::Args, Clone, Debug)]
pub struct GrowthBenchArgs {
    /// Distinct keys in the whole stream.
    #[arg(long, default_value_t = 50_000_000)]
    pub keys: u64,
    /// Keys never seen before in each step.
    #[arg(long, default_value_t = 100_000)]
    pub new_per_step: u64,
    /// Zipf draws over the keys seen so far in each step (deduplicated with the new ones).
    #[arg(long, default_value_t = 100_000)]
    pub hot_per_step: usize,
    /// Zipf exponent of the hot draws.
    #[arg(long, default_value_t = 1.05)]
    pub zipf_s: f64,
    /// Slots of the table at the start.
    #[arg(long, default_value_t = 1 << 20)]
    pub start_slots: u64,
    /// Values per row.
    #[arg(long, default_value_t = 8)]
    pub dim: u32,
    /// Row storage.
    #[arg(long, default_value = "f32")]
    pub dtype: StorageDtype,
    /// Largest table file (growth stops, LRU eviction starts); default: no limit.
    #[arg(long, value_parser = super::super::train::bytes)]
    pub max_bytes: Option<u64>,
    /// Directory of the table files (default: RINGREC_SHM_DIR or /dev/shm).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON records instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One growth of the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GrowthRow {
    /// The step (1-based) whose update needed it.
    pub step: u64,
    /// Slots before and after.
    pub from: u64,
    /// Slots after.
    pub to: u64,
    /// Bytes of the new table file.
    pub bytes: u64,
    /// Rows after the step that needed it.
    pub rows: u64,
    /// Seconds of the pause (create the new file, rehash every row).
    pub pause_s: f64,
    /// Steps since the previous growth (or the start), this one included.
    pub steps_between: u64,
    /// Median update time of those steps, growths left out (seconds).
    pub step_s: f64,
    /// `pause_s / steps_between / step_s`: the pause spread over the steps between
    /// doublings, in steps (target: at most 1.5).
    pub amortised_steps: f64,
}

/// What the whole run did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GrowthSummary {
    /// Steps taken.
    pub steps: u64,
    /// Distinct keys streamed.
    pub keys: u64,
    /// Rows at the end.
    pub rows: u64,
    /// Slots at the start and at the end.
    pub start_slots: u64,
    /// Slots at the end.
    pub end_slots: u64,
    /// Bytes of the table at the end.
    pub end_bytes: u64,
    /// Growths.
    pub growths: u64,
    /// Rows evicted (with `--max-bytes`).
    pub evicted: u64,
    /// Seconds of all updates, growths included.
    pub total_s: f64,
    /// Seconds of all growths.
    pub growth_s: f64,
    /// Median update time of a step without growth.
    pub median_step_s: f64,
    /// The largest `amortised_steps` of any growth.
    pub worst_amortised_steps: f64,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl GrowthRow {
    /// One line of the table, or one JSON record.
    fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            let mib = self.bytes as f64 / (1u64 << 20) as f64;
            println!(
                "{:>6} {:>11} {:>11} {:>9.1} {:>11} {:>9.3} {:>7} {:>9.2} {:>10.3}",
                self.step, self.from, self.to, mib, self.rows, self.pause_s, self.steps_between, self.step_s * 1e3, self.amortised_steps
            );
        }
        Ok(())
    }
}

impl GrowthSummary {
    /// The closing line, or one JSON record.
    fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            let mib = self.end_bytes as f64 / (1u64 << 20) as f64;
            println!(
                "# {} steps, {} keys, {} rows in {} slots ({mib:.1} MiB), {} growths ({:.2} s of {:.2} s), {} evicted; median step {:.2} ms; worst amortised pause {:.3} steps (target <= 1.5)",
                self.steps, self.keys, self.rows, self.end_slots, self.growths, self.growth_s, self.total_s, self.evicted, self.median_step_s * 1e3, self.worst_amortised_steps
            );
        }
        Ok(())
    }
}

/// The keys of `step`: `new` never seen before (after the `seen` so far), and
/// `hot_per_step` Zipf draws over the ones seen, sorted and deduplicated.
fn step_keys(a: &GrowthBenchArgs, seen: u64, new: u64, step: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (seen..seen + new).map(key_of).collect();
    if seen > 0 {
        keys.extend(zipf_ids(seen, a.hot_per_step, a.zipf_s, step).into_iter().map(key_of));
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Runs `ringrec bench growth`.
pub fn run(a: GrowthBenchArgs) -> anyhow::Result<()> {
    let dir = match a.dir.clone() {
        Some(d) => d,
        None => ringrec::config::RuntimeConfig::from_env()?.shm_dir,
    };
    let tag = format!("ringrec-bench-growth-{}", std::process::id());
    let d = a.dim as usize;
    let mut cfg = TableConfig::new(a.dim, a.start_slots);
    cfg.dtype = a.dtype;
    cfg.optimizer = OptimizerKind::Sgd;
    cfg.track_usage = true;
    let path = dir.join(format!("{tag}-0"));
    let mut guards = vec![SegmentGuard::new(&path)];
    let mut table = EmbeddingTable::create(&path, &cfg)?;
    let h = *table.header();
    let max_capacity = a.max_bytes.map_or(ringrec::embedding::format::MAX_CAPACITY, |b| TablePolicy::max_capacity_for(&h, b));
    let policy = TablePolicy { max_capacity, evict: Evict::Lru, expire_after: None };
    if !a.json {
        println!(
            "# bench growth: {} distinct keys, {} new + {} Zipf({}) hot draws per step, dim {} {}, from {} slots (largest {}); a row's size {} B + 8 B key + 8 B usage",
            a.keys, a.new_per_step, a.hot_per_step, a.zipf_s, a.dim, a.dtype, h.capacity, max_capacity, h.row_bytes()
        );
        println!("{:>6} {:>11} {:>11} {:>9} {:>11} {:>9} {:>7} {:>9} {:>10}", "step", "from", "to", "MiB", "rows", "pause s", "steps", "step ms", "amortised");
    }
    let mut seen = 0u64;
    let mut step = 0u64;
    let mut rows_out = Vec::new();
    let mut since: Vec<f64> = Vec::new();
    let mut all_steps: Vec<f64> = Vec::new();
    let (mut total, mut growth_s) = (0f64, 0f64);
    let mut grads = Vec::new();
    let mut ahead = Ahead::default();
    while seen < a.keys {
        step += 1;
        let new = a.new_per_step.min(a.keys - seen);
        let keys = step_keys(&a, seen, new, step);
        seen += new;
        grads.clear();
        grads.extend(keys.iter().flat_map(|k| (0..d).map(move |j| ((k >> (j % 48)) & 0xff) as f32 / 256.0 - 0.5)));
        let next = dir.join(format!("{tag}-{}", rows_out.len() + 1));
        let t = Instant::now();
        let m = apply_managed(&mut table, &keys, &grads, 0.01, &policy, &next, &mut ahead, None)?;
        let dt = t.elapsed().as_secs_f64();
        total += dt;
        match m.growth {
            Some((g, old)) => {
                guards.push(SegmentGuard::new(&next));
                drop(old);
                growth_s += g.seconds;
                let step_s = median(&mut since);
                let steps_between = since.len() as u64 + 1;
                let row = GrowthRow {
                    step,
                    from: g.from,
                    to: g.to,
                    bytes: g.bytes,
                    rows: table.live_rows(),
                    pause_s: g.seconds,
                    steps_between,
                    step_s,
                    amortised_steps: if step_s > 0.0 { g.seconds / steps_between as f64 / step_s } else { 0.0 },
                };
                row.print(a.json)?;
                rows_out.push(row);
                since.clear();
                // The step's own update, without the pause, counts as a step too.
                all_steps.push(dt - g.seconds);
            }
            None => {
                since.push(dt);
                all_steps.push(dt);
            }
        }
    }
    let s = GrowthSummary {
        steps: step,
        keys: seen,
        rows: table.live_rows(),
        start_slots: h.capacity,
        end_slots: table.capacity(),
        end_bytes: table.header().layout.file_len,
        growths: rows_out.len() as u64,
        evicted: table.counts().evicted,
        total_s: total,
        growth_s,
        median_step_s: median(&mut all_steps),
        worst_amortised_steps: rows_out.iter().map(|r| r.amortised_steps).fold(0.0, f64::max),
    };
    s.print(a.json)?;
    drop(ahead);
    drop(table);
    drop(guards);
    Ok(())
}
