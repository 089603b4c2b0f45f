//! [`ModelSpec`]: which dense model a run trains and its shape — the one description the
//! nets, `dense.bin`, checkpoints, bundles and the numpy scorer follow.
//!
//! Notation: `F` sparse fields, `d` = `--dim`, `n` dense features, `w = F d + n`. Every
//! model's parameters are one flat vector cut into **groups** ([`ModelSpec::groups`]); a
//! group is one engine tensor (`dense.layer<g>`) and one optimizer range. An MLP layer
//! `in -> out` is `W` (in x out, row-major) then `b` (out), as [`super::Mlp`] lays it out.
//!
//! - `mlp`: layers `[w, hidden..., 1]` on `[e_1..e_F, x]`.
//! - `dlrm`: bottom layers `[n, bottom..., d]` (ReLU after every one), then the dot
//!   products of `[z_0, e_1..e_F]` (pairs `i` in `0..=F`, `j < i`, or `j <= i` with
//!   self-interaction), then top layers `[d + P, hidden..., 1]` on `[z_0, dots]`.
//! - `dcn`: cross layers `x_{l+1} = x_0 * (x_l W_l + b_l) + x_l` (group: `W_l`, `b_l`), or
//!   low-rank `x_0 * ((x_l V_l) U_l + b_l) + x_l` (group: `V_l` (w x r), `U_l` (r x w),
//!   `b_l`); stacked: the MLP `[w, hidden..., 1]` on `x_L`; parallel: deep layers `[w,
//!   hidden...]` on `x_0` giving `h`, then one layer `[w + hidden_last, 1]` on `[x_L, h]`.
//! - `deepfm`: the MLP `[w, hidden..., 1]` on `[e, x]`, then the linear group `w_x` (n),
//!   `b` (1); logit = deep + `x w_x + b` + the first-order weights of the sample's keys +
//!   `0.5 * sum_k ((sum_f e_f)_k^2 - sum_f e_{f,k}^2)`. The table row is `d + 1` wide: value
//!   `d` is the key's first-order weight.
//! - `wide-deep`: as `deepfm` without the second-order term. Over fields of different dims
//!   (`--table`, [`ModelSpec::field_dims`]) the input is one field of their rows side by
//!   side: field `f`'s `d_f` values then its first-order weight; `e` is their values.

use crate::config::named_enum;
use crate::hash::splitmix64_next;

use super::input::InputLayout;

/// The dense model a run trains (`--model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// The embeddings and dense features concatenated into an MLP.
    #[default]
    Mlp,
    /// DLRM: bottom MLP, pairwise dot interaction, top MLP (Naumov et al. 2019).
    Dlrm,
    /// DCN-v2: cross network and deep MLP (Wang et al. 2021).
    Dcn,
    /// DeepFM: first order + factorisation machine + deep MLP (Guo et al. 2017).
    DeepFm,
    /// Wide & Deep: first order (linear) + deep MLP (Cheng et al. 2016).
    WideDeep,
}

named_enum!(ModelKind { Mlp => "mlp", Dlrm => "dlrm", Dcn => "dcn", DeepFm => "deepfm", WideDeep => "wide-deep" });

/// How DCN-v2's cross network and deep MLP are combined (`--cross-structure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CrossStructure {
    /// The deep MLP on the cross network's output.
    #[default]
    Stacked,
    /// The cross network and the deep MLP side by side on the input, concatenated into
    /// one last layer.
    Parallel,
}

named_enum!(CrossStructure { Stacked => "stacked", Parallel => "parallel" });

/// Which model and its shape (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The model.
    pub kind: ModelKind,
    /// Sparse fields per sample.
    pub fields: usize,
    /// Embedding dimension `d` (`--dim`).
    pub dim: usize,
    /// Dense features per sample.
    pub ndense: usize,
    /// Hidden widths of the deep (or DLRM's top) MLP (`--hidden`).
    pub hidden: Vec<usize>,
    /// DLRM's bottom MLP hidden widths (`--bottom-mlp`); its last layer is `d` wide.
    pub bottom: Vec<usize>,
    /// DLRM: each vector's dot with itself too (`--interaction-self`).
    pub interaction_self: bool,
    /// DCN-v2's cross layers (`--cross-layers`).
    pub cross_layers: usize,
    /// DCN-v2's cross rank (`--cross-rank`; 0 = full matrices).
    pub cross_rank: usize,
    /// DCN-v2's structure (`--cross-structure`).
    pub cross_structure: CrossStructure,
    /// A wide-deep over fields of different dims (`--table`, issue 33): each field's dim
    /// `d_f`, in field order; the model then takes one input field (`fields` 1, `dim` the
    /// sum of the `d_f`) holding every field's `d_f` values and first-order weight side by
    /// side. Empty otherwise (every field has `dim`).
    pub field_dims: Vec<usize>,
}

