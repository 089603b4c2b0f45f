//! A model described for a reader who writes a scorer from it: an export bundle's
//! `model.json` `model` section ([`ModelDescription`]). It records the [`ModelSpec`] (kind
//! and shape), the table row it reads, the order of its inputs, how the logit is formed,
//! and every parameter group of the flat parameter vector ([`ModelSpec::groups`]) with the
//! tensors in it: name, offset, rows, columns, and what a row and a column are. The words
//! follow the models' one definition (`ModelSpec`'s module docs); `scripts/bundle_predict.py`
//! scores every model from them.

use serde::{Deserialize, Serialize};

use crate::model::dense_bin::SpecRecord;
use crate::model::{CrossStructure, Group, ModelKind, ModelSpec};

/// One tensor of a parameter group: `rows x cols` f32 values, row-major, at `offset` of the
/// flat parameter vector (value `[r][c]` at `offset + r * cols + c`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorDescription {
    /// `W`, `b`, `V`, `U`, `w_x`.
    pub name: String,
    /// Its first value in the flat parameter vector.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// What a row and a column are, and how it is used.
    pub meaning: String,
}

/// One parameter group ([`Group`]): its place in the flat vector and its tensors, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupDescription {
    /// `top layer 1`, `cross layer 0`, `linear`.
    pub name: String,
    /// Its first value in the flat parameter vector.
    pub offset: usize,
    /// Rows of the group seen as one matrix (an MLP layer: inputs + 1).
    pub rows: usize,
    /// Columns of the group seen as one matrix (an MLP layer: outputs).
    pub cols: usize,
    /// Its tensors, one after the other.
    pub tensors: Vec<TensorDescription>,
}

/// `model.json`'s `model`: the model, in words precise enough to score with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelDescription {
    /// The kind and shape.
    #[serde(flatten)]
    pub spec: SpecRecord,
    /// Values per table row: `dim`, or `dim + 1` (deepfm, wide-deep: value `dim` is the
    /// key's first-order weight).
    pub row_width: usize,
    /// Dense parameters (the flat vector of `dense.bin`).
    pub params: usize,
    /// One line (`dlrm (bottom 13-64-16, 351 dots, top 367-256-128-1)`).
    pub summary: String,
    /// What the model reads, in order.
    pub inputs: String,
    /// How the logit is formed from the inputs and the groups.
    pub logit: String,
    /// How the logit becomes a score.
    pub score: String,
    /// The parameter groups, in flat order.
    pub groups: Vec<GroupDescription>,
}

impl ModelDescription {
    /// The description of `spec`.
    pub fn of(spec: &ModelSpec) -> ModelDescription {
        ModelDescription {
            spec: SpecRecord::from(spec),
            row_width: spec.row_width(),
            params: spec.num_params(),
            summary: spec.describe(),
            inputs: inputs(spec),
            logit: logit(spec),
            score: "score = 1 / (1 + exp(-logit))".into(),
            groups: spec.groups().iter().map(|g| group(spec, g)).collect(),
        }
    }
}

/// What `spec` reads.
fn inputs(spec: &ModelSpec) -> String {
    let (f, d, n) = (spec.fields, spec.dim, spec.ndense);
    let row = if !spec.field_dims.is_empty() {
        let dims: Vec<String> = spec.field_dims.iter().map(usize::to_string).collect();
        format!("the fields have different dims d_f = {} (sum d = {d}): field f's table row has d_f + 1 values, values 0..d_f its key's embedding e_f, value d_f its first-order weight w_k; the one input field holds the fields' rows side by side (F = 1, {} values)", dims.join(", "), spec.row_width())
    } else if spec.first_order() {
        format!("each table row has d + 1 = {} values: values 0..d are the key's embedding e, value d its first-order weight w_k", d + 1)
    } else {
        format!("each table row has d = {d} values: the key's embedding e")
    };
    let x = format!("x = [e_1, ..., e_F, dense]: e_f the embedding of the key of categorical field f (C1 is f = 1), dense the {n} transformed integer features I1..I{n} (the bundle's input section): w = F d + n = {} values", spec.concat_width());
    match spec.kind {
        ModelKind::Dlrm => format!("F = {f} fields, d = {d}, n = {n}; {row}; the bottom MLP reads dense (n values), the interaction reads e_1..e_F"),
        _ => format!("F = {f} fields, d = {d}, n = {n}; {row}; {x}"),
    }
}

