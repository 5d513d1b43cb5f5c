//! A counter with one label (`depth`, `mode`, `reason`): a small map rendered in label
//! order.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// A labelled counter family.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: Mutex<BTreeMap<String, u64>>,
}

impl Family {
    pub const fn new(name: &'static str, help: &'static str, label: &'static str) -> Self {
        Family {
            name,
            help,
            label,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn add(&self, value: impl Into<String>, n: u64) {
        let mut map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(value.into()).or_default() += n;
    }

    pub fn get(&self, value: &str) -> u64 {
        let map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        map.get(value).copied().unwrap_or(0)
    }

    pub fn render(&self, out: &mut String) {
        let (name, label) = (self.name, self.label);
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter", self.help);
        let map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        for (value, n) in map.iter() {
            let value = value.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_each_label_value() {
        let f = Family::new("x_total", "Xs.", "depth");
        f.add("2", 3);
        f.add("1", 1);
        f.add("2", 1);
        let mut out = String::new();
        f.render(&mut out);
        assert_eq!(
            out,
            "# HELP x_total Xs.\n# TYPE x_total counter\nx_total{depth=\"1\"} 1\nx_total{depth=\"2\"} 4\n"
        );
        assert_eq!(f.get("2"), 4);
    }
}
