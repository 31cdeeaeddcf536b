//! Parsers of single values: booleans, bounded numbers, durations, windows.

use super::*;

pub(super) fn non_empty(key: &str, value: &str) -> Result<String, SettingsError> {
    if value.trim().is_empty() {
        return Err(invalid(key, "must not be empty"));
    }
    Ok(value.to_string())
}

pub(super) fn parse_bool(key: &str, value: &str) -> Result<bool, SettingsError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(key, format!("'{value}' (expected true or false)"))),
    }
}

pub(super) fn parse_range<T>(key: &str, value: &str, min: T, max: T) -> Result<T, SettingsError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
{
    match value.trim().parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(invalid(
            key,
            format!("'{value}' (expected a whole number from {min} to {max})"),
        )),
    }
}

/// Parses a humantime duration (`30m`, `1h 30m`, `250ms`) within bounds.
pub fn parse_duration(
    key: &str,
    value: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, SettingsError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| {
        invalid(
            key,
            format!("'{value}' is not a duration ({e}); write it like 30s, 15m, 7d or 250ms"),
        )
    })?;
    if d < min || d > max {
        return Err(invalid(
            key,
            format!(
                "'{value}' is out of range ({} to {})",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d)
}

/// A window: at least one millisecond, at most what one `x-delay` can carry.
pub fn parse_window(key: &str, value: &str) -> Result<Duration, SettingsError> {
    parse_duration(key, value, Duration::from_millis(1), MAX_DELAY)
}
