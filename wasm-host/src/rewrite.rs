//! What the module rewrites that count things in a guest share: reading the module's
//! layout first (its imports, globals, function types and names), appending counter
//! globals and exporting them, and the instructions that add to a counter. `probe`
//! counts entries into named functions with them, `profile` each function's own
//! instructions.

use std::collections::BTreeMap;

use wasm_encoder::{ConstExpr, ExportKind, GlobalType, Instruction, ValType};
use wasmparser::{KnownCustom, Name, Parser, Payload, TypeRef};

/// Why a module could not be rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RewriteError {
    /// The module does not parse, or could not be written back.
    Module(String),
    /// No function of the module has this name (a stripped module has no names at all),
    /// and it is not one of the countable instructions.
    NoSuchFunction(String),
}

impl std::fmt::Display for RewriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Module(reason) => write!(f, "cannot rewrite the module to count calls: {reason}"),
            Self::NoSuchFunction(name) => write!(
                f,
                "cannot count calls to `{name}`: no function of the module has that name \
                 (its `name` section lacks it, or the module was stripped)"
            ),
        }
    }
}

/// What a rewrite needs to know about the module first.
pub(crate) struct Layout {
    /// Functions imported (they come first in the function index space).
    pub(crate) imported_functions: u32,
    /// Globals, imported and defined: the first counter appended gets this index.
    pub(crate) globals: u32,
    /// Each function type's parameter count.
    pub(crate) type_params: Vec<u32>,
    /// Each defined function's type.
    pub(crate) function_types: Vec<u32>,
    /// The `name` section's function names, by function index.
    pub(crate) names: BTreeMap<u32, String>,
}

impl Layout {
    /// The first function with this name (in index order), if any.
    pub(crate) fn index_of(&self, name: &str) -> Option<u32> {
        self.names.iter().find(|(_, n)| *n == name).map(|(index, _)| *index)
    }

    /// The parameter count of the `defined`-th defined function.
    pub(crate) fn params_of(&self, defined: usize) -> u32 {
        self.function_types.get(defined).and_then(|ty| self.type_params.get(*ty as usize)).copied().unwrap_or(0)
    }
}

/// Reads `bytes`'s layout.
///
/// # Errors
/// [`RewriteError::Module`] when the module does not parse.
pub(crate) fn layout(bytes: &[u8]) -> Result<Layout, RewriteError> {
    let module = |e: wasmparser::BinaryReaderError| RewriteError::Module(e.to_string());
    let mut layout = Layout {
        imported_functions: 0,
        globals: 0,
        type_params: Vec::new(),
        function_types: Vec::new(),
        names: BTreeMap::new(),
    };
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(module)? {
            Payload::TypeSection(types) => {
                for group in types {
                    for ty in group.map_err(module)?.types() {
                        let params = match &ty.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => f.params().len() as u32,
                            _ => 0,
                        };
                        layout.type_params.push(params);
                    }
                }
            }
            Payload::ImportSection(imports) => {
                for import in imports.into_imports() {
                    match import.map_err(module)?.ty {
                        TypeRef::Func(_) | TypeRef::FuncExact(_) => layout.imported_functions += 1,
                        TypeRef::Global(_) => layout.globals += 1,
                        _ => {}
                    }
                }
            }
            Payload::FunctionSection(functions) => {
                for ty in functions {
                    layout.function_types.push(ty.map_err(module)?);
                }
            }
            Payload::GlobalSection(globals) => layout.globals += globals.count(),
            Payload::CustomSection(section) => {
                if let KnownCustom::Name(reader) = section.as_known() {
                    for name in reader {
                        if let Name::Function(map) = name.map_err(module)? {
                            for naming in map {
                                let naming = naming.map_err(module)?;
                                layout.names.entry(naming.index).or_insert_with(|| naming.name.to_owned());
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(layout)
}

/// Appends `count` counters (mutable `i64` globals at 0) to `globals`.
pub(crate) fn append_counters(globals: &mut wasm_encoder::GlobalSection, count: usize) {
    for _ in 0..count {
        globals.global(GlobalType { val_type: ValType::I64, mutable: true, shared: false }, &ConstExpr::i64_const(0));
    }
}

/// Exports `count` counters from global `first` on, the `i`-th as `name(i)`.
pub(crate) fn export_counters(
    exports: &mut wasm_encoder::ExportSection,
    first: u32,
    count: usize,
    name: impl Fn(usize) -> String,
) {
    for (i, global) in (first..).take(count).enumerate() {
        exports.export(&name(i), ExportKind::Global, global);
    }
}

/// Adds what `value` leaves on the stack (an `i64`) to the counter in `global`.
pub(crate) fn add(function: &mut wasm_encoder::Function, global: u32, value: &[Instruction<'_>]) {
    function.instruction(&Instruction::GlobalGet(global));
    for instruction in value {
        function.instruction(instruction);
    }
    function.instruction(&Instruction::I64Add);
    function.instruction(&Instruction::GlobalSet(global));
}
