// End-to-end test over HTTPS: `llmesh serve --ssl-certfile --ssl-keyfile` driven by the official
// `openai` npm client through node's own TLS stack (fetch), trusting the server's self-signed
// certificate through NODE_EXTRA_CA_CERTS (run.sh makes the certificate with the openssl command
// and sets both). Plain and streamed completions agree at temperature 0 and with `llmesh
// generate`; a plain-HTTP client to the same port gets no answer; the server stops cleanly.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { promisify } from 'node:util';
import OpenAI from 'openai';

const BINARY = process.env.LLMESH_BINARY;
const MODEL_DIR = process.env.LLMESH_MODEL;
const TLS_DIR = process.env.LLMESH_TLS_DIR;
const MODEL = 'kjv-tiny';
const PROMPT = 'In the beginning God created';
const STARTUP_TIMEOUT_MS = 60_000;
const execFileAsync = promisify(execFile);

let server = null;
let serverLog = '';
let serverExit = null;
let port = 0;
let client = null;

function startServer() {
  assert.ok(BINARY && MODEL_DIR && TLS_DIR, 'set LLMESH_BINARY, LLMESH_MODEL and LLMESH_TLS_DIR');
  server = spawn(BINARY, ['serve', '--model', MODEL_DIR, '--http', '127.0.0.1:0', '--rpc', 'none', '--device', 'cpu',
    '--ssl-certfile', `${TLS_DIR}/cert.pem`, '--ssl-keyfile', `${TLS_DIR}/key.pem`], { stdio: ['ignore', 'ignore', 'pipe'] });
  serverExit = new Promise((resolve) => server.once('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port within ${STARTUP_TIMEOUT_MS} ms:\n${serverLog}`)), STARTUP_TIMEOUT_MS);
    server.stderr.setEncoding('utf8');
    server.stderr.on('data', (text) => {
      serverLog += text;
      const m = serverLog.match(/on https:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    serverExit.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`llmesh serve exited early (code ${code}, signal ${signal}):\n${serverLog}`));
    });
  });
}

process.on('exit', () => { if (server && server.exitCode === null) server.kill('SIGKILL'); });

before(async () => {
  port = await startServer();
  client = new OpenAI({ baseURL: `https://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
});

after(async () => {
  if (server && server.exitCode === null) server.kill('SIGTERM');
  await serverExit;
});

test('completions over HTTPS: plain and streamed agree with llmesh generate at temperature 0', async () => {
  const want = (await execFileAsync(BINARY, ['generate', '--model', MODEL_DIR, '--prompt', PROMPT, '--max-tokens', '16',
    '--temperature', '0', '--device', 'cpu'])).stdout.slice(0, -1);
  const whole = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 16, temperature: 0 });
  assert.equal(whole.choices[0].text, want);
  let streamed = '';
  const stream = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 16, temperature: 0, stream: true });
  for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, want);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
});

test('plain HTTP to the HTTPS port gets no answer', async () => {
  await assert.rejects(fetch(`http://127.0.0.1:${port}/health`));
});

test('the server stops cleanly on SIGTERM', async () => {
  server.kill('SIGTERM');
  const { code, signal } = await serverExit;
  assert.equal(signal, null, serverLog);
  assert.equal(code, 0, serverLog);
});
