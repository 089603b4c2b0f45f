//! The body of `POST /v1/score`: rows as JSON and/or Criteo TSV lines, parsed into the
//! samples the trainer reads, or a message naming the row and field that is wrong.
//!
//! ```text
//! {"rows": [{"label": 1, "dense": [13 x integer or null], "sparse": [26 x hex string or null]}, ...],
//!  "tsv":  ["<Criteo line>", ...]}
//! ```
//! - `rows[i].dense[j]` is integer feature I(j+1) as the TSV has it (an integer, transformed
//!   to `ln(1 + max(x, 0))` as training does); `null` is a missing value.
//! - `rows[i].sparse[j]` is categorical feature C(j+1): 1 to 16 hex digits (either case);
//!   `null` or `""` is a missing value.
//! - `label` is optional and does not change the score (0 or 1 when given).
//! - `tsv[i]` is a line as the trainer reads it: 40 tab-separated fields (label, I1..I13,
//!   C1..C26), or 39 without the label.
//!
//! Scores come back in that order: every `rows` entry, then every `tsv` line.

use ringrec::data::criteo::{self, Sample, NUM_DENSE, NUM_FIELDS, NUM_SPARSE};
use serde_json::Value;

/// Parses a request body into samples (see the module docs); the error names the row and
/// field.
pub fn parse(body: &[u8]) -> Result<Vec<Sample>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}; send {{\"rows\": [{{\"dense\": [13 values], \"sparse\": [26 values]}}]}} or {{\"tsv\": [\"line\"]}}"))?;
    let Value::Object(top) = v else { return Err("the body must be a JSON object with `rows` and/or `tsv`".into()) };
    if let Some(k) = top.keys().find(|k| *k != "rows" && *k != "tsv") {
        return Err(format!("unknown field `{}`: the body has `rows` (JSON rows) and/or `tsv` (Criteo lines)", k.escape_debug()));
    }
    let mut out = Vec::new();
    if let Some(rows) = top.get("rows") {
        let Value::Array(rows) = rows else { return Err("rows: must be an array of rows".into()) };
        for (i, r) in rows.iter().enumerate() {
            out.push(row(i, r)?);
        }
    }
    if let Some(lines) = top.get("tsv") {
        let Value::Array(lines) = lines else { return Err("tsv: must be an array of strings (Criteo lines)".into()) };
        for (i, l) in lines.iter().enumerate() {
            let Value::String(l) = l else { return Err(format!("tsv[{i}]: must be a string (a Criteo line)")) };
            out.push(line(l).map_err(|e| format!("tsv[{i}]: {e}"))?);
        }
    }
    if out.is_empty() {
        return Err("no rows: send at least one in `rows` or `tsv`".into());
    }
    Ok(out)
}

/// A TSV line, with or without its label.
fn line(l: &str) -> Result<Sample, String> {
    let l = l.strip_suffix('\n').unwrap_or(l);
    let fields = l.split('\t').count();
    let parsed = if fields == NUM_FIELDS - 1 { criteo::parse_line(format!("0\t{l}").as_bytes()) } else { criteo::parse_line(l.as_bytes()) };
    parsed.map_err(|e| format!("{} (a line has {NUM_FIELDS} tab-separated fields, label I1..I13 C1..C26, or {} without the label; it has {fields})", e.detail, NUM_FIELDS - 1))
}

fn row(i: usize, r: &Value) -> Result<Sample, String> {
    let Value::Object(r) = r else { return Err(format!("rows[{i}]: must be an object with `dense` and `sparse`")) };
    if let Some(k) = r.keys().find(|k| !["label", "dense", "sparse"].contains(&k.as_str())) {
        return Err(format!("rows[{i}]: unknown field `{}` (a row has `label`, `dense`, `sparse`)", k.escape_debug()));
    }
    let mut s = Sample::default();
    match r.get("label") {
        None | Some(Value::Null) => {}
        Some(l) => match l.as_f64() {
            Some(y) if y == 0.0 || y == 1.0 => s.label = y as f32,
            _ => return Err(format!("rows[{i}].label: {l} is not 0 or 1")),
        },
    }
    let dense = array(i, r, "dense", NUM_DENSE, "integers or null (I1..I13)")?;
    for (j, x) in dense.iter().enumerate() {
        s.dense[j] = match x {
            Value::Null => 0.0,
            Value::Number(n) => match n.as_i64() {
                Some(v) => criteo::dense_value(v),
                None => return Err(format!("rows[{i}].dense[{j}] (I{}): {n} is not an integer within a signed 64-bit integer", j + 1)),
            },
            other => return Err(format!("rows[{i}].dense[{j}] (I{}): {other} is not a number or null", j + 1)),
        };
    }
    let sparse = array(i, r, "sparse", NUM_SPARSE, "hex strings or null (C1..C26)")?;
    for (j, c) in sparse.iter().enumerate() {
        s.keys[j] = match c {
            Value::Null => criteo::missing_key(j),
            Value::String(h) if h.is_empty() => criteo::missing_key(j),
            Value::String(h) => match hex(h) {
                Some(v) => criteo::category_key(j, v),
                None => return Err(format!("rows[{i}].sparse[{j}] (C{}): \"{}\" is not 1 to 16 hex digits", j + 1, h.escape_debug())),
            },
            other => return Err(format!("rows[{i}].sparse[{j}] (C{}): {other} is not a hex string or null", j + 1)),
        };
    }
    Ok(s)
}

