//! Which modules a file's code names: every `crate::`, `super::` and `self::` path
//! (grouped, nested, in macros, from inline modules) resolved from the module it is in,
//! outside comments, literals and `#[cfg(test)]` items.

use super::lex::{ident_at, is_ident, item_end, lex, skip_space};
use super::spec::{MOD, ROOT};

/// One path in the code: where it is, the module whose code it is in, what it names.
#[derive(Debug)]
pub(super) struct Reference {
    /// The file, relative to `src/`.
    pub(super) file: String,
    /// Its line, from 1.
    pub(super) line: usize,
    /// The module the code is in (inline modules included), from the crate root.
    pub(super) from: Vec<String>,
    /// What the path names, from the crate root.
    pub(super) to: Vec<String>,
    /// The path as written (its first 40 characters), for the message.
    pub(super) text: String,
}

/// The module path of a file under `src/`: `config/validate/key.rs` is
/// `[config, validate, key]`, `config/mod.rs` is `[config]`, `lib.rs` is `[]`.
pub(super) fn module_path(file: &str) -> Vec<String> {
    let trimmed = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == MOD || p == ROOT) {
        parts.pop();
    }
    parts
}

/// The paths a use tree at `i` names: `a::b::C`, `a::{b, c::{D, E}}`, `a::*`, `a as b`.
fn use_tree(s: &[char], mut i: usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    loop {
        i = skip_space(s, i);
        if s.get(i) == Some(&'{') {
            let mut paths = Vec::new();
            let mut j = i + 1;
            loop {
                j = skip_space(s, j);
                if s.get(j).is_none_or(|c| *c == '}') {
                    break;
                }
                for path in use_tree(s, j) {
                    paths.push(prefix.iter().cloned().chain(path).collect());
                }
                let mut depth = 0usize;
                while let Some(c) = s.get(j) {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => break,
                        _ => {}
                    }
                    j += 1;
                }
                if s.get(j) == Some(&',') {
                    j += 1;
                }
            }
            return paths;
        }
        let ident = ident_at(s, i);
        if ident.is_empty() {
            break;
        }
        i += ident.len();
        if ident != "self" {
            prefix.push(ident);
        }
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            break;
        }
    }
    vec![prefix]
}

/// The references of one file, and the modules it declares `#[cfg(test)] mod name;`.
pub(super) fn references(file: &str, text: &str) -> (Vec<Reference>, Vec<String>) {
    let module = module_path(file);
    let s = lex(text);
    let at = |i: usize, pattern: &str| pattern.chars().enumerate().all(|(k, p)| s.get(i + k) == Some(&p));
    let line_of = |i: usize| s.iter().take(i).filter(|c| **c == '\n').count() + 1;
    let (mut refs, mut test_modules) = (Vec::new(), Vec::new());
    // Inline modules open here, with the brace depth outside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == ':');
        if at(i, "#[cfg(test)]") {
            let start = i + "#[cfg(test)]".len();
            let end = item_end(&s, start);
            let item: String = s.get(start..end).unwrap_or_default().iter().collect();
            let words: Vec<&str> = item.split_whitespace().collect();
            if let Some(k) = words.iter().position(|w| *w == "mod")
                && item.trim_end().ends_with(';')
                && !item.contains('{')
                && let Some(name) = words.get(k + 1)
            {
                test_modules.push(name.trim_end_matches(';').to_owned());
            }
            i = end;
            continue;
        }
        if boundary && at(i, "mod ") {
            let name_at = skip_space(&s, i + 4);
            let name = ident_at(&s, name_at);
            if s.get(skip_space(&s, name_at + name.len())) == Some(&'{') && !name.is_empty() {
                inline.push((name, depth));
            }
        }
        match s[i] {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        for keyword in ["crate::", "super::", "self::"] {
            if !(boundary && at(i, keyword)) {
                continue;
            }
            let mut base = match keyword {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => here.get(..here.len().saturating_sub(1)).unwrap_or_default().to_vec(),
            };
            let mut rest = i + keyword.len();
            while at(rest, "super::") {
                base.pop();
                rest += "super::".len();
            }
            let text: String = s.iter().skip(i).take(keyword.len() + 40).collect();
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            for path in use_tree(&s, rest) {
                let to = base.iter().cloned().chain(path).collect();
                refs.push(Reference {
                    file: file.to_owned(),
                    line: line_of(i),
                    from: here.clone(),
                    to,
                    text: text.clone(),
                });
            }
        }
        i += 1;
    }
    (refs, test_modules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(file: &str, text: &str) -> Vec<String> {
        references(file, text)
            .0
            .iter()
            .map(|r| format!("{}:{} {}", r.line, r.from.join("::"), r.to.join("::")))
            .collect()
    }

    #[test]
    fn a_use_tree_names_every_leaf_of_its_groups() {
        let s: Vec<char> = "a::{b, c::{D, self}, e as f}::g;".chars().collect();

        assert_eq!(use_tree(&s, 0), [vec!["a", "b"], vec!["a", "c", "D"], vec!["a", "c"], vec!["a", "e"]]);
    }

    #[test]
    fn super_and_self_resolve_from_the_file_and_its_inline_modules() {
        let text = "use super::super::x::Y;\nmod inner {\n    use super::Z;\n    use self::w::V;\n}\nuse self::u;\n";

        assert_eq!(
            names("a/b/c.rs", text),
            [
                "1:a::b::c a::x::Y",
                "3:a::b::c::inner a::b::c::Z",
                "4:a::b::c::inner a::b::c::inner::w::V",
                "6:a::b::c a::b::c::u"
            ]
        );
    }

    #[test]
    fn a_test_module_declared_by_its_file_is_named_and_its_paths_are_not_read() {
        let (refs, test_modules) =
            references("engine/mod.rs", "#[cfg(test)]\nmod unit;\n#[cfg(test)]\nfn f() { crate::x(); }\n");

        assert!(refs.is_empty(), "{refs:?}");
        assert_eq!(test_modules, ["unit"]);
    }

    #[test]
    fn a_file_names_its_module() {
        assert_eq!(module_path("config/validate/key.rs"), ["config", "validate", "key"]);
        assert_eq!(module_path("config/mod.rs"), ["config"]);
        assert!(module_path("lib.rs").is_empty());
    }
}
