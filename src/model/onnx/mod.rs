//! The dense model as an ONNX graph (`ringrec export --format onnx` writes it as a
//! bundle's `model.onnx`; feature `onnx`): ONNX IR version [`IR_VERSION`], the default
//! operator set at version [`OPSET`], so ONNX Runtime and any other ONNX runtime score a
//! ringrec model without ringrec.
//!
//! The graph is the dense part only; the table stays the bundle's `table.bin`. Inputs and
//! output (the batch dimension is dynamic, named `batch`):
//! ```text
//! dense        f32 [batch, n]       the n = 13 dense features as ringrec transforms them:
//!                                   ln(1 + max(x, 0)), a missing one 0 (model.json's input)
//! emb          f32 [batch, F, r]    the F = 26 fields' table rows in field order (C1..C26):
//!                                   row of the key of field f at emb[b, f, :]; r = dim (mlp,
//!                                   dlrm, dcn) or dim + 1 (deepfm, wide-deep: the row's
//!                                   value dim is the key's first-order weight); a
//!                                   wide-deep over fields of different dims: F = 1, its
//!                                   fields' rows side by side (r = sum of d_f + 1)
//! probability  f32 [batch, 1]       the click probability, 1 / (1 + exp(-logit))
//! ```
//! A server feeds it as `scripts/bundle_predict.py` does: each categorical value's key
//! (model.json's `input.key`), the key's row from `table.bin` (binary search in its sorted
//! keys), or for a key it lacks the deterministic initial row (model.json's
//! `table.unseen_keys`); `scripts/onnx_check.py` and `scripts/bench/ort_score.py` do it.
//!
//! Each model of docs/models.md is one function ([`nets`]) over a flat parameter vector in
//! the spec's group order, on a small graph builder ([`graph::Graph`]); the messages are
//! onnx.proto's, declared with prost ([`proto`]).

pub mod graph;
pub mod nets;
pub mod proto;

use prost::Message;

use graph::Dim;

/// The ONNX IR version written (8; with opset 17: ONNX 1.12+, ONNX Runtime 1.13+).
pub const IR_VERSION: i64 = 8;
/// The default (`ai.onnx`) operator set version the graph uses.
pub const OPSET: i64 = 17;
/// The input of transformed dense features.
pub const INPUT_DENSE: &str = "dense";
/// The input of the fields' table rows.
pub const INPUT_EMB: &str = "emb";
/// The output: the click probability.
pub const OUTPUT: &str = "probability";

/// Errors of building a graph.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The parameter vector does not fit the model's layout.
    #[error("{given} dense parameters given, the model's layout {}", match used { Some(u) => format!("uses {u}"), None => "needs more".to_string() })]
    Params {
        /// Parameters given.
        given: usize,
        /// Parameters the layout uses (None: it ran past the end).
        used: Option<usize>,
    },
    /// The shape flags describe no model.
    #[error("{0}")]
    Shape(String),
}

/// Result alias of the ONNX export.
pub type OnnxResult<T> = Result<T, OnnxError>;

pub use crate::model::spec::CrossStructure;

/// A model of docs/models.md with its shape flags (`--model` and the flags it takes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Net {
    /// `--model mlp` (`--hidden`).
    Mlp {
        /// Hidden widths.
        hidden: Vec<usize>,
    },
    /// `--model dlrm` (`--bottom-mlp`, `--hidden`, `--interaction-self`).
    Dlrm {
        /// The bottom MLP's hidden widths (its last layer is dim wide).
        bottom: Vec<usize>,
        /// The top MLP's hidden widths.
        hidden: Vec<usize>,
        /// Each vector's dot with itself included.
        interaction_self: bool,
    },
    /// `--model dcn` (`--cross-layers`, `--cross-rank`, `--cross-structure`, `--hidden`).
    Dcn {
        /// Cross layers L.
        layers: usize,
        /// 0: full W_l; R > 0: low-rank V_l U_l.
        rank: usize,
        /// Stacked or parallel.
        structure: CrossStructure,
        /// The deep MLP's hidden widths.
        hidden: Vec<usize>,
    },
    /// `--model deepfm` (`--hidden`).
    DeepFm {
        /// The deep MLP's hidden widths.
        hidden: Vec<usize>,
    },
    /// `--model wide-deep` (`--hidden`).
    WideDeep {
        /// The deep MLP's hidden widths.
        hidden: Vec<usize>,
        /// Over fields of different dims ([`crate::model::ModelSpec::field_dims`]): each
        /// field's dim, the `emb` input then one field of their rows side by side (each
        /// `d_f + 1`: its values, its first-order weight); empty otherwise.
        field_dims: Vec<usize>,
    },
}

