//! `orders.source` and `mapping.*`: whose orders the timeouts act on. By
//! default the service's own (`owned`: checkout through its API, its own
//! tables). With `orders.source = mapped`, a shop's existing orders table,
//! described here: its id and status columns, the status values each timeout
//! moves between, how each deadline is known, and what releasing stock means.
//!
//! Everything here is text checked for its shape (identifiers are letters,
//! digits and `_`, so that they can be quoted safely); whether the tables and
//! columns exist, and have types that fit, is checked against the database at
//! start-up and by `doctor` (`orders::mapped`).

use super::*;

choice! {
    /// Whose orders the timeouts act on (`orders.source`).
    OrdersSource {
        /// The service's own tables, filled by its checkout API.
        Owned = "owned",
        /// A shop's own orders table, described by `mapping.*`.
        Mapped = "mapped",
    }
}

/// How one timeout kind moves a mapped order (`mapping.<kind>.*`). Empty
/// text means "not set".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindMapping {
    /// The status the timeout acts on ("waiting for payment", "paid, to
    /// ship", "shipped"). Empty: this kind is not mapped.
    pub from: String,
    /// The status it sets ("cancelled", "completed"; for fulfillment, a status
    /// meaning "overdue", if the shop has one).
    pub to: String,
    /// Fulfillment only, instead of `to`: a nullable time column stamped once
    /// when the order is found overdue (the status is left as it is).
    pub flag_column: String,
    /// A column holding the deadline itself ...
    pub deadline_column: String,
    /// ... or the time the window starts (creation, payment, shipping); the
    /// deadline is then this plus the kind's `windows.*` setting.
    pub since_column: String,
}

impl KindMapping {
    /// Whether the timeouts of this kind act on the shop's table.
    pub fn is_mapped(&self) -> bool {
        !self.from.is_empty()
    }
}

/// What releasing an unpaid order's stock means, as a mapping of the shop's
/// tables (`mapping.stock.*`): the items table gives each SKU and quantity of
/// an order, and the stock table's reserved column gives them back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StockMapping {
    /// The items table (`oms_order_item`). Empty: no stock mapping.
    pub items_table: String,
    /// Its column holding the order id (`order_id`).
    pub items_order_column: String,
    /// Its column naming the stock row (`product_sku_id`).
    pub items_sku_column: String,
    /// Its quantity column (`product_quantity`).
    pub items_quantity_column: String,
    /// The stock table (`pms_sku_stock`).
    pub table: String,
    /// Its key, matched against the items' SKU column (`id`).
    pub id_column: String,
    /// The column the quantity leaves (`lock_stock`).
    pub reserved_column: String,
    /// Optionally, a column the quantity is added back to (for shops that
    /// take stock off sale at checkout).
    pub available_column: String,
}

impl StockMapping {
    /// Whether a stock mapping is configured.
    pub fn is_set(&self) -> bool {
        !self.items_table.is_empty()
    }
}

/// `orders.source` and `mapping.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingSettings {
    /// Whose orders.
    pub source: OrdersSource,
    /// Shadow mode: decide as `serve` would, change nothing of the shop's,
    /// record the decisions (`crate::shadow`).
    pub shadow: bool,
    /// The orders table, `name` or `schema.name`.
    pub table: String,
    /// Its primary key (integer, text or UUID: found in the database).
    pub id_column: String,
    /// Its status column (integer or text).
    pub status_column: String,
    /// Optionally, a time column set to the database's clock by every transition.
    pub stamp_column: String,
    /// The zone the shop writes its zone-less time columns in (`datetime`,
    /// `timestamp without time zone`); `None`: the database server's default,
    /// which is what the shop's own sessions get when they set nothing.
    pub time_zone: Option<Zone>,
    /// The payment timeout: cancels unpaid orders.
    pub payment: KindMapping,
    /// The fulfillment timeout: flags paid orders not shipped in time.
    pub fulfillment: KindMapping,
    /// The receipt timeout: completes shipped orders never confirmed.
    pub receipt: KindMapping,
    /// Stock released by a payment timeout, as a mapping ...
    pub stock: StockMapping,
    /// ... and/or as the operator's own statements, run once per cancelled
    /// order with its id bound as the only parameter.
    pub release_sql: Vec<String>,
}

impl MappingSettings {
    /// The kind's mapping.
    pub fn kind(&self, kind: crate::domain::TimeoutKind) -> &KindMapping {
        use crate::domain::TimeoutKind::*;
        match kind {
            Payment => &self.payment,
            Fulfillment => &self.fulfillment,
            Receipt => &self.receipt,
        }
    }
}

/// A time zone as `mapping.time_zone` (or a database server) spells it.
/// Its text is limited to what can sit in an SQL string literal as it is:
/// the statements splice it, quoted, since a zone cannot be bound there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Zone {
    /// A fixed offset from UTC in minutes, east positive (`+08:00`, `-05:00`),
    /// as MySQL and ISO 8601 read it. PostgreSQL reads the same text the
    /// POSIX way (west positive), so its statements spell it as an interval.
    Offset(i32),
    /// A name the database resolves: an IANA name (`Asia/Shanghai`), or
    /// MySQL's `SYSTEM`.
    Named(String),
}

