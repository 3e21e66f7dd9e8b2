// Drives the real, unmodified E2B SDK through the lifecycle details E2B
// code relies on: Sandbox.list's order, template and startedAfter filters
// (and E2B's 400 for a bad value), getMetrics over a range of the history,
// a command running when its sandbox is killed or paused, and one started
// before a pause, listed and connected to after the resume. Usage as compat.mjs;
// run by internal/front/e2b's TestRealSDKLifecycle.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox, CommandExitError, TimeoutError, SandboxError } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

async function rejects(p, cls, what) {
  try {
    await p
  } catch (e) {
    assert.ok(e instanceof cls, `${what}: got ${e?.constructor?.name}: ${e?.message}, want ${cls.name}`)
    return e
  }
  assert.fail(`${what}: no error, want ${cls.name}`)
}

const ids = (l) => l.map((x) => x.sandboxId)
const run = `${mod}-${process.pid}-${Date.now()}`
const a = await Sandbox.create({ metadata: { run }, timeoutMs: 180_000 })
const b = await Sandbox.create({ metadata: { run }, timeoutMs: 180_000 })
try {
  // order: by start time across the whole list, desc (newest first) by
  // default; pages follow the order.
  let l = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
  assert.deepEqual(ids(l), [b.sandboxId, a.sandboxId])
  l = await Sandbox.list({ query: { metadata: { run } }, order: 'desc' }).nextItems()
  assert.deepEqual(ids(l), [b.sandboxId, a.sandboxId])
  l = await Sandbox.list({ query: { metadata: { run } }, order: 'asc' }).nextItems()
  assert.deepEqual(ids(l), [a.sandboxId, b.sandboxId])
  const pages = Sandbox.list({ query: { metadata: { run } }, order: 'asc', limit: 1 })
  assert.deepEqual(ids(await pages.nextItems()), [a.sandboxId])
  assert.ok(pages.hasNext)
  assert.deepEqual(ids(await pages.nextItems()), [b.sandboxId])
  assert.ok(!pages.hasNext)
  // startedAfter: at or after the time given.
  const infoA = await a.getInfo()
  const infoB = await b.getInfo()
  l = await Sandbox.list({ query: { metadata: { run }, startedAfter: new Date(infoA.startedAt.getTime() + 1) } }).nextItems()
  assert.deepEqual(ids(l), [b.sandboxId])
  l = await Sandbox.list({ query: { metadata: { run }, startedAfter: infoA.startedAt } }).nextItems()
  assert.deepEqual(ids(l), [b.sandboxId, a.sandboxId])
  l = await Sandbox.list({ query: { metadata: { run }, startedAfter: new Date(infoB.startedAt.getTime() + 1000) } }).nextItems()
  assert.deepEqual(ids(l), [])
  // template: the template's name (or the image behind it).
  l = await Sandbox.list({ query: { metadata: { run }, template: infoA.templateId }, order: 'asc' }).nextItems()
  assert.deepEqual(ids(l), [a.sandboxId, b.sandboxId])
  l = await Sandbox.list({ query: { metadata: { run }, template: 'no-such-template' } }).nextItems()
  assert.deepEqual(ids(l), [])
  // A bad order is E2B's 400, not ignored.
  const e = await rejects(Sandbox.list({ query: { metadata: { run } }, order: 'sideways' }).nextItems(), SandboxError, 'list with order sideways')
  assert.ok(e.message.startsWith('400: ') && e.message.includes('order'), e.message)
  ok('list: order asc/desc across pages, startedAfter, template, 400 for a bad order')

  // getMetrics: the history, every 5 s, and a range of it.
  await a.commands.run('head -c 20000000 /dev/urandom > /home/user/fill && sync')
  const t0 = Date.now()
  let all = await a.getMetrics()
  // Three samples, the last taken after the write (on a loaded host the
  // history may hold three from before it).
  while (all.length < 3 || all[all.length - 1].timestamp.getTime() <= t0) {
    assert.ok(Date.now() - t0 < 60_000, `no history of 3 samples, the last after the write, after a minute: ${JSON.stringify(all)}`)
    await new Promise((r) => setTimeout(r, 2000))
    all = await a.getMetrics()
  }
  for (let i = 1; i < all.length; i++) {
    assert.ok(all[i].timestamp > all[i - 1].timestamp, `samples out of order: ${JSON.stringify(all)}`)
    const gap = all[i].timestamp - all[i - 1].timestamp
    assert.ok(gap >= 3_000 && gap <= 30_000, `samples ${gap} ms apart: ${JSON.stringify(all)}`)
  }
  for (const m of all) {
    assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.cpuCount > 0, JSON.stringify(m))
    assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
  }
  const last = all[all.length - 1]
  assert.ok(last.diskTotal > 0 && last.diskUsed >= 20_000_000, `disk of the last sample: ${JSON.stringify(last)}`)
  // A range of whole seconds holds the samples inside it only.
  const mid = all[1].timestamp
  const start = new Date(Math.floor(mid.getTime() / 1000) * 1000)
  const some = await a.getMetrics({ start, end: start })
  assert.deepEqual(some.map((m) => m.timestamp.getTime()), all.filter((m) => Math.floor(m.timestamp.getTime() / 1000) * 1000 === start.getTime()).map((m) => m.timestamp.getTime()))
  assert.ok(some.length >= 1, `no sample in [${start.toISOString()}]: ${JSON.stringify(all)}`)
  const none = await a.getMetrics({ start: new Date(t0 - 3_600_000), end: new Date(t0 - 3_000_000) })
  assert.deepEqual(none, [])
  await rejects(a.getMetrics({ start: new Date(), end: new Date(Date.now() - 60_000) }), SandboxError, 'getMetrics with end before start')
  ok('getMetrics: a history every 5 s, a range of it, 400 for end before start')

  // A command running when its sandbox is killed ends with TimeoutError
  // (E2B's "the sandbox was killed"), not an exit code.
  const fg = b.commands.run('sleep 600')
  const bg = await b.commands.run('sleep 600', { background: true })
  const fgDone = fg.then(() => null, (err) => err)
  await new Promise((r) => setTimeout(r, 500))
  assert.ok(await b.kill())
  let err = await fgDone
  assert.ok(err instanceof TimeoutError && !(err instanceof CommandExitError), `foreground: ${err?.constructor?.name}: ${err?.message}`)
  err = await bg.wait().then(() => null, (e) => e)
  assert.ok(err instanceof TimeoutError && !(err instanceof CommandExitError), `background: ${err?.constructor?.name}: ${err?.message}`)
  ok('a command whose sandbox is killed ends with TimeoutError')

  // Paused under a command: its stream ends with TimeoutError too; the
  // process itself survives the pause (the whole sandbox is checkpointed).
  const held = await a.commands.run('sleep 600', { background: true })
  assert.ok(await a.pause())
  err = await held.wait().then(() => null, (e) => e)
  assert.ok(err instanceof TimeoutError && !(err instanceof CommandExitError), `paused: ${err?.constructor?.name}: ${err?.message}`)
  await Sandbox.connect(a.sandboxId)
  const r = await a.commands.run(`for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 600'`)
  assert.equal(r.stdout.trim(), '1')
  ok('a command whose sandbox is paused ends with TimeoutError; its process lives on')

  // A command started before a pause is listed after the resume (as E2B
  // reports it: cmd, args, envs), and commands.connect(pid) attaches to
  // it: its output continues exactly where the first handle's stopped,
  // and its exit code arrives.
  const script = `sh -c 'for i in $(seq 1 40); do echo $i; sleep 0.2; done; exit 7'`
  let early = ''
  const counter = await a.commands.run(script, { background: true, timeoutMs: 0, envs: { COUNTER: 'yes' }, onStdout: (d) => { early += d } })
  const t2 = Date.now()
  while (early.split('\n').length < 4) {
    assert.ok(Date.now() - t2 < 60_000, `no output from the counter: ${JSON.stringify(early)}`)
    await new Promise((r) => setTimeout(r, 50))
  }
  assert.ok(await a.pause())
  err = await counter.wait().then(() => null, (e) => e)
  assert.ok(err instanceof TimeoutError, `counter paused: ${err?.constructor?.name}: ${err?.message}`)
  await Sandbox.connect(a.sandboxId)
  const listed = await a.commands.list()
  const mine = listed.filter((p) => p.pid === counter.pid)
  assert.equal(mine.length, 1, `pid ${counter.pid} not listed after the resume: ${JSON.stringify(listed)}`)
  assert.equal(mine[0].cmd, '/bin/bash')
  assert.deepEqual(mine[0].args, ['-l', '-c', script])
  assert.deepEqual(mine[0].envs, { COUNTER: 'yes' })
  let late = ''
  const again = await a.commands.connect(counter.pid, { timeoutMs: 0, onStdout: (d) => { late += d } })
  assert.equal(again.pid, counter.pid)
  err = await again.wait().then(() => null, (e) => e)
  assert.ok(err instanceof CommandExitError && err.exitCode === 7, `counter's end: ${err?.constructor?.name}: ${err?.message}`)
  assert.equal(err.stdout, late)
  assert.deepEqual((early + late).split('\n').filter(Boolean), Array.from({ length: 40 }, (_, i) => String(i + 1)),
    `output across the pause: before ${JSON.stringify(early)}, after ${JSON.stringify(late)}`)
  assert.deepEqual((await a.commands.list()).filter((p) => p.pid === counter.pid), [])
  ok('a command started before a pause is listed after the resume; connect(pid) continues its output and gets its exit')

  // pause({keepMemory: false}): the files are kept, the processes are not;
  // the resume starts the sandbox afresh on its files.
  await a.files.write('/home/user/kept.txt', 'kept')
  await a.commands.run('echo scratch > /tmp/scratch')
  const before = await a.commands.run('sleep 700', { background: true })
  assert.ok(await a.pause({ keepMemory: false }))
  err = await before.wait().then(() => null, (e) => e)
  assert.ok(err instanceof TimeoutError, `paused without memory: ${err?.constructor?.name}: ${err?.message}`)
  assert.equal((await Sandbox.getInfo(a.sandboxId)).state, 'paused')
  await Sandbox.connect(a.sandboxId)
  assert.equal(await a.files.read('/home/user/kept.txt'), 'kept')
  assert.equal((await a.commands.run('cat /tmp/scratch')).stdout, 'scratch\n')
  const procs = await a.commands.run(`for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep ' || true`)
  assert.equal(procs.stdout.trim(), '0', 'a process survived a pause without memory')
  assert.deepEqual((await a.commands.list()).map((p) => p.cmd), [])
  assert.equal((await a.commands.run('echo fresh')).stdout, 'fresh\n')
  ok('pause({keepMemory: false}) keeps the files, not the processes')

  // lifecycle.onTimeout {action: 'pause', keepMemory: false}
  // (autoPauseMemory: false): the timeout pauses the same way.
  const c = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  try {
    await c.files.write('/home/user/c.txt', 'c')
    await c.commands.run('sleep 800', { background: true })
    const t1 = Date.now()
    while ((await Sandbox.getInfo(c.sandboxId)).state !== 'paused') {
      assert.ok(Date.now() - t1 < 60_000, 'not paused a minute after its timeout')
      await new Promise((r) => setTimeout(r, 500))
    }
    await Sandbox.connect(c.sandboxId, { timeoutMs: 60_000 })
    assert.equal(await c.files.read('/home/user/c.txt'), 'c')
    const left = await c.commands.run(`for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 800' || true`)
    assert.equal(left.stdout.trim(), '0', 'a process survived an auto-pause without memory')
    ok('onTimeout pause with keepMemory: false keeps the files, not the processes')
  } finally {
    await c.kill()
  }
} finally {
  await a.kill()
  await b.kill()
}
console.log(`PASS ${mod}`)
