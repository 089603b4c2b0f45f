//! A `ringrec serve-model` process for tests: started on a free port, called over HTTP,
//! killed when dropped (tests/serve_model.rs, tests/tables_export.rs).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A running `ringrec serve-model`.
pub struct Server {
    child: Child,
    /// Its address (`127.0.0.1:PORT`).
    pub addr: String,
}

impl Server {
    /// Starts it on `model` with flags `more`; waits for its address.
    pub fn start(model: &Path, more: &[&str]) -> Server {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringrec"));
        c.args(["serve-model", "--listen", "127.0.0.1:0", "--threads", "2", "--model"]).arg(model).args(more).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = c.spawn().expect("start ringrec serve-model");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).expect("serve-model printed its address within 60 s");
        Server { child, addr }
    }

    /// (status, body) of a request.
    pub fn call(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
        let a: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into();
        let url = format!("http://{}{path}", self.addr);
        let resp = if method == "GET" {
            let mut r = a.get(&url);
            if let Some(t) = token {
                r = r.header("Authorization", &format!("Bearer {t}"));
            }
            r.call()
        } else {
            let mut r = a.post(&url).header("Content-Type", "application/json");
            if let Some(t) = token {
                r = r.header("Authorization", &format!("Bearer {t}"));
            }
            r.send(body)
        };
        let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().unwrap_or_default())
    }

    /// The probabilities and model version of a 200 answer to `body`.
    pub fn score(&self, token: Option<&str>, body: &Value) -> (Vec<f32>, u64) {
        let (st, text) = self.call("POST", "/v1/score", token, body.to_string().as_bytes());
        assert_eq!(st, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("JSON");
        let p = v["probabilities"].as_array().expect("probabilities").iter().map(|x| x.as_f64().expect("number") as f32).collect();
        (p, v["model"]["version"].as_u64().expect("version"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `n` rows of a multi-hot Parquet file as JSON rows of `serve-model`'s request
/// (read by pyarrow, an independent reader): no dense features, c0..c9 in hex (the model's
/// 10 single-hot fields, read as a Parquet file's strings), the lists by name.
pub fn multi_hot_rows(py: &str, data: &Path, n: usize) -> Vec<Value> {
    let script = r#"
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1]).slice(0, int(sys.argv[2])).to_pylist()
M = (1 << 64) - 1
rows = [{"label": r["label"], "dense": [],
         "sparse": [format(r[f"c{k}"] & M, "x") if r[f"c{k}"] is not None else None for k in range(10)],
         "lists": {f"l{g}": r[f"l{g}"] for g in range(6)}} for r in t]
print(json.dumps(rows))
"#;
    let o = Command::new(py).args(["-c", script]).arg(data).arg(n.to_string()).output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("rows")
}