/// `[first, mid..., last]`: an MLP's layer widths.
fn stack(first: usize, mid: &[usize], last: Option<usize>) -> Vec<usize> {
    let mut v = vec![first];
    v.extend(mid);
    v.extend(last);
    v
}

/// One parameter group: `rows x cols` values at `offset` of the flat vector (an MLP
/// layer: `(in + 1) x out`, its W then its b).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// What it is (`top layer 1`, `cross layer 0`, `linear`).
    pub name: String,
    /// Offset in the flat parameter vector.
    pub offset: usize,
    /// Rows of the group seen as a matrix (the non-finite check sums its columns).
    pub rows: usize,
    /// Columns of the group seen as a matrix.
    pub cols: usize,
}

impl Group {
    /// Values in the group.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    /// Whether the group is empty (never, for a valid spec).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Its range in the flat vector.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// How a group's values are drawn at initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    /// Glorot-uniform over (fan_in, fan_out).
    Glorot(usize, usize),
    /// Zeros.
    Zero,
}

impl ModelSpec {
    /// Today's model: the MLP of `hidden` over `fields` rows of `dim` and `ndense` features.
    pub fn mlp(fields: usize, dim: usize, ndense: usize, hidden: Vec<usize>) -> ModelSpec {
        ModelSpec { kind: ModelKind::Mlp, fields, dim, ndense, hidden, bottom: vec![64], interaction_self: false, cross_layers: 3, cross_rank: 0, cross_structure: CrossStructure::Stacked, field_dims: Vec::new() }
    }

    /// Values per table row: `d`, or `d + 1` where the model has first-order weights (with
    /// [`ModelSpec::field_dims`]: the one input field's, every `d_f + 1`).
    pub fn row_width(&self) -> usize {
        self.dim + usize::from(self.first_order()) * self.field_dims.len().max(1)
    }

    /// Whether the table rows carry a first-order weight (deepfm, wide-deep).
    pub fn first_order(&self) -> bool {
        matches!(self.kind, ModelKind::DeepFm | ModelKind::WideDeep)
    }

    /// The input layout the trainer stages: rows of [`ModelSpec::row_width`].
    pub fn layout(&self) -> InputLayout {
        InputLayout { fields: self.fields, dim: self.row_width(), ndense: self.ndense }
    }

    /// `w = F d + n`: the concatenated embeddings and dense features (the embeddings
    /// without first-order weights).
    pub fn concat_width(&self) -> usize {
        self.fields * self.dim + self.ndense
    }

    /// The widths of an `mlp`'s layers, `[w, hidden..., 1]` (what `dense.bin` records).
    pub fn mlp_widths(&self) -> Vec<usize> {
        stack(self.concat_width(), &self.hidden, Some(1))
    }

    /// The layer widths of the model's deep MLP (DLRM's top MLP): `[d + P, hidden..., 1]`
    /// for dlrm, `[w, hidden...]` for a parallel dcn (its last layer is a group of its own),
    /// `[w, hidden..., 1]` otherwise.
    pub fn deep_widths(&self) -> Vec<usize> {
        match self.kind {
            ModelKind::Dlrm => stack(self.dim + self.pairs(), &self.hidden, Some(1)),
            ModelKind::Dcn if self.cross_structure == CrossStructure::Parallel => stack(self.concat_width(), &self.hidden, None),
            _ => self.mlp_widths(),
        }
    }

    /// DLRM's bottom MLP's layer widths, `[n, bottom..., d]`.
    pub fn bottom_widths(&self) -> Vec<usize> {
        stack(self.ndense, &self.bottom, Some(self.dim))
    }

    /// DLRM's number of dot products.
    pub fn pairs(&self) -> usize {
        let v = self.fields + 1;
        if self.interaction_self {
            v * (v + 1) / 2
        } else {
            v * (v - 1) / 2
        }
    }

