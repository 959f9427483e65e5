//! What the benchmarks read of a process's CPU time and memory from `/proc`.

use std::time::Duration;

/// CPU time this process's threads have run, in nanoseconds, from each thread's
/// `/proc/self/task/<tid>/schedstat` (the scheduler's own count: `/proc/self/stat`
/// counts in 10 ms clock ticks, coarser than a scrape).
pub fn thread_cpu_time() -> Duration {
    let ns: u64 = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// The machine a benchmark ran on, as its report's first line: the CPUs this
/// process may use and the load averages (`/proc/loadavg`).
pub fn machine_line() -> String {
    format!(
        "nproc {}, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    )
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`); 0 when unknown.
pub fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user and system) of process `pid` so far, from `/proc/<pid>/stat`, in
/// clock ticks of 10 ms.
pub fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (in parentheses, which may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}
