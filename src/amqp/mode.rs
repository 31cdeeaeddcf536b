//! The delay mode: what `amqp.delay_mode` means on this broker, decided once
//! per process and used by every role (and by `doctor`).

use super::connection::{close_within, connect};
use super::deferral;
use super::topology::{self, Mode, Names};
use crate::context::Context;
use crate::settings::{AmqpSettings, DelayMode};

/// What the broker offers for delaying, as probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offers {
    /// Quorum queues hold a message until `x-opt-delivery-time` (RabbitMQ
    /// 4.3 and later); `Err` says why not.
    pub native: Result<(), String>,
    /// The `x-delayed-message` exchange type (`None`: not asked, since a
    /// broker with native delays is never asked for the plugin).
    pub plugin: Option<bool>,
}

/// Asks the broker what `auto` (or a configured `native`) needs to know: the
/// native stage first, then, only where that is missing, the plugin. Each
/// probe has a connection of its own (a missing exchange type closes it).
pub async fn probe(settings: &AmqpSettings, names: &Names) -> Result<Offers, lapin::Error> {
    let conn = connect(settings, "probe").await?;
    let native = deferral::probe(settings, &conn, names).await;
    close_within(conn.close(200, "probe done".into())).await;
    let native = native?;
    if native.is_ok() || settings.delay_mode == DelayMode::Native {
        return Ok(Offers {
            native,
            plugin: None,
        });
    }
    let conn = connect(settings, "probe").await?;
    let found = topology::probe_plugin(&conn, names).await;
    // The probe may already have closed the connection; either way it goes.
    close_within(conn.close(200, "probe done".into())).await;
    Ok(Offers {
        native,
        plugin: Some(found?),
    })
}

/// Resolves `amqp.delay_mode`: `plugin` and `ttl` as configured; `native`
/// once the broker is shown to hold delivery times (refused, saying why, on
/// one that does not: its deferrals would come straight back); `auto`
/// probes.
pub async fn resolve_mode(
    settings: &AmqpSettings,
    names: &Names,
) -> Result<(Mode, String), lapin::Error> {
    let offers = match settings.delay_mode {
        DelayMode::Auto | DelayMode::Native => probe(settings, names).await?,
        // Not probed: declaring the plugin's exchange fails loudly without it.
        DelayMode::Plugin | DelayMode::Ttl => Offers {
            native: Err("not probed".into()),
            plugin: None,
        },
    };
    if settings.delay_mode == DelayMode::Native
        && let Err(why) = &offers.native
    {
        return Err(std::io::Error::other(format!(
            "amqp.delay_mode = native, but the broker cannot hold timers: {why}"
        ))
        .into());
    }
    Ok(choose_mode(settings.delay_mode, &offers))
}

/// The one decision of the delay mode: what `configured` means on a broker
/// offering `offers`, with the reason in words. (`plugin` configured on a
/// broker without it stays `plugin`: the declaration then fails, and
/// `doctor` says why.)
pub fn choose_mode(configured: DelayMode, offers: &Offers) -> (Mode, String) {
    match configured {
        DelayMode::Ttl => (Mode::Ttl, "amqp.delay_mode = ttl".into()),
        DelayMode::Plugin => (Mode::Plugin, "amqp.delay_mode = plugin".into()),
        DelayMode::Native => (Mode::Native, "amqp.delay_mode = native".into()),
        DelayMode::Auto => match (&offers.native, offers.plugin) {
            (Ok(()), _) => (
                Mode::Native,
                "auto: the broker's quorum queues hold a message until its delivery time (RabbitMQ 4.3 or later)".into(),
            ),
            (Err(_), Some(true)) => (
                Mode::Plugin,
                "auto: the broker offers the x-delayed-message exchange type".into(),
            ),
            (Err(why), _) => (
                Mode::Ttl,
                format!(
                    "auto: the broker has no x-delayed-message exchange type (plugin not enabled), and no native delays ({why})"
                ),
            ),
        },
    }
}

/// The delay mode in effect, resolved on first use (probing the broker when
/// `amqp.delay_mode` is `auto` or `native`) and kept in the context.
pub async fn delay_mode(ctx: &Context) -> Result<Mode, lapin::Error> {
    let (mode, _) = ctx
        .mode
        .get_or_try_init(|| async {
            let (mode, why) = resolve_mode(&ctx.settings.amqp, &ctx.names).await?;
            ctx.telemetry
                .delay_mode_chosen(mode.as_str(), &why.to_string());
            Ok::<_, lapin::Error>((mode, why))
        })
        .await?;
    Ok(*mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offers(native: bool, plugin: Option<bool>) -> Offers {
        Offers {
            native: if native {
                Ok(())
            } else {
                Err("came back at once".into())
            },
            plugin,
        }
    }

    #[test]
    fn configured_modes_win_and_auto_prefers_native_then_the_plugin() {
        for o in [
            offers(true, None),
            offers(false, Some(true)),
            offers(false, Some(false)),
        ] {
            assert_eq!(choose_mode(DelayMode::Ttl, &o).0, Mode::Ttl);
            // Without the plugin the declaration fails loudly; never a silent ttl.
            assert_eq!(choose_mode(DelayMode::Plugin, &o).0, Mode::Plugin);
            assert_eq!(choose_mode(DelayMode::Native, &o).0, Mode::Native);
        }
        let (mode, why) = choose_mode(DelayMode::Auto, &offers(true, None));
        assert_eq!(mode, Mode::Native);
        assert!(why.contains("4.3"), "{why}");
        let (mode, why) = choose_mode(DelayMode::Auto, &offers(false, Some(true)));
        assert_eq!(mode, Mode::Plugin);
        assert!(why.starts_with("auto:"), "{why}");
        let (mode, why) = choose_mode(DelayMode::Auto, &offers(false, Some(false)));
        assert_eq!(mode, Mode::Ttl);
        assert!(why.contains("plugin not enabled"), "{why}");
        assert!(why.contains("came back at once"), "{why}");
    }
}