    /// Why the spec does not make a model; `None` when it does.
    pub fn check(&self) -> Option<String> {
        if self.fields == 0 || self.dim == 0 {
            return Some(format!("fields {} and dim {} must be positive", self.fields, self.dim));
        }
        if self.hidden.contains(&0) || self.bottom.contains(&0) {
            return Some("every --hidden and --bottom-mlp width must be positive".into());
        }
        if self.kind == ModelKind::Dcn && self.cross_layers == 0 {
            return Some("--cross-layers must be at least 1 for --model dcn".into());
        }
        if self.kind == ModelKind::Dcn && self.cross_structure == CrossStructure::Parallel && self.hidden.is_empty() {
            return Some("--cross-structure parallel needs at least one --hidden width".into());
        }
        if self.kind == ModelKind::Dlrm && self.ndense == 0 {
            return Some("--model dlrm needs dense features (its bottom MLP reads them)".into());
        }
        if !self.field_dims.is_empty() && (self.kind != ModelKind::WideDeep || self.fields != 1 || self.field_dims.contains(&0) || self.field_dims.iter().sum::<usize>() != self.dim) {
            return Some(format!("field dims {:?} are for a wide-deep of one input field of their sum (the {} has {} fields of {})", self.field_dims, self.kind, self.fields, self.dim));
        }
        None
    }

    /// The parameter groups in flat order, with how each is initialised.
    fn plan(&self) -> Vec<(String, usize, usize, Init)> {
        let mut g = Vec::new();
        let mlp = |g: &mut Vec<(String, usize, usize, Init)>, what: &str, widths: &[usize]| {
            for (l, p) in widths.windows(2).enumerate() {
                g.push((format!("{what} layer {l}"), p[0] + 1, p[1], Init::Glorot(p[0], p[1])));
            }
        };
        let w = self.concat_width();
        match self.kind {
            ModelKind::Mlp => mlp(&mut g, "mlp", &self.deep_widths()),
            ModelKind::Dlrm => {
                mlp(&mut g, "bottom", &self.bottom_widths());
                mlp(&mut g, "top", &self.deep_widths());
            }
            ModelKind::Dcn => {
                for l in 0..self.cross_layers {
                    let (rows, init) = if self.cross_rank == 0 { (w + 1, Init::Glorot(w, w)) } else { (2 * self.cross_rank + 1, Init::Glorot(w, self.cross_rank)) };
                    g.push((format!("cross layer {l}"), rows, w, init));
                }
                mlp(&mut g, "deep", &self.deep_widths());
                if self.cross_structure == CrossStructure::Parallel {
                    let h = self.hidden.last().copied().unwrap_or(0);
                    g.push(("last layer".into(), w + h + 1, 1, Init::Glorot(w + h, 1)));
                }
            }
            ModelKind::DeepFm | ModelKind::WideDeep => {
                mlp(&mut g, "deep", &self.deep_widths());
                g.push(("linear".into(), self.ndense + 1, 1, Init::Zero));
            }
        }
        g
    }

    /// The parameter groups in flat order (see the module docs).
    pub fn groups(&self) -> Vec<Group> {
        let mut offset = 0;
        self.plan()
            .into_iter()
            .map(|(name, rows, cols, _)| {
                let g = Group { name, offset, rows, cols };
                offset += g.len();
                g
            })
            .collect()
    }

    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.plan().iter().map(|(_, r, c, _)| r * c).sum()
    }

    /// The initial parameters drawn from `seed` (the same on every rank): Glorot-uniform
    /// matrices, zero biases and linear weights. For `mlp` the values of [`super::MlpShape::init_params`].
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut params = vec![0f32; self.num_params()];
        let mut rng = seed ^ 0xD1B5_4A32_D192_ED03;
        let mut at = 0;
        for (_, rows, cols, init) in self.plan() {
            if let Init::Glorot(fan_in, fan_out) = init {
                // The matrices of the group (all but its last row of biases); a low-rank
                // cross layer's V (w x r) and U (r x w) are drawn with one limit.
                let limit = (6.0 / (fan_in + fan_out) as f64).sqrt();
                for x in &mut params[at..at + (rows - 1) * cols] {
                    let u = (splitmix64_next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                    *x = ((2.0 * u - 1.0) * limit) as f32;
                }
            }
            at += rows * cols;
        }
        params
    }

    /// One line for logs: `dlrm (bottom 13-64-16, 351 dots, top 367-256-128-1)`.
    pub fn describe(&self) -> String {
        let dashed = |v: &[usize]| v.iter().map(|w| w.to_string()).collect::<Vec<_>>().join("-");
        let w = self.concat_width();
        let deep = dashed(&self.deep_widths());
        match self.kind {
            ModelKind::Mlp => format!("mlp {deep}"),
            ModelKind::Dlrm => {
                format!("dlrm (bottom {}, {} dots{}, top {deep})", dashed(&self.bottom_widths()), self.pairs(), if self.interaction_self { " with self" } else { "" })
            }
            ModelKind::Dcn => {
                let cross = if self.cross_rank == 0 { "full".to_string() } else { format!("rank {}", self.cross_rank) };
                format!("dcn ({} {cross} cross layers of {w}, {}, deep {deep})", self.cross_layers, self.cross_structure)
            }
            ModelKind::DeepFm => format!("deepfm (first order + FM over {} fields of {}, deep {deep})", self.fields, self.dim),
            ModelKind::WideDeep if !self.field_dims.is_empty() => format!("wide-deep (first order over {} fields of dims {}, deep {deep})", self.field_dims.len(), dashed(&self.field_dims)),
            ModelKind::WideDeep => format!("wide-deep (first order, deep {deep})"),
        }
    }
}

