// A minimal proxy-wasm host in Node.js, to run a guest under V8 (the engine Envoy embeds)
// where V8's own profilers can name the guest's functions, which they cannot inside
// Envoy's release build. It implements only what one HTTP request's callbacks need
// (request and response headers, shared data with CAS, metrics, the clock, local
// replies), drives `requests` streams through the guest, and prints the time per stream.
//
//   node --no-liftoff tests/benches/v8/host.mjs <guest.wasm> <plugin configuration> [requests] [header value]
//   node --no-liftoff --cpu-prof --cpu-prof-dir=/tmp/prof tests/benches/v8/host.mjs ...
//
// `--no-liftoff` is how Envoy (proxy-wasm-cpp-host) starts V8: every function compiled by
// TurboFan up front. Figures and method: docs/benchmarks.md, "Envoy", where the guest's
// time goes.
import { readFileSync } from 'node:fs';

const [wasmPath, configuration, requestsArg, headerValue] = process.argv.slice(2);
if (!wasmPath || configuration === undefined) {
  console.error('usage: host.mjs <guest.wasm> <plugin configuration> [requests] [header value]');
  process.exit(2);
}
const requests = Number(requestsArg ?? 200000);
const encoder = new TextEncoder();
const decoder = new TextDecoder();

let instance;
const memory = () => new DataView(instance.exports.memory.buffer);
const bytesAt = (ptr, len) => new Uint8Array(instance.exports.memory.buffer, ptr, len);
const text = (ptr, len) => decoder.decode(bytesAt(ptr, len));
// Hands `bytes` to the guest as Envoy does: allocated by the guest's allocator.
function copyOut(bytes, ptrPtr, sizePtr) {
  let address = 0;
  if (bytes.length > 0) {
    address = instance.exports.proxy_on_memory_allocate(bytes.length);
    bytesAt(address, bytes.length).set(bytes);
  }
  memory().setUint32(ptrPtr, address, true);
  memory().setUint32(sizePtr, bytes.length, true);
  return 0;
}

const OK = 0, NOT_FOUND = 1, CAS_MISMATCH = 8;
const shared = new Map(); // key -> { value: Uint8Array, cas }
let nextCas = 1;
const metrics = [];
const requestHeaders = new Map([['x-api-key', encoder.encode(headerValue ?? 'admit')], ['x-key', encoder.encode(headerValue ?? 'admit')]]);
const properties = new Map([['plugin_name', 'sluice'], ['plugin_root_id', 'sluice'], ['source\0address', '127.0.0.1:4242']]);
let replies = 0;
const start = process.hrtime.bigint();

const env = {
  proxy_log: (level, ptr, len) => { if (level >= 3) console.error(`guest log ${level}: ${text(ptr, len)}`); return OK; },
  proxy_get_log_level: (ptr) => { memory().setUint32(ptr, 4, true); return OK; },
  proxy_get_buffer_bytes: (type, start, length, ptrPtr, sizePtr) =>
    type === 7 ? copyOut(encoder.encode(configuration), ptrPtr, sizePtr) : copyOut(new Uint8Array(), ptrPtr, sizePtr),
  proxy_get_property: (ptr, len, ptrPtr, sizePtr) => {
    const value = properties.get(text(ptr, len).replace(/\0$/, ''));
    return value === undefined ? NOT_FOUND : copyOut(encoder.encode(value), ptrPtr, sizePtr);
  },
  proxy_get_header_map_value: (type, ptr, len, ptrPtr, sizePtr) => {
    const value = type === 0 ? requestHeaders.get(text(ptr, len)) : undefined;
    return value === undefined ? NOT_FOUND : copyOut(value, ptrPtr, sizePtr);
  },
  proxy_get_shared_data: (ptr, len, ptrPtr, sizePtr, casPtr) => {
    const entry = shared.get(text(ptr, len));
    if (!entry) return NOT_FOUND;
    memory().setUint32(casPtr, entry.cas, true);
    return copyOut(entry.value, ptrPtr, sizePtr);
  },
  proxy_set_shared_data: (kptr, klen, vptr, vlen, cas) => {
    const key = text(kptr, klen);
    const entry = shared.get(key);
    if (entry && cas !== 0 && cas !== entry.cas) return CAS_MISMATCH;
    shared.set(key, { value: bytesAt(vptr, vlen).slice(), cas: nextCas++ });
    return OK;
  },
  proxy_define_metric: (type, ptr, len, idPtr) => { metrics.push(0); memory().setUint32(idPtr, metrics.length, true); return OK; },
  proxy_increment_metric: (id, delta) => { metrics[id - 1] += Number(delta); return OK; },
  proxy_send_local_response: () => { replies += 1; return OK; },
  proxy_register_shared_queue: (ptr, len, idPtr) => { memory().setUint32(idPtr, 1, true); return OK; },
  proxy_set_tick_period_milliseconds: () => OK,
  proxy_set_effective_context: () => OK,
};
const wasi = {
  clock_time_get: (id, precision, ptr) => {
    const now = id === 0 ? BigInt(Date.now()) * 1000000n : process.hrtime.bigint() - start + 1000000000n;
    memory().setBigUint64(ptr, now, true);
    return 0;
  },
  random_get: (ptr, len) => { const b = bytesAt(ptr, len); for (let i = 0; i < len; i++) b[i] = (i * 97 + 13) & 255; return 0; },
  environ_sizes_get: (countPtr, sizePtr) => { memory().setUint32(countPtr, 0, true); memory().setUint32(sizePtr, 0, true); return 0; },
  environ_get: () => 0,
  fd_write: () => 0,
  proc_exit: (code) => { throw new Error(`proc_exit(${code})`); },
};

const module = new WebAssembly.Module(readFileSync(wasmPath));
const imports = { env: {}, wasi_snapshot_preview1: {} };
for (const { module: from, name, kind } of WebAssembly.Module.imports(module)) {
  if (kind !== 'function') continue;
  const table = from === 'env' ? env : wasi;
  imports[from][name] = table[name] ?? (() => { throw new Error(`the guest called ${from}.${name}, which this host does not implement`); });
}
instance = new WebAssembly.Instance(module, imports);
const x = instance.exports;
x._initialize?.();
const ROOT = 1;
x.proxy_on_context_create(ROOT, 0);
if (!x.proxy_on_vm_start(ROOT, 0)) throw new Error('proxy_on_vm_start failed');
if (!x.proxy_on_configure(ROOT, configuration.length)) throw new Error('proxy_on_configure refused the configuration');

let context = ROOT + 1;
function stream() {
  const id = context++;
  x.proxy_on_context_create(id, ROOT);
  const action = x.proxy_on_request_headers(id, requestHeaders.size, 1);
  if (action === 0) x.proxy_on_response_headers(id, 0, 1);
  x.proxy_on_done(id);
  x.proxy_on_log(id);
  x.proxy_on_delete(id);
}

// Warm up, then measure in rounds; the median round is the figure.
for (let i = 0; i < Math.min(requests, 20000); i++) stream();
const rounds = [];
for (let round = 0; round < 5; round++) {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < requests / 5; i++) stream();
  rounds.push(Number(process.hrtime.bigint() - t0) / (requests / 5));
}
rounds.sort((a, b) => a - b);
console.log(JSON.stringify({ ns_per_stream: Math.round(rounds[2]), rounds: rounds.map(Math.round), replies, metrics }));