impl Zone {
    /// Reads `+HH:MM`/`-HH:MM` (at most 14:00 either way) or a name of
    /// letters, digits and `_ / + - :`, starting with a letter, at most 64
    /// bytes. Whether the database knows the name is checked when the
    /// mapping is loaded.
    pub fn parse(text: &str) -> Result<Self, String> {
        let b = text.as_bytes();
        if let [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] = b {
            let digits = [h1, h2, m1, m2];
            if digits.iter().all(|d| d.is_ascii_digit()) {
                let n = |hi: &u8, lo: &u8| i32::from(hi - b'0') * 10 + i32::from(lo - b'0');
                let (hours, minutes) = (n(h1, h2), n(m1, m2));
                if hours > 14 || minutes > 59 || (hours == 14 && minutes > 0) {
                    return Err(format!(
                        "'{text}' is not an offset between -14:00 and +14:00"
                    ));
                }
                let east = hours * 60 + minutes;
                return Ok(Self::Offset(if *sign == b'-' { -east } else { east }));
            }
        }
        if !text.starts_with(|c: char| c.is_ascii_alphabetic()) || !Self::literal_safe(text) {
            return Err(format!(
                "'{}' is not a time zone: an IANA name like Asia/Shanghai, or an offset like +08:00 or -05:00",
                crate::domain::truncate(text, 80)
            ));
        }
        Ok(Self::Named(text.to_string()))
    }

    /// A zone as the database server spells its own default, kept as text
    /// for the server to read as its sessions read it: PostgreSQL reads
    /// `-05:00` POSIX-style (five hours *east*), MySQL ISO-style.
    pub fn verbatim(text: &str) -> Result<Self, String> {
        if !Self::literal_safe(text) {
            return Err(format!(
                "'{}' cannot be used as it is (expected letters, digits and _ / + - :)",
                crate::domain::truncate(text, 80)
            ));
        }
        Ok(Self::Named(text.to_string()))
    }

    /// Text that can sit between single quotes in SQL as it is.
    fn literal_safe(text: &str) -> bool {
        !text.is_empty()
            && text.len() <= 64
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_/+-:".contains(c))
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Offset(m) => {
                let sign = if *m < 0 { '-' } else { '+' };
                write!(f, "{sign}{:02}:{:02}", m.abs() / 60, m.abs() % 60)
            }
            Self::Named(name) => f.write_str(name),
        }
    }
}

/// `mapping.time_zone`: empty is the server's default.
pub(super) fn parse_time_zone(key: &str, value: &str) -> Result<Option<Zone>, SettingsError> {
    if value.is_empty() {
        return Ok(None);
    }
    Zone::parse(value).map(Some).map_err(|e| invalid(key, e))
}

/// Longest identifier part: MySQL's limit (PostgreSQL's is 63).
const MAX_IDENT: usize = 63;

/// A table (`name` or `schema.name`) or, with `qualified = false`, a column:
/// letters, digits and `_`, not starting with a digit. Empty means unset.
pub(super) fn parse_ident(
    key: &str,
    value: &str,
    qualified: bool,
) -> Result<String, SettingsError> {
    if value.is_empty() {
        return Ok(String::new());
    }
    let parts: Vec<&str> = value.split('.').collect();
    let shape_ok = parts.len() <= if qualified { 2 } else { 1 }
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= MAX_IDENT
                && !p.starts_with(|c: char| c.is_ascii_digit())
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if !shape_ok {
        let what = if qualified {
            "a table name, or schema.table"
        } else {
            "a column name"
        };
        return Err(invalid(
            key,
            format!(
                "'{value}' is not {what}: letters, digits and _ (not first), at most {MAX_IDENT} each"
            ),
        ));
    }
    Ok(value.to_string())
}

/// A status value: any text up to 64 bytes without control characters.
pub(super) fn parse_status(key: &str, value: &str) -> Result<String, SettingsError> {
    if value.len() > 64 || value.chars().any(char::is_control) {
        return Err(invalid(
            key,
            "a status value is at most 64 bytes, without control characters",
        ));
    }
    Ok(value.to_string())
}

/// The operator's release statements, separated by `;` (write no `;` inside
/// a literal). Each must bind the order id: `$1` on PostgreSQL, `?` on
/// MySQL/MariaDB (every `?` gets the id).
pub(super) fn parse_release_sql(key: &str, value: &str) -> Result<Vec<String>, SettingsError> {
    let statements: Vec<String> = value
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    for s in &statements {
        if !s.contains("$1") && !s.contains('?') {
            return Err(invalid(
                key,
                format!(
                    "'{}' does not bind the order id: write $1 (PostgreSQL) or ? (MySQL/MariaDB) where it goes",
                    crate::domain::truncate(s, 80)
                ),
            ));
        }
    }
    Ok(statements)
}

