//! Workloads, RMM log parsing, the replayers and the minimum-capacity search, over `Simulated`.

mod replayer;
mod rmm_log;
mod threads;

use mrstack::replay::Op;

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream\n";

fn alloc(id: usize, size: usize) -> Op {
    Op::Alloc {
        id,
        size,
        stream: 0,
    }
}

fn free(id: usize) -> Op {
    Op::Free { id }
}
