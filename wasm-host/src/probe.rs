//! How often a guest enters some of its own functions: the module is rewritten before
//! it is compiled so that each probed function (found by its name in the module's
//! `name` section) adds one to a counter of its own on entry, kept in an exported
//! global that the host reads back.
//!
//! This is how a test counts what it cannot see from the host side: allocations
//! (`malloc`, `realloc`), 128-bit arithmetic (`__multi3`, `__udivti3`, which compilers
//! call for `u128` multiplication and division on wasm32), or any function of the
//! filter's own. A few instructions can be counted the same way, by their text-format
//! name ([`INSTRUCTIONS`]): each occurrence counts its executions first, which is how
//! the bulk-memory copies and fills a request makes are counted (V8 runs each of them as
//! a call out of the compiled code). Counts, not times: the same module, configuration and requests give the
//! same figures on any machine, so a test can hold a per-request budget without ever
//! flaking. The probe adds four instructions per entry; the rewritten module behaves as
//! the original does in every other respect.

use std::collections::BTreeMap;

use wasm_encoder::Instruction;
use wasm_encoder::reencode::{self, Reencode};
use wasmparser::Parser;

use crate::rewrite;

/// The instructions that can be counted, by their text-format name.
pub const INSTRUCTIONS: [&str; 3] = ["memory.copy", "memory.fill", "call_indirect"];

/// Whether `operator` is the instruction named `name` in [`INSTRUCTIONS`].
fn is_instruction(operator: &wasmparser::Operator<'_>, name: &str) -> bool {
    use wasmparser::Operator;
    matches!(
        (operator, name),
        (Operator::MemoryCopy { .. }, "memory.copy")
            | (Operator::MemoryFill { .. }, "memory.fill")
            | (Operator::CallIndirect { .. }, "call_indirect")
    )
}

/// The prefix of the exported globals that hold the counts.
const EXPORT_PREFIX: &str = "wasm_host_probe_";

/// The export that holds the count of probe `index`.
pub(crate) fn export_name(index: usize) -> String {
    format!("{EXPORT_PREFIX}{index}")
}

/// Why a module could not be probed.
pub(crate) use crate::rewrite::RewriteError as ProbeError;

/// The rewrite: counters appended to the globals and exported, a prologue in each probed
/// function.
struct Prober {
    /// Probed function index -> the global that counts it.
    counters: BTreeMap<u32, u32>,
    /// Probed instructions, by name, and the global that counts each.
    instructions: Vec<(&'static str, u32)>,
    /// The first counter's global index; the others follow it.
    first_counter: u32,
    /// The index of the next function body the code section gives.
    next_function: u32,
    /// Whether the counters were added to a global and an export section.
    written: (bool, bool),
}

impl Reencode for Prober {
    type Error = std::convert::Infallible;

    fn parse_global_section(
        &mut self,
        globals: &mut wasm_encoder::GlobalSection,
        section: wasmparser::GlobalSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_global_section(self, globals, section)?;
        self.written.0 = true;
        rewrite::append_counters(globals, self.counters.len() + self.instructions.len());
        Ok(())
    }

    fn parse_export_section(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        section: wasmparser::ExportSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_export_section(self, exports, section)?;
        self.written.1 = true;
        let count = self.counters.len() + self.instructions.len();
        rewrite::export_counters(exports, self.first_counter, count, export_name);
        Ok(())
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: wasmparser::FunctionBody<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        let index = self.next_function;
        self.next_function += 1;
        let mut function = self.new_function_with_parsed_locals(&func)?;
        if let Some(&global) = self.counters.get(&index) {
            count(&mut function, global);
        }
        let mut reader = func.get_operators_reader()?;
        while !reader.eof() {
            let operator = reader.read()?;
            if let Some((_, global)) = self.instructions.iter().find(|(name, _)| is_instruction(&operator, name)) {
                count(&mut function, *global);
            }
            function.instruction(&self.instruction(operator)?);
        }
        code.function(&function);
        Ok(())
    }
}

/// Adds one to the counter in `global`.
fn count(function: &mut wasm_encoder::Function, global: u32) {
    rewrite::add(function, global, &[Instruction::I64Const(1)]);
}

/// `bytes` rewritten so that each function named in `names` counts its entries, and each
/// of the [`INSTRUCTIONS`] named there its executions; the count of `names[i]` is in the
/// exported global [`export_name`]`(i)`.
///
/// # Errors
/// [`ProbeError::NoSuchFunction`] for a name no function defined in the module has (or
/// a name given twice); [`ProbeError::Module`] when the module does not parse, or has no
/// global or export section to add the counters to (every module a Rust toolchain
/// emits has both: the stack pointer, and the exported entry points).
pub(crate) fn instrument(bytes: &[u8], names: &[String]) -> Result<Vec<u8>, ProbeError> {
    let layout = rewrite::layout(bytes)?;
    let mut counters = BTreeMap::new();
    let mut instructions = Vec::new();
    for (global, name) in (layout.globals..).zip(names) {
        if let Some(instruction) = INSTRUCTIONS.into_iter().find(|i| i == name) {
            if instructions.iter().any(|(i, _)| *i == instruction) {
                return Err(ProbeError::NoSuchFunction(format!("{name} (named twice)")));
            }
            instructions.push((instruction, global));
            continue;
        }
        let index = layout
            .index_of(name)
            .filter(|&index| index >= layout.imported_functions)
            .ok_or_else(|| ProbeError::NoSuchFunction(name.clone()))?;
        if counters.insert(index, global).is_some() {
            return Err(ProbeError::NoSuchFunction(format!("{name} (named twice)")));
        }
    }
    let mut prober = Prober {
        counters,
        instructions,
        first_counter: layout.globals,
        next_function: layout.imported_functions,
        written: (false, false),
    };
    let mut module = wasm_encoder::Module::new();
    reencode::utils::parse_core_module(&mut prober, &mut module, Parser::new(0), bytes)
        .map_err(|e| ProbeError::Module(e.to_string()))?;
    if !names.is_empty() && prober.written != (true, true) {
        return Err(ProbeError::Module("it has no global section or no export section to hold the counters".into()));
    }
    Ok(module.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Engine, Instance, Module, Store};

    const MODULE: &str = r#"(module
        (import "env" "log" (func $log (param i32)))
        (global $sp (mut i32) (i32.const 1024))
        (func $square (export "square") (param i32) (result i32)
            local.get 0 local.get 0 i32.mul)
        (func $twice_square (export "twice_square") (param i32) (result i32)
            local.get 0 call $square local.get 0 call $square i32.add)
        (func $untouched (export "untouched") (result i32) global.get $sp))"#;

