//! Reading the cost a response reports in its body, as the body passes: a JSON document
//! (`{"usage": {"total_tokens": 42}}`, read whole once it has ended) or a stream of
//! server-sent events (`text/event-stream`, each `data:` line read as it completes; the
//! last event that carries the path gives the cost, as in OpenAI's streams with
//! `stream_options.include_usage`). A number is read as a count when it is a whole number
//! from 0; one beyond `u64::MAX` is read as `u64::MAX` (then clamped to the policy's `max`,
//! as a response header's is).
//!
//! Nothing is delayed or changed: the reader sees a copy of each chunk. Its memory is
//! bounded per stream: a JSON body is kept up to [`MAX_JSON_BODY`] bytes (beyond that it
//! is dropped and its cost is unknown), an event stream only its current line, up to
//! [`MAX_EVENT_LINE`] bytes (a longer line is skipped); and per worker, across its
//! streams, by [`MAX_HELD_PER_WORKER`] (the worker passes each reader its room:
//! [`UsageReader::feed_within`]).

use serde_json::Value;

/// The longest JSON body read for its cost; a longer one's cost is unknown.
pub const MAX_JSON_BODY: usize = 256 * 1024;
/// The longest server-sent event line read; a longer one is skipped.
pub const MAX_EVENT_LINE: usize = 64 * 1024;
/// The most one worker's readers hold at once, across its streams: a JSON body that
/// would take it beyond is dropped (its cost is unknown), an event line skipped.
pub const MAX_HELD_PER_WORKER: usize = 8 * 1024 * 1024;

/// How the body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// One JSON document, read when it has ended.
    Json,
    /// Server-sent events, read line by line.
    Events,
}

/// Reads numbers at JSON paths from a response body fed to it chunk by chunk.
#[derive(Debug)]
pub struct UsageReader {
    paths: Vec<Vec<String>>,
    found: Vec<Option<u64>>,
    form: Form,
    /// The JSON body so far, or the event stream's current line.
    buffer: Vec<u8>,
    /// JSON: the body outgrew [`MAX_JSON_BODY`]. Events: the current line is being skipped.
    overflowed: bool,
    /// Bytes were dropped because the worker's bound across its streams was reached
    /// (not this stream's own).
    over_budget: bool,
}

impl UsageReader {
    /// A reader for the numbers at `paths` (each a list of object keys), for a body of
    /// this `content-type`.
    pub fn new(paths: Vec<Vec<String>>, content_type: Option<&[u8]>) -> Self {
        let events = content_type.is_some_and(|t| {
            t.trim_ascii_start().get(..17).is_some_and(|head| head.eq_ignore_ascii_case(b"text/event-stream"))
        });
        let found = vec![None; paths.len()];
        Self {
            paths,
            found,
            form: if events { Form::Events } else { Form::Json },
            buffer: Vec::new(),
            overflowed: false,
            over_budget: false,
        }
    }

    /// Whether the body is read as server-sent events.
    pub fn reads_events(&self) -> bool {
        self.form == Form::Events
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.feed_within(chunk, usize::MAX);
    }

    /// Reads the next chunk of the body, holding at most `cap` bytes (what its worker
    /// has room for, this reader's own bytes included): beyond it, a JSON body is dropped
    /// and an event line skipped, as beyond the stream's own bound, and
    /// [`Self::over_budget`] says so.
    pub fn feed_within(&mut self, chunk: &[u8], cap: usize) {
        match self.form {
            Form::Json => self.hold(chunk, MAX_JSON_BODY, cap),
            Form::Events => {
                let mut rest = chunk;
                while let Some(end) = rest.iter().position(|b| *b == b'\n') {
                    let (line, after) = rest.split_at(end);
                    self.hold(line, MAX_EVENT_LINE, cap);
                    if !self.overflowed {
                        let line = std::mem::take(&mut self.buffer);
                        self.event_line(&line);
                        self.buffer = line;
                    }
                    self.buffer.clear();
                    self.overflowed = false;
                    rest = after.get(1..).unwrap_or_default();
                }
                self.hold(rest, MAX_EVENT_LINE, cap);
            }
        }
    }

    /// Whether bytes were dropped because the worker's bound across its streams was
    /// reached (see [`Self::feed_within`]).
    pub fn over_budget(&self) -> bool {
        self.over_budget
    }

    /// The body has ended (`complete`) or was cut short: what was found for each path, in
    /// the order given. A JSON body cut short has no cost; an event stream keeps what its
    /// complete events said.
    pub fn finish(&mut self, complete: bool) -> &[Option<u64>] {
        match self.form {
            Form::Json if complete && !self.overflowed => {
                if let Ok(document) = serde_json::from_slice::<Value>(&self.buffer) {
                    self.read(&document);
                }
            }
            Form::Json => {}
            Form::Events if complete && !self.overflowed => {
                // A last event line without its newline.
                let line = std::mem::take(&mut self.buffer);
                self.event_line(&line);
            }
            Form::Events => {}
        }
        self.buffer = Vec::new();
        &self.found
    }