impl Net {
    /// The graph of the model `spec` describes, and its sizes.
    pub fn of_spec(spec: &crate::model::ModelSpec) -> (Net, Sizes) {
        use crate::model::ModelKind;
        let hidden = spec.hidden.clone();
        let net = match spec.kind {
            ModelKind::Mlp => Net::Mlp { hidden },
            ModelKind::Dlrm => Net::Dlrm { bottom: spec.bottom.clone(), hidden, interaction_self: spec.interaction_self },
            ModelKind::Dcn => Net::Dcn { layers: spec.cross_layers, rank: spec.cross_rank, structure: spec.cross_structure, hidden },
            ModelKind::DeepFm => Net::DeepFm { hidden },
            ModelKind::WideDeep => Net::WideDeep { hidden, field_dims: spec.field_dims.clone() },
        };
        (net, Sizes { fields: spec.fields, dim: spec.dim, dense: spec.ndense })
    }

    /// Its `--model` name.
    pub fn name(&self) -> &'static str {
        match self {
            Net::Mlp { .. } => "mlp",
            Net::Dlrm { .. } => "dlrm",
            Net::Dcn { .. } => "dcn",
            Net::DeepFm { .. } => "deepfm",
            Net::WideDeep { .. } => "wide-deep",
        }
    }

    /// Values per table row (the `emb` input's last dimension) for embeddings of `dim`.
    pub fn row_width(&self, dim: usize) -> usize {
        match self {
            Net::WideDeep { field_dims, .. } => dim + field_dims.len().max(1),
            Net::DeepFm { .. } => dim + 1,
            _ => dim,
        }
    }
}

/// The input sizes: F sparse fields, d (`--dim`), n dense features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Sparse fields F (26 on Criteo data).
    pub fields: usize,
    /// Embedding values per field d (`--dim`).
    pub dim: usize,
    /// Dense features n (13).
    pub dense: usize,
}

impl Sizes {
    /// Criteo's 26 fields and 13 dense features, embeddings of `dim`.
    pub fn criteo(dim: usize) -> Sizes {
        Sizes { fields: crate::data::criteo::NUM_SPARSE, dim, dense: crate::data::criteo::NUM_DENSE }
    }
}

/// Builds the graph of `net` (or with `params` None only counts its parameters).
fn build(net: &Net, s: Sizes, params: Option<&[f32]>) -> OnnxResult<(proto::GraphProto, usize)> {
    let mut b = nets::Build::new(params);
    let batch = Dim::Named("batch");
    let dense = b.g.input(INPUT_DENSE, &[batch.clone(), Dim::Fixed(s.dense)], "dense features, ln(1 + max(x, 0)), missing 0");
    let emb = b.g.input(INPUT_EMB, &[batch.clone(), Dim::Fixed(s.fields), Dim::Fixed(net.row_width(s.dim))], "table rows of the fields' keys, field order");
    let logit = nets::logit(&mut b, net, s, &dense, &emb)?;
    let used = b.used()?;
    let p = b.g.sigmoid(&logit);
    let out = b.g.finish(&format!("ringrec-{}", net.name()), &p, (OUTPUT, &[batch, Dim::Fixed(1)], "click probability"));
    Ok((out, used))
}

/// The parameters `net` has on inputs of `sizes` (the flat vector's length).
pub fn param_count(net: &Net, sizes: Sizes) -> OnnxResult<usize> {
    build(net, sizes, None).map(|(_, n)| n)
}

/// The ONNX model of `net` with the flat dense parameters `params` (docs/models.md's
/// group order), on inputs of `sizes`.
pub fn model(net: &Net, sizes: Sizes, params: &[f32]) -> OnnxResult<proto::ModelProto> {
    let (graph, _) = build(net, sizes, Some(params))?;
    Ok(proto::ModelProto {
        ir_version: IR_VERSION,
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: OPSET }],
        producer_name: "ringrec".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: format!("ringrec {} dense model: inputs {INPUT_DENSE} [batch, {}] and {INPUT_EMB} [batch, {}, {}], output {OUTPUT} [batch, 1]", net.name(), sizes.dense, sizes.fields, net.row_width(sizes.dim)),
        graph: Some(graph),
    })
}

