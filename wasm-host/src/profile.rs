//! Where a guest's instructions go: the module is rewritten before it is compiled so
//! that every function it defines adds, to a counter of its own, the instructions it runs
//! itself (its callees' are theirs), as wasmtime's fuel counts them. The counters are
//! exported globals the host reads back ([`crate::HostBuilder::profile_instructions`]).
//!
//! Each straight run of a function's code (from its entry, or from just after a
//! `block`, `loop`, `if`, `else`, `end` or branch, to the next of those) starts by adding
//! what the run costs: one per instruction, none for `nop`, `drop`, `block`, `loop`,
//! `unreachable`, `return`, `else` and `end`, and one for entering the function
//! (wasmtime's default costs). A branch leaves
//! a run only at its end, so every instruction is counted exactly when it runs.
//! `memory.copy` and `memory.fill` also add their byte count, as wasmtime charges them.
//! Without `memory.init` and the table operations (which Rust does not emit), a
//! function's counts therefore sum to the fuel the unrewritten module would use: a
//! profile that cannot disagree with the budget it explains. The rewrite's own
//! instructions are not counted.

use wasm_encoder::reencode::{self, Reencode};
use wasm_encoder::{Instruction, ValType};
use wasmparser::{Operator, Parser};

use crate::rewrite::{self, Layout, RewriteError, add};

/// The prefix of the exported globals that hold the counts.
const EXPORT_PREFIX: &str = "wasm_host_profile_";

/// The export that holds the count of the module's `index`-th defined function.
pub(crate) fn export_name(index: usize) -> String {
    format!("{EXPORT_PREFIX}{index}")
}

/// What wasmtime's fuel charges for `operator` (its default costs), bytes aside.
const fn cost(operator: &Operator<'_>) -> i64 {
    match operator {
        Operator::Nop
        | Operator::Drop
        | Operator::Block { .. }
        | Operator::Loop { .. }
        | Operator::Unreachable
        | Operator::Return
        | Operator::Else
        | Operator::End => 0,
        _ => 1,
    }
}

/// Whether a straight run of code ends after `operator`: control may go elsewhere, or
/// arrive here from elsewhere, next.
const fn ends_run(operator: &Operator<'_>) -> bool {
    matches!(
        operator,
        Operator::Block { .. }
            | Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::Else
            | Operator::End
            | Operator::Br { .. }
            | Operator::BrIf { .. }
            | Operator::BrTable { .. }
            | Operator::BrOnNull { .. }
            | Operator::BrOnNonNull { .. }
            | Operator::Return
            | Operator::Unreachable
            | Operator::TryTable { .. }
            | Operator::Throw { .. }
            | Operator::ThrowRef
    )
}

/// The rewrite: a counter per defined function, appended to the globals and exported,
/// and each run of code counted.
struct Profiler {
    layout: Layout,
    /// The index of the next function body the code section gives.
    next_function: u32,
    /// Whether the counters were added to a global and an export section.
    written: (bool, bool),
}

impl Profiler {
    fn counter(&self, function: u32) -> u32 {
        self.layout.globals + (function - self.layout.imported_functions)
    }

    fn defined(&self) -> usize {
        self.layout.function_types.len()
    }
}

impl Reencode for Profiler {
    type Error = std::convert::Infallible;

    fn parse_global_section(
        &mut self,
        globals: &mut wasm_encoder::GlobalSection,
        section: wasmparser::GlobalSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_global_section(self, globals, section)?;
        self.written.0 = true;
        rewrite::append_counters(globals, self.defined());
        Ok(())
    }

    fn parse_export_section(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        section: wasmparser::ExportSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_export_section(self, exports, section)?;
        self.written.1 = true;
        rewrite::export_counters(exports, self.layout.globals, self.defined(), export_name);
        Ok(())
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: wasmparser::FunctionBody<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        let index = self.next_function;
        self.next_function += 1;
        let counter = self.counter(index);
        let defined = (index - self.layout.imported_functions) as usize;
        let params = self.layout.params_of(defined);
        let mut locals = Vec::new();
        let mut declared = 0u32;
        for local in func.get_locals_reader()? {
            let (count, ty) = local?;
            declared += count;
            locals.push((count, self.val_type(ty)?));
        }
        let mut operators = Vec::new();
        let mut reader = func.get_operators_reader()?;
        while !reader.eof() {
            operators.push(reader.read()?);
        }
        // A scratch local for the byte count of a bulk-memory operation.
        let bulk = operators.iter().any(|op| matches!(op, Operator::MemoryCopy { .. } | Operator::MemoryFill { .. }));
        let scratch = params + declared;
        if bulk {
            locals.push((1, ValType::I32));
        }
        let mut function = wasm_encoder::Function::new(locals);
        let mut run_starts = true;
        for (at, operator) in operators.iter().enumerate() {
            if run_starts {
                // Entering a function costs one, as wasmtime counts it.
                let mut run = i64::from(at == 0);
                for op in &operators[at..] {
                    run += cost(op);
                    if ends_run(op) {
                        break;
                    }
                }
                if run > 0 {
                    add(&mut function, counter, &[Instruction::I64Const(run)]);
                }
            }
            if matches!(operator, Operator::MemoryCopy { .. } | Operator::MemoryFill { .. }) {
                // The byte count is on top of the stack: count it, and put it back.
                function.instruction(&Instruction::LocalSet(scratch));
                add(&mut function, counter, &[Instruction::LocalGet(scratch), Instruction::I64ExtendI32U]);
                function.instruction(&Instruction::LocalGet(scratch));
            }
            function.instruction(&self.instruction(operator.clone())?);
            run_starts = ends_run(operator);
        }
        code.function(&function);
        Ok(())
    }
}

