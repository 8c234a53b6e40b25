//! Logging to stderr, filtered by `HCCN_LOG` (tracing's EnvFilter syntax), started once per process.

use crate::config::Config;

/// Starts logging with `cfg.log` as the filter; later calls do nothing.
pub fn init(cfg: &Config) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        // Module paths are for whoever debugs hccn (a filter naming modules, debug, trace); a
        // user reading a warning needs what happened, not where in the source.
        let targets = !matches!(cfg.log.as_str(), "off" | "error" | "warn" | "info");
        // Another subscriber set by the host program wins; that is fine.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_target(targets)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
