//! `RINGREC_TIMELINE=path`: a Chrome trace (JSON array format) of every tensor's phases,
//! for chrome://tracing or Perfetto, in the manner of Horovod's timeline.
//!
//! Rank 0 writes it. One row (`tid`) per tensor name, named by a metadata event; phases
//! are complete events (`"ph": "X"`): `NEGOTIATE` (submitted until every rank agreed),
//! `QUEUE` (agreed until its collective started), then the collective's own steps:
//! `MEMCPY_IN_FUSION_BUFFER`, the reduction (`ALLREDUCE`, or `ALLGATHER`/`BROADCAST`),
//! `MEMCPY_OUT_FUSION_BUFFER`. A fused allreduce on a backend that reduces the tensors in
//! place (`shm`) has no copies: its only step is `ALLREDUCE`. Compressed reductions show
//! `COMPRESS` / `DECOMPRESS` instead of the copies.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

/// An open trace file.
pub struct Timeline {
    out: BufWriter<File>,
    start: Instant,
    pid: usize,
    rows: HashMap<String, usize>,
    closed: bool,
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl Timeline {
    /// Creates `path` (truncating it); events are timed from now.
    pub fn create(path: &Path, rank: usize) -> std::io::Result<Timeline> {
        let mut out = BufWriter::new(crate::fileio::create_private(path, false)?);
        out.write_all(b"[\n")?;
        Ok(Timeline { out, start: Instant::now(), pid: rank, rows: HashMap::new(), closed: false })
    }

    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64() * 1e6
    }

    fn row(&mut self, tensor: &str) -> std::io::Result<usize> {
        if let Some(r) = self.rows.get(tensor) {
            return Ok(*r);
        }
        let r = self.rows.len() + 1;
        self.rows.insert(tensor.to_string(), r);
        writeln!(self.out, "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {r}, \"args\": {{\"name\": {}}}}},", self.pid, json_str(tensor))?;
        writeln!(self.out, "{{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": {}, \"tid\": {r}, \"args\": {{\"sort_index\": {r}}}}},", self.pid)?;
        Ok(r)
    }

    /// Records phase `phase` of `tensor` from `from` to `to`; `args` is a JSON object or empty.
    pub fn span(&mut self, tensor: &str, phase: &str, from: Instant, to: Instant, args: &str) -> std::io::Result<()> {
        let tid = self.row(tensor)?;
        let ts = self.us(from);
        let dur = (self.us(to) - ts).max(0.0);
        let args = if args.is_empty() { "{}" } else { args };
        writeln!(self.out, "{{\"name\": {}, \"cat\": {}, \"ph\": \"X\", \"ts\": {ts:.3}, \"dur\": {dur:.3}, \"pid\": {}, \"tid\": {tid}, \"args\": {args}}},", json_str(phase), json_str(tensor), self.pid)
    }

    /// Writes buffered events out.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Ends the JSON array. Also done on drop.
    pub fn close(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        // A final metadata event, so the array needs no trailing-comma fix-up.
        writeln!(self.out, "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"args\": {{\"name\": \"ringrec rank {}\"}}}}\n]", self.pid, self.pid)?;
        self.out.flush()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_valid_chrome_trace_json() {
        let dir = std::env::temp_dir().join(format!("ringrec-tl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        let mut t = Timeline::create(&path, 0).unwrap();
        let a = Instant::now();
        let b = a + std::time::Duration::from_micros(250);
        t.span("layer\"1", "NEGOTIATE", a, b, "").unwrap();
        t.span("layer\"1", "ALLREDUCE", b, b, "{\"fused\": 2}").unwrap();
        t.span("other", "QUEUE", a, b, "").unwrap();
        drop(t);
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let ev = v.as_array().unwrap();
        let spans: Vec<_> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[0]["cat"], "layer\"1");
        assert_eq!(spans[0]["dur"].as_f64().unwrap(), 250.0);
        assert_eq!(spans[1]["args"]["fused"], 2);
        assert_eq!(spans[0]["tid"], spans[1]["tid"]);
        assert_ne!(spans[0]["tid"], spans[2]["tid"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
