//! The body of `POST /v1/score`: rows as JSON and/or Criteo TSV lines, parsed into the
//! samples the trainer reads, or a message naming the row and field that is wrong.
//!
//! ```text
//! {"rows": [{"label": 1, "dense": [13 x integer or null], "sparse": [26 x hex string or null],
//!            "lists": {"l0": [integer ids], ...}}, ...],
//!  "tsv":  ["<Criteo line>", ...]}
//! ```
//! - `rows[i].dense[j]` is integer feature I(j+1) as the TSV has it (an integer, transformed
//!   to `ln(1 + max(x, 0))` as training does); `null` is a missing value.
//! - `rows[i].sparse[j]` is categorical feature C(j+1): 1 to 16 hex digits (either case);
//!   `null` or `""` is a missing value.
//! - `rows[i].lists` holds a model's multi-hot fields (its `model.json`'s `input.multi_hot`),
//!   every one by name: a list of ids as the Parquet list column had them (integers within
//!   a signed or unsigned 64-bit integer, or strings keyed as a Parquet list's strings: their
//!   hex digits' number, else their FNV-1a 64; an empty string or a null left out), pooled as the model was trained (an empty list
//!   or `null` pools to zeros); a model without multi-hot fields takes no `lists`.
//! - `label` is optional and does not change the score (0 or 1 when given).
//! - `tsv[i]` is a line as the trainer reads it: 40 tab-separated fields (label, I1..I13,
//!   C1..C26), or 39 without the label; not for a model with multi-hot fields.
//!
//!
//! A model trained on other rows than Criteo's (a Parquet file's columns: n dense features
//! and F single-hot categorical fields, [`Fields`]; its lists in `lists`) takes `rows` of its shape: `dense` n values, an
//! integer read as a Parquet integer column is (`ln(1 + max(x, 0))`), any other number as a
//! float column is (as it is), unless the model's schema gave the column a transform (`[dense]`
//! of `--schema`: `log` or `none`, which then applies to either), `null` 0; `sparse` F values, a string as a Parquet string
//! column's (1 to 16 hex digits the number they spell, another string its FNV-1a 64), an
//! integer its value, `null` or `""` missing. It takes no `tsv` lines.
//!
//! Scores come back in that order: every `rows` entry, then every `tsv` line.

use ringrec::data::criteo::{self, Columns, NUM_FIELDS};
use ringrec::data::{Fields, Transform};
use ringrec::train::scorer::Rows;
use serde_json::Value;

/// Parses a request body into rows of `fields`' shape, the model's, its dense features
/// transformed by `transforms` where given (by slot), with the bags of its multi-hot fields
/// `lists` (see the module docs); the error names the row and field.
pub fn parse_rows(body: &[u8], fields: Fields, transforms: &[Option<Transform>], lists: &[String]) -> Result<Rows, String> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if !lists.is_empty() && v.get("tsv").is_some() {
        return Err(format!("tsv: a Criteo line has no multi-hot fields, and this model has {} ({}): send `rows` with `lists`", lists.len(), lists.join(", ")));
    }
    let columns = parse(body, fields, transforms)?;
    let mut rows = Rows::default();
    rows.clear(fields, lists.len());
    let json_rows = v.get("rows").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if lists.is_empty() {
        if let Some(i) = json_rows.iter().position(|r| r.get("lists").is_some()) {
            return Err(format!("rows[{i}].lists: this model has no multi-hot fields"));
        }
    }
    for (i, r) in json_rows.iter().enumerate().filter(|_| !lists.is_empty()) {
        bags(i, r, (fields, lists), &mut rows.keys, &mut rows.offsets)?;
    }
    rows.columns = columns;
    Ok(rows)
}

