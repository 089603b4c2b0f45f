//! `ringrec serve-model` against a real server: its scores are `ringrec predict`'s bit for
//! bit (JSON rows and TSV lines, keys the table lacks included), bad requests get a 4xx
//! naming the field, tokens are required when configured, concurrent requests coalesced
//! into shared batches still get predict's bits, a full queue refuses with 503, and a model
//! swap under concurrent requests drops none and answers each with the model that scored
//! it, bit for bit.

mod common;
#[path = "common/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::{json, Value};
use server::{multi_hot_rows, Server};

fn ringrec() -> &'static str {
    env!("CARGO_BIN_EXE_ringrec")
}

/// `ringrec ARGS` (one rank; a `train` on [`common::SMALL_TABLE`]), the data cache under
/// `dir`; must succeed.
fn run(dir: &TempDir, args: &[&str]) -> String {
    let data = dir.path("cache");
    let job = common::mpirun(1, &[("RINGREC_DATA_DIR", data.to_str().expect("utf8"))], &common::small_table(args));
    job.assert_ok();
    job.stdout.clone()
}

fn synth(dir: &TempDir, rows: u64) -> PathBuf {
    let p = dir.path("d.tsv");
    common::synth(&p, rows);
    p
}

fn train(dir: &TempDir, data: &Path, ck: &Path, steps: u32, resume: bool) {
    let (d, c, s) = (data.to_str().expect("utf8"), ck.to_str().expect("utf8"), steps.to_string());
    let mut args = vec!["train", "--data", d, "--batch", "200", "--max-steps", &s, "--checkpoint-dir", c, "--threads", "2", "--no-progress"];
    if resume {
        args.push("--resume");
    }
    run(dir, &args);
}

