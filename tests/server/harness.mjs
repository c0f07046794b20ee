// Starts and stops `megactx serve` for the tests: the binary and model come from MEGACTX_BIN / MEGACTX_MODEL.
import { spawn as spawnChild } from 'node:child_process';
import net from 'node:net';
import { after } from 'node:test';

export const BIN = process.env.MEGACTX_BIN;
export const MODEL = process.env.MEGACTX_MODEL;
export const API_KEY = 'test-key';

// Every process a test starts is killed when the test file ends, whatever happened: a failed assertion must not
// leave a server running (it would keep the test runner, and whoever waits for its output, alive).
// The hook is registered once the test file's own code has run (setImmediate), so it runs after the file's
// `after` hooks, which stop their servers gracefully and check the exit codes.
const children = new Set();
setImmediate(() => after(() => { for (const proc of children) proc.kill('SIGKILL'); }));
export function spawn(...args) {
  const proc = spawnChild(...args);
  children.add(proc);
  proc.on('exit', () => children.delete(proc));
  return proc;
}

// `servedName` null: no --served-model-name (the server names the model after its directory).
export async function startServer(extra = [], model = MODEL, { servedName = 'tiny' } = {}) {
  if (!BIN || !MODEL) throw new Error('set MEGACTX_BIN and MEGACTX_MODEL');
  const name = servedName === null ? [] : ['--served-model-name', servedName];
  const args = ['serve', '--model', model, '--port', '0', ...name, '--api-key', API_KEY, ...extra];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const base = await new Promise((resolve, reject) => {
    let url = null;
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on (http:\/\/[^ ]+)/);
      if (m) url = m[1];
      if (url && /ready in/.test(log)) {
        clearTimeout(timer);
        resolve(url);
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  return {
    proc,
    base,
    log: () => log,
    // Resolves with the exit code; a server that has not exited 20 s after the signal is killed (null).
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.on('exit', (code) => r(code)));
      proc.kill(signal);
      const timer = setTimeout(() => proc.kill('SIGKILL'), 20000);
      const code = await done;
      clearTimeout(timer);
      return code;
    },
  };
}

export async function raw(base, path, { method = 'POST', body, headers = {} } = {}) {
  const res = await fetch(base + path, {
    method,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}`, ...headers },
    body,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json };
}

// Prometheus text → { 'name{labels}': value }
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) ([-+0-9.eEinfINFaN]+)$/);
    if (!m) throw new Error('bad metrics line: ' + line);
    out[m[1]] = Number(m[2]);
  }
  return out;
}

// Runs `megactx serve` with `args` and resolves when it exits: { code, log, ms }.
export function runServe(args, timeoutMs = 10000) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const proc = spawn(BIN, ['serve', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.on('data', (d) => { log += d.toString(); });
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('serve did not exit:\n' + log)); }, timeoutMs);
    proc.on('exit', (code) => { clearTimeout(timer); resolve({ code, log, ms: Date.now() - t0 }); });
  });
}

// One raw HTTP/1.1 exchange over a TCP socket: writes `chunks` (strings or Buffers) in order, then resolves with
// the status line's code and everything read until the server closes or `idleMs` passes without data.
export function rawHttp(base, chunks, { idleMs = 2000 } = {}) {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(url.port), url.hostname);
    let data = Buffer.alloc(0);
    let timer = null;
    const t0 = Date.now();
    const finish = () => {
      clearTimeout(timer);
      sock.destroy();
      const text = data.toString('latin1');
      const m = text.match(/^HTTP\/1\.1 (\d+)/);
      resolve({ status: m ? Number(m[1]) : 0, text, ms: Date.now() - t0 });
    };
    const arm = () => { clearTimeout(timer); timer = setTimeout(finish, idleMs); };
    sock.on('data', (d) => { data = Buffer.concat([data, d]); arm(); });
    sock.on('end', finish);
    sock.on('error', (e) => (data.length ? finish() : reject(e)));
    sock.on('connect', async () => {
      arm();
      for (const c of chunks) {
        if (sock.destroyed) break;
        await new Promise((r) => (sock.write(c) ? r() : sock.once('drain', r)));
      }
    });
  });
}

export async function metricsOf(base) {
  return parseMetrics((await raw(base, '/metrics', { method: 'GET' })).text);
}

// Polls until `pred(metrics)` holds (or `ms` pass); returns the last metrics read.
export async function waitMetrics(base, pred, ms = 5000) {
  let m;
  for (const t0 = Date.now(); Date.now() - t0 < ms;) {
    m = await metricsOf(base);
    if (pred(m)) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  return m;
}

// Polls the server's log until a line matches `re` (or `ms` pass): the access line of a request is written after its
// response, and the child's stderr reaches this process later still. Returns whether one matched.
export async function waitLog(server, re, ms = 5000) {
  for (const t0 = Date.now(); Date.now() - t0 < ms;) {
    if (server.log().split('\n').some((l) => re.test(l))) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return server.log().split('\n').some((l) => re.test(l));
}