    /// Bytes held now (bounded by [`MAX_JSON_BODY`] or [`MAX_EVENT_LINE`]).
    pub fn held(&self) -> usize {
        self.buffer.len()
    }

    /// Keeps `bytes` unless the buffer would outgrow `limit` (the stream's own bound) or
    /// `cap` (its worker's room): then it is dropped, and stays dropped until the caller
    /// resets `overflowed`.
    fn hold(&mut self, bytes: &[u8], limit: usize, cap: usize) {
        if self.overflowed {
            return;
        }
        let wanted = self.buffer.len().saturating_add(bytes.len());
        if wanted > limit || wanted > cap {
            self.over_budget |= wanted <= limit;
            self.overflowed = true;
            self.buffer = Vec::new();
        } else {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// One complete line of the event stream: a `data:` line carrying a JSON object
    /// that names the first key of some path is parsed.
    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return };
        let data = data.trim_ascii();
        if !data.starts_with(b"{") || !self.paths.iter().any(|path| names_key(data, path)) {
            return;
        }
        if let Ok(event) = serde_json::from_slice::<Value>(data) {
            self.read(&event);
        }
    }

    fn read(&mut self, document: &Value) {
        for (path, found) in self.paths.iter().zip(self.found.iter_mut()) {
            let value = path.iter().try_fold(document, |at, key| at.get(key.as_str()));
            if let Some(number) = value.and_then(count) {
                *found = Some(number);
            }
        }
    }
}

/// A JSON value as a count: a whole number from 0, or, beyond `u64::MAX` (which
/// serde_json reads as a float), `u64::MAX`, as a response header beyond it reads:
/// settling clamps it to the policy's `max`, never takes it for no report. Anything else
/// (a fraction, a negative number, a string) is no count.
fn count(value: &Value) -> Option<u64> {
    /// 2^64, the first float beyond every `u64`.
    const BEYOND_U64: f64 = 18_446_744_073_709_551_616.0;
    value.as_u64().or_else(|| value.as_f64().filter(|f| *f >= BEYOND_U64).map(|_| u64::MAX))
}

