//! The settings as a TOML file, written from the table: every key under its
//! section, in table order, with its one-line description. The built-in
//! defaults written so are `config/order-timeout.toml` ([`defaults_file`]);
//! the settings in effect are what `order-timeout config` prints
//! ([`Settings::to_toml`]), each value as it was given, secrets redacted.

use std::fmt::Write as _;

use super::keys::{Key, SECTIONS};
use super::live::live_when_owned_only;
use super::*;

/// How `config/order-timeout.toml` is written again after a key changes: said
/// by the unit test that compares it with the table (the file itself speaks
/// to operators, who have the installed binary, not the source).
pub const REGENERATE: &str = "cargo run -q -- config --defaults > config/order-timeout.toml";

const DEFAULTS_HEADER: &str = "\
# order-timeout: every setting, with its built-in default.
#
# Read with `order-timeout --config FILE` (or ORDER_TIMEOUT_CONFIG=FILE). The
# environment wins over the file: ORDER_TIMEOUT__SECTION__KEY sets one key
# (ORDER_TIMEOUT__AMQP__PREFIX is amqp.prefix). Secrets (URLs with passwords,
# tokens) are better given in the environment than written here.
# A key left out or commented out keeps its default: as shipped, this file
# changes nothing. Values are strings, or bare numbers and booleans.
#
#   order-timeout config              the settings in effect, in this form, secrets redacted
#   order-timeout config --defaults   this file as shipped
#   order-timeout doctor              checks them, the database and the broker
#
# A running `serve` reads this file again on SIGHUP and applies the keys that
# say they reload live; any other change needs a restart. With the Debian
# package (this file is /etc/order-timeout/order-timeout.toml, the secrets are
# in order-timeout.env beside it): `systemctl reload order-timeout`,
# `systemctl restart order-timeout`, and doctor as the service runs it:
#   sudo -u order-timeout sh -c 'set -a; . /etc/order-timeout/order-timeout.env;
#     exec order-timeout --config /etc/order-timeout/order-timeout.toml doctor'
";

const EFFECTIVE_HEADER: &str = "\
# order-timeout: the settings in effect, from the built-in defaults, then the
# file, then ORDER_TIMEOUT__SECTION__KEY variables; `# from` marks a value the
# file or the environment gave. Secrets are redacted (***): a redacted token is
# refused if this is read back; give the real ones in the environment.
";

/// The built-in defaults as a settings file: `config/order-timeout.toml`.
pub fn defaults_file() -> String {
    let mut out = DEFAULTS_HEADER.to_string();
    render(&mut out, |_| None);
    out
}

impl Settings {
    /// The settings in effect as a settings file (`order-timeout config`): a
    /// key the file or the environment gave has its text as given, secrets
    /// redacted, and says where it came from; the others are as in
    /// [`defaults_file`].
    pub fn to_toml(&self) -> String {
        let mut out = EFFECTIVE_HEADER.to_string();
        render(&mut out, |key| {
            let source = self
                .sources
                .get(key.name)
                .filter(|s| **s != Source::Default)?;
            let text = self.given.get(key.name).map_or("", String::as_str);
            Some((text, source))
        });
        out
    }
}

/// Every section and key; `given` says which keys a layer set, with what
/// text (already redacted) and from where. A key at its default is commented
/// out when it is empty, or when its section is opt-in: so the defaults,
/// read back, are exactly the built-in ones.
fn render<'a>(out: &mut String, given: impl Fn(&Key) -> Option<(&'a str, &'a Source)>) {
    for section in SECTIONS {
        let name = section_name(section.keys[0].name);
        let _ = write!(out, "\n# {}\n[{name}]\n", section.doc);
        for key in section.keys {
            let field = &key.name[name.len() + 1..];
            // The keys a reload applies while running say so, and when.
            let live = match (key.live, live_when_owned_only(key.name)) {
                (true, false) => " Reloads live (SIGHUP).",
                (true, true) => {
                    " Reloads live (SIGHUP) for the service's own orders; with orders.source = mapped, on restart."
                }
                (false, _) => "",
            };
            let _ = writeln!(out, "# {}{live}", key.doc);
            match given(key) {
                Some((text, source)) => {
                    let value = toml_value(key, text);
                    let _ = writeln!(out, "{field} = {value}  # from {source}");
                }
                None if key.default.is_empty() || section.opt_in => {
                    let _ = writeln!(out, "# {field} = {}", toml_value(key, key.default));
                }
                None => {
                    let _ = writeln!(out, "{field} = {}", toml_value(key, key.default));
                }
            }
        }
    }
}

/// The section of a dotted key: `mapping` for `mapping.payment.from`, whose
/// rest (`payment.from`) is a dotted key within it.
pub(super) fn section_name(key: &str) -> &str {
    key.split_once('.').map_or(key, |(section, _)| section)
}

/// A key's value as TOML: bare if it is a whole number or a boolean and so is
/// the key's default (a count or a switch), a string otherwise (a status value
/// `0` stays text). The loader reads every value as text: either reads back
/// the same.
fn toml_value(key: &Key, text: &str) -> String {
    if bare(key.default) && bare(text) {
        return text.to_string();
    }
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(quoted, "\\u{:04X}", c as u32);
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Whether TOML can carry the text unquoted, as an integer or a boolean.
fn bare(text: &str) -> bool {
    let number = !text.is_empty()
        && text.len() <= 18
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    number || text == "true" || text == "false"
}