/// `orders.source` and `mapping.*` together: with `mapped`, the table, the
/// payment states and one way to know each mapped deadline; with `owned`,
/// nothing of `mapping.*` set (it would be silently ignored otherwise).
pub(super) fn check_mapping(settings: &Settings) -> Result<(), SettingsError> {
    let m = &settings.mapping;
    if m.source == OrdersSource::Owned {
        if m.shadow {
            return Err(invalid(
                "orders.shadow",
                "is true but `orders.source` is owned: shadow mode records what the service would do to a shop's own table; set `orders.source = \"mapped\"`, or leave it false",
            ));
        }
        if let Some(key) = settings
            .sources
            .keys()
            .find(|k| k.starts_with("mapping.") && settings.sources[*k] != Source::Default)
        {
            return Err(invalid(
                key,
                "is set but `orders.source` is owned: set `orders.source = \"mapped\"` to act on this table",
            ));
        }
        return Ok(());
    }
    if settings.database.url.expose().starts_with("sqlite:") {
        return Err(invalid(
            "orders.source",
            "mapped needs PostgreSQL or MySQL/MariaDB in `database.url` (the shop's database)",
        ));
    }
    if m.table.is_empty() {
        return Err(invalid(
            "mapping.table",
            "must name the orders table when `orders.source` is mapped",
        ));
    }
    if !m.payment.is_mapped() || m.payment.to.is_empty() {
        let key = if m.payment.from.is_empty() {
            "mapping.payment.from"
        } else {
            "mapping.payment.to"
        };
        return Err(invalid(
            key,
            "must be set when `orders.source` is mapped: the status of an unpaid order, and of a cancelled one",
        ));
    }
    for kind in crate::domain::TimeoutKind::ALL {
        check_kind(kind, m.kind(kind), settings)?;
    }
    // Every `mapping.stock.*` key but the optional available column, in table order.
    let stock: Vec<(&str, String)> = keys()
        .filter(|k| k.name.starts_with("mapping.stock.") && !k.name.ends_with(".available_column"))
        .map(|k| (k.name, (k.show)(settings)))
        .collect();
    let given = stock.iter().filter(|(_, v)| !v.is_empty()).count();
    if let Some((missing, _)) = stock.iter().find(|(_, v)| v.is_empty())
        && given != 0
    {
        return Err(invalid(
            missing,
            "must be set: a stock mapping needs the items table, its order, SKU and quantity columns, and the stock table, its key and reserved column",
        ));
    }
    if !m.stock.available_column.is_empty() && given == 0 {
        return Err(invalid(
            "mapping.stock.available_column",
            "needs the rest of `mapping.stock.*`",
        ));
    }
    Ok(())
}

/// One kind: a mapped kind has its target (status or flag column) and
/// exactly one way to know its deadline; an unmapped one has nothing set.
fn check_kind(
    timeout: crate::domain::TimeoutKind,
    k: &KindMapping,
    settings: &Settings,
) -> Result<(), SettingsError> {
    let kind = timeout.as_str();
    let key = |field: &str| format!("mapping.{kind}.{field}");
    let stamp = &settings.mapping.stamp_column;
    if !k.is_mapped() {
        let prefix = key("");
        let set = keys().find(|key| {
            let given = !(key.show)(settings).is_empty();
            key.name.starts_with(&prefix) && !key.name.ends_with(".from") && given
        });
        return match set {
            Some(set) => Err(invalid(
                set.name,
                format!("needs `mapping.{kind}.from`: the status this timeout acts on"),
            )),
            None => Ok(()),
        };
    }
    match (k.to.is_empty(), k.flag_column.is_empty()) {
        (true, true) => {
            return Err(invalid(
                &key("to"),
                "must be set: the status this timeout sets",
            ));
        }
        (false, false) => {
            return Err(invalid(
                &key("flag_column"),
                format!("set either this or `mapping.{kind}.to`, not both"),
            ));
        }
        (false, true) if k.to == k.from => {
            return Err(invalid(
                &key("to"),
                format!("is the same status as `mapping.{kind}.from`"),
            ));
        }
        _ => {}
    }
    if !k.flag_column.is_empty() && !timeout.edge().flag_only {
        // The diagram says which timeouts only flag an order.
        let flagging: Vec<&str> = crate::domain::TimeoutKind::ALL
            .iter()
            .filter(|t| t.edge().flag_only)
            .map(|t| t.as_str())
            .collect();
        return Err(invalid(
            &key("flag_column"),
            format!(
                "only the {} timeout flags instead of changing the status",
                flagging.join(" and ")
            ),
        ));
    }
    match (k.deadline_column.is_empty(), k.since_column.is_empty()) {
        (true, true) => Err(invalid(
            &key("deadline_column"),
            format!(
                "set this (a column holding the deadline) or `mapping.{kind}.since_column` (the start of the window, plus `windows.{kind}`)"
            ),
        )),
        (false, false) => Err(invalid(
            &key("since_column"),
            format!("set either this or `mapping.{kind}.deadline_column`, not both"),
        )),
        _ if !stamp.is_empty() && (k.deadline_column == *stamp || k.since_column == *stamp) => {
            Err(invalid(
                "mapping.stamp_column",
                format!(
                    "is also the column `mapping.{kind}` reads its deadline from: a transition would move the deadline"
                ),
            ))
        }
        _ => Ok(()),
    }
}
