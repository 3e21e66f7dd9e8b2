// Resolves the ingress's names through the daemon's --ingress-dns server,
// as a resolver pointed at it does (Node's own resolver, real UDP queries
// on loopback), and fetches `http://${sbx.getHost(port)}` at the address it
// answered, with the unmodified E2B SDK. Usage as compat.mjs, with
// CLADE_INGRESS_DNS (ADDR:PORT); run by internal/front/e2b's
// TestRealSDKIngressDNS.
import assert from 'node:assert/strict'
import dns from 'node:dns'
import http from 'node:http'

const mod = process.argv[2] || 'e2b'
const { Sandbox } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

const resolver = new dns.promises.Resolver({ timeout: 5000, tries: 2 })
resolver.setServers([process.env.CLADE_INGRESS_DNS])

// lookup resolves through the ingress's DNS server only.
function lookup(host, opts, cb) {
  if (typeof opts === 'function') cb = opts
  resolver.resolve4(host).then((as) => {
    if (opts?.all) cb(null, as.map((address) => ({ address, family: 4 })))
    else cb(null, as[0], 4)
  }, cb)
}

function get(url) {
  return new Promise((resolve, reject) => {
    http.get(url, { lookup }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject)
  })
}

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  await sbx.commands.run('mkdir -p /tmp/www && echo served-by-$((40+2)) > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  const host = sbx.getHost(8000)
  const name = host.replace(/:\d+$/, '')
  assert.deepEqual(await resolver.resolve4(name), ['127.0.0.1'])
  const aaaa = await resolver.resolve6(name).catch((e) => e.code)
  assert.ok(aaaa === 'ENODATA' || (Array.isArray(aaaa) && aaaa.length === 0), String(aaaa))
  const refused = await resolver.resolve4('example.com').catch((e) => e.code)
  assert.equal(refused, 'EREFUSED')
  let r
  const end = Date.now() + 60_000
  for (;;) {
    r = await get(`http://${host}/`).catch((e) => ({ status: 0, body: String(e) }))
    if (r.status === 200 || Date.now() > end) break
    await new Promise((res) => setTimeout(res, 200))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'served-by-42\n')
  ok('ingress names resolve through --ingress-dns; other names are refused')
} finally {
  await sbx.kill()
}
console.log(`PASS ${mod}`)
