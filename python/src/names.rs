//! Horovod's automatic names: `kind.noname.N`, counted per kind in this process, so every
//! rank that makes the same calls in the same order names them alike. One counter for the
//! Python layer (`_name`) and the extension's fast path ([`crate::allreduce_simple`]).

use std::sync::Mutex;

use pyo3::prelude::*;

/// The count of each kind so far, in first-use order (a handful of kinds).
static COUNTS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// The next automatic name of `kind`.
pub fn next(kind: &str) -> String {
    let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match counts.iter().position(|(k, _)| k == kind) {
        Some(i) => i,
        None => {
            counts.push((kind.to_string(), 0));
            counts.len() - 1
        }
    };
    let n = counts[i].1;
    counts[i].1 += 1;
    format!("{kind}.noname.{n}")
}

/// The next automatic name of `kind` (`allreduce`, `broadcast`, ...), for the Python layer.
#[pyfunction]
pub fn auto_name(kind: &str) -> String {
    next(kind)
}
