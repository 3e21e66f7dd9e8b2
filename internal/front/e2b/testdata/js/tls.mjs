// Drives the real, unmodified E2B SDK through clade's TLS ingress:
// `https://${sbx.getHost(port)}` as E2B code builds it, trusting clade's CA
// through NODE_EXTRA_CA_CERTS alone (no `ca` option is passed), over
// HTTP/1.1 and HTTP/2; E2B's 502 for a killed sandbox; maskRequestHost;
// the traffic token of a private sandbox. Names are never looked up: the
// requests' lookup answers loopback. Usage as compat.mjs, with
// CLADE_INGRESS_ADDR; run by internal/front/e2b's TestRealSDKTLS.
import assert from 'node:assert/strict'
import https from 'node:https'
import http2 from 'node:http2'

const mod = process.argv[2] || 'e2b'
const { Sandbox } = await import(mod)
const ingress = process.env.CLADE_INGRESS_ADDR
const port = ingress.split(':').pop()

function ok(name) { console.log(`ok ${mod} ${name}`) }

// loopback is a lookup that answers 127.0.0.1 for every name.
function loopback(_host, opts, cb) {
  if (typeof opts === 'function') cb = opts
  if (opts?.all) cb(null, [{ address: '127.0.0.1', family: 4 }])
  else cb(null, '127.0.0.1', 4)
}

// get fetches url over HTTP/1.1 (https) with the headers.
function get(url, headers = {}) {
  return new Promise((resolve, reject) => {
    https.get(url, { headers, lookup: loopback, ALPNProtocols: ['http/1.1'] }, (res) => {
      const alpn = res.socket.alpnProtocol
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body, alpn }))
    }).on('error', reject)
  })
}

// get2 fetches url over HTTP/2.
function get2(url, headers = {}) {
  const u = new URL(url)
  return new Promise((resolve, reject) => {
    const s = http2.connect(u.origin, { lookup: loopback })
    s.on('error', reject)
    const req = s.request({ ':path': u.pathname, ...headers })
    let body = '', status
    req.on('response', (h) => { status = h[':status'] })
    req.on('data', (d) => { body += d })
    req.on('end', () => { const alpn = s.alpnProtocol; s.close(); resolve({ status, body, alpn }) })
    req.on('error', reject)
    req.end()
  })
}

async function waitFor(what, ms, check) {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

// An HTTP server in the sandbox that answers the Host header it got.
const server = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = ("host=" + self.headers.get("Host", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

const sbx = await Sandbox.create({ timeoutMs: 120_000, network: { maskRequestHost: 'masked.example:${PORT}' } })
const priv = await Sandbox.create({ timeoutMs: 120_000, network: { allowPublicTraffic: false } })
try {
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${process.env.CLADE_INGRESS_DOMAIN}${port === '443' ? '' : ':' + port}`)
  const url = `https://${host}/`
  for (const s of [sbx, priv]) {
    await s.files.write('/tmp/host.py', server)
    await s.commands.run('python3 /tmp/host.py', { background: true, timeoutMs: 0 })
  }
  let r
  await waitFor('the server in the sandbox answers', 60_000, async () => {
    // Until it listens the ingress answers 502; a certificate it does
    // not trust throws.
    r = await get(url)
    return r.status === 200
  })
  assert.equal(r.alpn, 'http/1.1')
  assert.equal(r.body, 'host=masked.example:8000')
  ok('https getHost over HTTP/1.1, trusting the CA by NODE_EXTRA_CA_CERTS; maskRequestHost')
  r = await get2(url)
  assert.equal(r.status, 200)
  assert.equal(r.alpn, 'h2')
  assert.equal(r.body, 'host=masked.example:8000')
  ok('https getHost over HTTP/2')

  const purl = `https://${priv.getHost(8000)}/`
  await waitFor('the private sandbox\'s server answers', 60_000, async () => (await get(purl, { 'e2b-traffic-access-token': priv.trafficAccessToken })).status === 200)
  r = await get(purl)
  assert.equal(r.status, 403)
  r = await get2(purl, { 'e2b-traffic-access-token': 'wrong' })
  assert.equal(r.status, 403)
  r = await get2(purl, { 'e2b-traffic-access-token': priv.trafficAccessToken })
  assert.equal(r.status, 200)
  assert.match(r.body, /^host=8000-/)
  ok('a private sandbox needs e2b-traffic-access-token')

  await sbx.kill()
  for (const f of [get, get2]) {
    r = await f(url)
    assert.equal(r.status, 502)
    assert.deepEqual(JSON.parse(r.body), { sandboxId: sbx.sandboxId, message: 'The sandbox was not found', code: 502 })
  }
  assert.equal(await sbx.isRunning(), false)
  ok('a killed sandbox is E2B\'s 502')
} finally {
  await sbx.kill().catch(() => {})
  await priv.kill().catch(() => {})
}
console.log(`PASS ${mod}`)
