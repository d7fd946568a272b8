//! What `/metrics` serves beside the node's `sigma_*` ([`sigma_node::metrics`]) and
//! libp2p's `libp2p_*`: `sigma_build_info` and the process's own metrics.
//!
//! prometheus-client has no process collector, so [`Process`] reads `/proc/self` at
//! each scrape (Linux; elsewhere it encodes nothing). The names and meanings are those
//! of the Prometheus client libraries' process collectors, so existing dashboards and
//! alerts work unchanged:
//!
//! | metric | type | from |
//! | --- | --- | --- |
//! | `process_cpu_seconds_total` | counter | `/proc/self/stat` utime + stime |
//! | `process_resident_memory_bytes` | gauge | `/proc/self/status` VmRSS |
//! | `process_virtual_memory_bytes` | gauge | `/proc/self/status` VmSize |
//! | `process_threads` | gauge | `/proc/self/status` Threads |
//! | `process_open_fds` | gauge | entries of `/proc/self/fd` |
//! | `process_max_fds` | gauge | the soft `RLIMIT_NOFILE` |
//! | `process_start_time_seconds` | gauge | boot time (`/proc/stat` btime) + starttime |

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::version;

/// Registers `sigma_build_info{version, commit, protocol} 1` and the `process_*`
/// metrics in `registry`.
pub fn register(registry: &mut Registry) {
    registry.sub_registry_with_prefix("sigma").register(
        "build",
        "The build: crate version, git commit and Sigma wire protocol (always 1)",
        Info::new(vec![("version", version::VERSION), ("commit", version::COMMIT), ("protocol", version::protocol())]),
    );
    registry.register_collector(Box::new(Process));
}

/// The process's CPU time, memory, threads, file descriptors and start time, read at
/// each scrape.
#[derive(Debug)]
pub struct Process;

/// One reading of `/proc/self`.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    threads: u64,
    open_fds: u64,
    max_fds: u64,
    start_time_seconds: f64,
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: V,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    let me = e.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(me)
}

impl Collector for Process {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A missing /proc (not Linux, or not mounted) leaves them out rather than
        // report zeros that look like readings.
        let Some(r) = read() else { return Ok(()) };
        let cpu = ConstCounter::new(r.cpu_seconds);
        let me = e.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(me)?;
        gauge(&mut e, "process_resident_memory_bytes", "Resident memory size in bytes", r.resident_bytes)?;
        gauge(&mut e, "process_virtual_memory_bytes", "Virtual memory size in bytes", r.virtual_bytes)?;
        gauge(&mut e, "process_threads", "Number of OS threads in the process", r.threads)?;
        gauge(&mut e, "process_open_fds", "Number of open file descriptors", r.open_fds)?;
        gauge(&mut e, "process_max_fds", "Maximum number of open file descriptors (the soft limit)", r.max_fds)?;
        gauge(
            &mut e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            r.start_time_seconds,
        )
    }
}

#[cfg(target_os = "linux")]
fn read() -> Option<Reading> {
    use nix::unistd::{sysconf, SysconfVar};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().filter(|t| *t > 0)? as f64;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (utime, stime, start) = parse_stat(&stat)?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: u64 = boot.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let (max_fds, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    Some(Reading {
        cpu_seconds: (utime + stime) as f64 / ticks,
        resident_bytes: status_kb(&status, "VmRSS:")? * 1024,
        virtual_bytes: status_kb(&status, "VmSize:")? * 1024,
        threads: status_kb(&status, "Threads:")?,
        // The read_dir's own descriptor is among them.
        open_fds: open_fds.saturating_sub(1),
        max_fds,
        start_time_seconds: btime as f64 + start as f64 / ticks,
    })
}

#[cfg(not(target_os = "linux"))]
fn read() -> Option<Reading> {
    None
}

/// utime, stime and starttime (clock ticks) from `/proc/self/stat`: fields 14, 15 and
/// 22, counted after the command name, which is in parentheses and may hold spaces
/// and parentheses itself (hence the last `)`).
fn parse_stat(stat: &str) -> Option<(u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)?, field(15)?, field(22)?))
}

/// The number of a `/proc/self/status` line, e.g. `VmRSS:   1234 kB` → 1234.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(key))?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 123456 1000 200 \
                    18446744073709551615";
        assert_eq!(parse_stat(stat), Some((250, 75, 123456)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_lines() {
        let status = "Name:\tsigma\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\nThreads:\t5\n";
        assert_eq!(status_kb(status, "VmRSS:"), Some(2048));
        assert_eq!(status_kb(status, "Threads:"), Some(5));
        assert_eq!(status_kb(status, "VmSwap:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_plausibly_and_encodes() {
        let r = read().expect("a reading of /proc/self");
        assert!(r.resident_bytes > 0 && r.virtual_bytes >= r.resident_bytes, "{r:?}");
        assert!(r.threads >= 1 && r.open_fds >= 3 && r.max_fds >= r.open_fds, "{r:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(r.start_time_seconds <= now + 1.0 && r.start_time_seconds > now - 86_400.0, "{r:?}");
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total "), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        let info = format!(
            "sigma_build_info{{version=\"{}\",commit=\"{}\",protocol=\"/sigma/",
            version::VERSION,
            version::COMMIT
        );
        assert!(text.contains(&info), "{text}");
    }
}