/// `predict`'s scores of `data` with `--batch batch` (as f32, in row order).
fn predict(dir: &TempDir, model: &Path, data: &Path, batch: usize) -> Vec<f32> {
    let out = dir.path(&format!("scores-{}.tsv", data.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    run(dir, &["predict", "--model", model.to_str().expect("utf8"), "--data", data.to_str().expect("utf8"), "--batch", &batch.to_string(), "--threads", "2", "--out", out.to_str().expect("utf8")]);
    common::read_scores(&out)
}

fn lines(path: &Path, n: usize) -> Vec<String> {
    std::fs::read_to_string(path).expect("data").lines().take(n).map(str::to_string).collect()
}

/// A TSV line as a JSON row.
fn row_of(line: &str) -> Value {
    let f: Vec<&str> = line.split('\t').collect();
    let dense: Vec<Value> = f[1..14].iter().map(|x| if x.is_empty() { Value::Null } else { json!(x.parse::<i64>().expect("integer")) }).collect();
    let sparse: Vec<Value> = f[14..].iter().map(|x| if x.is_empty() { Value::Null } else { json!(x) }).collect();
    json!({ "label": f[0].parse::<u8>().expect("label"), "dense": dense, "sparse": sparse })
}

fn token(state: &Path) -> String {
    let o = Command::new(ringrec()).args(["serve", "token", "add", "alice", "--state-dir"]).arg(state).output().expect("token add");
    assert!(o.status.success(), "token add: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().last().and_then(|l| l.split_whitespace().last()).expect("a token").to_string()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn scores_equal_predicts_and_bad_requests_are_refused() {
    let dir = TempDir::new("serve-model-scores");
    let data = synth(&dir, 2000);
    let ck = dir.path("ck");
    train(&dir, &data, &ck, 5, false);
    // 320 rows: 5 batches of 64, as predict --batch 64 cuts the file's first 320 rows.
    let first = lines(&data, 320);
    let want = predict(&dir, &ck, &data, 64);
    // Keys no row of the training data has: the table lacks them, they score with their
    // initial rows, as in predict.
    let unseen: Vec<String> = first[..64]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut f: Vec<String> = l.split('\t').map(str::to_string).collect();
            f[14] = format!("{:x}", 0xdead_beef_0000_0000u64 + i as u64);
            f[20] = format!("{:x}", 0xfeed_f00d_0000_0000u64 + i as u64);
            f.join("\t")
        })
        .collect();
    let unseen_tsv = dir.path("unseen.tsv");
    std::fs::write(&unseen_tsv, unseen.join("\n") + "\n").expect("write");
    let want_unseen = predict(&dir, &ck, &unseen_tsv, 64);

    let state = dir.path("state");
    let tok = token(&state);
    let s = Server::start(&ck, &["--max-batch", "64", "--max-body", "1000000", "--state-dir", state.to_str().expect("utf8")]);
    let t = Some(tok.as_str());
    let (tsv, v) = s.score(t, &json!({ "tsv": first }));
    assert_eq!(v, 1);
    assert_eq!(bits(&tsv), bits(&want[..320]), "TSV lines score as predict does, bit for bit");
    let rows: Vec<Value> = first.iter().map(|l| row_of(l)).collect();
    let (js, _) = s.score(t, &json!({ "rows": rows }));
    assert_eq!(bits(&js), bits(&want[..320]), "JSON rows score as predict does, bit for bit");
    let (un, _) = s.score(t, &json!({ "tsv": unseen }));
    assert_eq!(bits(&un), bits(&want_unseen), "keys the table lacks score with their initial rows, as in predict");

    // Refusals.
    let (st, text) = s.call("POST", "/v1/score", None, b"{}");
    assert_eq!(st, 401, "no token: {text}");
    let (st, _) = s.call("POST", "/v1/score", Some("wrong"), json!({ "tsv": [first[0]] }).to_string().as_bytes());
    assert_eq!(st, 401, "a wrong token");
    let mut bad = row_of(&first[0]);
    bad["sparse"][3] = json!("not-hex");
    for (body, field) in [
        (json!({ "rows": [row_of(&first[0]), bad] }), "rows[1].sparse[3] (C4)"),
        (json!({ "rows": [{ "dense": [1], "sparse": [] }] }), "rows[0].dense: 1 values"),
        (json!({ "tsv": ["1\t2\t3"] }), "tsv[0]:"),
        (json!({ "rows": [], "tsv": [] }), "no rows"),
        (json!({ "row": [] }), "unknown field `row`"),
    ] {
        let (st, text) = s.call("POST", "/v1/score", t, body.to_string().as_bytes());
        assert_eq!(st, 400, "{body}: {text}");
        let msg = serde_json::from_str::<Value>(&text).expect("JSON error")["error"].as_str().expect("error").to_string();
        assert!(msg.contains(field), "{msg:?} names {field:?}");
    }
    let (st, _) = s.call("POST", "/v1/score", t, &vec![b' '; 2_000_000]);
    assert_eq!(st, 413, "a body over --max-body");
    let (st, metrics) = s.call("GET", "/metrics", t, b"");
    assert_eq!(st, 200);
    assert!(metrics.contains("ringrec_serve_model_rows_total 704"), "{metrics}");
    assert!(metrics.contains("ringrec_serve_model_requests_total{code=\"200\"} 3"), "{metrics}");

    // Concurrent requests of other sizes and offsets, coalesced into shared batches: each
    // row still gets predict's bits (which rows share a batch changes no row's score).
    let s = Arc::new(s);
    let (first, want) = (Arc::new(first), Arc::new(want));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (s, first, want, tok) = (s.clone(), first.clone(), want.clone(), tok.clone());
            std::thread::spawn(move || {
                for i in 0..12 {
                    let (at, n) = ((c * 37 + i * 11) % 300, 1 + (c + i) % 7);
                    let (got, _) = s.score(Some(&tok), &json!({ "tsv": first[at..at + n] }));
                    assert_eq!(bits(&got), bits(&want[at..at + n]), "rows {at}..{} scored in a shared batch equal predict's bit for bit", at + n);
                }
            })
        })
        .collect();
    clients.into_iter().for_each(|c| c.join().expect("client"));
    let (_, metrics) = s.call("GET", "/metrics", t, b"");
    let coalesced = metrics.lines().find(|l| l.starts_with("ringrec_serve_model_batch_rows_count")).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<u64>().ok()).expect("batch count");
    eprintln!("{coalesced} model batches for {} requests", 3 + 8 * 12);
}