/// The bytes of a `model.onnx` of `net` ([`model`]).
pub fn encode(net: &Net, sizes: Sizes, params: &[f32]) -> OnnxResult<Vec<u8>> {
    Ok(model(net, sizes, params)?.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Sizes {
        Sizes { fields: 3, dim: 4, dense: 2 }
    }

    #[test]
    fn the_mlp_has_dense_bins_parameter_count() {
        let net = Net::Mlp { hidden: vec![8, 5] };
        let want = crate::model::DenseWeights::count(&[3 * 4 + 2, 8, 5, 1]).unwrap();
        assert_eq!(param_count(&net, small()).unwrap(), want);
    }

    #[test]
    fn counts_follow_the_spec() {
        let s = small();
        let w = 3 * 4 + 2;
        // dlrm: bottom 2 -> 6 -> 4, P = 4 * 3 / 2 = 6 pairs, top (4 + 6) -> 5 -> 1.
        let dlrm = Net::Dlrm { bottom: vec![6], hidden: vec![5], interaction_self: false };
        assert_eq!(param_count(&dlrm, s).unwrap(), (2 * 6 + 6) + (6 * 4 + 4) + (10 * 5 + 5) + (5 + 1));
        // dcn low-rank 2, 2 layers, stacked MLP w -> 5 -> 1.
        let dcn = Net::Dcn { layers: 2, rank: 2, structure: CrossStructure::Stacked, hidden: vec![5] };
        assert_eq!(param_count(&dcn, s).unwrap(), 2 * (w * 2 + 2 * w + w) + (w * 5 + 5) + (5 + 1));
        // dcn full, parallel: 1 cross layer, deep w -> 5, last (w + 5) -> 1.
        let par = Net::Dcn { layers: 1, rank: 0, structure: CrossStructure::Parallel, hidden: vec![5] };
        assert_eq!(param_count(&par, s).unwrap(), (w * w + w) + (w * 5 + 5) + (w + 5 + 1));
        // deepfm: deep w -> 5 -> 1, linear n + 1.
        assert_eq!(param_count(&Net::DeepFm { hidden: vec![5] }, s).unwrap(), (w * 5 + 5) + (5 + 1) + (2 + 1));
        // wide-deep over fields of dims 1, 3 (one input field of 4 + 2 values): the deep
        // part reads their 4 values and the dense features, as a wide-deep of one dim would.
        let dims = Net::WideDeep { hidden: vec![5], field_dims: vec![1, 3] };
        let one = Sizes { fields: 1, dim: 4, dense: 2 };
        assert_eq!((param_count(&dims, one).unwrap(), dims.row_width(4)), ((6 * 5 + 5) + (5 + 1) + (2 + 1), 6));
        let flat = Net::Dcn { layers: 1, rank: 0, structure: CrossStructure::Parallel, hidden: vec![] };
        assert!(matches!(param_count(&flat, s), Err(OnnxError::Shape(_))));
    }

    #[test]
    fn a_parameter_vector_of_another_length_is_refused() {
        let net = Net::Mlp { hidden: vec![8] };
        let n = param_count(&net, small()).unwrap();
        let short = model(&net, small(), &vec![0.0; n - 1]).unwrap_err().to_string();
        assert_eq!(short, format!("{} dense parameters given, the model's layout needs more", n - 1));
        let long = model(&net, small(), &vec![0.0; n + 1]).unwrap_err().to_string();
        assert_eq!(long, format!("{} dense parameters given, the model's layout uses {n}", n + 1));
    }

    #[test]
    fn the_file_decodes_to_the_graph_with_its_weights() {
        let net = Net::Mlp { hidden: vec![2] };
        let n = param_count(&net, small()).unwrap();
        let params: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let bytes = encode(&net, small(), &params).unwrap();
        let m = proto::ModelProto::decode(bytes.as_slice()).unwrap();
        assert_eq!((m.ir_version, m.opset_import[0].version), (IR_VERSION, OPSET));
        let g = m.graph.unwrap();
        let names: Vec<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, [INPUT_DENSE, INPUT_EMB]);
        assert_eq!(g.output[0].name, OUTPUT);
        let w0 = g.initializer.iter().find(|t| t.name == "layer0.W").unwrap();
        assert_eq!(w0.dims, [14, 2]);
        let first: Vec<f32> = w0.raw_data.chunks(4).take(3).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(first, [0.0, 0.5, 1.0]);
        let b1 = g.initializer.iter().find(|t| t.name == "layer1.b").unwrap();
        assert_eq!(b1.raw_data, params[n - 1].to_le_bytes());
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Flatten", "Concat", "Gemm", "Relu", "Gemm", "Sigmoid", "Identity"]);
    }
}