impl ModelSpec {
    /// The flags that give this model's shape, as typed (`--model`, `--dim`, `--hidden`,
    /// then the kind's own: `--bottom-mlp`, `--interaction-self` for dlrm; `--cross-layers`,
    /// `--cross-rank`, `--cross-structure` for dcn), the input's field counts, and a
    /// wide-deep's `field dims` ([`ModelSpec::field_dims`]) when it has them: what a warm
    /// start compares and a bundle's `model.json` records.
    pub fn shape_flags(&self) -> Vec<(&'static str, String)> {
        let list = |v: &[usize]| v.iter().map(|w| w.to_string()).collect::<Vec<_>>().join(",");
        let mut v = vec![("--model", self.kind.to_string()), ("sparse fields", self.fields.to_string()), ("dense features", self.ndense.to_string()), ("--dim", self.dim.to_string()), ("--hidden", list(&self.hidden))];
        match self.kind {
            ModelKind::Dlrm => v.extend([("--bottom-mlp", list(&self.bottom)), ("--interaction-self", self.interaction_self.to_string())]),
            ModelKind::Dcn => v.extend([("--cross-layers", self.cross_layers.to_string()), ("--cross-rank", self.cross_rank.to_string()), ("--cross-structure", self.cross_structure.to_string())]),
            _ => {}
        }
        if !self.field_dims.is_empty() {
            v.push(("field dims", list(&self.field_dims)));
        }
        v
    }

    /// Where `self` and `other` are different models: each flag of [`ModelSpec::shape_flags`]
    /// they both have with its two values (`self`'s first); a kind's own flags only when
    /// the kinds agree. Empty: the same model (the same parameters mean the same thing).
    pub fn differences(&self, other: &ModelSpec) -> Vec<(&'static str, String, String)> {
        let theirs = other.shape_flags();
        self.shape_flags().into_iter().filter_map(|(flag, mine)| theirs.iter().find(|(f, _)| *f == flag).filter(|(_, t)| *t != mine).map(|(_, t)| (flag, mine, t.clone()))).collect()
    }