#[test]
fn a_full_queue_refuses_with_503() {
    let dir = TempDir::new("serve-model-queue");
    let data = synth(&dir, 2000);
    let ck = dir.path("ck");
    train(&dir, &data, &ck, 5, false);
    let all = lines(&data, 2000);
    let s = Arc::new(Server::start(&ck, &["--max-queue", "1", "--max-batch", "64", "--max-body", "64000000"]));
    // A long request keeps the scoring thread busy; single rows pile up behind it.
    let big: Vec<&String> = all.iter().cycle().take(40_000).collect();
    let big_body = json!({ "tsv": big }).to_string();
    let done = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (s, done, one) = (s.clone(), done.clone(), json!({ "tsv": [all[0]] }).to_string());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    got.push(s.call("POST", "/v1/score", None, one.as_bytes()));
                }
                got
            })
        })
        .collect();
    // The clients may have filled the queue first (a loaded machine): then it too is
    // refused, and sent again.
    let mut big_refused = 0;
    let (st, text) = loop {
        let (st, text) = s.call("POST", "/v1/score", None, big_body.as_bytes());
        if st != 503 {
            break (st, text);
        }
        assert!(text.contains("the scoring queue is full"), "{text}");
        big_refused += 1;
    };
    done.store(true, Ordering::Relaxed);
    assert_eq!(st, 200, "the long request itself is scored");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["probabilities"].as_array().map(Vec::len), Some(40_000));
    let (mut ok, mut full) = (0, 0);
    for c in clients {
        for (st, text) in c.join().expect("client") {
            match st {
                200 => ok += 1,
                503 => {
                    assert!(text.contains("the scoring queue is full") && text.contains("--max-queue"), "{text}");
                    full += 1;
                }
                _ => panic!("{st}: {text}"),
            }
        }
    }
    eprintln!("{ok} answered, {full} refused while the long request was scored");
    assert!(full > 0, "some of 8 clients' requests found the queue of 1 full ({ok} answered)");
    let (_, metrics) = s.call("GET", "/metrics", None, b"");
    assert!(metrics.contains(&format!("ringrec_serve_model_requests_total{{code=\"503\"}} {}", full + big_refused)), "{metrics}");
}

#[test]
fn a_swap_under_concurrent_requests_drops_none_and_answers_with_each_model() {
    let dir = TempDir::new("serve-model-swap");
    let data = synth(&dir, 2000);
    let ck = dir.path("ck");
    train(&dir, &data, &ck, 5, false);
    let line = lines(&data, 1).remove(0);
    let s = Arc::new(Server::start(&ck, &["--watch", "--watch-secs", "0.2", "--max-wait-us", "500"]));
    let body = json!({ "tsv": [line] });
    let (a, v) = s.score(None, &body);
    assert_eq!(v, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (s, stop, body) = (s.clone(), stop.clone(), body.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let (st, text) = s.call("POST", "/v1/score", None, body.to_string().as_bytes());
                    got.push((st, text));
                }
                got
            })
        })
        .collect();
    // A newer checkpoint appears while the clients score.
    train(&dir, &data, &ck, 10, true);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = s.score(None, &body);
        if v == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no swap within 60 s of the new checkpoint");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (b, _) = s.score(None, &body);
    assert!((a[0] - b[0]).abs() > 1e-5, "the two models score the row apart ({} and {})", a[0], b[0]);
    let (mut n, mut versions) = (0, std::collections::BTreeSet::new());
    for c in clients {
        for (st, text) in c.join().expect("client") {
            assert_eq!(st, 200, "no request fails across the swap: {text}");
            let v: Value = serde_json::from_str(&text).expect("JSON");
            let (p, ver) = (v["probabilities"][0].as_f64().expect("p") as f32, v["model"]["version"].as_u64().expect("version"));
            let want = if ver == 1 { a[0] } else { b[0] };
            assert_eq!(p.to_bits(), want.to_bits(), "version {ver} answered {p}, its model scores {want}");
            versions.insert(ver);
            n += 1;
        }
    }
    assert!(n > 0 && versions.contains(&1), "{n} answers, versions {versions:?}");
    let (_, metrics) = s.call("GET", "/metrics", None, b"");
    assert!(metrics.contains("ringrec_serve_model_swaps_total 1"), "{metrics}");
    assert!(metrics.contains("ringrec_serve_model_version 2"), "{metrics}");
}

