// Drives the real, unmodified E2B SDK against a clade daemon's E2B front.
// Usage: node compat.mjs MODULE (e2b or e2b-2.50), with E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL set. Prints one line per check and exits
// non-zero at the first failure. Run by internal/front/e2b's Go test.
import assert from 'node:assert/strict'
import http from 'node:http'

const mod = process.argv[2] || 'e2b'
const {
  Sandbox, CommandExitError, NotFoundError, TimeoutError, SandboxNotFoundError, AuthenticationError, FileType,
} = await import(mod)
const run = `${process.pid}-${Date.now()}`
const apiUrl = process.env.E2B_API_URL

// waitFor polls check (a clade timeout acts within a fraction of a second
// of its deadline) until it returns true, for at most ms.
async function waitFor(what, ms, check) {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

// get fetches path through clade's ingress at addr for Host host.
function get(addr, host, path) {
  const [hostname, port] = addr.split(':')
  return new Promise((resolve, reject) => {
    http.get({ hostname, port, path, headers: { Host: host } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject)
  })
}

function ok(name) { console.log(`ok ${mod} ${name}`) }

async function rejects(p, cls, name) {
  try {
    await p
  } catch (e) {
    assert.ok(e instanceof cls, `${name}: got ${e?.constructor?.name}: ${e?.message}, want ${cls.name}`)
    return e
  }
  assert.fail(`${name}: did not throw`)
}

const killed = []
try {
  // A wrong key: E2B's status and body, and the SDK's AuthenticationError.
  const res = await fetch(`${apiUrl}/v2/sandboxes`, { headers: { 'X-API-KEY': 'wrong' } })
  assert.equal(res.status, 401)
  const body = await res.json()
  assert.equal(body.code, 401)
  assert.match(body.message, /API key/)
  await rejects(Sandbox.create({ apiKey: 'wrong' }), AuthenticationError, 'create with a wrong key')
  ok('wrong API key is 401 with E2B\'s body')

  const sbx = await Sandbox.create({ metadata: { suite: 'compat', run }, envs: { FROM_CREATE: 'c1' }, timeoutMs: 120_000 })
  killed.push(sbx)
  assert.match(sbx.sandboxId, /^[0-9a-f]+$/)
  ok('create')

  // Foreground commands: output, exit codes, envs, cwd, home.
  let r = await sbx.commands.run('echo out; echo err >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  const e = await rejects(sbx.commands.run('echo partial; exit 3'), CommandExitError, 'non-zero exit')
  assert.equal(e.exitCode, 3)
  assert.equal(e.stdout, 'partial\n')
  r = await sbx.commands.run('echo "$FROM_CREATE $FROM_RUN"; pwd', { envs: { FROM_RUN: 'r1' }, cwd: '/tmp' })
  assert.equal(r.stdout, 'c1 r1\n/tmp\n')
  r = await sbx.commands.run('pwd; echo $HOME; id -u user >/dev/null && echo has-user; readlink -f /bin/bash')
  assert.equal(r.stdout, '/home/user\n/home/user\nhas-user\n/usr/bin/bash\n')
  const chunks = []
  r = await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), 'line1\nline2\nline3\n')
  await rejects(sbx.commands.run('sleep 30', { timeoutMs: 1_000 }), TimeoutError, 'a command past its timeoutMs')
  ok('commands.run: stdout, stderr, exit codes, envs, cwd, home, streaming, timeoutMs')

  // Background: listed, killed, and surviving its client's disconnect.
  const bg = await sbx.commands.run('sleep 600', { background: true })
  assert.ok(bg.pid > 0)
  let procs = await sbx.commands.list()
  assert.ok(procs.some((p) => p.pid === bg.pid && p.args.includes('sleep 600')), JSON.stringify(procs))
  assert.equal(await sbx.commands.kill(bg.pid), true)
  await rejects(bg.wait(), CommandExitError, 'a killed command')
  procs = await sbx.commands.list()
  assert.ok(!procs.some((p) => p.pid === bg.pid))
  assert.equal(await sbx.commands.kill(bg.pid), false)

  const survivor = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true })
  await survivor.disconnect()
  const again = await sbx.commands.connect(survivor.pid)
  await sbx.commands.sendStdin(survivor.pid, 'hello\n')
  r = await again.wait()
  assert.equal(r.stdout, 'got hello\n')
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'abc')
  await sbx.commands.closeStdin(cat.pid)
  r = await cat.wait()
  assert.equal(r.stdout, 'abc')
  ok('background commands: list, kill, disconnect + connect, stdin, closeStdin')

  // PTY: a real terminal in the sandbox, sized, resizable.
  let term = ''
  const decoder = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { term += decoder.decode(d) } })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('tty; stty size\n'))
  await waitFor('the terminal says its size', 30_000, () => /\/dev\/pts\/\d+\s+24 80/.test(term))
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit 0\n'))
  const ptyEnd = await pty.wait()
  assert.equal(ptyEnd.exitCode, 0)
  assert.match(term, /30 100/)
  ok('pty: create, input, size, resize')

  // Files.
  const info = await sbx.files.write('/home/user/dir/a.txt', 'hello file')
  assert.equal(info.path, '/home/user/dir/a.txt')
  assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'hello file')
  await sbx.files.write('rel.txt', 'relative')
  assert.equal(await sbx.files.read('/home/user/rel.txt'), 'relative')
  const bin = new Uint8Array(70_000).map((_, i) => (i * 7) & 0xff)
  await sbx.files.write('/tmp/bin', bin.buffer)
  assert.deepEqual(await sbx.files.read('/tmp/bin', { format: 'bytes' }), bin)
  await sbx.files.write([{ path: '/tmp/m/one', data: '1' }, { path: '/tmp/m/two', data: '2' }])
  assert.equal(await sbx.files.read('/tmp/m/two'), '2')
  await sbx.files.write('/tmp/gz.txt', 'gzipped', { gzip: true })
  assert.equal(await sbx.files.read('/tmp/gz.txt'), 'gzipped')
  const list = await sbx.files.list('/home/user/dir')
  assert.deepEqual(list.map((x) => [x.name, x.type, x.path]), [['a.txt', FileType.FILE, '/home/user/dir/a.txt']])
  assert.equal(await sbx.files.makeDir('/home/user/newdir/sub'), true)
  assert.equal(await sbx.files.makeDir('/home/user/newdir/sub'), false)
  assert.equal(await sbx.files.exists('/home/user/newdir/sub'), true)
  const st = await sbx.files.getInfo('/home/user/dir/a.txt')
  assert.equal(st.size, 10)
  assert.equal(st.type, FileType.FILE)
  await sbx.files.rename('/home/user/dir/a.txt', '/home/user/dir/b.txt')
  assert.equal(await sbx.files.read('/home/user/dir/b.txt'), 'hello file')
  await sbx.files.remove('/home/user/newdir')
  assert.equal(await sbx.files.exists('/home/user/newdir'), false)
  await rejects(sbx.files.read('/home/user/missing.txt'), NotFoundError, 'reading a missing file')
  r = await sbx.commands.run('cat /home/user/dir/b.txt')
  assert.equal(r.stdout, 'hello file')
  ok('files: write, read, list, makeDir, exists, getInfo, rename, remove')

  // watchDir: clade compares listings, so events come within a poll.
  await sbx.files.makeDir('/tmp/w')
  const seen = []
  const watch = await sbx.files.watchDir('/tmp/w', (ev) => seen.push(`${ev.type}:${ev.name}`))
  await sbx.files.write('/tmp/w/new.txt', 'one')
  await waitFor('a create event', 30_000, () => seen.includes('create:new.txt'))
  await sbx.files.write('/tmp/w/new.txt', 'two, longer')
  await waitFor('a write event', 30_000, () => seen.includes('write:new.txt'))
  await sbx.files.remove('/tmp/w/new.txt')
  await waitFor('a remove event', 30_000, () => seen.includes('remove:new.txt'))
  await watch.stop()
  await rejects(sbx.files.watchDir('/tmp/no-such-dir', () => {}), NotFoundError, 'watching a missing directory')
  ok('files.watchDir: create, write, remove')

  // Timeout, info, list by metadata, metrics.
  await sbx.setTimeout(60_000)
  let si = await sbx.getInfo()
  assert.equal(si.sandboxId, sbx.sandboxId)
  assert.equal(si.templateId, 'base')
  assert.equal(si.state, 'running')
  assert.equal(si.metadata.run, run)
  const left = si.endAt.getTime() - Date.now()
  assert.ok(left > 30_000 && left <= 61_000, `endAt ${si.endAt.toISOString()} is ${left} ms away`)
  let found = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
  assert.deepEqual(found.map((x) => x.sandboxId), [sbx.sandboxId])
  found = await Sandbox.list({ query: { metadata: { run: 'another' } } }).nextItems()
  assert.deepEqual(found, [])
  const metrics = await sbx.getMetrics()
  assert.ok(metrics.length >= 1 && metrics[0].memTotal > 0 && metrics[0].cpuCount > 0, JSON.stringify(metrics))
  ok('setTimeout, getInfo, list with a metadata filter, getMetrics')

  // connect() only ever extends the timeout, as E2B's does: a reconnect
  // with a short timeout (older SDKs send 300 s on every connect) keeps a
  // longer end; a longer one moves it out.
  await sbx.setTimeout(3_600_000)
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  let end = (await sbx.getInfo()).endAt.getTime() - Date.now()
  assert.ok(end > 3_500_000, `a connect with 60 s cut the 1 h timeout to ${end} ms`)
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 7_200_000 })
  end = (await sbx.getInfo()).endAt.getTime() - Date.now()
  assert.ok(end > 7_100_000 && end <= 7_201_000, `a connect with 2 h left ${end} ms`)
  ok('connect extends the timeout, never shortens it')

  // Pause (clade sleep) and resume (wake): the files are still there.
  assert.equal(await sbx.pause(), true)
  si = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(si.state, 'paused')
  found = await Sandbox.list({ query: { metadata: { run }, state: ['paused'] } }).nextItems()
  assert.deepEqual(found.map((x) => x.sandboxId), [sbx.sandboxId])
  found = await Sandbox.list({ query: { metadata: { run }, state: ['running'] } }).nextItems()
  assert.deepEqual(found, [])
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)
  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  r = await resumed.commands.run('cat /home/user/dir/b.txt')
  assert.equal(r.stdout, 'hello file')
  ok('pause, list by state, connect (resume)')

  // Fork: children carry the parent's files; the parent keeps running.
  const kids = await sbx.fork({ count: 2 })
  assert.equal(kids.length, 2)
  for (const k of kids) {
    assert.ok(k instanceof Sandbox, String(k))
    killed.push(k)
    r = await k.commands.run('cat /home/user/dir/b.txt')
    assert.equal(r.stdout, 'hello file')
  }
  assert.notEqual(kids[0].sandboxId, kids[1].sandboxId)
  r = await sbx.commands.run('echo parent')
  assert.equal(r.stdout, 'parent\n')
  ok('fork into 2 children')

  // Snapshots: create, list, create a sandbox from one, delete.
  const snap = await sbx.createSnapshot()
  assert.ok(snap.snapshotId)
  const snaps = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.ok(snaps.some((x) => x.snapshotId === snap.snapshotId), JSON.stringify(snaps))
  const fromSnap = await Sandbox.create(snap.snapshotId)
  killed.push(fromSnap)
  r = await fromSnap.commands.run('cat /home/user/dir/b.txt')
  assert.equal(r.stdout, 'hello file')
  await fromSnap.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  ok('snapshots: create, list, create from, delete')

  // getHost(port) is served by clade's ingress (its domain is E2B's).
  const ingress = process.env.CLADE_INGRESS_ADDR
  if (ingress) {
    const host = sbx.getHost(8000)
    // The ingress's port rides on the domain (it is not on 80 here), so
    // the host getHost returns reaches it.
    const port = ingress.split(':').pop()
    assert.equal(host, `8000-${sbx.sandboxId}.${process.env.CLADE_INGRESS_DOMAIN}${port === '80' ? '' : ':' + port}`)
    await sbx.files.write('/tmp/www/index.html', 'served')
    const srv = await sbx.commands.run('python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www', { background: true, timeoutMs: 0 })
    let page
    await waitFor('the server in the sandbox answers', 60_000, async () => {
      page = await get(ingress, host, '/index.html').catch(() => undefined)
      return page?.status === 200
    })
    assert.equal(page.body, 'served')
    await srv.kill()
    ok('getHost through clade\'s ingress')
  }

  // Lifecycle: a timeout kills, or with onTimeout 'pause' pauses.
  const shortLived = await Sandbox.create({ timeoutMs: 2_000 })
  killed.push(shortLived)
  await waitFor('the sandbox is killed at its timeout', 60_000, async () => !(await shortLived.isRunning().catch(() => false)) &&
    (await Sandbox.getInfo(shortLived.sandboxId).then(() => false, (e) => e instanceof SandboxNotFoundError)))
  const autoPaused = await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
  killed.push(autoPaused)
  await waitFor('the sandbox is paused at its timeout', 60_000, async () => (await Sandbox.getInfo(autoPaused.sandboxId)).state === 'paused')
  await Sandbox.connect(autoPaused.sandboxId, { timeoutMs: 60_000 })
  assert.equal((await autoPaused.commands.run('echo back')).stdout, 'back\n')
  ok('timeout kills; onTimeout pause pauses, connect resumes')

  // Kill.
  await sbx.kill()
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'info of a killed sandbox')
  await rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError, 'connect to a killed sandbox')
  assert.equal(await sbx.isRunning(), false)
  // As against E2B: envd answers 502, the SDK's health probe says gone.
  await rejects(sbx.commands.run('true'), SandboxNotFoundError, 'a command in a killed sandbox')
  await rejects(sbx.files.read('/etc/hostname'), TimeoutError, 'a read in a killed sandbox')
  ok('kill')
} finally {
  for (const s of killed) await s.kill().catch(() => {})
}
console.log(`PASS ${mod}`)
