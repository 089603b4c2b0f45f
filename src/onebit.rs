//! The 1-bit compression forms of design 001, shared by the dense allreduce
//! ([`crate::engine::compression`], with the derivation of the bounds) and the sparse rows
//! of the cross-host exchange ([`crate::sparse::onebit`]): a vector `v` of `d` values is
//! sent as `s * sign(v)` with one scale `s`.

/// The scale of 1-bit compression (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OneBitForm {
    /// `||v||_1 / d`.
    L1,
    /// `lambda ||v||_2 / sqrt(d)`.
    L2 {
        /// The factor, in `(0, 1]`.
        lambda: f32,
    },
}

/// The default `RINGREC_ONEBIT_LAMBDA`: the L2 form keeps the norm.
pub const DEFAULT_LAMBDA: f32 = 1.0;

/// Checks a lambda of the L2 form: `0 < lambda <= 1`.
pub fn check_lambda(lambda: f32) -> Result<f32, String> {
    if lambda > 0.0 && lambda <= 1.0 {
        Ok(lambda)
    } else {
        Err(format!("the 1-bit L2 factor lambda must be in (0, 1], got {lambda}; e.g. 0.5"))
    }
}

impl OneBitForm {
    /// The scale of `v` in this form, from its L1 norm or its squared L2 norm (each summed
    /// in f64) and its length `d`.
    pub fn scale(self, l1: f64, l2sq: f64, d: usize) -> f32 {
        if d == 0 {
            return 0.0;
        }
        match self {
            OneBitForm::L1 => (l1 / d as f64) as f32,
            OneBitForm::L2 { lambda } => lambda * (l2sq / d as f64).sqrt() as f32,
        }
    }

    /// The scale of `v` (norms summed in index order).
    pub fn scale_of(self, v: &[f32]) -> f32 {
        let (l1, l2sq) = v.iter().fold((0f64, 0f64), |(a, b), x| (a + x.abs() as f64, b + (*x as f64) * (*x as f64)));
        self.scale(l1, l2sq, v.len())
    }

    /// The wire code of the L2 factor (f32 bits; 0 for the L1 form).
    pub fn lambda(self) -> f32 {
        match self {
            OneBitForm::L1 => 0.0,
            OneBitForm::L2 { lambda } => lambda,
        }
    }
}

/// The bound design 001 states on the error of one compression, as the module docs derive
/// it: `||C[v] - v||^2 <= (1 - 1/d) ||v||^2` for the L1 form, and `(1 - lambda^2) ||v||^2`
/// for the L2 form where `lambda <= rho(v)`; `None` where the L2 form has no such bound
/// (`lambda > rho(v)`).
pub fn onebit_error_bound(form: OneBitForm, v: &[f32]) -> Option<f64> {
    let d = v.len() as f64;
    let l2sq: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum();
    let l1: f64 = v.iter().map(|x| x.abs() as f64).sum();
    match form {
        OneBitForm::L1 => Some((1.0 - 1.0 / d) * l2sq),
        OneBitForm::L2 { lambda } => {
            let rho = l1 / (d.sqrt() * l2sq.sqrt());
            (lambda as f64 <= rho).then(|| (1.0 - (lambda as f64).powi(2)) * l2sq)
        }
    }
}


/// Scales of a 1-bit encoding of `n` values in blocks of `block` values (0: one scale for
/// all of them); at least 1.
pub fn scales(n: usize, block: usize) -> usize {
    if block == 0 {
        1
    } else {
        n.div_ceil(block).max(1)
    }
}