/// A Parquet file of other rows than Criteo's (written by pyarrow, the tests' venv): a
/// float `price`, an integer `count` (dense features), strings `item`, `user` and an integer
/// `shop` named categorical — 2 dense and 3 categorical fields; and its rows as JSON.
const PYARROW_SHAPED: &str = r#"
import sys, json, numpy as np, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
rng = np.random.default_rng(3)
n = 1200
item, user, shop = rng.integers(0, 30, n), rng.integers(0, 50, n), rng.integers(0, 7, n)
price, count = rng.normal(0, 1, n), rng.integers(-2, 40, n)
label = (rng.random(n) < 1 / (1 + np.exp(-(item % 3 - 1.0 + price)))).astype(np.int64)
t = {"label": label, "price": price, "count": count, "item": [f"i{v}" for v in item], "user": [f"{v:x}" for v in user], "shop": shop}
pq.write_table(pa.table(t), f"{d}/shaped.parquet", row_group_size=500)
rows = [{"dense": [float(price[i]), int(count[i])], "sparse": [f"i{item[i]}", f"{user[i]:x}", int(shop[i])]} for i in range(n)]
json.dump(rows, open(f"{d}/shaped.json", "w"))
"#;

#[test]
fn a_model_of_another_shape_scores_json_rows_of_its_shape_as_predict_does() {
    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    let dir = TempDir::new("serve-model-shaped");
    assert!(Command::new(&py).args(["-c", PYARROW_SHAPED]).arg(dir.path("")).status().expect("python").success(), "the pyarrow script failed");
    let (data, ck) = (dir.path("shaped.parquet"), dir.path("ck"));
    let (d, c) = (data.to_str().expect("utf8"), ck.to_str().expect("utf8"));
    run(&dir, &["train", "--data", d, "--dense-columns", "price,count", "--sparse-columns", "item,user,shop", "--batch", "200", "--max-steps", "5", "--checkpoint-dir", c, "--threads", "2", "--no-progress"]);
    let out = dir.path("scores.tsv");
    run(&dir, &["predict", "--model", c, "--data", d, "--dense-columns", "price,count", "--sparse-columns", "item,user,shop", "--batch", "64", "--threads", "2", "--out", out.to_str().expect("utf8")]);
    let want = common::read_scores(&out);
    let rows: Vec<Value> = serde_json::from_slice(&std::fs::read(dir.path("shaped.json")).expect("rows")).expect("JSON");
    let s = Server::start(&ck, &["--max-batch", "64"]);
    let (got, _) = s.score(None, &json!({ "rows": rows[..320] }));
    assert_eq!(bits(&got), bits(&want[..320]), "serve-model scores the rows as predict does");
    // Criteo rows and lines do not fit the model: refused, naming its shape.
    let (st, text) = s.call("POST", "/v1/score", None, json!({ "rows": [row_of(&["0"; 40].join("\t"))] }).to_string().as_bytes());
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("rows[0].dense: 13 values, expected 2 numbers or null"), "{text}");
    let (st, text) = s.call("POST", "/v1/score", None, json!({ "tsv": ["1"] }).to_string().as_bytes());
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("the model takes rows of 2 dense and 3 single-hot categorical fields, not Criteo lines"), "{text}");
}

/// A schema file giving the shaped file's dense columns mixed transforms: `price` (a float)
/// `log`, `count` (an integer) `none`, `age` (an integer) the default; its `[dense]` table
/// lists them in another order than the file's (price, count, age).
const MIXED_SCHEMA: &str = "sparse = [\"item\", \"user\", \"shop\"]\n[dense]\nprice = \"log\"\ncount = \"none\"\nage = {}\n";

