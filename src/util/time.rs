//! The UTC clock as kvbench writes it: RFC 3339 timestamps in `meta.json`, and the compact
//! form that names run folders (`20260101-120000`).

/// Current UTC time, RFC 3339 with whole seconds (`2026-01-01T12:00:00Z`).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// An RFC 3339 UTC timestamp (`2026-01-01T12:00:00Z`) in the compact form used in folder
/// names: `20260101-120000` (no separators, `T` → `-`, no `Z`).
pub fn compact(rfc3339: &str) -> String {
    rfc3339
        .replace([':', '-'], "")
        .trim_end_matches('Z')
        .replace('T', "-")
}

/// The current UTC time in [`compact`] form, for names like `reports/compare-<time>`.
pub fn now_compact() -> String {
    compact(&now_rfc3339())
}

/// A run id: `<compact UTC start time>-<label>`, with `/` and spaces in the label made `_` so
/// the id is one path component (e.g. `20260101-120000-SmolLM2-135M-Instruct-Q4_1`).
pub fn run_id(started_at_rfc3339: &str, label: &str) -> String {
    format!(
        "{}-{}",
        compact(started_at_rfc3339),
        label.replace(['/', ' '], "_")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: separators dropped, `T` becomes `-`, the label's slash and space become `_`.
    #[test]
    fn compact_and_run_id() {
        assert_eq!(compact("2026-12-01T13:05:09Z"), "20261201-130509");
        assert_eq!(
            run_id("2026-12-01T13:05:09Z", "org/model q4"),
            "20261201-130509-org_model_q4"
        );
        let now = now_rfc3339();
        assert_eq!(now.len(), "2026-12-01T13:05:09Z".len(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
    }
}
