//! `GET /metrics` of `ringrec serve` (bearer token required, as for the API): Prometheus
//! text through `prometheus-client`.
//!
//! - `ringrec_serve_jobs{state}`: jobs in each state (every state, 0 included)
//! - `ringrec_serve_submissions_total`: jobs submitted (created and resubmitted)
//! - `ringrec_serve_api_request_seconds{route,method}`: API latency per route (histogram)
//! - `ringrec_job_<field>{job_id}`: every numeric field of each job's last interval report
//!   (`samples_per_sec`, `loss`, `auc`, `table_rows`, bytes moved ..., whatever the report
//!   holds; a nested object's fields joined with `_`), labelled `job_id` (not `job`: that
//!   is the label Prometheus gives every target of a scrape job)

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::service::Service;
use super::state::JobState;

type Labels = Vec<(String, String)>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(100e-6, 2.0, 16))
}

/// The service's own counters (the jobs' values are read at each scrape).
pub struct ServeMetrics {
    /// Jobs submitted.
    pub submissions: Counter,
    /// API latency by route and method.
    pub latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for ServeMetrics {
    fn default() -> Self {
        ServeMetrics { submissions: Counter::default(), latency: Family::new_with_constructor(latency_histogram) }
    }
}

/// `report`'s numeric fields as (metric name suffix, value), nested objects flattened.
fn numeric_fields(prefix: &str, report: &Value, out: &mut Vec<(String, f64)>) {
    let Value::Object(m) = report else { return };
    for (k, v) in m {
        let name: String = format!("{prefix}{k}").chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((name, x));
                }
            }
            Value::Object(_) => numeric_fields(&format!("{name}_"), v, out),
            _ => {}
        }
    }
}

impl ServeMetrics {
    /// Observes one API call of `route` (the matched pattern).
    pub fn observe(&self, route: &str, method: &str, seconds: f64) {
        self.latency.get_or_create(&vec![("route".into(), route.into()), ("method".into(), method.into())]).observe(seconds);
    }

    /// The text exposition, with the jobs as `svc` holds them now.
    pub fn render(&self, svc: &Service) -> Result<String, std::fmt::Error> {
        let mut r = Registry::default();
        r.register("ringrec_serve_submissions", "Jobs submitted (created and resubmitted)", self.submissions.clone());
        r.register("ringrec_serve_api_request_seconds", "Latency of API calls per route (seconds)", self.latency.clone());
        let jobs = svc.last_reports();
        let by_state: Family<Labels, Gauge> = Family::default();
        for s in JobState::ALL {
            by_state.get_or_create(&vec![("state".into(), s.as_str().into())]).set(jobs.iter().filter(|j| j.1 == s).count() as i64);
        }
        r.register("ringrec_serve_jobs", "Jobs in each state", by_state);
        let mut fields: std::collections::BTreeMap<String, Family<Labels, Gauge<f64, AtomicU64>>> = Default::default();
        for (id, _, report) in &jobs {
            let mut values = Vec::new();
            if let Some(rep) = report {
                numeric_fields("", rep, &mut values);
            }
            for (name, x) in values {
                fields.entry(name).or_default().get_or_create(&vec![("job_id".into(), id.to_string())]).set(x);
            }
        }
        for (name, fam) in fields {
            r.register(format!("ringrec_job_{name}"), format!("`{name}` of the job's last interval report"), fam);
        }
        let mut out = String::new();
        encode(&mut out, &r)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_field_of_a_report_is_exported() {
        let mut out = Vec::new();
        numeric_fields("", &serde_json::json!({ "samples_per_sec": 1.5e5, "loss": 0.45, "phase": "train", "traffic": { "bytes-sent": 10 }, "ok": true }), &mut out);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(out, vec![("loss".to_string(), 0.45), ("samples_per_sec".to_string(), 1.5e5), ("traffic_bytes_sent".to_string(), 10.0)]);
    }
}
