//! What breaks one level's layers: a module with no layer, an import of a higher layer,
//! a circle; and which table entries name no module.

use std::collections::{BTreeMap, BTreeSet};

use super::references::Reference;
use super::spec::{Layer, MOD, ROOT};

/// The index and name of the layer `module` is in.
fn layer_of<'a>(layers: &[Layer<'a>], module: &str) -> Option<(usize, &'a str)> {
    layers.iter().enumerate().find(|(_, (_, modules))| modules.contains(&module)).map(|(i, (name, _))| (i, *name))
}

/// `name` as a path from the crate root, inside `parent`.
fn qualified(parent: &[String], name: &str) -> String {
    match (parent.is_empty(), name == MOD) {
        (true, _) => name.to_owned(),
        (false, true) => parent.join("::"),
        (false, false) => format!("{}::{name}", parent.join("::")),
    }
}

/// The top of `parent`'s level: the crate root, or the module's own file.
fn top(parent: &[String]) -> &'static str {
    if parent.is_empty() { ROOT } else { MOD }
}

/// The table a level's layers come from, as its messages name it.
fn table(parent: &[String]) -> String {
    if parent.is_empty() { "LAYERS".to_owned() } else { format!("INNER[{:?}]", parent.join("::")) }
}

/// Whether `path` is `parent` or inside it.
fn inside(parent: &[String], path: &[String]) -> bool {
    path.len() >= parent.len() && path.get(..parent.len()) == Some(parent)
}

/// The submodules of `parent` that have files among `paths`.
fn submodules(paths: &[Vec<String>], parent: &[String]) -> BTreeSet<String> {
    paths.iter().filter(|p| inside(parent, p)).filter_map(|p| p.get(parent.len()).cloned()).collect()
}

/// What breaks the layers of `parent`'s submodules: one without a layer, an import of a
/// higher layer (with its file and line), and a circle.
pub(super) fn imports(refs: &[Reference], paths: &[Vec<String>], parent: &[String], layers: &[Layer]) -> Vec<String> {
    let top = top(parent);
    let submodules = submodules(paths, parent);
    let name_of = |path: &[String]| match path.get(parent.len()) {
        Some(next) if submodules.contains(next) => next.clone(),
        _ => top.to_owned(),
    };
    let table = table(parent);
    let mut problems = Vec::new();
    for module in submodules.iter().map(String::as_str).chain([top]) {
        if layer_of(layers, module).is_none() {
            let module = qualified(parent, module);
            problems.push(format!("module `{module}` has no layer: add it to {table} (and to the crate docs)"));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for reference in refs.iter().filter(|r| inside(parent, &r.from) && inside(parent, &r.to)) {
        let (from, to) = (name_of(&reference.from), name_of(&reference.to));
        if from == to {
            continue;
        }
        graph.entry(from.clone()).or_default().insert(to.clone());
        if let (Some((from_layer, from_name)), Some((to_layer, to_name))) =
            (layer_of(layers, &from), layer_of(layers, &to))
            && to_layer > from_layer
        {
            problems.push(format!(
                "src/{}:{}: `{}` ({from_name}, layer {}) imports `{}` ({to_name}, layer {}), which is above it: {}",
                reference.file,
                reference.line,
                qualified(parent, &from),
                from_layer + 1,
                qualified(parent, &to),
                to_layer + 1,
                reference.text
            ));
        }
    }
    problems.sort();
    problems.dedup();
    if let Some(circle) = find_circle(&graph) {
        let circle: Vec<String> = circle.iter().map(|m| qualified(parent, m)).collect();
        problems.push(format!("the modules import each other in a circle: {}", circle.join(" -> ")));
    }
    problems
}

/// The entries of `parent`'s table that name no module.
pub(super) fn stale(paths: &[Vec<String>], parent: &[String], layers: &[Layer]) -> Vec<String> {
    let (top, submodules, table) = (top(parent), submodules(paths, parent), table(parent));
    layers
        .iter()
        .flat_map(|(_, modules)| modules.iter())
        .filter(|module| **module != top && !submodules.contains(**module))
        .map(|module| format!("{table} names `{}`, which is not a module", qualified(parent, module)))
        .collect()
}

/// A circle in `graph`, as the modules along it (the first repeated at the end).
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}
