//! From a field's path (`callers[1].rate[0].rps`) to its line and column in the YAML
//! text, for errors found after parsing (a region that names nothing, rates out of
//! order). serde gives the location of the errors it finds itself; this finds the rest.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A mapping's key.
    Key(String),
    /// A sequence's index.
    Index(usize),
}

/// Splits `callers[1].rate[0].rps` into its segments.
pub fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            let (name, indexes) = rest.split_at(open);
            if !name.is_empty() {
                out.push(Segment::Key(name.to_owned()));
            }
            rest = indexes;
            for index in rest.split('[').filter(|s| !s.is_empty()) {
                if let Ok(i) = index.trim_end_matches(']').parse() {
                    out.push(Segment::Index(i));
                }
            }
        } else if !rest.is_empty() {
            out.push(Segment::Key(rest.to_owned()));
        }
    }
    out
}

#[derive(Default)]
struct Events(Vec<(Event, Marker)>);

impl MarkedEventReceiver for Events {
    fn on_event(&mut self, event: Event, mark: Marker) {
        self.0.push((event, mark));
    }
}

/// The 1-based line and column of the field at `path` (of the closest ancestor that
/// exists), if the text parses as YAML at all.
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let mut events = Events::default();
    Parser::new_from_str(text).load(&mut events, false).ok()?;
    let events = events.0;
    let want = segments(path);
    // Skip to the document's root node.
    let mut at = events.iter().position(|(e, _)| matches!(e, Event::MappingStart(..) | Event::SequenceStart(..)))?;
    let mut found = events.get(at).map(|(_, m)| *m)?;
    for segment in &want {
        match (events.get(at).map(|(e, _)| e), segment) {
            (Some(Event::MappingStart(..)), Segment::Key(name)) => {
                let mut i = at + 1;
                let mut hit = None;
                while let Some((event, mark)) = events.get(i) {
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    let is_key = matches!(event, Event::Scalar(key, ..) if key == name);
                    let value = skip(&events, i);
                    if is_key {
                        hit = Some((value, *mark));
                        break;
                    }
                    i = skip(&events, value);
                }
                let Some((value, mark)) = hit else { return Some(line_col(found)) };
                found = mark;
                at = value;
            }
            (Some(Event::SequenceStart(..)), Segment::Index(n)) => {
                let mut i = at + 1;
                for _ in 0..*n {
                    if matches!(events.get(i).map(|(e, _)| e), Some(Event::SequenceEnd) | None) {
                        return Some(line_col(found));
                    }
                    i = skip(&events, i);
                }
                let (event, mark) = events.get(i)?;
                if matches!(event, Event::SequenceEnd) {
                    return Some(line_col(found));
                }
                found = *mark;
                at = i;
            }
            _ => return Some(line_col(found)),
        }
    }
    Some(line_col(found))
}

fn line_col(mark: Marker) -> (usize, usize) {
    (mark.line(), mark.col() + 1)
}

/// The index just past the node starting at `i`.
fn skip(events: &[(Event, Marker)], i: usize) -> usize {
    match events.get(i).map(|(e, _)| e) {
        Some(Event::MappingStart(..) | Event::SequenceStart(..)) => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some((event, _)) = events.get(j) {
                match event {
                    Event::MappingStart(..) | Event::SequenceStart(..) => depth += 1,
                    Event::MappingEnd | Event::SequenceEnd => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j
        }
        _ => i + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "name: x\ncallers:\n  - name: a\n    rate:\n      - at: 0s\n        rps: 5\n  - name: b\n    rate: []\n";

    #[test]
    fn a_nested_field_is_found_on_its_own_line() {
        assert_eq!(locate(TEXT, "callers[0].rate[0].rps"), Some((6, 9)));
        assert_eq!(locate(TEXT, "callers[1].name"), Some((7, 5)));
        assert_eq!(locate(TEXT, "name"), Some((1, 1)));
    }

    #[test]
    fn a_missing_field_points_at_its_closest_ancestor() {
        assert_eq!(locate(TEXT, "callers[1].retry").map(|(line, _)| line), Some(7));
        assert_eq!(locate(TEXT, "callers[5].name"), Some((2, 1)));
    }
}
