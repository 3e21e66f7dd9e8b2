// Drives the real, unmodified E2B SDK through PTYs: the agent's own
// terminals, resized at once after the start, input, output, exit codes,
// kill, and connecting to a PTY's process from another handle. Usage as
// compat.mjs; run by internal/front/e2b's TestRealSDKPTY.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox, CommandExitError } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

async function waitFor(what, ms, check) {
  const end = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

const enc = (s) => new TextEncoder().encode(s)

// term opens a PTY whose output is collected in .out.
async function term(sbx, opts) {
  const t = { out: '' }
  const dec = new TextDecoder()
  t.h = await sbx.pty.create({ cols: 80, rows: 24, ...opts, onData: (d) => { t.out += dec.decode(d, { stream: true }) } })
  return t
}

const sbx = await Sandbox.create({ timeoutMs: 180_000 })
try {
  // A resize sent right after the start reaches the terminal, every time:
  // the terminal exists before the pid is known.
  for (let i = 0; i < 6; i++) {
    const rows = 20 + i, cols = 90 + i
    const t = await term(sbx)
    await sbx.pty.resize(t.h.pid, { cols, rows })
    await sbx.pty.sendInput(t.h.pid, enc(`stty size; echo "[$TERM] $((6*7))"; exit 0\n`))
    const r = await t.h.wait()
    assert.equal(r.exitCode, 0)
    assert.match(t.out, new RegExp(`\\b${rows} ${cols}\\b`), `round ${i}: ${JSON.stringify(t.out)}`)
    assert.match(t.out, /\[xterm-256color\] 42/)
  }
  ok('pty: resize at once after the start, input and output, TERM')

  // The process is the terminal's session leader, as the user, in the
  // user's home, and sees a terminal on its standard streams.
  let t = await term(sbx, { cols: 132, rows: 43 })
  await sbx.pty.sendInput(t.h.pid, enc('echo "<$(whoami) $PWD $([ -t 0 ] && [ -t 2 ] && echo tty) $(stty size) $(cut -d\' \' -f6 /proc/$$/stat)>"; exit 0\n'))
  await t.h.wait()
  const m = t.out.match(/<(\S+) (\S+) tty (\d+ \d+) (\d+)>/)
  assert.ok(m, JSON.stringify(t.out))
  assert.deepEqual(m.slice(1, 4), ['user', '/home/user', '43 132'])
  assert.equal(Number(m[4]), t.h.pid)
  ok('pty: session leader, user, home, a terminal on its streams')

  // Exit codes: the shell's own.
  t = await term(sbx)
  await sbx.pty.sendInput(t.h.pid, enc('exit 7\n'))
  try {
    await t.h.wait()
    assert.fail('exit 7 did not fail')
  } catch (e) {
    assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
    assert.equal(e.exitCode, 7)
  }
  ok('pty: exit code')

  // Another handle reaches a running PTY by its pid (pty.connect where the
  // SDK has it, commands.connect everywhere) and sees what it prints.
  t = await term(sbx)
  await sbx.pty.sendInput(t.h.pid, enc('echo ready-$((1+1))\n'))
  await waitFor('the first handle sees the shell', 30_000, () => t.out.includes('ready-2'))
  await t.h.disconnect()
  let seen = ''
  const dec = new TextDecoder()
  const other = sbx.pty.connect
    ? await sbx.pty.connect(t.h.pid, { onData: (d) => { seen += dec.decode(d, { stream: true }) } })
    : await sbx.commands.connect(t.h.pid)
  assert.equal(other.pid, t.h.pid)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === t.h.pid), JSON.stringify(listed))
  await sbx.pty.resize(t.h.pid, { cols: 61, rows: 17 })
  await sbx.pty.sendInput(t.h.pid, enc('stty size; exit 0\n'))
  const r = await other.wait()
  assert.equal(r.exitCode, 0)
  if (sbx.pty.connect) assert.match(seen, /\b17 61\b/, JSON.stringify(seen))
  ok('pty: connect to a running PTY, resize and input after it')

  // Kill: the shell ends (as envd's kill, the signal goes to the process
  // itself), the stream ends and the process leaves the list.
  t = await term(sbx)
  await sbx.pty.sendInput(t.h.pid, enc('echo u$((1))p\n'))
  await waitFor('the shell answers', 30_000, () => t.out.includes('u1p'))
  assert.equal(await sbx.pty.kill(t.h.pid), true)
  try {
    await t.h.wait()
    assert.fail('a killed PTY ended well')
  } catch (e) {
    assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
  }
  await waitFor('the killed PTY leaves the list', 30_000,
    async () => !(await sbx.commands.list()).some((p) => p.pid === t.h.pid))
  assert.equal(await sbx.pty.kill(t.h.pid), false)
  ok('pty: kill')
} finally {
  await sbx.kill()
}
console.log(`PASS ${mod}`)
