//! Allreduce over sub-groups of a multi-host world, so that the hierarchical algorithm meets
//! uneven host layouts (three ranks on one host and one on the other, for instance). Each rank
//! prints its group's host layout and whether every result was right.
//! Usage: hccnrun ... hccn-hier (with 2 hosts of 2 ranks: the netns test runs it).

use std::process::ExitCode;

use hccn_runtime::{Communicator, DataType, Op, Ptr, ReduceOp};

/// Checks allreduce(sum) over `comm` at several counts, out of place and in place; the expected
/// value of element i is the sum over members m of (world rank of m + 1) * (i % 7 + 1).
fn check(comm: &Communicator, world_ranks: &[u32]) -> Result<u64, String> {
    let me = world_ranks[comm.rank() as usize];
    let total: i64 = world_ranks.iter().map(|r| *r as i64 + 1).sum();
    let mut wrong = 0u64;
    for count in [1usize, 2, 3, 5, 1000, 300_001] {
        let send: Vec<i64> = (0..count).map(|i| (me as i64 + 1) * (i as i64 % 7 + 1)).collect();
        let mut recv = vec![0i64; count];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).map_err(|e| format!("count {count}: {e}"))?;
        let mut in_place = send.clone();
        let op = Op::AllReduce {
            send: Ptr::from_const(in_place.as_ptr()),
            recv: Ptr::from_mut(in_place.as_mut_ptr()),
            count: count as u64,
            dt: DataType::Int64,
            op: ReduceOp::Sum,
        };
        // SAFETY: one live buffer of `count` elements, both send and receive (in place), which
        // outlives this blocking call.
        unsafe { comm.submit(op, None) }.map_err(|e| format!("count {count} in place: {e}"))?;
        for got in [&recv, &in_place] {
            wrong += got.iter().enumerate().filter(|(i, v)| **v != total * (*i as i64 % 7 + 1)).count() as u64;
        }
    }
    Ok(wrong)
}

fn main() -> ExitCode {
    let world = match hccn_tools::join_job() {
        Ok(c) => c.control().clone(),
        Err(e) => {
            eprintln!("hccn-hier: {e}");
            return ExitCode::FAILURE;
        }
    };
    let n = world.size();
    let me = world.rank();
    let mut groups: Vec<Vec<u32>> = vec![(0..n).collect()];
    // Every set of n-1 ranks: with two hosts of two, each leaves one host with a single rank.
    groups.extend((0..n).map(|skip| (0..n).filter(|r| *r != skip).collect()));
    let mut ok = true;
    for g in &groups {
        if !g.contains(&me) {
            continue;
        }
        let outcome = world.new_group(g).map_err(|e| e.to_string()).and_then(|c| {
            let hosts = c.hosts();
            check(&c, g).map(|wrong| (hosts, wrong))
        });
        match outcome {
            Ok((hosts, wrong)) => {
                println!("GROUP {g:?} hosts={hosts:?} wrong={wrong}");
                ok &= wrong == 0;
            }
            Err(e) => {
                println!("GROUP {g:?} FAIL {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