/// `bytes` rewritten so that every function it defines counts the instructions it runs
/// itself; the count of the `i`-th defined function is in the exported global
/// [`export_name`]`(i)`, and its name is the `i`-th of the names returned (`func[N]`
/// for a function the `name` section does not name).
///
/// # Errors
/// [`RewriteError::Module`] when the module does not parse, or has no global or export
/// section to add the counters to.
pub(crate) fn instrument(bytes: &[u8]) -> Result<(Vec<u8>, Vec<String>), RewriteError> {
    let layout = rewrite::layout(bytes)?;
    let names = (0..layout.function_types.len() as u32)
        .map(|i| {
            let index = layout.imported_functions + i;
            layout.names.get(&index).cloned().unwrap_or_else(|| format!("func[{index}]"))
        })
        .collect();
    let mut profiler = Profiler { next_function: layout.imported_functions, layout, written: (false, false) };
    let mut module = wasm_encoder::Module::new();
    reencode::utils::parse_core_module(&mut profiler, &mut module, Parser::new(0), bytes)
        .map_err(|e| RewriteError::Module(e.to_string()))?;
    if profiler.written != (true, true) {
        return Err(RewriteError::Module("it has no global section or no export section to hold the counters".into()));
    }
    Ok((module.finish(), names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Config, Engine, Instance, Module, Store};

    /// Loops, branches taken and not, an `if` with and without `else`, calls, and bulk
    /// memory: every way control moves in code a Rust toolchain emits.
    const MODULE: &str = r#"(module
        (memory (export "memory") 1)
        (global $sp (mut i32) (i32.const 1024))
        (func $square (param i32) (result i32)
            local.get 0 local.get 0 i32.mul)
        (func $sum_of_squares (export "sum_of_squares") (param $n i32) (result i32)
            (local $acc i32)
            (block $done
                (loop $next
                    (br_if $done (i32.eqz (local.get $n)))
                    (local.set $acc (i32.add (local.get $acc) (call $square (local.get $n))))
                    (local.set $n (i32.sub (local.get $n) (i32.const 1)))
                    (br $next)))
            (if (i32.gt_u (local.get $acc) (i32.const 10))
                (then (local.set $acc (i32.add (local.get $acc) (i32.const 1))))
                (else (local.set $acc (i32.sub (local.get $acc) (i32.const 1)))))
            (if (i32.eqz (local.get $acc)) (then (return (i32.const 0))))
            (memory.copy (i32.const 0) (i32.const 64) (local.get $acc))
            (memory.fill (i32.const 128) (i32.const 7) (i32.const 5))
            nop
            local.get $acc))"#;

    /// Runs `sum_of_squares(n)` for each `n`, with fuel, on `bytes`: the results and the
    /// fuel used.
    fn run(bytes: &[u8], inputs: &[i32]) -> (Vec<i32>, u64, Store<()>, Instance) {
        let engine = Engine::new(Config::new().consume_fuel(true)).expect("an engine");
        let module = Module::new(&engine, bytes).expect("a valid module");
        let mut store = Store::new(&engine, ());
        store.set_fuel(u64::MAX).expect("fuel");
        let instance = Instance::new(&mut store, &module, &[]).expect("it instantiates");
        let f = instance.get_typed_func::<i32, i32>(&mut store, "sum_of_squares").expect("exported");
        let results = inputs.iter().map(|n| f.call(&mut store, *n).expect("runs")).collect();
        let used = u64::MAX - store.get_fuel().expect("fuel");
        (results, used, store, instance)
    }

    #[test]
    fn each_functions_own_instructions_sum_to_the_fuel_the_original_module_uses() {
        let bytes = wat::parse_str(MODULE).expect("the test module parses");
        let (profiled, names) = instrument(&bytes).expect("the module is profiled");
        // 1 returns early; 3 and 20 take the `if`'s two arms and copy 15 and 2 871 bytes.
        let inputs = [1, 3, 20];

        let (expected, fuel) = {
            let (results, fuel, _, _) = run(&bytes, &inputs);
            (results, fuel)
        };
        let (results, _, mut store, instance) = run(&profiled, &inputs);
        let counts: Vec<u64> = (0..names.len())
            .map(|i| {
                let global = instance.get_global(&mut store, &export_name(i)).expect("a counter");
                global.get(&mut store).unwrap_i64() as u64
            })
            .collect();

        assert_eq!(results, expected, "the rewritten module computes what the original does");
        assert_eq!(names, ["square", "sum_of_squares"]);
        assert_eq!(counts[0], 4 * (1 + 3 + 20), "square: entered and 3 instructions, once per loop turn");
        assert_eq!(counts.iter().sum::<u64>(), fuel, "{counts:?}");
    }

    #[test]
    fn a_function_the_name_section_does_not_name_goes_by_its_index() {
        let bytes = wat::parse_str("(module (global (mut i32) (i32.const 0)) (func (export \"f\")))").expect("parses");
        let (_, names) = instrument(&bytes).expect("profiled");

        assert_eq!(names, ["func[0]"]);
    }
}