    /// The spec with the fields its kind does not use at their defaults (those of
    /// [`ModelSpec::mlp`]): two specs of one model compare equal.
    pub fn normalized(&self) -> ModelSpec {
        let base = ModelSpec::mlp(self.fields, self.dim, self.ndense, self.hidden.clone());
        match self.kind {
            ModelKind::Dlrm => ModelSpec { kind: self.kind, bottom: self.bottom.clone(), interaction_self: self.interaction_self, ..base },
            ModelKind::Dcn => ModelSpec { kind: self.kind, cross_layers: self.cross_layers, cross_rank: self.cross_rank, cross_structure: self.cross_structure, ..base },
            ModelKind::WideDeep => ModelSpec { kind: self.kind, field_dims: self.field_dims.clone(), ..base },
            kind => ModelSpec { kind, ..base },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MlpShape;

    fn spec(kind: ModelKind) -> ModelSpec {
        ModelSpec { kind, ..ModelSpec::mlp(26, 16, 13, vec![256, 128]) }
    }

    #[test]
    fn the_mlp_spec_is_todays_mlp_bit_for_bit() {
        let s = spec(ModelKind::Mlp);
        let shape = MlpShape { input: 429, hidden: vec![256, 128] };
        assert_eq!(s.num_params(), shape.num_params());
        assert_eq!(s.init_params(7), shape.init_params(7));
        let offs = shape.offsets();
        for (g, (w, _)) in s.groups().iter().zip(offs) {
            assert_eq!(g.offset, w);
        }
        assert_eq!(s.layout(), InputLayout { fields: 26, dim: 16, ndense: 13 });
    }

    #[test]
    fn group_sizes_follow_the_formulas() {
        let d = spec(ModelKind::Dlrm);
        assert_eq!(d.pairs(), 27 * 26 / 2);
        let bottom = 14 * 64 + 65 * 16;
        let top = (16 + 351 + 1) * 256 + 257 * 128 + 129;
        assert_eq!(d.num_params(), bottom + top);
        assert_eq!(ModelSpec { interaction_self: true, ..d.clone() }.pairs(), 27 * 28 / 2);
        let c = spec(ModelKind::Dcn);
        assert_eq!(c.num_params(), 3 * 430 * 429 + 430 * 256 + 257 * 128 + 129);
        let lr = ModelSpec { cross_rank: 8, cross_structure: CrossStructure::Parallel, ..c };
        assert_eq!(lr.num_params(), 3 * (2 * 429 * 8 + 429) + 430 * 256 + 257 * 128 + (429 + 128 + 1));
        let f = spec(ModelKind::DeepFm);
        assert_eq!(f.num_params(), spec(ModelKind::Mlp).num_params() + 14);
        assert_eq!((f.row_width(), f.layout().width()), (17, 26 * 17 + 13));
        let groups = f.groups();
        assert_eq!(groups.last().map(|g| (g.name.as_str(), g.range())), Some(("linear", f.num_params() - 14..f.num_params())));
        assert!(groups.windows(2).all(|p| p[0].range().end == p[1].offset));
    }

    #[test]
    fn init_draws_matrices_and_leaves_biases_and_linear_zero() {
        for kind in ModelKind::ALL {
            let s = spec(*kind);
            let p = s.init_params(3);
            for g in s.groups() {
                let v = &p[g.range()];
                let (body, last) = v.split_at(v.len() - g.cols);
                assert!(last.iter().all(|x| *x == 0.0), "{kind} {}: biases", g.name);
                assert_eq!(body.iter().any(|x| *x != 0.0), g.name != "linear", "{kind} {}", g.name);
            }
        }
    }

    #[test]
    fn bad_specs_are_refused_with_the_flag() {
        assert!(ModelSpec { cross_layers: 0, ..spec(ModelKind::Dcn) }.check().unwrap().contains("--cross-layers"));
        assert!(ModelSpec { hidden: vec![], cross_structure: CrossStructure::Parallel, ..spec(ModelKind::Dcn) }.check().unwrap().contains("parallel"));
        assert!(spec(ModelKind::Dlrm).check().is_none());
        assert_eq!("wide-deep".parse::<ModelKind>(), Ok(ModelKind::WideDeep));
        assert!("dlrm2".parse::<ModelKind>().unwrap_err().contains("mlp, dlrm, dcn, deepfm, wide-deep"));
    }

    #[test]
    fn differences_name_the_flags_of_the_shape() {
        let d = spec(ModelKind::Dlrm);
        assert!(d.differences(&d.clone()).is_empty());
        let other = ModelSpec { bottom: vec![32], dim: 8, ..d.clone() };
        assert_eq!(d.differences(&other), vec![("--dim", "16".to_string(), "8".to_string()), ("--bottom-mlp", "64".into(), "32".into())]);
        // Another kind: its flags are not compared, only the shared ones.
        assert_eq!(d.differences(&spec(ModelKind::Mlp)), vec![("--model", "dlrm".to_string(), "mlp".to_string())]);
        // Fields a kind does not use do not make another model.
        let stray = ModelSpec { cross_layers: 7, ..spec(ModelKind::DeepFm) };
        assert!(stray.differences(&spec(ModelKind::DeepFm)).is_empty());
        assert_eq!(stray.normalized(), spec(ModelKind::DeepFm));
        assert_eq!(spec(ModelKind::Dcn).shape_flags().last(), Some(&("--cross-structure", "stacked".to_string())));
    }
}
