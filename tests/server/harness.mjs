// Starts and stops `megactx serve` for the tests: the binary and model come from MEGACTX_BIN / MEGACTX_MODEL.
import { spawn } from 'node:child_process';

export const BIN = process.env.MEGACTX_BIN;
export const MODEL = process.env.MEGACTX_MODEL;
export const API_KEY = 'test-key';

export async function startServer(extra = [], model = MODEL) {
  if (!BIN || !MODEL) throw new Error('set MEGACTX_BIN and MEGACTX_MODEL');
  const args = ['serve', '--model', model, '--port', '0', '--served-model-name', 'tiny', '--api-key', API_KEY, ...extra];
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
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.on('exit', (code) => r(code)));
      proc.kill(signal);
      return done;
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
