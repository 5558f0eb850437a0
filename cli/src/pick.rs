//! Picking the stacks to replay by name.

use std::fmt::Write as _;

/// Picks stacks by name from `available`, in the order asked, each once; nothing asked means all.
/// `aliases` maps other names to available ones (`cuda` for the raw upstream). An unknown name is
/// an error that lists the available names.
///
/// ```
/// use mrstack_cli::select;
/// let all = ["upstream", "pool"];
/// assert_eq!(select(&[], &all, &[]).unwrap(), ["upstream", "pool"]);
/// assert_eq!(select(&["pool".into(), "cuda".into()], &all, &[("cuda", "upstream")]).unwrap(), ["pool", "upstream"]);
/// assert!(select(&["arena".into()], &all, &[]).unwrap_err().contains("available: upstream, pool"));
/// ```
pub fn select(
    asked: &[String],
    available: &[&str],
    aliases: &[(&str, &str)],
) -> Result<Vec<String>, String> {
    if asked.is_empty() {
        return Ok(available.iter().map(|s| (*s).to_owned()).collect());
    }
    let mut chosen: Vec<String> = Vec::new();
    for name in asked {
        let name = name.trim();
        let resolved = available
            .iter()
            .find(|a| **a == name)
            .copied()
            .or_else(|| aliases.iter().find(|(a, _)| *a == name).map(|(_, to)| *to));
        match resolved {
            Some(n) if !chosen.iter().any(|c| c == n) => chosen.push(n.to_owned()),
            Some(_) => {}
            None => {
                let mut names = available.join(", ");
                for (alias, to) in aliases {
                    let _ = write!(names, ", {alias} (= {to})");
                }
                return Err(format!("unknown stack `{name}`; available: {names}"));
            }
        }
    }
    Ok(chosen)
}