    fn run(names: &[&str], calls: &[(&str, i32)]) -> (Vec<i32>, Vec<i64>) {
        let bytes = wat::parse_str(MODULE).expect("the test module parses");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let probed = instrument(&bytes, &names).expect("the module is probed");
        let engine = Engine::default();
        let module = Module::new(&engine, probed).expect("the probed module is valid");
        let mut store = Store::new(&engine, ());
        let log = wasmtime::Func::wrap(&mut store, |_: i32| {});
        let instance = Instance::new(&mut store, &module, &[log.into()]).expect("it instantiates");
        let results = calls
            .iter()
            .map(|(name, arg)| {
                let f = instance.get_typed_func::<i32, i32>(&mut store, name).expect("exported");
                f.call(&mut store, *arg).expect("runs")
            })
            .collect();
        let counts = (0..names.len())
            .map(|i| instance.get_global(&mut store, &export_name(i)).expect("counter").get(&mut store).unwrap_i64())
            .collect();
        (results, counts)
    }

    #[test]
    fn each_probed_function_counts_its_entries_and_computes_what_it_did_before() {
        let (results, counts) = run(&["square", "twice_square"], &[("square", 3), ("twice_square", 2), ("square", 4)]);

        assert_eq!(results, [9, 8, 16]);
        assert_eq!(counts, [4, 1], "square: twice directly, twice through twice_square");
    }

    #[test]
    fn an_instruction_counts_its_executions_wherever_it_stands() {
        const COPIES: &str = r#"(module
            (memory (export "memory") 1)
            (global $sp (mut i32) (i32.const 1024))
            (func $copy (export "copy") (param i32) (result i32)
                (memory.copy (i32.const 0) (i32.const 16) (local.get 0))
                (memory.copy (i32.const 32) (i32.const 48) (local.get 0))
                (memory.fill (i32.const 64) (i32.const 7) (local.get 0))
                (i32.load8_u (i32.const 64))))"#;
        let bytes = wat::parse_str(COPIES).expect("the test module parses");
        let probed = instrument(&bytes, &["memory.copy".to_owned(), "memory.fill".to_owned()]).expect("probed");
        let engine = Engine::default();
        let mut store = Store::new(&engine, ());
        let instance = Instance::new(&mut store, &Module::new(&engine, probed).expect("valid"), &[]).expect("runs");
        let copy = instance.get_typed_func::<i32, i32>(&mut store, "copy").expect("exported");
        let results: Vec<i32> = (0..3).map(|_| copy.call(&mut store, 4).expect("runs")).collect();
        let counts: Vec<i64> = (0..2)
            .map(|i| instance.get_global(&mut store, &export_name(i)).expect("counter").get(&mut store).unwrap_i64())
            .collect();

        assert_eq!(results, [7, 7, 7]);
        assert_eq!(counts, [6, 3], "two copies and one fill per call, three calls");
    }

    #[test]
    fn functions_that_are_not_probed_are_left_as_they_were() {
        let bytes = wat::parse_str(MODULE).expect("the test module parses");
        let probed = instrument(&bytes, &["square".to_owned()]).expect("probed");
        let unprobed = instrument(&bytes, &[]).expect("rewritten without probes");

        assert_eq!(unprobed, bytes, "a rewrite without probes gives the module back byte for byte");
        assert!(probed.len() > bytes.len());
    }

    #[test]
    fn a_name_no_function_has_is_refused_with_that_name() {
        let bytes = wat::parse_str(MODULE).expect("the test module parses");

        for name in ["malloc", "log"] {
            let error = instrument(&bytes, &[name.to_owned()]).expect_err("no such defined function");
            assert_eq!(error, ProbeError::NoSuchFunction(name.to_owned()));
            assert!(error.to_string().contains(&format!("`{name}`")), "{error}");
        }
    }
}
