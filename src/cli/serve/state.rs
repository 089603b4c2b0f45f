//! A job's states (design 004's eleven, plus `succeeded`) and what may follow what.

use serde::{Deserialize, Serialize};

/// Where a job is in its life, as the API writes it (snake_case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Recorded by the service; not yet handed to a back end.
    Received,
    /// Being handed to its back end (spawning the local supervisor, `sbatch`).
    Submitting,
    /// The back end accepted it (a supervisor runs, Slurm gave a job id).
    Submitted,
    /// The back end could not take it (the cause says why).
    SubmitFailed,
    /// Waiting for resources (a local slot, a Slurm allocation).
    Queued,
    /// Its ranks run.
    Running,
    /// The back end cannot say (the service restarted while submitting, the cluster
    /// forgot the job); resolved at the next poll where possible.
    Unknown,
    /// A kill was sent; the job has not ended yet.
    StopRequested,
    /// Suspended by the cluster (Slurm `SUSPENDED`).
    Paused,
    /// Ended by a kill (or cancelled by the cluster).
    Stopped,
    /// Ended with an error (the cause says which, from the log).
    Failed,
    /// Ended with exit status 0.
    Succeeded,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 12] = [
        JobState::Received,
        JobState::Submitting,
        JobState::Submitted,
        JobState::SubmitFailed,
        JobState::Queued,
        JobState::Running,
        JobState::Unknown,
        JobState::StopRequested,
        JobState::Paused,
        JobState::Stopped,
        JobState::Failed,
        JobState::Succeeded,
    ];

    /// The API's (and the database's) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Received => "received",
            JobState::Submitting => "submitting",
            JobState::Submitted => "submitted",
            JobState::SubmitFailed => "submit_failed",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Unknown => "unknown",
            JobState::StopRequested => "stop_requested",
            JobState::Paused => "paused",
            JobState::Stopped => "stopped",
            JobState::Failed => "failed",
            JobState::Succeeded => "succeeded",
        }
    }

    /// The state spelled `s` (as [`JobState::as_str`] writes it).
    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Nothing follows a final state: the job's processes are gone.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::SubmitFailed | JobState::Stopped | JobState::Failed | JobState::Succeeded)
    }

    /// The job was handed to a back end, which may still run it (it is polled).
    pub fn is_tracked(self) -> bool {
        matches!(self, JobState::Submitted | JobState::Queued | JobState::Running | JobState::Unknown | JobState::StopRequested | JobState::Paused)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_and_match_serde() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{}\"", s.as_str())));
        }
        assert_eq!(JobState::parse("Running"), None);
        assert_eq!(JobState::ALL.iter().filter(|s| s.is_final()).count(), 4);
        assert!(!JobState::Received.is_tracked() && JobState::StopRequested.is_tracked());
    }
}
