//! What in a Rust file is code: its text with comments and string and character literals
//! blanked (newlines kept, so lines still count), and the small readers the reference
//! finder walks it with.

/// Whether `c` can be part of an identifier.
pub(super) fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The text with comments and string and character literals blanked, newlines kept.
pub(super) fn lex(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(s.len())).skip(from) {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let at = |i: usize, pattern: &str| pattern.chars().enumerate().all(|(k, p)| s.get(i + k) == Some(&p));
    let mut i = 0;
    while i < s.len() {
        let previous_is_ident = i > 0 && is_ident(s[i - 1]);
        if at(i, "//") {
            let end = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if at(i, "/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < s.len() {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if s[i] == 'r' && !previous_is_ident && matches!(s.get(i + 1), Some('#' | '"')) {
            let hashes = (i + 1..s.len()).take_while(|&j| s[j] == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let start = i + 2 + hashes;
            let end = (start..s.len()).find(|&j| at(j, &close)).map_or(s.len(), |j| j + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == '\'' {
            // A character literal, or a lifetime or label (left as it is).
            let end = if s.get(i + 1) == Some(&'\\') {
                (i + 3..s.len()).find(|&j| s[j] == '\'').map(|j| j + 1)
            } else if s.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the item starting at `start` ends: after its `;`, or after the `}` of its body.
pub(super) fn item_end(s: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    for (j, c) in s.iter().enumerate().skip(start) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            ';' if depth == 0 => return j + 1,
            _ => {}
        }
    }
    s.len()
}

/// The identifier starting at `i` ("" if none does).
pub(super) fn ident_at(s: &[char], i: usize) -> String {
    s.iter().skip(i).take_while(|c| is_ident(**c)).collect()
}

/// The first position from `i` that is not white space.
pub(super) fn skip_space(s: &[char], mut i: usize) -> usize {
    while s.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lexed(text: &str) -> String {
        lex(text).into_iter().collect()
    }

    #[test]
    fn comments_and_literals_are_blanked_and_lines_kept() {
        let text = "a // crate::x\nb /* c /* d */ e */ f\n\"crate::y\" r#\"z\"# g\n";

        let code = lexed(text);

        assert_eq!(code.split_whitespace().collect::<Vec<_>>(), ["a", "b", "f", "g"]);
        assert_eq!((code.lines().count(), code.len()), (3, text.len()));
    }

    #[test]
    fn a_character_literal_is_blanked_and_a_lifetime_is_not() {
        assert_eq!(lexed("'{' '\\'' x").trim_start(), "x");
        assert_eq!(lexed("fn f<'a>(x: &'a str)"), "fn f<'a>(x: &'a str)");
    }

    #[test]
    fn an_item_ends_at_its_semicolon_or_its_closing_brace() {
        let s: Vec<char> = "mod a; mod b { fn f() { g(); } } h".chars().collect();

        assert_eq!(item_end(&s, 0), 6);
        assert_eq!(item_end(&s, 6), 32);
    }
}
