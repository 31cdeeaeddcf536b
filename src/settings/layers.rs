//! The layers: the TOML file and the environment read into dotted keys, and
//! the check that every key is one the service knows.

use super::*;

pub(super) fn check_known(key: &str, source_name: &str) -> Result<(), SettingsError> {
    if DEFAULTS.iter().any(|(k, _)| *k == key) {
        return Ok(());
    }
    Err(SettingsError::Unknown {
        key: key.to_string(),
        source_name: source_name.to_string(),
        known: DEFAULTS
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Reads a TOML file into dotted keys with text values.
pub(super) fn read_file(path: &Path) -> Result<Vec<(String, String)>, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|e| SettingsError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let config = Config::builder()
        .add_source(File::from_str(&text, FileFormat::Toml))
        .build()
        .map_err(|e| SettingsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let table = config
        .try_deserialize::<config::Map<String, Value>>()
        .map_err(|e| SettingsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let mut out = Vec::new();
    flatten("", table, &mut out)?;
    Ok(out)
}

pub(super) fn flatten(
    prefix: &str,
    table: config::Map<String, Value>,
    out: &mut Vec<(String, String)>,
) -> Result<(), SettingsError> {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value.kind {
            ValueKind::Table(inner) => flatten(&full, inner, out)?,
            ValueKind::Array(_) => return Err(invalid(&full, "arrays are not accepted here")),
            ValueKind::Nil => {}
            _ => {
                let text = value
                    .into_string()
                    .map_err(|e| invalid(&full, e.to_string()))?;
                out.push((full, text));
            }
        }
    }
    Ok(())
}

/// Reads `ORDER_TIMEOUT__SECTION__KEY` variables into dotted keys.
pub(super) fn read_env(
    env: &HashMap<String, String>,
) -> Result<Vec<(String, String, String)>, SettingsError> {
    // The config crate's Environment source does the prefix and separator work;
    // we feed it the map so tests never have to set process variables.
    let source = Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("__")
        .separator("__")
        .source(Some(env.clone().into_iter().collect()));
    let config = Config::builder()
        .add_source(source)
        .build()
        .map_err(|e| invalid("environment", e.to_string()))?;
    let table = config
        .try_deserialize::<config::Map<String, Value>>()
        .map_err(|e| invalid("environment", e.to_string()))?;
    let mut flat = Vec::new();
    flatten("", table, &mut flat)?;
    Ok(flat
        .into_iter()
        .map(|(key, value)| {
            let var = format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase());
            (key, value, var)
        })
        .collect())
}
