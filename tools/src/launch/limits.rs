//! The open-file limit: hccnrun holds pipes and store connections for every rank, and each rank
//! a connection or two per peer. The soft limit (which the ranks inherit) is raised toward the
//! hard one as far as the job needs, and no further: programs that still use select() break on
//! descriptors above 1024.

/// Descriptors a job of `world` ranks may need in one process (hccnrun's pipes, files and store
/// connections for its ranks, or a rank's links to its peers), over what any process uses.
pub(super) fn needed(world: u32) -> u64 {
    256 + 8 * u64::from(world)
}

/// Raises the soft RLIMIT_NOFILE to `need` (at most the hard limit); says so when the hard
/// limit is lower.
pub(super) fn raise_open_files(need: u64) {
    // SAFETY: a zeroed rlimit is a valid out-parameter.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `lim` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= need {
        return;
    }
    let want = need.min(lim.rlim_max);
    if want > lim.rlim_cur {
        let raised = libc::rlimit { rlim_cur: want, rlim_max: lim.rlim_max };
        // SAFETY: a plain setrlimit within the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            super::say(format_args!(
                "cannot raise the open-file limit from {} to {want}: {}; ranks may fail with \"Too many open files\"",
                lim.rlim_cur,
                std::io::Error::last_os_error()
            ));
            return;
        }
    }
    if want < need {
        super::say(format_args!(
            "the open-file limit is {want} (its hard limit, ulimit -Hn) but this job may need about {need}; \
             raise the hard limit if ranks fail with \"Too many open files\""
        ));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_job_of_many_ranks_needs_more_than_the_usual_1024() {
        assert!(super::needed(16) <= 1024);
        assert!(super::needed(1000) > 1024);
    }
}
