//! Engine and linker setup: compiling a module once per host, checking that it is a
//! proxy-wasm 0.2 plugin, and linking every host function of `crate::abi` into it.
//!
//! Layer: above the host functions (it links them), below the worker (which
//! instantiates the result once per VM, and again on `FAIL_RELOAD`). The engines are
//! process-wide and hold configuration only, so hosts built one after another share
//! compiled-code caches but no state a test could observe.

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::{Config, Engine, ExternType, InstancePre, Linker, Module, OptLevel, ProfilingStrategy, format_err};

use crate::error::HostError;
use crate::state::HostState;

/// A module compiled and linked, ready to be instantiated once per VM.
pub(crate) struct Compiled {
    /// The module with every import resolved.
    pub(crate) pre: InstancePre<HostState>,
    /// The imports this host does not implement (each fails the VM when called).
    pub(crate) unimplemented: Vec<String>,
}

/// What an engine's generated code carries beyond the guest's own: epoch checks (a call
/// time limit) and fuel (instructions counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flavor {
    /// Epoch checks, so that a call can be cut at its time limit.
    pub(crate) interruptible: bool,
    /// Fuel consumed per instruction, so that a test can count the guest's work
    /// ([`crate::HostBuilder::count_instructions`]).
    pub(crate) fuel: bool,
}

impl Flavor {
    const fn index(self) -> usize {
        (self.interruptible as usize) | ((self.fuel as usize) << 1)
    }
}

/// Compiles `bytes` (binary or WAT) on the engine of `flavor` (see [`engine`]), checks
/// the proxy-wasm ABI, and links the host functions. `origin` names the module in
/// errors.
///
/// # Errors
/// [`HostError::InvalidModule`] when wasmtime refuses the bytes,
/// [`HostError::NotProxyWasm`] when the module is not a proxy-wasm 0.2 plugin or cannot
/// be linked.
pub(crate) fn compile(bytes: &[u8], origin: &str, flavor: Flavor) -> Result<Compiled, HostError> {
    let engine = engine(flavor);
    let module = match cached(bytes, flavor) {
        Some(module) => module,
        None => {
            let module = Module::new(&engine, bytes)
                .map_err(|e| HostError::InvalidModule { origin: origin.to_owned(), reason: format!("{e:#}") })?;
            remember(bytes, flavor, &module);
            module
        }
    };
    check_abi(&module, origin)?;
    let (pre, unimplemented) = link(&engine, &module)
        .map_err(|e| HostError::NotProxyWasm { origin: origin.to_owned(), reason: format!("{e:#}") })?;
    Ok(Compiled { pre, unimplemented })
}

/// Most compiled modules kept for reuse (the oldest is dropped first).
const MAX_CACHED_MODULES: usize = 8;

/// Modules compiled in this process, by their exact bytes and engine: a fleet of hosts
/// running one module compiles it once (compiling sluice.wasm takes about a second;
/// instantiating it, milliseconds). A `Module` is immutable code, so sharing it shares
/// no state a test could observe.
type ModuleCache = std::sync::Mutex<Vec<(Vec<u8>, Flavor, Module)>>;

fn module_cache() -> &'static ModuleCache {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    CACHE.get_or_init(|| std::sync::Mutex::new(Vec::new()))
}

fn cached(bytes: &[u8], flavor: Flavor) -> Option<Module> {
    let cache = module_cache().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.iter().find(|(b, f, _)| *f == flavor && b.as_slice() == bytes).map(|(_, _, m)| m.clone())
}

fn remember(bytes: &[u8], flavor: Flavor, module: &Module) {
    let mut cache = module_cache().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= MAX_CACHED_MODULES {
        cache.remove(0);
    }
    cache.push((bytes.to_vec(), flavor, module.clone()));
}

/// Epoch ticks in `limit` (at least 1); no limit is `u64::MAX`.
pub(crate) fn call_ticks(limit: Option<Duration>) -> u64 {
    limit.map_or(u64::MAX, |limit| (limit.as_millis() / EPOCH_TICK.as_millis()).try_into().unwrap_or(u64::MAX).max(1))
}

