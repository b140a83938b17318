//! The WASI preview1 calls a Rust `wasm32-wasip1` module imports, as proxy-wasm hosts
//! implement them (proxy-wasm-cpp-host `src/exports.cc`): stdout and stderr go to the
//! log (`info` and `error`), clocks read the host's [`crate::Clock`], randomness comes
//! from the host, the environment is the plugin's (empty unless configured), there are
//! no arguments, no files and no preopened directories, and `proc_exit` fails the VM.

use wasmtime::{Caller, Linker, format_err};

use super::{Failure, HostResult, read, write, write_u32, write_u64};
use crate::logs::{LogLevel, LogSource};
use crate::state::HostState;

const MODULE: &str = "wasi_snapshot_preview1";

mod errno {
    pub(super) const SUCCESS: u32 = 0;
    pub(super) const BADF: u32 = 8;
    pub(super) const FAULT: u32 = 21;
    pub(super) const INVAL: u32 = 28;
    pub(super) const NOENT: u32 = 44;
    pub(super) const NOSYS: u32 = 52;
    pub(super) const NOTSUP: u32 = 58;
}

/// The most bytes one `random_get` may ask for (cpp-host's
/// `PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES`).
const MAX_RANDOM_BYTES: u32 = 64 * 1024;

/// Registers a WASI function: memory faults answer `FAULT` rather than the proxy-wasm
/// `INVALID_MEMORY_ACCESS`.
macro_rules! wasi {
    ($linker:expr, $name:literal, $f:path, ($($arg:ident : $ty:ty),*)) => {
        $linker.func_wrap(
            MODULE,
            $name,
            |mut caller: Caller<'_, HostState>, $($arg: $ty),*| -> wasmtime::Result<u32> {
                match super::enter(&mut caller, $name).and_then(|()| $f(&mut caller, $($arg),*)) {
                    Ok(()) => Ok(errno::SUCCESS),
                    Err(Failure::Status(super::status::INVALID_MEMORY_ACCESS)) => Ok(errno::FAULT),
                    Err(Failure::Status(code)) => Ok(code),
                    Err(Failure::Trap(error)) => Err(error),
                }
            },
        )?;
    };
}

fn errno<T>(code: u32) -> HostResult<T> {
    Err(Failure::Status(code))
}

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasi!(linker, "fd_write", fd_write, (fd: u32, iovs: u32, iovs_len: u32, written_ptr: u32));
    wasi!(linker, "fd_read", unsupported4, (_a: u32, _b: u32, _c: u32, _d: u32));
    wasi!(linker, "fd_close", succeed1, (_fd: u32));
    wasi!(linker, "fd_seek", fd_seek, (_fd: u32, _offset: i64, _whence: u32, _new_offset_ptr: u32));
    wasi!(linker, "fd_fdstat_get", fd_fdstat_get, (fd: u32, stat_ptr: u32));
    wasi!(linker, "fd_fdstat_set_flags", unsupported2, (_fd: u32, _flags: u32));
    wasi!(linker, "fd_prestat_get", bad_descriptor2, (_fd: u32, _ptr: u32));
    wasi!(linker, "fd_prestat_dir_name", unsupported3, (_fd: u32, _ptr: u32, _len: u32));
    wasi!(linker, "fd_filestat_get", bad_descriptor2, (_fd: u32, _ptr: u32));
    wasi!(linker, "path_open", path_open, (_fd: u32, _dirflags: u32, _path: u32, _path_len: u32, _oflags: u32, _base: i64, _inheriting: i64, _fdflags: u32, _fd_ptr: u32));
    wasi!(linker, "path_filestat_get", not_supported5, (_fd: u32, _flags: u32, _path: u32, _path_len: u32, _ptr: u32));
    wasi!(linker, "environ_sizes_get", environ_sizes_get, (count_ptr: u32, size_ptr: u32));
    wasi!(linker, "environ_get", environ_get, (array_ptr: u32, buf_ptr: u32));
    wasi!(linker, "args_sizes_get", args_sizes_get, (count_ptr: u32, size_ptr: u32));
    wasi!(linker, "args_get", succeed2, (_argv: u32, _buf: u32));
    wasi!(linker, "clock_time_get", clock_time_get, (id: u32, _precision: u64, time_ptr: u32));
    wasi!(linker, "clock_res_get", clock_res_get, (id: u32, resolution_ptr: u32));
    wasi!(linker, "random_get", random_get, (buf: u32, len: u32));
    wasi!(linker, "sched_yield", succeed0, ());
    wasi!(linker, "poll_oneoff", unsupported4, (_in: u32, _out: u32, _n: u32, _events_ptr: u32));
    linker.func_wrap(MODULE, "proc_exit", |caller: Caller<'_, HostState>, code: u32| -> wasmtime::Result<()> {
        let _ = caller;
        Err(format_err!("the guest called proc_exit({code}); a proxy-wasm VM cannot exit, so it is failed"))
    })?;
    Ok(())
}

fn succeed0(_: &mut Caller<'_, HostState>) -> HostResult {
    Ok(())
}

fn succeed1(_: &mut Caller<'_, HostState>, _: u32) -> HostResult {
    Ok(())
}

fn succeed2(_: &mut Caller<'_, HostState>, _: u32, _: u32) -> HostResult {
    Ok(())
}

fn unsupported2(_: &mut Caller<'_, HostState>, _: u32, _: u32) -> HostResult {
    errno(errno::NOSYS)
}