/// Row `i`'s bags, one per field of `lists` (of data of `fields`' shape), appended to
/// `keys` and their ends to `ends`.
fn bags(i: usize, r: &Value, (fields, lists): (Fields, &[String]), keys: &mut Vec<u64>, ends: &mut Vec<u32>) -> Result<(), String> {
    let names = lists.join(", ");
    let given = match r.get("lists") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(format!("rows[{i}].lists: must be an object of the multi-hot fields ({names}), each a list of integer ids")),
        None => return Err(format!("rows[{i}].lists: missing; this model has multi-hot fields ({names}), each a list of integer ids")),
    };
    if let Some(k) = given.keys().find(|k| !lists.contains(k)) {
        return Err(format!("rows[{i}].lists: unknown field `{}` (the model's multi-hot fields are {names})", k.escape_debug()));
    }
    for (g, name) in lists.iter().enumerate() {
        let at = format!("rows[{i}].lists.{name}");
        match given.get(name) {
            None => return Err(format!("{at}: missing (every multi-hot field is given: an empty list pools to zeros)")),
            Some(Value::Null) => {}
            Some(Value::Array(ids)) => {
                for (j, id) in ids.iter().enumerate() {
                    let v = match id {
                        Value::Number(n) => n.as_i64().map(|v| v as u64).or_else(|| n.as_u64()),
                        // A string id as a Parquet list's: its hex digits' number, else its
                        // FNV-1a 64; an empty one (or a null) is left out.
                        Value::String(t) if t.is_empty() => continue,
                        Value::String(t) => Some(hex(t).unwrap_or_else(|| ringrec::hash::fnv1a64(t.as_bytes()))),
                        Value::Null => continue,
                        _ => None,
                    };
                    let v = v.ok_or_else(|| format!("{at}[{j}]: {id} is not an id (an integer within 64 bits or a string)"))?;
                    keys.push(fields.list_key(g, v));
                }
            }
            Some(other) => return Err(format!("{at}: {other} is not a list of integer ids")),
        }
        ends.push(u32::try_from(keys.len()).map_err(|_| format!("{at}: more ids in the request than a batch holds"))?);
    }
    Ok(())
}

/// Parses a request body into rows of `fields`' shape, the model's, its dense features
/// transformed by `transforms` where given (by slot; see the module docs); the error names
/// the row and field.
pub fn parse(body: &[u8], fields: Fields, transforms: &[Option<Transform>]) -> Result<Columns, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}; send {{\"rows\": [{{\"dense\": [13 values], \"sparse\": [26 values]}}]}} or {{\"tsv\": [\"line\"]}}"))?;
    let Value::Object(top) = v else { return Err("the body must be a JSON object with `rows` and/or `tsv`".into()) };
    if let Some(k) = top.keys().find(|k| *k != "rows" && *k != "tsv") {
        return Err(format!("unknown field `{}`: the body has `rows` (JSON rows) and/or `tsv` (Criteo lines)", k.escape_debug()));
    }
    let mut out = Columns { fields, ..Columns::default() };
    if let Some(rows) = top.get("rows") {
        let Value::Array(rows) = rows else { return Err("rows: must be an array of rows".into()) };
        for (i, r) in rows.iter().enumerate() {
            row(i, r, transforms, &mut out)?;
        }
    }
    if let Some(lines) = top.get("tsv") {
        let Value::Array(lines) = lines else { return Err("tsv: must be an array of strings (Criteo lines)".into()) };
        if fields != Fields::CRITEO && !lines.is_empty() {
            return Err(format!("tsv: the model takes rows of {fields}, not Criteo lines: send them as `rows`"));
        }
        for (i, l) in lines.iter().enumerate() {
            let Value::String(l) = l else { return Err(format!("tsv[{i}]: must be a string (a Criteo line)")) };
            out.push(&line(l).map_err(|e| format!("tsv[{i}]: {e}"))?);
        }
    }
    if out.is_empty() {
        return Err("no rows: send at least one in `rows` or `tsv`".into());
    }
    Ok(out)
}

