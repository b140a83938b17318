//! `proxy_log` and `proxy_get_log_level`.

use wasmtime::{Caller, Linker};

use super::{HostResult, fail, read, register, status, write_u32};
use crate::logs::{LogLevel, LogRecord, LogSource};
use crate::state::HostState;

/// How many warn-or-worse lines of one callback are kept for error reports.
const MAX_CALLBACK_LINES: usize = 16;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_log", proxy_log, (level: u32, ptr: u32, len: u32));
    register!(linker, "env", "proxy_get_log_level", proxy_get_log_level, (level_ptr: u32));
    Ok(())
}

/// Writes a guest log line on behalf of `source`; remembers critical lines, which is
/// where the Rust SDK's panic hook writes the panic message before the VM traps.
pub(crate) fn emit(state: &mut HostState, level: LogLevel, source: LogSource, message: &[u8]) {
    let message = String::from_utf8_lossy(message).into_owned();
    if level == LogLevel::Critical || source == LogSource::Stderr {
        state.vm.last_critical = Some(message.clone());
    }
    if level >= LogLevel::Warn && state.vm.callback_lines.len() < MAX_CALLBACK_LINES {
        state.vm.callback_lines.push(message.clone());
    }
    state.shared.logs.write(LogRecord { worker: state.worker, level, source, message });
}

fn proxy_log(caller: &mut Caller<'_, HostState>, level: u32, ptr: u32, len: u32) -> HostResult {
    let message = read(caller, ptr, len)?;
    let Some(level) = LogLevel::from_abi(level) else {
        return fail(status::BAD_ARGUMENT);
    };
    emit(caller.data_mut(), level, LogSource::Guest, &message);
    Ok(())
}

fn proxy_get_log_level(caller: &mut Caller<'_, HostState>, level_ptr: u32) -> HostResult {
    let level = caller.data().shared.logs.level.to_abi();
    write_u32(caller, level_ptr, level)
}