fn unsupported3(_: &mut Caller<'_, HostState>, _: u32, _: u32, _: u32) -> HostResult {
    errno(errno::NOSYS)
}

fn unsupported4(_: &mut Caller<'_, HostState>, _: u32, _: u32, _: u32, _: u32) -> HostResult {
    errno(errno::NOSYS)
}

fn bad_descriptor2(_: &mut Caller<'_, HostState>, _: u32, _: u32) -> HostResult {
    errno(errno::BADF)
}

fn not_supported5(_: &mut Caller<'_, HostState>, _: u32, _: u32, _: u32, _: u32, _: u32) -> HostResult {
    errno(errno::NOTSUP)
}

#[allow(clippy::too_many_arguments, reason = "the WASI signature")]
fn path_open(
    _: &mut Caller<'_, HostState>,
    _: u32,
    _: u32,
    _: u32,
    _: u32,
    _: u32,
    _: i64,
    _: i64,
    _: u32,
    _: u32,
) -> HostResult {
    errno(errno::NOENT)
}

/// There is no file to seek in; cpp-host answers success without moving anything.
fn fd_seek(_: &mut Caller<'_, HostState>, _: u32, _: i64, _: u32, _: u32) -> HostResult {
    Ok(())
}

fn fd_write(caller: &mut Caller<'_, HostState>, fd: u32, iovs: u32, iovs_len: u32, written_ptr: u32) -> HostResult {
    let (level, source) = match fd {
        1 => (LogLevel::Info, LogSource::Stdout),
        2 => (LogLevel::Error, LogSource::Stderr),
        _ => return errno(errno::BADF),
    };
    let mut text = Vec::new();
    for i in 0..iovs_len {
        let entry = iovs.checked_add(i.saturating_mul(8)).ok_or(Failure::Status(errno::FAULT))?;
        let iovec = read(caller, entry, 8)?;
        let field = |at: usize| iovec.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        let (Some(buf), Some(len)) = (field(0), field(4)) else {
            return errno(errno::FAULT);
        };
        text.extend_from_slice(&read(caller, buf, len)?);
    }
    let written = u32::try_from(text.len()).unwrap_or(u32::MAX);
    if !text.is_empty() {
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        super::log::emit(caller.data_mut(), level, source, &text);
    }
    write_u32(caller, written_ptr, written)
}

/// Only stdout and stderr exist; they are write-only character devices.
fn fd_fdstat_get(caller: &mut Caller<'_, HostState>, fd: u32, stat_ptr: u32) -> HostResult {
    if fd != 1 && fd != 2 {
        return errno(errno::BADF);
    }
    let mut stat = [0u8; 24];
    // fs_rights_base = FD_WRITE, as cpp-host reports.
    stat[8..16].copy_from_slice(&64u64.to_le_bytes());
    write(caller, stat_ptr, &stat)
}

fn environment(caller: &Caller<'_, HostState>) -> Vec<Vec<u8>> {
    caller.data().shared.env.iter().map(|(k, v)| format!("{k}={v}\0").into_bytes()).collect()
}

fn environ_sizes_get(caller: &mut Caller<'_, HostState>, count_ptr: u32, size_ptr: u32) -> HostResult {
    let env = environment(caller);
    let size: usize = env.iter().map(Vec::len).sum();
    write_u32(caller, count_ptr, u32::try_from(env.len()).unwrap_or(u32::MAX))?;
    write_u32(caller, size_ptr, u32::try_from(size).unwrap_or(u32::MAX))
}

fn environ_get(caller: &mut Caller<'_, HostState>, array_ptr: u32, buf_ptr: u32) -> HostResult {
    let mut slot = array_ptr;
    let mut at = buf_ptr;
    for entry in environment(caller) {
        write_u32(caller, slot, at)?;
        write(caller, at, &entry)?;
        slot = slot.checked_add(4).ok_or(Failure::Status(errno::FAULT))?;
        at = at.checked_add(u32::try_from(entry.len()).unwrap_or(u32::MAX)).ok_or(Failure::Status(errno::FAULT))?;
    }
    Ok(())
}

fn args_sizes_get(caller: &mut Caller<'_, HostState>, count_ptr: u32, size_ptr: u32) -> HostResult {
    write_u32(caller, count_ptr, 0)?;
    write_u32(caller, size_ptr, 0)
}

fn clock_time_get(caller: &mut Caller<'_, HostState>, id: u32, _precision: u64, time_ptr: u32) -> HostResult {
    let clock = &caller.data().shared.clock;
    let now = match id {
        0 => clock.realtime_nanos(),
        1 => clock.monotonic_nanos(),
        _ => return errno(errno::NOTSUP),
    };
    write_u64(caller, time_ptr, now)
}

fn clock_res_get(caller: &mut Caller<'_, HostState>, id: u32, resolution_ptr: u32) -> HostResult {
    if id > 1 {
        return errno(errno::NOTSUP);
    }
    write_u64(caller, resolution_ptr, 1)
}

fn random_get(caller: &mut Caller<'_, HostState>, buf: u32, len: u32) -> HostResult {
    if len > MAX_RANDOM_BYTES {
        return errno(errno::INVAL);
    }
    let mut bytes = vec![0u8; len as usize];
    caller.data().shared.entropy.fill(&mut bytes);
    write(caller, buf, &bytes)
}