/// A TSV line, with or without its label.
fn line(l: &str) -> Result<criteo::Sample, String> {
    let l = l.strip_suffix('\n').unwrap_or(l);
    let fields = l.split('\t').count();
    let parsed = if fields == NUM_FIELDS - 1 { criteo::parse_line(format!("0\t{l}").as_bytes()) } else { criteo::parse_line(l.as_bytes()) };
    parsed.map_err(|e| format!("{} (a line has {NUM_FIELDS} tab-separated fields, label I1..I13 C1..C26, or {} without the label; it has {fields})", e.detail, NUM_FIELDS - 1))
}

/// Appends JSON row `i` to `out`, its dense features transformed by `transforms` where given.
fn row(i: usize, r: &Value, transforms: &[Option<Transform>], out: &mut Columns) -> Result<(), String> {
    let Value::Object(r) = r else { return Err(format!("rows[{i}]: must be an object with `dense` and `sparse`")) };
    if let Some(k) = r.keys().find(|k| !["label", "dense", "sparse", "lists"].contains(&k.as_str())) {
        return Err(format!("rows[{i}]: unknown field `{}` (a row has `label`, `dense`, `sparse`, and `lists` for a model with multi-hot fields)", k.escape_debug()));
    }
    let label = match r.get("label") {
        None | Some(Value::Null) => 0.0,
        Some(l) => match l.as_f64() {
            Some(y) if y == 0.0 || y == 1.0 => y as f32,
            _ => return Err(format!("rows[{i}].label: {l} is not 0 or 1")),
        },
    };
    // A Criteo row's values are a TSV line's (I1..I13 integers, C1..C26 hex strings); any
    // other model's are a Parquet file's (see the module docs).
    let fields = out.fields;
    let criteo = fields == Fields::CRITEO;
    let (dense_what, sparse_what) = if criteo { ("integers or null (I1..I13)", "hex strings or null (C1..C26)") } else { ("numbers or null", "strings, integers or null") };
    let name = |kind: char, j: usize| if criteo { format!("{kind}{}", j + 1) } else { format!("{} {j}", if kind == 'I' { "dense feature" } else { "field" }) };
    let dense = array(i, r, "dense", fields.dense, dense_what)?;
    for (j, x) in dense.iter().enumerate() {
        let v = match x {
            Value::Null => 0.0,
            // As the Parquet reader takes an integer and a float column's value.
            Value::Number(n) => match (n.as_i64(), n.as_f64(), transforms.get(j).copied().flatten()) {
                (Some(v), _, Some(Transform::None)) => v as f32,
                (Some(v), _, _) => criteo::dense_value(v),
                (None, Some(x), Some(Transform::Log)) if !criteo => x.max(0.0).ln_1p() as f32,
                (None, Some(x), _) if !criteo => x as f32,
                _ => return Err(format!("rows[{i}].dense[{j}] ({}): {n} is not an integer within a signed 64-bit integer", name('I', j))),
            },
            other => return Err(format!("rows[{i}].dense[{j}] ({}): {other} is not a number or null", name('I', j))),
        };
        out.dense.push(v);
    }
    let sparse = array(i, r, "sparse", fields.sparse, sparse_what)?;
    let one_id = if criteo { "a hex string or null" } else { "a string, a non-negative integer or null" };
    for (j, c) in sparse.iter().enumerate() {
        let k = match c {
            Value::Null => criteo::missing_key(j),
            Value::String(h) if h.is_empty() => criteo::missing_key(j),
            Value::String(h) if !criteo => ringrec::data::parquet_file::text_key(j, h.as_bytes()),
            Value::Number(n) if !criteo && n.as_u64().is_some() => criteo::category_key(j, n.as_u64().unwrap_or_default()),
            Value::String(h) => match hex(h) {
                Some(v) => criteo::category_key(j, v),
                None => return Err(format!("rows[{i}].sparse[{j}] ({}): \"{}\" is not 1 to 16 hex digits", name('C', j), h.escape_debug())),
            },
            Value::Array(_) => return Err(format!("rows[{i}].sparse[{j}] ({}): a list where one id is expected (a single-hot field: {}; multi-hot fields go in `lists`)", name('C', j), one_id)),
            other => return Err(format!("rows[{i}].sparse[{j}] ({}): {other} is not {}", name('C', j), one_id)),
        };
        out.keys.push(k);
    }
    out.labels.push(label);
    Ok(())
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
        let got = parse(body.to_string().as_bytes(), Fields::CRITEO, &[]).unwrap();
        assert_eq!(got.len(), 3);
        let mut one = Columns::default();
        one.push(&want);
        for r in 0..3 {
            assert_eq!((&got.dense[r * 13..(r + 1) * 13], &got.keys[r * 26..(r + 1) * 26]), (&one.dense[..], &one.keys[..]), "row {r}: a line without its label scores the same");
        }
        assert_eq!(got.labels, [1.0, 1.0, 0.0]);
    }

    #[test]
    fn bad_requests_name_the_row_and_field() {
        let mut r = json_of(LINE);
        let err = |v: Value| parse(v.to_string().as_bytes(), Fields::CRITEO, &[]).unwrap_err();
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
        assert!(parse(b"{", Fields::CRITEO, &[]).unwrap_err().starts_with("the body is not JSON"));
        let mut r = json_of(LINE);
        r["sparse"][3] = serde_json::json!(["ab"]);
        assert!(err(serde_json::json!({ "rows": [r] })).contains("rows[0].sparse[3] (C4): a list where one id is expected"));
        assert_eq!(hex("+1"), None);
        assert_eq!(hex("00ab"), Some(0xab));
        assert_eq!(hex("11112222333344445"), None);
    }

    #[test]
    fn rows_of_another_shape_are_read_as_a_parquet_files_and_take_no_tsv() {
        let fields = Fields { dense: 2, sparse: 3 };
        let body = serde_json::json!({ "rows": [{ "dense": [5, 0.25], "sparse": ["v3", "00ab", 7] }, { "dense": [null, -1], "sparse": [null, "", "v3"] }] });
        let got = parse(body.to_string().as_bytes(), fields, &[]).unwrap();
        assert_eq!(got.fields, fields);
        assert_eq!(got.dense, [criteo::dense_value(5), 0.25, 0.0, 0.0]);
        let text = ringrec::data::parquet_file::text_key;
        assert_eq!(got.keys, [text(0, b"v3"), criteo::category_key(1, 0xab), criteo::category_key(2, 7), criteo::missing_key(0), criteo::missing_key(1), text(2, b"v3")]);
        let err = |v: Value| parse(v.to_string().as_bytes(), fields, &[]).unwrap_err();
        assert!(err(serde_json::json!({ "rows": [{ "dense": [1], "sparse": ["a", "b", "c"] }] })).starts_with("rows[0].dense: 1 values, expected 2 numbers or null"));
        assert!(err(serde_json::json!({ "rows": [{ "dense": [1, 2], "sparse": ["a", "b", -1] }] })).starts_with("rows[0].sparse[2] (field 2): -1 is not a string, a non-negative integer or null"));
        assert!(err(serde_json::json!({ "tsv": [LINE] })).starts_with("tsv: the model takes rows of 2 dense and 3 single-hot categorical fields, not Criteo lines"));
    }

    #[test]
    fn a_schemas_transforms_apply_to_their_slots_whatever_the_values_type() {
        let fields = Fields { dense: 4, sparse: 1 };
        let t = [Some(Transform::None), Some(Transform::Log), None, None];
        let body = serde_json::json!({ "rows": [{ "dense": [5, 2.5, 7, 0.5], "sparse": ["a"] }, { "dense": [-3, -1.5, null, 3], "sparse": [null] }] });
        let got = parse(body.to_string().as_bytes(), fields, &t).unwrap();
        let want = [5.0, 2.5f64.ln_1p() as f32, criteo::dense_value(7), 0.5, -3.0, 0.0, 0.0, criteo::dense_value(3)];
        assert_eq!(got.dense.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        // An integer column's `log` is the integer's table value, as the Parquet reader's.
        let got = parse(serde_json::json!({ "rows": [{ "dense": [1, 9, 0, 0], "sparse": [null] }] }).to_string().as_bytes(), fields, &t).unwrap();
        assert_eq!(got.dense[1].to_bits(), criteo::dense_value(9).to_bits());
    }

    #[test]
    fn a_multi_hot_models_rows_carry_every_list_field_by_name() {
        let lists = ["l0".to_string(), "l1".to_string()];
        let mut r = json_of(LINE);
        r["lists"] = serde_json::json!({ "l0": [5, -1, 5], "l1": [] });
        let mut r2 = json_of(LINE);
        r2["lists"] = serde_json::json!({ "l1": [18446744073709551615u64], "l0": null });
        let rows = parse_rows(serde_json::json!({ "rows": [r, r2] }).to_string().as_bytes(), Fields::CRITEO, &[], &lists).unwrap();
        assert_eq!((rows.len(), rows.bags), (2, 2));
        assert_eq!(rows.offsets, [0, 3, 3, 3, 4]);
        assert_eq!(rows.keys, [Fields::CRITEO.list_key(0, 5), Fields::CRITEO.list_key(0, u64::MAX), Fields::CRITEO.list_key(0, 5), Fields::CRITEO.list_key(1, u64::MAX)]);
        let err = |v: Value| parse_rows(v.to_string().as_bytes(), Fields::CRITEO, &[], &lists).unwrap_err();
        let mut bad = json_of(LINE);
        bad["lists"] = serde_json::json!({ "l0": [1] });
        assert!(err(serde_json::json!({ "rows": [bad.clone()] })).starts_with("rows[0].lists.l1: missing"));
        bad["lists"] = serde_json::json!({ "l0": [1], "l1": [[2]] });
        assert!(err(serde_json::json!({ "rows": [bad.clone()] })).starts_with("rows[0].lists.l1[0]: [2] is not an id"));
        let mut r3 = json_of(LINE);
        r3["lists"] = serde_json::json!({ "l0": ["item-7", "", null, "Ab"], "l1": [] });
        let rows = parse_rows(serde_json::json!({ "rows": [r3] }).to_string().as_bytes(), Fields::CRITEO, &[], &lists).unwrap();
        assert_eq!(rows.keys, [Fields::CRITEO.list_key(0, ringrec::hash::fnv1a64(b"item-7")), Fields::CRITEO.list_key(0, 0xab)]);
        bad["lists"] = serde_json::json!({ "l0": 3, "l1": [] });
        assert!(err(serde_json::json!({ "rows": [bad.clone()] })).starts_with("rows[0].lists.l0: 3 is not a list"));
        bad["lists"] = serde_json::json!({ "l0": [], "l1": [], "l9": [] });
        assert!(err(serde_json::json!({ "rows": [bad] })).contains("unknown field `l9`"));
        assert!(err(serde_json::json!({ "rows": [json_of(LINE)] })).starts_with("rows[0].lists: missing; this model has multi-hot fields (l0, l1)"));
        assert!(err(serde_json::json!({ "tsv": [LINE] })).starts_with("tsv: a Criteo line has no multi-hot fields"));
        assert_eq!(parse_rows(serde_json::json!({ "tsv": [LINE] }).to_string().as_bytes(), Fields::CRITEO, &[], &[]).unwrap().len(), 1);
        let mut r = json_of(LINE);
        r["lists"] = serde_json::json!({});
        assert!(parse_rows(serde_json::json!({ "rows": [r] }).to_string().as_bytes(), Fields::CRITEO, &[], &[]).unwrap_err().contains("no multi-hot fields"));
        // A model of another shape: its lists salted after its own single-hot fields.
        let wide = Fields { dense: 1, sparse: 30 };
        let row = serde_json::json!({ "dense": [1], "sparse": vec![Value::Null; 30], "lists": { "l0": [5], "l1": [] } });
        let rows = parse_rows(serde_json::json!({ "rows": [row] }).to_string().as_bytes(), wide, &[], &lists).unwrap();
        assert_eq!((rows.columns.fields, rows.keys.as_slice()), (wide, &[wide.list_key(0, 5)][..]));
    }
}