#[test]
fn a_schemas_mixed_transforms_score_json_rows_as_predict_and_the_bundle_reader_do() {
    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    let dir = TempDir::new("serve-model-transforms");
    let script = PYARROW_SHAPED.replace("\"count\": count,", "\"count\": count, \"age\": rng.integers(0, 90, n),").replace("int(count[i])]", "int(count[i]), int(t[\"age\"][i])]");
    assert!(Command::new(&py).args(["-c", &script]).arg(dir.path("")).status().expect("python").success(), "the pyarrow script failed");
    std::fs::write(dir.path("schema.toml"), MIXED_SCHEMA).expect("schema");
    let (data, ck, bundle, out, schema) = (dir.path("shaped.parquet"), dir.path("ck"), dir.path("bundle"), dir.path("scores.tsv"), dir.path("schema.toml"));
    let [d, c, b, o, sc] = [&data, &ck, &bundle, &out, &schema].map(|p| p.to_str().expect("utf8"));
    run(&dir, &["train", "--data", d, "--schema", sc, "--batch", "200", "--max-steps", "5", "--checkpoint-dir", c, "--threads", "2", "--no-progress"]);
    run(&dir, &["predict", "--model", c, "--data", d, "--schema", sc, "--batch", "64", "--threads", "2", "--out", o]);
    let want: Vec<f32> = std::fs::read_to_string(&out).expect("scores").lines().map(|l| l.split('\t').next().and_then(|s| s.parse().ok()).expect("score")).collect();
    // The checkpoint records the dense columns in their slots' order, with their transforms.
    run(&dir, &["export", "--model", c, "--out", b]);
    let model: Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).expect("model.json")).expect("JSON");
    assert_eq!(model["input"]["schema"]["dense"], json!(["price", "count", "age"]), "{}", model["input"]);
    assert_eq!(model["input"]["schema"]["transforms"], json!([["count", "none"], ["price", "log"]]), "{}", model["input"]);
    // The rows as JSON: dense [price, count, age], the file's order (the model's slots).
    let rows: Vec<Value> = serde_json::from_slice(&std::fs::read(dir.path("shaped.json")).expect("rows")).expect("JSON");
    for m in [&ck, &bundle] {
        let s = Server::start(m, &["--max-batch", "64"]);
        let (got, _) = s.score(None, &json!({ "rows": rows[..320] }));
        assert_eq!(bits(&got), bits(&want[..320]), "{}: serve-model applies each column's transform as predict does", m.display());
    }
    // scripts/bundle_predict.py reads the file with the same transforms.
    let mut cmd = Command::new(&py);
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bundle_predict.py")).arg(&bundle).arg(&data).arg("--compare").arg(&out).args(["--tolerance", "1e-6"]);
    common::run_with_timeout(cmd, Duration::from_secs(120)).assert_ok();
    // A resume with the schema file (its own order) is the same run.
    run(&dir, &["train", "--data", d, "--schema", sc, "--batch", "200", "--max-steps", "7", "--checkpoint-dir", c, "--threads", "2", "--no-progress", "--resume"]);
}

/// The generated multi-hot set's columns, all categorical (its ids are integers).
const MULTI_HOT_SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";

#[test]
fn a_multi_hot_models_rows_score_as_predict_in_the_server_and_the_bundle_reader() {
    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    let dir = TempDir::new("serve-model-multihot");
    let data = dir.path("mh.parquet");
    ringrec::data::multihot::synth_multi_hot_cut(&data, 2000, 5, None).expect("synth");
    let (ck, bundle, scores) = (dir.path("ck"), dir.path("bundle"), dir.path("scores.tsv"));
    let (d, c, b, sc) = (data.to_str().expect("utf8"), ck.to_str().expect("utf8"), bundle.to_str().expect("utf8"), scores.to_str().expect("utf8"));
    run(&dir, &["train", "--data", d, "--sparse-columns", MULTI_HOT_SPARSE, "--batch", "200", "--max-steps", "4", "--hidden", "16", "--multi-hot-pooling", "l1=mean,l4=mean", "--checkpoint-dir", c, "--threads", "2", "--no-progress"]);
    // predict takes the pooling from the checkpoint.
    run(&dir, &["predict", "--model", c, "--data", d, "--sparse-columns", MULTI_HOT_SPARSE, "--batch", "64", "--threads", "2", "--out", sc]);
    let want = common::read_scores(&scores);
    run(&dir, &["export", "--model", c, "--out", b]);
    let model: Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).expect("model.json")).expect("JSON");
    let fields: Vec<(&str, &str)> = model["input"]["multi_hot"].as_array().expect("input.multi_hot").iter().map(|f| (f["name"].as_str().expect("name"), f["pooling"].as_str().expect("pooling"))).collect();
    assert_eq!(fields, [("l0", "sum"), ("l1", "mean"), ("l2", "sum"), ("l3", "sum"), ("l4", "mean"), ("l5", "sum")]);
    // The input counts the model's own single-hot fields (c0..c9), the lists salted after 26.
    assert_eq!((&model["input"]["dense_features"], &model["input"]["categorical_features"]), (&json!(0), &json!(10)));
    let salts: Vec<u64> = model["input"]["multi_hot"].as_array().expect("input.multi_hot").iter().map(|f| f["field"].as_u64().expect("field")).collect();
    assert_eq!(salts, [26, 27, 28, 29, 30, 31]);

    // scripts/bundle_predict.py (numpy, pyarrow) pools the lists as ringrec does.
    common::compare_with_predict(&py, "bundle_predict.py", &[b, d], &scores, "1e-6");

    // The server, from the checkpoint and from the bundle: predict's bits for JSON rows with
    // their lists (320 rows: 5 batches of 64, as predict cut them).
    let rows = multi_hot_rows(&py, &data, 320);
    for model in [&ck, &bundle] {
        let s = Server::start(model, &["--max-batch", "64", "--max-body", "10000000"]);
        let (got, _) = s.score(None, &json!({ "rows": rows }));
        assert_eq!(bits(&got), bits(&want[..320]), "{}: JSON rows with lists score as predict does, bit for bit", model.display());
        let (st, text) = s.call("GET", "/v1/model", None, b"");
        assert!(st == 200 && text.contains("\"multi_hot\":[\"l0\",\"l1\",\"l2\",\"l3\",\"l4\",\"l5\"]"), "{text}");
        let refused = |body: Value, says: &str| {
            let (st, text) = s.call("POST", "/v1/score", None, body.to_string().as_bytes());
            assert!(st == 400 && text.contains(says), "{st} {text}, expected {says:?}");
        };
        let mut r = rows[0].clone();
        r["lists"].as_object_mut().expect("lists").remove("l3");
        refused(json!({ "rows": [r] }), "rows[0].lists.l3: missing");
        let mut r = rows[0].clone();
        r["sparse"][2] = json!(["1", "2"]);
        refused(json!({ "rows": [r] }), "rows[0].sparse[2] (field 2): a list where one id is expected");
        let mut r = rows[0].clone();
        r["lists"]["l0"] = json!([["1"]]);
        refused(json!({ "rows": [r] }), "rows[0].lists.l0[0]: [\\\"1\\\"] is not an id");
        refused(json!({ "tsv": ["0\t1"] }), "tsv: a Criteo line has no multi-hot fields");
    }
}

