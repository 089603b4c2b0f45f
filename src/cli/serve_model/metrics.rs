//! `GET /metrics` of `ringrec serve-model`: Prometheus text through `prometheus-client`.
//!
//! - `ringrec_serve_model_requests_total{code}`: scoring requests answered, by HTTP status
//! - `ringrec_serve_model_rows_total`: rows scored
//! - `ringrec_serve_model_request_seconds`: scoring requests' latency (histogram)
//! - `ringrec_serve_model_batch_rows`: rows per model batch (histogram; requests coalesced)
//! - `ringrec_serve_model_version`, `ringrec_serve_model_step`: the model served (version 1
//!   at start, +1 per swap) and the step it was trained to
//! - `ringrec_serve_model_loaded_timestamp_seconds`, `ringrec_serve_model_age_seconds`:
//!   when it was loaded, and how long ago (at the scrape)
//! - `ringrec_serve_model_swaps_total`, `ringrec_serve_model_swap_failures_total`

use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::live::Loaded;

/// The service's metrics (each a handle on the value the registry encodes).
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by status code.
    pub requests: Family<Vec<(String, String)>, Counter>,
    /// Rows scored.
    pub rows: Counter,
    /// Request latency, seconds.
    pub latency: Histogram,
    /// Rows per model batch.
    pub batch_rows: Histogram,
    version: Gauge,
    step: Gauge,
    loaded_at: Gauge<f64, AtomicU64>,
    age: Gauge<f64, AtomicU64>,
    /// Models swapped in.
    pub swaps: Counter,
    /// New models that failed to load (the old one kept serving).
    pub swap_failures: Counter,
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Metrics {
    /// Fresh metrics, registered.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            rows: Counter::default(),
            latency: Histogram::new(exponential_buckets(50e-6, 2.0, 16)),
            batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            version: Gauge::default(),
            step: Gauge::default(),
            loaded_at: Gauge::default(),
            age: Gauge::default(),
            swaps: Counter::default(),
            swap_failures: Counter::default(),
        };
        let r = &mut m.registry;
        r.register("ringrec_serve_model_requests", "Scoring requests answered, by HTTP status", m.requests.clone());
        r.register("ringrec_serve_model_rows", "Rows scored", m.rows.clone());
        r.register("ringrec_serve_model_request_seconds", "Latency of scoring requests (seconds)", m.latency.clone());
        r.register("ringrec_serve_model_batch_rows", "Rows per model batch (concurrent requests coalesced)", m.batch_rows.clone());
        r.register("ringrec_serve_model_version", "The model served: 1 at start, +1 per swap", m.version.clone());
        r.register("ringrec_serve_model_step", "The step the model served was trained to", m.step.clone());
        r.register("ringrec_serve_model_loaded_timestamp_seconds", "When the model served was loaded (Unix time)", m.loaded_at.clone());
        r.register("ringrec_serve_model_age_seconds", "Seconds since the model served was loaded", m.age.clone());
        r.register("ringrec_serve_model_swaps", "Newer models swapped in (--watch)", m.swaps.clone());
        r.register("ringrec_serve_model_swap_failures", "Newer models that failed to load (the old one kept serving)", m.swap_failures.clone());
        m
    }

    /// Records `m` as the model served.
    pub fn model_loaded(&self, m: &Loaded) {
        self.version.set(m.version as i64);
        self.step.set(m.step.map_or(-1, |s| s as i64));
        self.loaded_at.set(secs(m.loaded_at));
    }

    /// Counts one answered request of `rows` rows (0 when refused) with status `code`.
    pub fn answered(&self, code: u16, rows: usize, seconds: f64) {
        self.requests.get_or_create(&vec![("code".to_string(), code.to_string())]).inc();
        self.rows.inc_by(rows as u64);
        self.latency.observe(seconds);
    }

    /// The text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        self.age.set((secs(SystemTime::now()) - self.loaded_at.get()).max(0.0));
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
