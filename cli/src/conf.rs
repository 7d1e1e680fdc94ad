//! `conf show`: the effective configuration, each key with its value and
//! where it came from.

use serde_json::json;

use curvine_conf::Loader;

use crate::output::print_json;

pub fn show(loader: &Loader, json_out: bool) {
    let entries = loader.entries();
    if json_out {
        let list: Vec<_> = entries
            .iter()
            .map(|e| json!({"key": e.key, "value": e.value, "source": e.source.to_string()}))
            .collect();
        print_json(&list);
    } else {
        let width = entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 3)
            .max()
            .unwrap_or(0);
        for e in entries {
            let kv = format!("{} = {}", e.key, e.value);
            out!("{kv:<width$}  # {}", e.source);
        }
    }
}