/// How `spec`'s logit is formed.
fn logit(spec: &ModelSpec) -> String {
    const MLP: &str = "an MLP layer is y = h W + b (h a row vector, W in x out, b out values)";
    let deep = |on: &str| format!("the groups `deep layer 0..` as an MLP on {on}, ReLU after every layer but the last (1 wide)");
    match spec.kind {
        ModelKind::Mlp => format!("{MLP}; h_0 = x; the groups `mlp layer 0..` in order, ReLU after every layer but the last; logit = the last layer's one output"),
        ModelKind::Dlrm => {
            let pairs = if spec.interaction_self { "j <= i" } else { "j < i" };
            format!(
                "{MLP}; z_0 = the groups `bottom layer 0..` on dense, ReLU after EVERY bottom layer including the last (d wide); Z = [z_0, e_1, ..., e_F] (F + 1 vectors of d); dots: for i in 0..=F, for j in 0..=F with {pairs}: dot(Z_i, Z_j), in that order ({} values); t = [z_0, dots] ({} values); logit = the groups `top layer 0..` as an MLP on t, ReLU after every layer but the last",
                spec.pairs(),
                spec.dim + spec.pairs()
            )
        }
        ModelKind::Dcn => {
            let cross = if spec.cross_rank == 0 { "y = x_l W_l + b_l" } else { "y = (x_l V_l) U_l + b_l" };
            let tail = match spec.cross_structure {
                CrossStructure::Stacked => format!("logit = {}", deep("x_L")),
                CrossStructure::Parallel => "h = the groups `deep layer 0..` as an MLP on x_0, ReLU after EVERY deep layer including the last; logit = [x_L, h] W + b of the group `last layer`".into(),
            };
            format!("{MLP}; x_0 = x; for each group `cross layer l` (l = 0..{}): {cross}, x_(l+1) = x_0 * y + x_l (element-wise), giving x_L; {tail}", spec.cross_layers)
        }
        ModelKind::DeepFm | ModelKind::WideDeep => {
            let fm = if spec.kind == ModelKind::DeepFm { " + 0.5 * sum over k in 0..d of ((sum_f e_f[k])^2 - sum_f e_f[k]^2)" } else { "" };
            format!("{MLP}; deep = {} (the embeddings only, not the first-order weights); logit = deep + (dense w_x + b) + sum_f w_(k_f){fm}; w_x and b from the group `linear`, w_(k_f) the first-order weight of field f's key", deep("x"))
        }
    }
}

/// The tensors of group `g` of `spec`.
fn group(spec: &ModelSpec, g: &Group) -> GroupDescription {
    let t = |name: &str, offset: usize, rows: usize, cols: usize, meaning: String| TensorDescription { name: name.into(), offset, rows, cols, meaning };
    let (o, w) = (g.offset, spec.concat_width());
    let tensors = if g.name.starts_with("cross layer") {
        if spec.cross_rank == 0 {
            vec![
                t("W", o, w, w, format!("W_l[i][j]: from value i of x_l to value j of y (w = {w})")),
                t("b", o + w * w, 1, w, "b_l[j]: added to value j of y".into()),
            ]
        } else {
            let r = spec.cross_rank;
            vec![
                t("V", o, w, r, format!("V_l[i][q]: from value i of x_l to value q of the rank-{r} projection")),
                t("U", o + w * r, r, w, "U_l[q][j]: from value q of the projection to value j of y".into()),
                t("b", o + 2 * w * r, 1, w, "b_l[j]: added to value j of y".into()),
            ]
        }
    } else if g.name == "linear" {
        vec![
            t("w_x", o, spec.ndense, 1, "w_x[i]: the weight of dense feature i in the linear term".into()),
            t("b", o + spec.ndense, 1, 1, "b: the linear term's bias".into()),
        ]
    } else {
        let (inputs, outputs) = (g.rows - 1, g.cols);
        vec![
            t("W", o, inputs, outputs, format!("W[i][j]: from value i of the layer's input ({inputs} values) to its output j ({outputs} values)")),
            t("b", o + inputs * outputs, 1, outputs, "b[j]: added to output j".into()),
        ]
    };
    GroupDescription { name: g.name.clone(), offset: g.offset, rows: g.rows, cols: g.cols, tensors }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_is_its_tensors_end_to_end() {
        let base = ModelSpec::mlp(26, 4, 13, vec![8, 4]);
        for spec in [
            base.clone(),
            ModelSpec { kind: ModelKind::Dlrm, bottom: vec![6], interaction_self: true, ..base.clone() },
            ModelSpec { kind: ModelKind::Dcn, cross_layers: 2, ..base.clone() },
            ModelSpec { kind: ModelKind::Dcn, cross_rank: 3, cross_structure: CrossStructure::Parallel, ..base.clone() },
            ModelSpec { kind: ModelKind::DeepFm, ..base.clone() },
            ModelSpec { kind: ModelKind::WideDeep, ..base },
        ] {
            let d = ModelDescription::of(&spec);
            let mut at = 0;
            for g in &d.groups {
                assert_eq!(g.offset, at, "{}: {}", d.summary, g.name);
                for t in &g.tensors {
                    assert_eq!(t.offset, at, "{}: {} {}", d.summary, g.name, t.name);
                    at += t.rows * t.cols;
                }
                assert_eq!(at, g.offset + g.rows * g.cols, "{}: {}", d.summary, g.name);
            }
            assert_eq!((at, d.params), (spec.num_params(), spec.num_params()));
            let json = serde_json::to_string(&d).unwrap();
            let back: ModelDescription = serde_json::from_str(&json).unwrap();
            assert_eq!(back.spec.spec().unwrap(), spec, "{json}");
        }
    }
}
