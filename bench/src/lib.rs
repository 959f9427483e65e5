//! What the benchmark tools share: reading a measured process's CPU time and memory
//! from `/proc`, and simulated agents ([`sim`]).

pub mod sim;

pub mod process {
    use anyhow::Context;

    /// Clock ticks per second of [`cpu_ticks`] (`getconf CLK_TCK`), 100 when it
    /// cannot be asked.
    pub fn clock_ticks() -> f64 {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    }

    /// utime + stime of a process, in clock ticks.
    pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat
            .rsplit_once(')')
            .context("malformed /proc stat")?
            .1
            .split_whitespace()
            .collect::<Vec<_>>();
        // rest[0] is field 3 (state): utime is field 14, stime field 15.
        let utime: u64 = rest.get(11).context("utime")?.parse()?;
        let stime: u64 = rest.get(12).context("stime")?.parse()?;
        Ok(utime + stime)
    }

    /// Resident set size now and at its peak (VmRSS, VmHWM) of a process, in KiB.
    pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .with_context(|| format!("{name} in /proc status"))?;
            Ok(line.trim().trim_end_matches("kB").trim().parse()?)
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// [`memory_kib`] in MiB.
    pub fn memory_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
        let (rss, hwm) = memory_kib(pid)?;
        Ok((rss as f64 / 1024.0, hwm as f64 / 1024.0))
    }
}
