//! The delay mode: what `amqp.delay_mode` means on this broker, decided once
//! per process and used by every role (and by `doctor`).

use super::connection::connect;
use super::topology::{self, Mode, Names};
use crate::context::Context;
use crate::settings::{AmqpSettings, DelayMode};

/// Resolves `amqp.delay_mode`: `plugin` and `ttl` as configured; `auto`
/// probes the broker on a connection of its own.
pub async fn resolve_mode(
    settings: &AmqpSettings,
    names: &Names,
) -> Result<(Mode, String), lapin::Error> {
    let plugin = match settings.delay_mode {
        DelayMode::Auto => {
            let conn = connect(settings, "probe").await?;
            let found = topology::probe_plugin(&conn, names).await;
            // The probe may already have closed the connection; either way it goes.
            let _ = conn.close(200, "probe done".into()).await;
            found?
        }
        // Not probed: declaring the plugin's exchange fails loudly without it.
        DelayMode::Plugin => true,
        DelayMode::Ttl => false,
    };
    Ok(choose_mode(settings.delay_mode, plugin))
}

/// The one decision of the delay mode: what `configured` means on a broker
/// that has the plugin or not, with the reason in words. (`plugin` configured
/// on a broker without it stays `plugin`: the declaration then fails, and
/// `doctor` says why.)
pub fn choose_mode(configured: DelayMode, plugin: bool) -> (Mode, String) {
    match (configured, plugin) {
        (DelayMode::Ttl, _) => (Mode::Ttl, "amqp.delay_mode = ttl".into()),
        (DelayMode::Plugin, _) => (Mode::Plugin, "amqp.delay_mode = plugin".into()),
        (DelayMode::Auto, true) => (
            Mode::Plugin,
            "auto: the broker offers the x-delayed-message exchange type".into(),
        ),
        (DelayMode::Auto, false) => (
            Mode::Ttl,
            "auto: the broker has no x-delayed-message exchange type (plugin not enabled)".into(),
        ),
    }
}

/// The delay mode in effect, resolved on first use (probing the broker for the
/// plugin when `amqp.delay_mode = auto`) and kept in the context.
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

    #[test]
    fn configured_modes_win_and_auto_follows_the_plugin() {
        for plugin in [true, false] {
            assert_eq!(choose_mode(DelayMode::Ttl, plugin).0, Mode::Ttl);
            // Without the plugin the declaration fails loudly; never a silent ttl.
            assert_eq!(choose_mode(DelayMode::Plugin, plugin).0, Mode::Plugin);
        }
        let (mode, why) = choose_mode(DelayMode::Auto, true);
        assert_eq!(mode, Mode::Plugin);
        assert!(why.starts_with("auto:"), "{why}");
        let (mode, why) = choose_mode(DelayMode::Auto, false);
        assert_eq!(mode, Mode::Ttl);
        assert!(why.contains("plugin not enabled"), "{why}");
    }
}
