//! A real Prometheus (the distribution's `prometheus` package; `scripts/setup.sh --tests`
//! installs it) scrapes `ringrec serve` and `ringrec serve-model` on the loopback every
//! second, with their bearer token, and gives back through its HTTP API (`/api/v1/query`)
//! what they export: a finished training job's last interval report (samples/s, loss,
//! AUC, table rows, bytes moved) equal to the job's own record, the jobs by state and the
//! submissions, and serve-model's request and row counters equal to what this test sent.
//!
//! Without the `prometheus` binary the test prints `skipped: <reason>`, except under CI
//! (`CI=true`), where it fails.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{json, Value};

fn ringrec() -> &'static str {
    env!("CARGO_BIN_EXE_ringrec")
}

/// The `prometheus` binary, or why there is none.
fn prometheus() -> Result<PathBuf, String> {
    let found = Command::new("sh").args(["-c", "command -v prometheus || { test -x /usr/bin/prometheus && echo /usr/bin/prometheus; }"]).output().map_err(|e| format!("running sh: {e}"))?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    if found.status.success() && !path.is_empty() {
        return Ok(PathBuf::from(path));
    }
    Err("prometheus is not installed (scripts/setup.sh --tests installs the distribution's `prometheus` package)".into())
}

/// A child process killed on drop (its output in `log`, printed when the test fails).
struct Proc {
    child: Child,
    log: Option<PathBuf>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let (true, Some(log)) = (std::thread::panicking(), &self.log) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("---- the end of {} ----\n{}", log.display(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }
}

/// Starts `ringrec ARGS --listen 127.0.0.1:0` and waits for the address it prints.
fn start_service(args: &[&str]) -> (Proc, String) {
    let mut c = Command::new(ringrec());
    c.args(args).args(["--listen", "127.0.0.1:0"]).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("starting ringrec {}: {e}", args[0]));
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let (false, Some(rest)) = (sent, line.split("listening on http://").nth(1)) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                sent = true;
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("ringrec {} printed its address within 60 s", args[0]));
    (Proc { child, log: None }, addr)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into()
}

/// (status, body) of `GET url` or, with a body, `POST url`.
fn call(url: &str, token: &str, body: Option<&Value>) -> (u16, String) {
    let a = agent();
    let auth = format!("Bearer {token}");
    let resp = match body {
        None => a.get(url).header("Authorization", &auth).call(),
        Some(b) => a.post(url).header("Authorization", &auth).header("Content-Type", "application/json").send(b.to_string().as_bytes()),
    };
    let mut resp = resp.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

/// Polls `f` every 250 ms until it gives a value or `secs` pass (then panics with `what`
/// and the last thing `f` saw).
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}; last: {last}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A free port on the loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The value of the one series `query` selects, through Prometheus's HTTP API.
fn query(prom: &str, q: &str) -> Result<f64, String> {
    let mut resp = agent().get(format!("http://{prom}/api/v1/query")).query("query", q).call().map_err(|e| format!("{q}: {e}"))?;
    let text = resp.body_mut().read_to_string().map_err(|e| format!("{q}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{q}: {e}: {text}"))?;
    match v["data"]["result"].as_array().map(Vec::as_slice) {
        Some([one]) => one["value"][1].as_str().and_then(|s| s.parse().ok()).ok_or_else(|| format!("{q}: {text}")),
        _ => Err(format!("{q}: not one series yet: {text}")),
    }
}

/// Waits until Prometheus gives `want` for `q` (exactly: the exposition and the API both
/// print a float in its shortest round-trip form).
fn expect(prom: &str, q: &str, want: f64) {
    wait_for(60, &format!("{q} == {want}"), || match query(prom, q) {
        Ok(got) if got == want => Ok(()),
        Ok(got) => Err(format!("{q} = {got}")),
        Err(e) => Err(e),
    });
}

fn synth(dir: &Path, rows: u64) -> PathBuf {
    let out = dir.join("data.tsv");
    let st = Command::new(ringrec()).args(["data", "synth", "--rows", &rows.to_string(), "--out"]).arg(&out).stdout(Stdio::null()).status().expect("ringrec data synth");
    assert!(st.success(), "data synth failed");
    out
}

