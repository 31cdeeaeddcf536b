//! The delayed-message plugin keeps its timers in a table of the broker's
//! node, not in the vhost: deleting a vhost leaves its timers there until
//! they come due (a day or two for the bench's `--million`), and a node
//! holding many of them spends CPU and memory on them. This removes them,
//! through `rabbitmqctl eval` on the node (the plugin offers no API for it).

use std::process::Command;

/// Which timers to remove.
#[derive(Debug, Clone, Copy)]
pub enum Timers<'a> {
    /// Those of one vhost's exchanges.
    OfVhost(&'a str),
    /// Those of every vhost whose name starts with this and that no longer
    /// exists: what finished test runs left behind, and nothing of a live one.
    OfDeletedVhosts(&'a str),
}

/// Why the timers could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a vhost name or prefix of letters, digits, '-' and '_' only, not {0:?}")]
    Name(String),
    #[error("no command given to reach the broker's node")]
    NoCommand,
    #[error("{command} could not run: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("{command} eval failed: {output}")]
    Eval { command: String, output: String },
}

/// Removes the plugin's timers that `which` names, with `rabbitmqctl` (the
/// command and its leading arguments, `["rabbitmqctl"]` for the local node,
/// say `["chroot", "/srv/rabbitmq4", "rabbitmqctl", "-n", "rabbit4@localhost"]`
/// for another). Returns how many it removed; 0 where the plugin is not
/// enabled, or where the node runs no Mnesia (RabbitMQ 4.3 and later).
pub fn forget(rabbitmqctl: &[String], which: Timers<'_>) -> Result<u64, Error> {
    let (name, select) = match which {
        Timers::OfVhost(vhost) => (vhost, format!("V =:= <<\"{vhost}\">>")),
        Timers::OfDeletedVhosts(prefix) => (
            prefix,
            format!(
                "binary:longest_common_prefix([V, <<\"{prefix}\">>]) =:= {} \
                 andalso not rabbit_vhost:exists(V)",
                prefix.len()
            ),
        ),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::Name(name.to_string()));
    }
    // Entries are #delay_entry{delay_key = #delay_key{timestamp, exchange}}
    // in a bag, indexed by #delay_index{delay_key} in an ordered set; the
    // exchange's name is a #resource{virtual_host, …}. The same in plugin
    // 3.10.2 and 4.0.7. (No match spec: the CLI turns the atom '$1' into ''.)
    // RabbitMQ 4.3 runs no Mnesia (Khepri only, so no plugin either): there
    // asking for its tables aborts, and there is nothing to forget.
    let erl = format!(
        "T = list_to_atom(\"rabbit_delayed_message\" ++ atom_to_list(node())), \
         I = list_to_atom(atom_to_list(T) ++ \"_index\"), \
         case mnesia:system_info(is_running) =:= yes \
             andalso lists:member(I, mnesia:system_info(tables)) of \
           false -> 0; \
           true -> \
             ets:foldl(fun({{delay_index, K, _}}, N) -> \
                 V = element(2, element(2, element(3, K))), \
                 case {select} of \
                   true -> mnesia:dirty_delete(T, K), mnesia:dirty_delete(I, K), N + 1; \
                   false -> N \
                 end end, 0, I) \
         end."
    );
    let (program, args) = rabbitmqctl.split_first().ok_or(Error::NoCommand)?;
    let command = rabbitmqctl.join(" ");
    let out = Command::new(program)
        .args(args)
        .args(["eval", &erl])
        .output()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match stdout.parse() {
        Ok(n) if out.status.success() => Ok(n),
        _ => Err(Error::Eval {
            command,
            output: format!("{stdout} {}", String::from_utf8_lossy(&out.stderr).trim()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_names_that_would_reach_into_the_expression() {
        let ctl = vec!["rabbitmqctl".to_string()];
        for bad in ["", "a\"b", "x>>, true", "ot test"] {
            assert!(matches!(
                forget(&ctl, Timers::OfVhost(bad)),
                Err(Error::Name(_))
            ));
            assert!(matches!(
                forget(&ctl, Timers::OfDeletedVhosts(bad)),
                Err(Error::Name(_))
            ));
        }
        assert!(matches!(
            forget(&[], Timers::OfVhost("ot-test-1")),
            Err(Error::NoCommand)
        ));
    }

    #[test]
    fn a_command_that_is_not_there_says_which() {
        let ctl = vec!["/nonexistent/rabbitmqctl".to_string()];
        let e = forget(&ctl, Timers::OfVhost("ot-test-1")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/rabbitmqctl"), "{e}");
    }
}