/// A Parquet file of 2 float dense columns, 28 string categorical columns and 2 lists of
/// int64 ids (written by pyarrow), and its rows as JSON with their lists.
const PYARROW_WIDE_LISTS: &str = r#"
import sys, json, numpy as np, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
rng = np.random.default_rng(5)
n = 600
dense = {f"d{k}": rng.normal(0, 1, n) for k in range(2)}
cats = {f"c{k}": [f"v{v}" for v in rng.integers(0, 20, n)] for k in range(28)}
lists = {f"l{g}": [[int(v) for v in rng.integers(0, 40, rng.integers(0, 5))] for _ in range(n)] for g in range(2)}
label = (rng.random(n) < 0.4).astype(np.int64)
t = {"label": label, **dense, **cats, **{g: pa.array(l, pa.list_(pa.int64())) for g, l in lists.items()}}
pq.write_table(pa.table(t), f"{d}/wide.parquet", row_group_size=250)
rows = [{"dense": [float(dense[f"d{k}"][i]) for k in range(2)], "sparse": [cats[f"c{k}"][i] for k in range(28)], "lists": {g: l[i] for g, l in lists.items()}} for i in range(n)]
json.dump(rows, open(f"{d}/wide.json", "w"))
"#;

#[test]
fn a_multi_hot_model_of_more_than_26_single_hot_fields_scores_json_rows_as_predict_does() {
    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    let dir = TempDir::new("serve-model-wide-lists");
    assert!(Command::new(&py).args(["-c", PYARROW_WIDE_LISTS]).arg(dir.path("")).status().expect("python").success(), "the pyarrow script failed");
    let (data, ck) = (dir.path("wide.parquet"), dir.path("ck"));
    let (d, c) = (data.to_str().expect("utf8"), ck.to_str().expect("utf8"));
    run(&dir, &["train", "--data", d, "--batch", "100", "--max-steps", "4", "--hidden", "16", "--multi-hot-pooling", "l1=mean", "--checkpoint-dir", c, "--threads", "2", "--no-progress"]);
    let out = dir.path("scores.tsv");
    run(&dir, &["predict", "--model", c, "--data", d, "--batch", "64", "--threads", "2", "--out", out.to_str().expect("utf8")]);
    let want = common::read_scores(&out);
    let rows: Vec<Value> = serde_json::from_slice(&std::fs::read(dir.path("wide.json")).expect("rows")).expect("JSON");
    let s = Server::start(&ck, &["--max-batch", "64"]);
    let (got, _) = s.score(None, &json!({ "rows": rows[..192] }));
    assert_eq!(bits(&got), bits(&want[..192]), "serve-model keys the lists after the model's 28 single-hot fields, as predict does");
}
