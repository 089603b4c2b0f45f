//! A small builder of ONNX inference graphs: each operator a method that takes value names
//! and gives the name of its output, weights as initializers, opset
//! [`super::OPSET`]'s operator signatures (Slice, ReduceSum and Unsqueeze take their axes
//! as int64 inputs, as they do since opset 13).

use super::proto::{self, AttributeProto, GraphProto, NodeProto, TensorProto, ValueInfoProto};

/// A dimension of a graph input or output: fixed, or named (dynamic, the batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A size the caller chooses, under this name.
    Named(&'static str),
}

/// A graph being built: nodes in the order they are added (which is topological, since an
/// operator only takes values that exist), initializers, inputs.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    next: usize,
}

/// A value's type: f32 of `dims`.
fn value_info(name: &str, dims: &[Dim], doc: &str) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => proto::Dimension { dim_value: Some(*n as i64), dim_param: None },
            Dim::Named(s) => proto::Dimension { dim_value: None, dim_param: Some((*s).to_string()) },
        })
        .collect();
    let tensor_type = proto::TensorTypeProto { elem_type: proto::FLOAT, shape: Some(proto::TensorShapeProto { dim }) };
    ValueInfoProto { name: name.into(), r#type: Some(proto::TypeProto { tensor_type: Some(tensor_type) }), doc_string: doc.into() }
}

/// An integer attribute.
fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i, ints: Vec::new(), r#type: proto::ATTR_INT }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Declares a graph input of f32 values, `dims` its shape; gives its name.
    pub fn input(&mut self, name: &str, dims: &[Dim], doc: &str) -> String {
        self.inputs.push(value_info(name, dims, doc));
        name.to_string()
    }

    /// An f32 initializer `name` of shape `dims` holding `values` (row-major).
    pub fn weight(&mut self, name: &str, dims: &[usize], values: &[f32]) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        let raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializers.push(TensorProto { dims: dims.iter().map(|d| *d as i64).collect(), data_type: proto::FLOAT, name: name.into(), raw_data });
        name.to_string()
    }

    /// A one-dimensional int64 constant (axes, indices, slice bounds).
    pub fn ints(&mut self, values: &[i64]) -> String {
        let name = self.fresh("const");
        let raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializers.push(TensorProto { dims: vec![values.len() as i64], data_type: proto::INT64, name: name.clone(), raw_data });
        name
    }

    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{what}{}", self.next)
    }

    /// Appends a node of `op` on `inputs` with `attributes`; gives its one output's name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> String {
        let out = self.fresh(&op.to_ascii_lowercase());
        self.nodes.push(NodeProto { input: inputs.iter().map(|s| s.to_string()).collect(), output: vec![out.clone()], name: format!("{out}_node"), op_type: op.into(), attribute: attributes });
        out
    }

    /// `x @ w + b` (`Gemm`; `x` is batch x in, `w` in x out, `b` out).
    pub fn gemm(&mut self, x: &str, w: &str, b: &str) -> String {
        self.op("Gemm", &[x, w, b], Vec::new())
    }

    /// `a @ b` (`MatMul`, batched over leading dimensions).
    pub fn matmul(&mut self, a: &str, b: &str) -> String {
        self.op("MatMul", &[a, b], Vec::new())
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, x: &str) -> String {
        self.op("Relu", &[x], Vec::new())
    }

    /// `1 / (1 + exp(-x))`.
    pub fn sigmoid(&mut self, x: &str) -> String {
        self.op("Sigmoid", &[x], Vec::new())
    }

    /// `a + b` (broadcast).
    pub fn add(&mut self, a: &str, b: &str) -> String {
        self.op("Add", &[a, b], Vec::new())
    }

    /// `a - b` (broadcast).
    pub fn sub(&mut self, a: &str, b: &str) -> String {
        self.op("Sub", &[a, b], Vec::new())
    }

    /// `a * b`, element-wise (broadcast).
    pub fn mul(&mut self, a: &str, b: &str) -> String {
        self.op("Mul", &[a, b], Vec::new())
    }

    /// The values joined along `axis`.
    pub fn concat(&mut self, xs: &[&str], axis: i64) -> String {
        self.op("Concat", xs, vec![int("axis", axis)])
    }

    /// `x` as a matrix: its dimensions from `axis` on joined into one.
    pub fn flatten(&mut self, x: &str, axis: i64) -> String {
        self.op("Flatten", &[x], vec![int("axis", axis)])
    }

    /// `x[..., start..end, ...]` along `axis`.
    pub fn slice(&mut self, x: &str, axis: i64, start: usize, end: usize) -> String {
        let (s, e, a) = (self.ints(&[start as i64]), self.ints(&[end as i64]), self.ints(&[axis]));
        self.op("Slice", &[x, &s, &e, &a], Vec::new())
    }

    /// The sum over `axes`, those dimensions kept as 1 when `keep`.
    pub fn reduce_sum(&mut self, x: &str, axes: &[i64], keep: bool) -> String {
        let a = self.ints(axes);
        self.op("ReduceSum", &[x, &a], vec![int("keepdims", i64::from(keep))])
    }

    /// `x` with a dimension of 1 inserted at `axis`.
    pub fn unsqueeze(&mut self, x: &str, axis: i64) -> String {
        let a = self.ints(&[axis]);
        self.op("Unsqueeze", &[x, &a], Vec::new())
    }

    /// `x` with its dimensions in the order `perm`.
    pub fn transpose(&mut self, x: &str, perm: &[i64]) -> String {
        self.op("Transpose", &[x], vec![AttributeProto { name: "perm".into(), i: 0, ints: perm.to_vec(), r#type: proto::ATTR_INTS }])
    }

    /// The entries `indices` of `x` along `axis`.
    pub fn gather(&mut self, x: &str, axis: i64, indices: &[i64]) -> String {
        let i = self.ints(indices);
        self.op("Gather", &[x, &i], vec![int("axis", axis)])
    }

    /// The finished graph `name`, its output `value` published as `output` (an Identity
    /// node names it), of shape `dims`.
    pub fn finish(mut self, name: &str, value: &str, output: (&str, &[Dim], &str)) -> GraphProto {
        let (out, dims, doc) = output;
        self.nodes.push(NodeProto { input: vec![value.into()], output: vec![out.into()], name: format!("{out}_node"), op_type: "Identity".into(), attribute: Vec::new() });
        GraphProto { node: self.nodes, name: name.into(), initializer: self.initializers, doc_string: String::new(), input: self.inputs, output: vec![value_info(out, dims, doc)] }
    }
}
