//! The layers: the built-in defaults, the TOML file and the environment,
//! merged into one text value per dotted key, with the check that every key
//! is one the service knows.

use super::*;

/// Each key's text and where it came from.
pub(super) type Merged = BTreeMap<String, (String, Source)>;

/// Reads the layers in order, later ones winning: the defaults of the key
/// table, the file (`--config` or [`CONFIG_FILE_ENV`]), then the environment;
/// every known key has at least its default.
pub(super) fn merge(source: &SettingsSource) -> Result<Merged, SettingsError> {
    let env_map: HashMap<String, String> = match &source.env {
        Some(map) => map.clone(),
        None => std::env::vars().collect(),
    };
    let file = source
        .file
        .clone()
        .or_else(|| env_map.get(CONFIG_FILE_ENV).map(PathBuf::from));
    let mut merged: Merged = keys()
        .map(|k| (k.name.to_string(), (k.default.to_string(), Source::Default)))
        .collect();
    if let Some(path) = &file {
        for (key, value) in read_file(path)? {
            check_known(&key, &format!("file {}", path.display()))?;
            merged.insert(key, (value, Source::File(path.clone())));
        }
    }
    for (key, value, var) in read_env(&env_map) {
        check_known(&key, &format!("env {var}"))?;
        merged.insert(key, (value, Source::Env(var)));
    }
    Ok(merged)
}

/// A key from a file or the environment must be in the table: a typo is
/// refused, not silently ignored.
fn check_known(key: &str, source_name: &str) -> Result<(), SettingsError> {
    if keys().any(|k| k.name == key) {
        return Ok(());
    }
    Err(SettingsError::Unknown {
        key: key.to_string(),
        source_name: source_name.to_string(),
        known: keys().map(|k| k.name).collect::<Vec<_>>().join(", "),
    })
}

/// Reads a TOML file into dotted keys with text values.
fn read_file(path: &Path) -> Result<Vec<(String, String)>, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|e| SettingsError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    // The parser's error is told by position, never quoting the line, which
    // may hold a token or a URL's password (a missing quote is the usual mistake).
    let table = text
        .parse::<toml::Table>()
        .map_err(|e| SettingsError::File {
            path: path.to_path_buf(),
            reason: syntax_error(&text, &e),
        })?;
    let mut out = Vec::new();
    flatten("", table, &mut out)?;
    Ok(out)
}

/// A TOML syntax error as line, column and the parser's message, never the
/// text of the line: `line 3, column 16: invalid basic string`.
pub(super) fn syntax_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return message.to_string();
    };
    // The span starts on a character; `get` keeps a wrong one from panicking.
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    format!("line {line}, column {column}: {message}")
}

/// A table's values as dotted keys and text: numbers and booleans as they
/// read, a nested table's keys under its name.
fn flatten(
    prefix: &str,
    table: toml::Table,
    out: &mut Vec<(String, String)>,
) -> Result<(), SettingsError> {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        let text = match value {
            toml::Value::Table(inner) => {
                flatten(&full, inner, out)?;
                continue;
            }
            toml::Value::Array(_) => return Err(invalid(&full, "arrays are not accepted here")),
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
        };
        out.push((full, text));
    }
    Ok(())
}

/// Reads `ORDER_TIMEOUT__SECTION__KEY` variables (any case) into dotted keys,
/// each with the variable's name as `doctor` tells it.
fn read_env(env: &HashMap<String, String>) -> Vec<(String, String, String)> {
    let prefix = format!("{ENV_PREFIX}__").to_lowercase();
    let mut found: Vec<_> = env
        .iter()
        .filter_map(|(var, value)| {
            let key = var.to_lowercase().strip_prefix(&prefix)?.replace("__", ".");
            let var = format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase());
            Some((key, value.clone(), var))
        })
        .collect();
    found.sort();
    found
}
