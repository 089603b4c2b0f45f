//! The likely cause of a failed job, read from its log (design 004's log analysis): a full
//! disk, too many bad input lines, a rank that died, the first error line of any rank, in
//! that order of precedence (a dead rank makes the others report errors about it; a full
//! disk or bad data is the root of whatever follows).

/// The cause of a failure, in one line.
pub fn cause(log: &str, exit_code: Option<i32>) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim_end).collect();
    let first = |pred: &dyn Fn(&str) -> bool| lines.iter().copied().find(|l| pred(l));
    if let Some(l) = first(&|l| l.contains("No space left on device") || l.contains("free space there") || l.contains("Disk quota exceeded")) {
        return format!("disk full: {}", strip(l));
    }
    if let Some(l) = first(&|l| l.contains("malformed line(s)")) {
        return format!("bad input: {}", strip(l));
    }
    if let Some(d) = dead_rank(&lines) {
        return d;
    }
    if let Some(l) = first(&|l| is_error_line(l)) {
        return strip(l).to_string();
    }
    if let Some(l) = first(&|l| l.contains("slurmstepd: error:") || l.contains("srun: error:") || l.starts_with("sbatch: error:")) {
        return l.to_string();
    }
    match exit_code {
        Some(c) if c > 128 => format!("ended by signal {} (exit status {c}); the log names no error", c - 128),
        Some(c) => format!("exit status {c}; the log names no error (see the job's logs)"),
        None => "ended without an exit status; the log names no error".into(),
    }
}

/// `ringrec rank R: error: ...` or `ringrec: error: ...` (or any `error:` line of a rank).
fn is_error_line(l: &str) -> bool {
    (l.starts_with("ringrec") && l.contains("error:")) || l.starts_with("error:")
}

/// The line without a leading `ringrec: ` (the rank form stays: it names the rank).
fn strip(l: &str) -> &str {
    l.strip_prefix("ringrec: ").unwrap_or(l)
}

/// A rank killed by a signal or vanished, as mpirun or srun report it.
fn dead_rank(lines: &[&str]) -> Option<String> {
    for l in lines {
        // Open MPI: "mpirun noticed that process rank 1 with PID 123 on node vm exited on signal 9 (Killed)."
        if let Some(rest) = l.split("mpirun noticed that process rank ").nth(1) {
            let rank = rest.split_whitespace().next().unwrap_or("?");
            if let Some(sig) = rest.split("exited on signal ").nth(1) {
                return Some(format!("rank {rank} died: signal {}", sig.trim_end_matches('.')));
            }
        }
        // srun: "srun: error: vm: task 1: Killed"
        if l.starts_with("srun: error:") && (l.ends_with("Killed") || l.contains("Segmentation fault") || l.contains("Aborted")) {
            return Some(format!("a rank died: {l}"));
        }
    }
    // A rank that exited without an error line of its own (e.g. an abrupt exit) and
    // the watchdog saw it: ringrec's own line says which.
    lines.iter().find(|l| l.contains("the watchdogs saw")).map(|l| {
        let seen = l.split("(the watchdogs saw: ").nth(1).map_or(*l, |s| s.trim_end_matches(')'));
        format!("a rank died or stopped: {seen}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_in_order_of_precedence() {
        let full = "step 1\nringrec rank 0: error: checkpoint: /c/x: cannot reserve space: needs 10 bytes, 0 bytes free in /c: free space there or point ringrec at a larger directory\n";
        assert!(cause(full, Some(1)).starts_with("disk full: ringrec rank 0: error: checkpoint"));
        let bad = "ringrec rank 1: error: reading data: /d/x.tsv: 3 malformed line(s) by line 9, more than --max-bad-lines 2 allows; line 4: 2 fields\n";
        assert!(cause(bad, Some(1)).starts_with("bad input: ringrec rank 1: error: reading data: /d/x.tsv: 3 malformed"));
        let dead = "ringrec rank 0: error: waiting for rank 1: peer gone\n--------\nmpirun noticed that process rank 1 with PID 4242 on node vm exited on signal 9 (Killed).\n";
        assert_eq!(cause(dead, Some(137)), "rank 1 died: signal 9 (Killed)");
        let err = "starting\nringrec: error: --batch 0: must be positive\nringrec rank 1: error: later\n";
        assert_eq!(cause(err, Some(1)), "error: --batch 0: must be positive");
        let srun = "srun: error: vm: task 1: Killed\n";
        assert_eq!(cause(srun, Some(137)), "a rank died: srun: error: vm: task 1: Killed");
        assert_eq!(cause("nothing here\n", Some(3)), "exit status 3; the log names no error (see the job's logs)");
        assert_eq!(cause("", Some(143)), "ended by signal 15 (exit status 143); the log names no error");
    }
}