fn array<'a>(i: usize, r: &'a serde_json::Map<String, Value>, name: &str, n: usize, what: &str) -> Result<&'a Vec<Value>, String> {
    match r.get(name) {
        Some(Value::Array(a)) if a.len() == n => Ok(a),
        Some(Value::Array(a)) => Err(format!("rows[{i}].{name}: {} values, expected {n} {what}", a.len())),
        Some(_) => Err(format!("rows[{i}].{name}: must be an array of {n} {what}")),
        None => Err(format!("rows[{i}].{name}: missing ({n} {what})")),
    }
}

/// 1 to 16 hex digits, as the TSV reader takes a categorical value.
fn hex(h: &str) -> Option<u64> {
    (h.len() <= 16 && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| u64::from_str_radix(h, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "1\t5\t\t3\t0\t-2\t100\t7\t1\t0\t\t4\t9\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16";

    fn json_of(line: &str) -> Value {
        let f: Vec<&str> = line.split('\t').collect();
        let dense: Vec<Value> = f[1..14].iter().map(|x| if x.is_empty() { Value::Null } else { Value::from(x.parse::<i64>().unwrap()) }).collect();
        let sparse: Vec<Value> = f[14..].iter().map(|x| if x.is_empty() { Value::Null } else { Value::from(*x) }).collect();
        serde_json::json!({ "label": 1, "dense": dense, "sparse": sparse })
    }

    #[test]
    fn json_rows_and_tsv_lines_give_the_trainers_samples() {
        let want = criteo::parse_line(LINE.as_bytes()).unwrap();
        let body = serde_json::json!({ "rows": [json_of(LINE)], "tsv": [LINE, LINE.split_once('\t').unwrap().1] });
        let got = parse(body.to_string().as_bytes()).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], want);
        assert_eq!(got[1], want);
        assert_eq!((got[2].dense, got[2].keys), (want.dense, want.keys), "a line without its label scores the same");
    }

    #[test]
    fn bad_requests_name_the_row_and_field() {
        let mut r = json_of(LINE);
        let err = |v: Value| parse(v.to_string().as_bytes()).unwrap_err();
        r["dense"][2] = Value::from(1.5);
        assert!(err(serde_json::json!({ "rows": [json_of(LINE), r.clone()] })).starts_with("rows[1].dense[2] (I3): 1.5 is not an integer"));
        let mut r = json_of(LINE);
        r["sparse"][4] = Value::from("xyz");
        assert!(err(serde_json::json!({ "rows": [r] })).starts_with("rows[0].sparse[4] (C5): \"xyz\""));
        let mut r = json_of(LINE);
        r["dense"].as_array_mut().unwrap().pop();
        assert!(err(serde_json::json!({ "rows": [r] })).starts_with("rows[0].dense: 12 values, expected 13"));
        assert!(err(serde_json::json!({ "tsv": ["1\t2"] })).starts_with("tsv[0]: "));
        assert!(err(serde_json::json!({ "rowz": [] })).contains("unknown field `rowz`"));
        assert!(err(serde_json::json!({ "rows": [] })).starts_with("no rows"));
        let mut r = json_of(LINE);
        r["label"] = Value::from(2);
        assert!(err(serde_json::json!({ "rows": [r] })).starts_with("rows[0].label"));
        assert!(parse(b"{").unwrap_err().starts_with("the body is not JSON"));
        assert_eq!(hex("+1"), None);
        assert_eq!(hex("00ab"), Some(0xab));
        assert_eq!(hex("11112222333344445"), None);
    }
}