#[test]
fn prometheus_scrapes_both_services() {
    let prom_bin = match prometheus() {
        Ok(p) => p,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI=true and {why}"),
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = TempDir::new("prometheus");
    let data = dir.path("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let tsv = synth(&data, 4000);
    let state = dir.path("state");
    let o = Command::new(ringrec()).args(["serve", "token", "add", "prom", "--state-dir"]).arg(&state).output().expect("token add");
    assert!(o.status.success(), "token add: {}", String::from_utf8_lossy(&o.stderr));
    let token = String::from_utf8_lossy(&o.stdout).lines().last().and_then(|l| l.split_whitespace().last()).expect("a token").to_string();
    let state_s = state.to_str().expect("utf-8 path");

    // A real short training job through the local back end, checkpointing.
    let (_serve, serve) = start_service(&["serve", "--state-dir", state_s, "--data-root", data.to_str().expect("utf-8 path"), "--no-slurm", "--local-slots", "1", "--local-nice", "0", "--poll-ms", "200"]);
    let spec = json!({"backend": "local", "ranks": 1, "threads": 1, "data": "data.tsv", "batch": 256, "epochs": 1, "eval_every": 5, "checkpoint_every": 5, "hidden": [16, 8], "args": ["--table-capacity", "65536"]});
    let (st, body) = call(&format!("http://{serve}/api/jobs"), &token, Some(&spec));
    assert_eq!(st, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).expect("JSON")["id"].as_i64().expect("an id");
    let job = wait_for(300, &format!("job {id} to succeed"), || {
        let (_, body) = call(&format!("http://{serve}/api/jobs/{id}"), &token, None);
        let j: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        match j["state"].as_str() {
            Some("succeeded") => Ok(j),
            Some(s @ ("failed" | "stopped" | "submit_failed")) => panic!("job {id} ended {s}: {j:#}"),
            s => Err(format!("state {s:?}")),
        }
    });
    let report = job["last_metrics"].clone();
    assert!(report["samples_per_sec"].as_f64().is_some_and(|x| x > 0.0), "the job's last interval report: {report}");

    // serve-model on the job's checkpoints, with the same tokens; requests of known sizes.
    let ck = state.join("jobs").join(id.to_string()).join("ckpt");
    let (_model, scorer) = start_service(&["serve-model", "--model", ck.to_str().expect("utf-8 path"), "--state-dir", state_s, "--threads", "1"]);
    let lines: Vec<String> = std::fs::read_to_string(&tsv).expect("data").lines().take(10).map(str::to_string).collect();
    let url = format!("http://{scorer}/v1/score");
    let sizes = [1usize, 4, 10];
    for n in sizes {
        let (st, body) = call(&url, &token, Some(&json!({ "tsv": lines[..n] })));
        assert_eq!(st, 200, "{body}");
    }
    let (st, body) = call(&url, &token, Some(&json!({ "tsv": ["1\t2"] })));
    assert_eq!(st, 400, "{body}");

    // Prometheus, scraping both every second with the bearer token.
    let prom = format!("127.0.0.1:{}", free_port());
    let config = dir.path("prometheus.yml");
    let scrape = |name: &str, target: &str| format!("  - job_name: {name}\n    authorization: {{type: Bearer, credentials: \"{token}\"}}\n    static_configs: [{{targets: [\"{target}\"]}}]\n");
    let yml = format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}", scrape("ringrec-serve", &serve), scrape("ringrec-serve-model", &scorer));
    std::fs::write(&config, yml).expect("write prometheus.yml");
    let log = dir.path("prometheus.log");
    let out = std::fs::File::create(&log).expect("log");
    let child = Command::new(&prom_bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path("tsdb").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start prometheus");
    let _prom = Proc { child, log: Some(log) };

    for target in ["ringrec-serve", "ringrec-serve-model"] {
        expect(&prom, &format!("up{{job=\"{target}\"}}"), 1.0);
    }
    // The job's last interval report, as its own record has it.
    let sel = format!("{{job=\"ringrec-serve\",job_id=\"{id}\"}}");
    for field in ["samples_per_sec", "train_loss", "eval_auc", "table_rows", "dense_bytes_reduced", "sparse_bytes_intra_host"] {
        let want = report[field].as_f64().unwrap_or_else(|| panic!("{field} in the job's report: {report}"));
        expect(&prom, &format!("ringrec_job_{field}{sel}"), want);
    }
    expect(&prom, "ringrec_serve_jobs{state=\"succeeded\"}", 1.0);
    expect(&prom, "ringrec_serve_jobs{state=\"running\"}", 0.0);
    expect(&prom, "ringrec_serve_submissions_total", 1.0);
    // This test's polls of the job, under the route's pattern.
    expect(&prom, "count(ringrec_serve_api_request_seconds_count{route=~\".*/jobs/.id.\",method=\"GET\"} > 0)", 1.0);
    // serve-model's counters: what this test sent.
    expect(&prom, "ringrec_serve_model_requests_total{code=\"200\"}", sizes.len() as f64);
    expect(&prom, "ringrec_serve_model_requests_total{code=\"400\"}", 1.0);
    expect(&prom, "ringrec_serve_model_rows_total", sizes.iter().sum::<usize>() as f64);
    expect(&prom, "ringrec_serve_model_request_seconds_count", (sizes.len() + 1) as f64);
    expect(&prom, "ringrec_serve_model_version", 1.0);
    let step = job["summary"]["global_step"].as_f64().or_else(|| job["summary"]["steps"].as_f64()).expect("the job's steps");
    expect(&prom, "ringrec_serve_model_step", step);
}