/// Whether `data` mentions the path's first key as a JSON string (a cheap test before
/// parsing an event: most events of a stream carry only content).
fn names_key(data: &[u8], path: &[String]) -> bool {
    let Some(first) = path.first() else { return false };
    let needle = first.as_bytes();
    data.windows(needle.len() + 2)
        .any(|w| w.first() == Some(&b'"') && w.last() == Some(&b'"') && w.get(1..=needle.len()) == Some(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total() -> Vec<Vec<String>> {
        vec![vec!["usage".to_owned(), "total_tokens".to_owned()]]
    }

    fn read_json(chunks: &[&[u8]]) -> Option<u64> {
        let mut reader = UsageReader::new(total(), Some(b"application/json"));
        for chunk in chunks {
            reader.feed(chunk);
        }
        reader.finish(true).first().copied().flatten()
    }

    #[test]
    fn a_json_body_split_anywhere_gives_the_number_at_its_path() {
        let body = br#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":5,"total_tokens":42}}"#;
        for cut in 0..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(read_json(&[a, b]), Some(42), "cut at {cut}");
        }
    }

    #[test]
    fn a_body_without_the_path_or_that_is_not_json_or_not_a_whole_number_has_no_cost() {
        assert_eq!(read_json(&[br#"{"usage":{"prompt_tokens":5}}"#]), None);
        assert_eq!(read_json(&[b"<html>oops</html>"]), None);
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":"42"}}"#]), None);
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":-3}}"#]), None);
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":4.5}}"#]), None);
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":42}"#]), None, "cut short");
    }

    #[test]
    fn a_json_usage_above_the_largest_count_is_read_as_the_largest_count_like_a_header_not_as_unknown() {
        // serde_json reads an integer beyond u64 as a float: such a report is clamped to
        // the policy's `max` when it is settled, as a response header's is.
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":99999999999999999999999}}"#]), Some(u64::MAX));
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":18446744073709551616}}"#]), Some(u64::MAX));
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":18446744073709551615}}"#]), Some(u64::MAX));
        let mut events = UsageReader::new(total(), Some(b"text/event-stream"));
        events.feed(b"data: {\"usage\":{\"total_tokens\":123456789012345678901234567890}}\n\n");
        assert_eq!(events.finish(true), [Some(u64::MAX)]);
        assert_eq!(read_json(&[br#"{"usage":{"total_tokens":-99999999999999999999999}}"#]), None);
    }

    #[test]
    fn a_json_body_beyond_the_bound_is_dropped_and_has_no_cost() {
        let mut reader = UsageReader::new(total(), None);
        let filler = vec![b' '; MAX_JSON_BODY];
        reader.feed(br#"{"usage":{"total_tokens":42},"pad":""#);
        reader.feed(&filler);
        assert_eq!(reader.held(), 0, "the memory is released at once");
        reader.feed(br#""}"#);
        assert_eq!(reader.finish(true), [None]);
    }

    #[test]
    fn beyond_the_room_its_worker_gives_a_json_body_is_dropped_and_an_event_line_skipped_and_both_say_so() {
        let mut json = UsageReader::new(total(), None);
        json.feed_within(br#"{"usage":{"total_tokens":42}}"#, 10);
        assert_eq!((json.held(), json.over_budget()), (0, true));
        assert_eq!(json.finish(true), [None]);

        let mut events = UsageReader::new(total(), Some(b"text/event-stream"));
        events.feed_within(b"data: {\"usage\":{\"total_tokens\":1}}\n\n", 8);
        events.feed_within(b"data: {\"usage\":{\"total_tokens\":7}}\n\n", 100);
        assert!(events.over_budget());
        assert_eq!(events.finish(true), [Some(7)], "the line that fitted is read");

        let mut within = UsageReader::new(total(), None);
        within.feed_within(br#"{"usage":{"total_tokens":42}}"#, 29);
        assert!(!within.over_budget());
        assert_eq!(within.finish(true), [Some(42)]);
    }

    #[test]
    fn a_json_body_cut_short_has_no_cost() {
        let mut reader = UsageReader::new(total(), None);
        reader.feed(br#"{"usage":{"total_tokens":42}}"#);
        assert_eq!(reader.finish(false), [None]);
    }

    fn stream(include_usage: bool) -> Vec<u8> {
        let mut body = Vec::new();
        for word in ["Hel", "lo", "!"] {
            body.extend_from_slice(
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{word}\"}}}}],\"usage\":null}}\n\n")
                    .as_bytes(),
            );
        }
        if include_usage {
            body.extend_from_slice(
                b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":12}}\r\n\r\n",
            );
        }
        body.extend_from_slice(b"data: [DONE]\n\n");
        body
    }

    #[test]
    fn an_event_stream_split_anywhere_gives_the_usage_of_its_last_event_that_has_one() {
        let body = stream(true);
        for cut in 0..body.len() {
            let mut reader = UsageReader::new(total(), Some(b"text/event-stream; charset=utf-8"));
            assert!(reader.reads_events());
            let (a, b) = body.split_at(cut);
            reader.feed(a);
            reader.feed(b);
            assert!(reader.held() < 200, "only the current line is held");
            assert_eq!(reader.finish(true), [Some(12)], "cut at {cut}");
        }
    }

    #[test]
    fn an_event_stream_without_usage_has_no_cost_and_one_cut_after_its_usage_keeps_it() {
        let mut without = UsageReader::new(total(), Some(b"text/event-stream"));
        without.feed(&stream(false));
        assert_eq!(without.finish(true), [None]);

        let body = stream(true);
        let usage_end = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 2;
        let mut cut = UsageReader::new(total(), Some(b"text/event-stream"));
        cut.feed(&body[..usage_end]);
        assert_eq!(cut.finish(false), [Some(12)], "the client left after the usage event");
        let mut early = UsageReader::new(total(), Some(b"text/event-stream"));
        early.feed(&body[..usage_end - 10]);
        assert_eq!(early.finish(false), [None], "the usage event never completed");
    }

    #[test]
    fn an_event_line_beyond_the_bound_is_skipped_and_the_next_ones_are_read() {
        let mut reader = UsageReader::new(total(), Some(b"text/event-stream"));
        reader.feed(b"data: {\"usage\":{\"total_tokens\":1");
        reader.feed(&vec![b'0'; MAX_EVENT_LINE]);
        assert_eq!(reader.held(), 0);
        reader.feed(b"}}\n\ndata: {\"usage\":{\"total_tokens\":7}}\n\n");
        assert_eq!(reader.finish(true), [Some(7)]);
    }

    #[test]
    fn several_paths_are_read_from_one_body() {
        let paths = vec![
            vec!["usage".to_owned(), "prompt_tokens".to_owned()],
            vec!["usage".to_owned(), "completion_tokens".to_owned()],
            vec!["missing".to_owned()],
        ];
        let mut reader = UsageReader::new(paths, None);
        reader.feed(br#"{"usage":{"prompt_tokens":5,"completion_tokens":37}}"#);
        assert_eq!(reader.finish(true), [Some(5), Some(37), None]);
    }
}
