//! Stop sequences over streamed text.

/// Watches generated text for stop strings. Text that could still turn into a stop string
/// is held back until it is decided, so a client never sees a partial stop sequence.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds a piece of text; returns the text that is safe to emit. After a stop string
    /// is seen, returns the text before it and ignores everything after.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Everything still held back (at the end of the generation).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`, on char
/// boundaries.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_matches_and_cuts_at_the_stop() {
        let mut m = StopMatcher::new(["END".to_string()]);
        assert_eq!(m.push("hello E"), "hello ");
        assert_eq!(m.push("N"), "");
        assert_eq!(m.push("X more"), "ENX more");
        assert_eq!(m.push(" and EN"), " and ");
        assert_eq!(m.push("D tail"), "");
        assert!(m.stopped());
        assert_eq!(m.push("ignored"), "");
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_safe() {
        let mut m = StopMatcher::new(["bb".to_string(), "a".to_string()]);
        assert_eq!(m.push("ééxbba"), "ééx");
        let mut m = StopMatcher::new(["ü!".to_string()]);
        assert_eq!(m.push("grün"), "grün");
        assert_eq!(m.push("ü"), "");
        assert_eq!(m.finish(), "ü");
    }
}
