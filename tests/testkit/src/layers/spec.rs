//! How a crate describes its layers to the checker: named layers from the bottom, and
//! rules inside modules.

/// The crate root (`lib.rs`): what it re-exports sits above everything.
pub const ROOT: &str = "lib";
/// A module's own file (`mod.rs`), the top of its submodules.
pub const MOD: &str = "mod";

/// One layer: its name and its modules. A module may import from its own layer and
/// those below.
pub type Layer<'a> = (&'a str, &'a [&'a str]);

/// The rules inside one module.
#[derive(Clone, Copy, Debug)]
pub struct Inner<'a> {
    /// Its submodules' layers, from the bottom ([`MOD`] for its own file); `None` until
    /// it has some (its submodules are then not checked against each other).
    pub layers: Option<&'a [Layer<'a>]>,
    /// Modules (paths from the crate root) that none of its files may import.
    pub forbidden: &'a [&'a str],
}

impl<'a> Inner<'a> {
    /// Submodules in these layers, and no module forbidden.
    pub const fn layered(layers: &'a [Layer<'a>]) -> Self {
        Self { layers: Some(layers), forbidden: &[] }
    }
}

/// A crate's layer spec: its top-level modules' layers, and the rules inside modules.
#[derive(Clone, Copy, Debug)]
pub struct Layers<'a> {
    /// The crate's top-level modules' layers, from the bottom ([`ROOT`] last).
    pub top: &'a [Layer<'a>],
    /// The rules inside modules, keyed by the module's path (`config::validate`).
    pub inner: &'a [(&'a str, Inner<'a>)],
}

impl<'a> Layers<'a> {
    /// Top-level layers, and no rules inside modules.
    pub const fn new(top: &'a [Layer<'a>]) -> Self {
        Self { top, inner: &[] }
    }

    /// The same, with rules inside modules.
    pub const fn with_inner(self, inner: &'a [(&'a str, Inner<'a>)]) -> Self {
        Self { inner, ..self }
    }
}
