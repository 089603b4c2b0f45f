//! Work split into near-equal consecutive ranges: the one rule every backend and kernel
//! uses to divide `n` items among `parts` (rank r's part of a ring or a shared segment, a
//! CPU thread's rows).

/// Splits `n` items into `parts` nearly equal consecutive ranges; range `i`.
pub fn part(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    (n * i / parts)..(n * (i + 1) / parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_everything_once() {
        for n in [0, 1, 7, 13, 100] {
            for p in 1..6 {
                let mut next = 0;
                for i in 0..p {
                    let r = part(n, p, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
