//! The messages of onnx.proto (ONNX's `onnx/onnx.proto`, package `onnx`) that an inference
//! graph of dense tensors needs, declared with prost's derive under onnx.proto's own field
//! numbers. Fields ringrec never writes are left out: a protobuf reader skips nothing it
//! expects and the writer only emits what is here.

/// `TensorProto.DataType.FLOAT`.
pub const FLOAT: i32 = 1;
/// `TensorProto.DataType.INT64`.
pub const INT64: i32 = 7;
/// `AttributeProto.AttributeType.INT`.
pub const ATTR_INT: i32 = 2;
/// `AttributeProto.AttributeType.INTS`.
pub const ATTR_INTS: i32 = 7;

/// `ModelProto`: the file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// The IR version the model targets.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// The operator sets it imports.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// The tool that wrote it.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// That tool's version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// What the model is, for a person.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// `OperatorSetIdProto`: an operator set and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// The domain (empty: the default `ai.onnx`).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The opset version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `GraphProto`: nodes in topological order, the constant tensors, inputs and outputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// The graph's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The weights and constant index tensors.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// What the graph is, for a person.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// The inputs a caller feeds.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// The outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`: one operator applied.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input value names.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// The operator (`Gemm`, `Relu`, ...).
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Its attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto`: an integer or a list of integers (all ringrec's graphs need).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// One integer ([`ATTR_INT`]).
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// Integers ([`ATTR_INTS`]).
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    /// Which of the above it is.
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

/// `TensorProto`: a constant tensor, little-endian in `raw_data`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// Its shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// Its element type ([`FLOAT`], [`INT64`]).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Its name (the value name nodes refer to).
    #[prost(string, tag = "8")]
    pub name: String,
    /// The elements, little-endian, row-major.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
}

/// `ValueInfoProto`: a graph input's or output's name and type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    /// What it is, for a person.
    #[prost(string, tag = "3")]
    pub doc_string: String,
}

/// `TypeProto` with its `tensor_type` case (field 1 of its `value` oneof).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// A dense tensor type.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`: element type and shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorTypeProto {
    /// The element type.
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// The shape.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a fixed size or a named (dynamic) one.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// A fixed size (`dim_value`, field 1 of the `value` oneof).
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// A named size (`dim_param`, field 2 of the oneof).
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}