/// How often the engine's epoch advances; a call's time limit is counted in these.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Set to `perfmap` to let `perf` name the guest's functions (see docs/benchmarks.md).
pub const PROFILE_ENV: &str = "WASM_HOST_PROFILE";

/// The engines hosts use, one per [`Flavor`]: configuration only, no state a test could
/// observe. With a call time limit, the engine's epoch advances every [`EPOCH_TICK`] on a
/// background thread, so that a guest stuck in a loop traps at the limit instead of
/// hanging the worker; without one, generated code carries no epoch checks. With fuel,
/// each instruction the guest runs consumes one unit (wasmtime's count, the same on
/// every machine).
fn engine(flavor: Flavor) -> Engine {
    static ENGINES: [OnceLock<Engine>; 4] = [const { OnceLock::new() }; 4];
    let interruptible = flavor.interruptible;
    let cell = ENGINES.get(flavor.index()).unwrap_or(&ENGINES[0]);
    cell.get_or_init(|| {
        let mut config = Config::new();
        config.cranelift_opt_level(OptLevel::Speed);
        config.epoch_interruption(interruptible);
        config.consume_fuel(flavor.fuel);
        if std::env::var_os(PROFILE_ENV).is_some_and(|v| v == "perfmap") {
            // Names generated code for `perf report` (writes /tmp/perf-<pid>.map).
            config.profiler(ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).unwrap_or_default();
        if interruptible {
            let weak = engine.weak();
            let _ = std::thread::Builder::new().name("wasm-host-epoch".to_owned()).spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            });
        }
        engine
    })
    .clone()
}

/// proxy-wasm-cpp-host refuses a module that advertises no ABI version it knows.
fn check_abi(module: &Module, origin: &str) -> Result<(), HostError> {
    let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    if !exports.iter().any(|name| *name == "proxy_abi_version_0_2_1" || *name == "proxy_abi_version_0_2_0") {
        let reason = if exports.contains(&"proxy_abi_version_0_1_0") {
            "it exports proxy_abi_version_0_1_0; only ABI 0.2.0 and 0.2.1 are supported".to_owned()
        } else {
            "it exports neither proxy_abi_version_0_2_1 nor proxy_abi_version_0_2_0".to_owned()
        };
        return Err(HostError::NotProxyWasm { origin: origin.to_owned(), reason });
    }
    if !exports.iter().any(|name| *name == "proxy_on_memory_allocate" || *name == "malloc") {
        return Err(HostError::NotProxyWasm {
            origin: origin.to_owned(),
            reason: "it exports neither proxy_on_memory_allocate nor malloc, so the host cannot pass it data"
                .to_owned(),
        });
    }
    if !exports.contains(&"memory") {
        return Err(HostError::NotProxyWasm { origin: origin.to_owned(), reason: "it exports no memory".to_owned() });
    }
    Ok(())
}

/// Links every implemented host function, and turns each other function import into a
/// stub that fails the VM with the import's name when called. Returns the names of
/// those stubs.
fn link(engine: &Engine, module: &Module) -> wasmtime::Result<(InstancePre<HostState>, Vec<String>)> {
    let mut linker: Linker<HostState> = Linker::new(engine);
    crate::abi::add_to_linker(&mut linker)?;
    let mut unimplemented = Vec::new();
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else { continue };
        let name = format!("{}.{}", import.module(), import.name());
        let message = name.clone();
        // Defining a name that is already defined fails: that is how known imports are
        // told apart from unknown ones.
        if linker
            .func_new(import.module(), import.name(), ty, move |_, _, _| {
                Err(format_err!("the guest called `{message}`, which wasm-host does not implement"))
            })
            .is_ok()
        {
            unimplemented.push(name);
        }
    }
    Ok((linker.instantiate_pre(module)?, unimplemented))
}
