//! The binary's commands: flags (clap), printing and progress; the work is the library's.

pub mod bench;
pub mod clean;
pub mod data;
pub mod export;
pub mod info;
pub mod launch;
pub mod predict;
pub mod progress;
pub mod serve;
pub mod serve_model;
pub mod table;
pub mod train;

/// `given`, else the value of the variable `var` (a flag's default on the command line,
/// [`ringrec::config::cli_default`]), parsed; a value that does not parse is an error
/// naming the variable.
pub fn or_env<T: std::str::FromStr>(given: Option<T>, var: &str) -> anyhow::Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    if given.is_some() {
        return Ok(given);
    }
    match ringrec::config::cli_default(var) {
        Some(v) => v.parse::<T>().map(Some).map_err(|e| anyhow::anyhow!("{var}={v:?} is not valid: {e}")),
        None => Ok(None),
    }
}

/// The message of `e` and its causes, each cause once: a cause whose text its parent
/// already contains (typed errors often quote their source) is not repeated.
pub fn render(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

/// Prints `e` (once, with the rank when several run) and ends the process: with MPI up
/// and peers, the whole job (`MPI_Abort`, after a second so that peers failing the same
/// way print theirs), never through MPI_Finalize, which could wait for a stuck peer.
pub fn fail(e: &anyhow::Error, topo: Option<&ringrec::topology::Topology>) -> ! {
    use std::io::Write;
    match topo {
        Some(t) if t.size > 1 => {
            // A timeout may blame the peer this rank waited for while the cause is another
            // rank the watchdogs saw stop or exit: name it too.
            let msg = render(e);
            let known: Vec<String> = ringrec::watchdog::known_trouble().into_iter().filter(|k| !msg.contains(k.as_str())).collect();
            let seen = if known.is_empty() { String::new() } else { format!(" (the watchdogs saw: {})", known.join("; ")) };
            ringrec::eprint_line(&format!("ringrec rank {}: error: {msg}{seen}", t.rank))
        }
        _ => ringrec::eprint_line(&format!("ringrec: error: {}", render(e))),
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match topo {
        Some(t) if t.size > 1 => {
            std::thread::sleep(std::time::Duration::from_secs(1));
            t.abort(1)
        }
        _ => std::process::exit(1),
    }
}
